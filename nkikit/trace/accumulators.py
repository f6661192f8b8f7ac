"""The engines' accumulator registers, carried from one instruction to the next.

VectorE and ScalarE each hold 128 per-lane fp32 accumulators.  The ScalarE ones are shared by
``activation``, ``activation_reduce`` and ``activate2``; the VectorE ones by ``exponential``,
``range_select``, ``select_reduce``, ``tensor_scalar_reduce`` and
``tensor_scalar_cumulative``.  An instruction's ``reduce_cmd`` says what it does to them
[reference/nki-0x.md §4.1, §4.10, §6.3]:

- ``idle``: leaves them as they are;
- ``reset``: sets them to the identity of the reduction, and reduces nothing;
- ``reset_reduce``: identity, then this instruction's row reduction;
- ``reduce``: combines this instruction's row reduction into them;
- ``load_reduce``: loads ``reduce_init`` (``imm1``), then as ``reduce``;

and a ``reduce_res`` (P, 1) tile, when given, receives their value afterwards (the extra
read-out instruction the ISA describes; ``None`` keeps the value for the next instruction).

nkikit models each engine's accumulators as a (128, 1) fp32 SBUF tensor of the kernel
(``acc_vector``, ``acc_scalar``), allocated when an instruction first touches it and poisoned
until written, so a chain that starts with ``reduce`` reads NaN, as reading before writing
should show.  A ``reduce_cmd`` becomes ops of existing primitives around the instruction's
own reduction (:class:`Chain`), so no layer needs to know about the registers: the
simulators, the verifier and the cost model see ordinary ops.  The P lanes of an instruction
are the accumulators' first P partitions, as a per-partition operand's are
(``nkikit/nki/isa``: ``_lanes``).

Readings where the reference is silent (see each):

- ``idle`` with a ``reduce_res``: the instruction's own row reduction goes straight to
  ``reduce_res`` and the accumulators stay as they were (what both dialects did before the
  registers were modeled, and what the NKI Library's calls rely on);
- "any VectorE instruction with ``idle`` may still clobber them" [§6.3] is not modeled: an
  instruction that does not touch them leaves them as they were;
- the combine step of ``reduce`` and the fills of ``reset`` / ``load_reduce`` run as small
  VectorE ops (a ScalarE accumulator included): the cost model charges one short
  instruction for each, where the hardware folds them into the instruction itself.
"""

from __future__ import annotations

import enum

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc
from ..ir.affine import Affine, Axis
from ..ir.core import ACCUMULATOR_LANES, Access, Alloc, Op, Tensor
from . import instructions as E
from .builder import current, maybe_current

LANES = ACCUMULATOR_LANES  # accumulators per engine, one per partition lane [§4.10]

CMDS = ("idle", "reset", "reduce", "reset_reduce", "load_reduce")
"""The ``reduce_cmd`` values, by their ``nisa.reduce_cmd`` names (values 0..4 [§4.1])."""

# the elementwise operator that folds a new row reduction into the accumulator
_COMBINE = {
    "add": "add",
    "subtract": "add",  # a subtract reduction sums [§6.3: identity 0]
    "multiply": "multiply",
    "max": "maximum",
    "min": "minimum",
    "abs_max": "abs_max",
    "abs_min": "abs_min",
}
# reset values [§6.3]
IDENTITY = {
    "add": 0.0,
    "subtract": 0.0,
    "multiply": 1.0,
    "max": -np.inf,
    "min": np.inf,
    "abs_max": 0.0,
    "abs_min": np.inf,
}


def command(cmd: object, loc: SourceLoc, op: str) -> str:
    """The name of a ``reduce_cmd`` argument (an ``nisa.reduce_cmd`` member or its int);
    ``err_invalid_argument`` for anything else."""
    if isinstance(cmd, enum.Enum) and cmd.name in CMDS:
        return cmd.name
    if isinstance(cmd, int | np.integer) and not isinstance(cmd, bool) and 0 <= cmd < len(CMDS):
        return CMDS[int(cmd)]
    raise NkiError(
        "err_invalid_argument",
        loc,
        op=f"nisa.{op}",
        why=f"reduce_cmd={cmd!r} is not a nisa.reduce_cmd member",
    )


def register(engine: str, partitions: int, loc: SourceLoc) -> Access:
    """Lanes ``0..partitions-1`` of ``engine``'s accumulators, as a (P, 1) fp32 access."""
    b = maybe_current() or current("the engine accumulators")
    regs = b.__dict__.setdefault("_accumulators", {})
    t = regs.get(engine)
    if t is None:
        # one tensor for the whole kernel: allocated ahead of every statement, outside
        # every loop, so that a chain may span loops
        t = Tensor(b.unique(f"acc_{engine}"), (LANES, 1), dtypes.float32, "sbuf", loc=loc)
        b.tensors.append(t)
        b.body.insert(0, Alloc(t))
        regs[engine] = t
    return Access(t, (partitions, 1), (Affine.of(Axis(0)), Affine.of(Axis(1))))


class Chain:
    """What one instruction does to its engine's accumulators.

    Built before the instruction is emitted (it emits the fill of ``reset`` / ``load_reduce``);
    :attr:`into` is where the instruction writes its own row reduction (None: it reduces
    nothing); :meth:`finish`, called after the instruction, folds a ``reduce`` into the
    accumulators and reads them out into ``reduce_res``.  ``negate``: the read-out is
    negated (``tensor_scalar_reduce(reduce_res_negate=True)``)."""

    def __init__(
        self,
        engine: str,
        cmd: str,
        reduce_op: str | None,
        partitions: int,
        reduce_res: Access | None,
        *,
        loc: SourceLoc,
        init: Access | float | None = None,
        negate: bool = False,
        op: str,
    ) -> None:
        self.cmd, self.reduce_op, self.reduce_res, self.negate = cmd, reduce_op, reduce_res, negate
        self.loc = loc
        self.engine = engine
        self.tmp: Access | None = None
        self.into: Access | None = None
        self.acc: Access | None = None
        if cmd != "idle" and reduce_op is None:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{op}",
                why=f"reduce_cmd={cmd} needs reduce_op",
            )
        if cmd != "idle" and reduce_op not in IDENTITY:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{op}",
                why=f"reduce_op={reduce_op} cannot accumulate across instructions (the "
                f"accumulators take {', '.join(IDENTITY)})",
            )
        if cmd == "load_reduce" and init is None:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{op}",
                why="reduce_cmd=load_reduce needs the value to load (reduce_init)",
            )
        if cmd == "idle":
            if reduce_res is not None and reduce_op is not None:
                self.into = self._temp(partitions) if negate else reduce_res
            return
        assert reduce_op is not None
        self.acc = register(engine, partitions, loc)
        if cmd == "reset":
            E.emit_memset(self.acc, value=IDENTITY[reduce_op], loc=loc)
        elif cmd == "reset_reduce":
            self.into = self.acc
        else:  # reduce, load_reduce
            if cmd == "load_reduce":
                if isinstance(init, Access):
                    E.emit_tensor_copy(self.acc, init, loc=loc)
                else:
                    E.emit_memset(self.acc, value=float(init), loc=loc)
            self.into = self.tmp = self._temp(partitions)

    def _temp(self, partitions: int) -> Access:
        b = maybe_current() or current("the engine accumulators")
        t = b.new_tensor((partitions, 1), dtypes.float32, "sbuf", loc=self.loc, fallback="red")
        return Access.whole(t)

    def finish(self, op: Op) -> None:
        """Emit what follows the instruction ``op``: the fold of ``reduce`` / ``load_reduce``
        and the read-out into ``reduce_res``.  ``op`` stays the builder's last op, so that
        ``t[...] = nisa.activation_reduce(...)`` still writes ``t`` directly (none of these
        ops reads the instruction's destination)."""
        self._finish()
        b = maybe_current() or current("the engine accumulators")
        b.last_op = op

    def _finish(self) -> None:
        loc = self.loc
        if self.tmp is not None and self.acc is not None:
            E.emit_tensor_tensor(
                self.acc,
                self.acc,
                self.tmp,
                op=_COMBINE[self.reduce_op],
                accumulate=True,
                loc=loc,
            )
        src = self.acc if self.acc is not None else self.into
        if self.reduce_res is None or src is None or src is self.reduce_res:
            return
        if self.negate:
            E.emit_tensor_scalar(
                self.reduce_res, src, -1.0, op0="multiply", engine="vector", loc=loc
            )
        else:
            eng = "scalar" if self.engine == "scalar" else "vector"
            E.emit_tensor_copy(self.reduce_res, src, engine=eng, loc=loc)
