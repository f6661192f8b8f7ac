"""PSUM accumulation groups for Beta-1's ``psum[...] += nisa.nc_matmul(...)`` / ``nl.matmul``.

On the hardware a matmul accumulation group starts with a write that overwrites and goes on
with writes that add (the ``accumulate=None`` rule of the NKI 0.x ``nc_matmul``: the first
matmul write to a PSUM element since it was allocated overwrites, later ones add).  So a ``+=``
of a matmul into a PSUM region no instruction has written since its tensor was allocated gives
the product, not fresh memory plus the product; a region written before (``nl.zeros``, an
earlier matmul) is added to, as before.

Beta-1 keeps ``affine_range`` / ``sequential_range`` loops rolled, so "first" is decided per
traced instruction:

* the region is *fresh* -- no earlier instruction of the trace writes an overlapping part of
  its tensor after the tensor's allocation -- and every rolled loop entered since the
  allocation moves the region (each iteration writes its own): the matmul overwrites;
* fresh, but some such loop leaves the region in place (a reduction loop): its first
  iteration must overwrite and the others add, which one rolled instruction cannot say, so
  that loop is split into as many copies as it has iterations (:func:`request_split`, as
  ``i % k`` indexing splits it: in place while its first copy is traced) and each copy is
  decided on its own;
* otherwise (written before, or an overlap the affine indices cannot settle): it adds.

Regions are compared symbolically: two accesses are disjoint when, along some dimension,
the coordinates they reach over all iterations of their loops do not meet, or their
loop-variable terms agree there and their tile-axis intervals do not meet.
"""

from __future__ import annotations

from ..errors import SourceLoc
from ..ir.affine import Affine, Axis, LoopVar
from ..ir.core import Access, Alloc, Loop, Op, Stmt
from ..trace.builder import Builder
from ..trace.loops import request_split


def matmul_accumulates(b: Builder, op: Op, dst: Access, loc: SourceLoc) -> bool:
    """Whether the matmul ``op`` (already writing ``dst``, a PSUM access) adds to ``dst``:
    see the module docstring.  Raises the loop-split signal for a fresh region in a reduction
    loop."""
    t = dst.tensor
    if _written_before(b, op, dst):
        return True
    depth = len(t.scope)
    moved = {s for a in dst.index for s in a.syms if isinstance(s, LoopVar)}
    for var in list(b.loops[depth:]):
        if var.trip > 1 and var not in moved:
            # split per iteration; in place, this body copy is the loop's first iteration
            split = request_split(b, Affine.of(var), var.trip, loc, f"{t.name} += matmul")
            if split is None:
                return True  # loop splitting is off: keep adding
    return False


def _written_before(b: Builder, op: Op, dst: Access) -> bool:
    """Some instruction traced before ``op`` since ``dst``'s tensor was allocated writes a
    part of ``dst`` (or may: an overlap the indices do not settle)."""
    t = dst.tensor
    for body in reversed(b.bodies):
        for s in reversed(body):
            if isinstance(s, Alloc) and s.tensor is t:
                return False
            if _writes(s, dst, op):
                return True
    return False


def _writes(s: Stmt, dst: Access, op: Op) -> bool:
    """``s`` (other than ``op``; a loop holding ``op`` counts what else it holds) writes a
    part of ``dst``."""
    if isinstance(s, Op):
        return s is not op and any(a.tensor is dst.tensor and _may_overlap(a, dst) for a in s.outs)
    if isinstance(s, Loop):
        return any(_writes(x, dst, op) for x in s.body)
    return False


def _may_overlap(x: Access, y: Access) -> bool:
    for ax, ay in zip(x.index, y.index):
        rx, ry = _reach(ax, x.shape), _reach(ay, y.shape)
        if rx is not None and ry is not None and (rx[1] < ry[0] or ry[1] < rx[0]):
            return False  # apart over every iteration of their loops
        lx, ly = _loop_part(ax), _loop_part(ay)
        if lx != ly:
            continue  # different loop terms: this dimension cannot tell more
        lo_x, hi_x = _axis_part(ax).bounds({Axis(k): n for k, n in enumerate(x.shape)})
        lo_y, hi_y = _axis_part(ay).bounds({Axis(k): n for k, n in enumerate(y.shape)})
        if hi_x < lo_y or hi_y < lo_x:
            return False
    return True


def _reach(a: Affine, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """The coordinates an index reaches over its tile axes and every iteration of its loops,
    or None (a program id: unknown range)."""
    lo = hi = a.const
    for s, c in a.terms:
        if isinstance(s, Axis):
            n = shape[s.k]
        elif isinstance(s, LoopVar):
            n = s.trip
        else:
            return None
        top = c * (n - 1)
        lo, hi = lo + min(0, top), hi + max(0, top)
    return lo, hi


def _loop_part(a: Affine) -> frozenset:
    return frozenset((s, c) for s, c in a.terms if not isinstance(s, Axis))


def _axis_part(a: Affine) -> Affine:
    return Affine(tuple((s, c) for s, c in a.terms if isinstance(s, Axis)), a.const)
