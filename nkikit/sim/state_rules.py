"""Simulation rules of the primitives that carry on-device state from one instruction to the
next: the random number instructions, whose PRNG state is an IR tensor (``trace/rng.py``,
generator in ``sim/prng.py``), and NKI 0.7 ``NkiScalar`` arithmetic on one-element integer
tiles.  Registered in ``rules.RULES`` like every other rule; these primitives move raw bits,
so their inputs arrive in their storage dtype.
"""

from __future__ import annotations

import math

import numpy as np

from .prng import draw, seed_state, uniform
from .rules import rule


def _seed64(op, value, ctx) -> int:
    """The seeding key: the 32-bit seed, or (kernel-start seeding) the immediate mixed with
    the simulation call's seed in the keys above 2^32, so the two never meet."""
    if op.attrs["call_seed"]:
        return (((ctx.seed & 0x7FFFFFFF) + 1) << 32) | (int(value) & 0xFFFFFFFF)
    return int(np.asarray(value).reshape(-1)[:1].view(np.uint32)[0])


@rule("set_rng_seed")
def _set_rng_seed(op, ins, ctx):
    lanes, words = op.outs[0].shape
    return [seed_state(_seed64(op, ins[0], ctx), lanes, words)]


@rule("rand_set_state")
def _rand_set_state(op, ins, ctx):
    return [np.asarray(ins[0]).astype(np.uint32).reshape(op.outs[0].shape)]


@rule("rand_get_state")
def _rand_get_state(op, ins, ctx):
    return [np.asarray(ins[0], dtype=np.uint32)]


def _draw(op, state) -> tuple[np.ndarray, np.ndarray]:
    """Random bits shaped like the op's destination, and the advanced state."""
    shape = op.outs[0].shape
    bits, new = draw(state, math.prod(shape[1:]))
    return bits.reshape(shape), new


@rule("rng")
def _rng(op, ins, ctx):
    # 32 bits truncated to the destination's least significant bits [ISA rng]
    bits, new = _draw(op, ins[0])
    dt = op.outs[0].dtype
    return [bits.astype(np.dtype(f"u{dt.itemsize}")).view(dt), new]


@rule("rand2")
def _rand2(op, ins, ctx):
    bits, new = _draw(op, ins[0])
    lo, hi = (np.asarray(x, dtype=np.float32) for x in ins[1:3])
    lo = lo.reshape(-1, *(1,) * (bits.ndim - 1)) if lo.ndim else lo
    hi = hi.reshape(-1, *(1,) * (bits.ndim - 1)) if hi.ndim else hi
    return [lo + uniform(bits) * (hi - lo), new]


@rule("dropout")
def _dropout(op, ins, ctx):
    data, prob, state = ins
    bits, new = draw(state, math.prod(data.shape[1:]))
    p = np.asarray(prob, dtype=np.float32)
    p = p.reshape(-1, 1) if p.ndim else p
    keep = (uniform(bits) >= p).reshape(data.shape)
    # no rescaling of the kept elements [ISA dropout]; the data keeps its own dtype
    return [np.where(keep, data, np.zeros((), data.dtype)), new]


_WRAP = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}
_COMPARE = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}


@rule("scalar_arith")
def _scalar_arith(op, ins, ctx):
    # in int64, then cut to the destination's width: two's-complement wrap-around, as the
    # 32-bit sequencer ALU (int32: 100000 * 100000 -> 1410065408) [nki-0x.md §4.14]
    x, y = (np.asarray(v, dtype=np.int64).reshape(()) for v in ins)
    name = op.attrs["op"]
    if name in _WRAP:
        with np.errstate(over="ignore"):
            r = _WRAP[name](x, y)
    else:
        r = _COMPARE[name](x, y).astype(np.int64)
    dt = op.outs[0].dtype
    return [np.asarray(r).astype(dt).reshape((1,) * len(op.outs[0].shape))]
