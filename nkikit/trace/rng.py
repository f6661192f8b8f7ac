"""The PRNG state of the kernel being traced: one IR tensor per engine (and per program of an
LNC launch traced in lockstep, each core having its own generators).

The random instructions (``rng``, ``rand2``, ``dropout``, ``set_rng_seed``,
``rand_set_state``, ``rand_get_state``) read and write this tensor as an ordinary operand, so
the state they carry from one instruction to the next is explicit in the IR: both simulators
run it as memory, the verifier and the scheduler see the dependency.  The tensor is an SBUF
tile of ``RNG_STATE_WORDS[engine]`` uint32 words per partition (the layout ``rand_get_state``
returns [nki-0x.md §4.12]), created at the kernel's top level the first time an engine's
generator is used, and seeded there by a ``set_rng_seed`` with ``call_seed=True``: the stream
of a kernel that never seeds is a function of the simulation call's seed, so reruns reproduce.
"""

from __future__ import annotations

from .. import dtypes
from ..errors import SourceLoc
from ..ir.affine import Affine, Axis
from ..ir.core import Access, Alloc, Op, Tensor
from ..ir.prims import RNG_STATE_WORDS, check_op
from .builder import Builder, current

LANES = 128  # one generator state per partition (nl.tile_size.pmax) [nki.md §2.1]


def rng_state(engine: str, partitions: int, loc: SourceLoc, key: tuple = ()) -> Access:
    """The first ``partitions`` lanes of ``engine``'s PRNG state (created and seeded at the
    kernel's start on first use).  ``key``: the program of an LNC launch traced in lockstep
    (each program has its own state)."""
    b = current("the random number instructions")
    t = _state_tensor(b, engine, key, loc)
    words = RNG_STATE_WORDS[engine]
    return Access(
        t,
        (partitions, words),
        (Affine.of(Axis(0)), Affine.of(Axis(1))),
    )


def _state_tensor(b: Builder, engine: str, key: tuple, loc: SourceLoc) -> Tensor:
    states: dict[tuple, Tensor] = b.__dict__.setdefault("_rng_states", {})
    t = states.get((engine, key))
    if t is not None:
        return t
    name = b.unique(f"rng_{engine}" + "".join(f".{k}" for k in key))
    t = Tensor(name, (LANES, RNG_STATE_WORDS[engine]), dtypes.uint32, "sbuf", loc=loc)
    b.tensors.append(t)
    attrs = check_op("set_rng_seed", [Access.whole(t)], [0], {"call_seed": True, "engine": engine})
    seed = Op("set_rng_seed", [Access.whole(t)], [0], attrs, loc)
    # at the top of the kernel, after the states made before: the state lives for the whole
    # kernel, whatever loop first used it
    at = 2 * len(states)
    b.body[at:at] = [Alloc(t), seed]
    states[(engine, key)] = t
    return t
