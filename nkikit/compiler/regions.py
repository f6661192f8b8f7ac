"""Operand regions: where in a buffer an access lands, in granules the scheduler can track.

A :class:`Tracked` buffer (an on-chip tensor, or an HBM tensor that is written) is cut into
``rows x cols`` granules per buffer.  A :class:`Region` is one operand's footprint: rows
(partitions) and bytes, both affine in the loop environment, so the scheduler finds the
granules of an iteration with a few integer operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from math import gcd, prod

from ..ir.affine import Affine, Axis, Sym
from ..ir.core import Access, Tensor
from .allocate import Placement

MAX_ONCHIP_ROW_GRANULES = 4  # partition quadrants
MAX_COL_GRANULES = 512  # enough to keep every tile of the tutorial kernels apart
MAX_HBM_ROW_GRANULES = 64

Terms = tuple[tuple[int, int], ...]  # (env slot, coefficient)


@dataclass(slots=True)
class Tracked:
    """A buffer whose accesses the scheduler orders: an on-chip tensor (or the tensors of one
    rotation group, which take its buffers in turn) or a written HBM tensor.

    Its memory is cut into ``rows x cols`` granules per buffer; an access marks every granule
    it touches.  Granule sizes divide every access offset and size when that keeps the count
    small, so that distinct tiles of one tensor do not depend on each other.
    """

    index: int
    tensor: Tensor
    buffers: int
    rows: int  # rows (partitions) in total
    cols: int  # bytes per row
    row_g: int = 1
    col_g: int = 1
    n_rows: int = 1
    n_cols: int = 1
    base: int = 0  # first state slot, set by the scheduler
    regions: list[Region] = field(default_factory=list)
    # on-chip: where its buffers live (the scheduler orders the tenants of that memory)
    placement: Placement | None = None
    implicit: bool = False  # on-chip but never allocated by an Alloc statement
    # members of a rotation group that are live together hold different buffers: each
    # lane (scheduler slot ``lane0 + k``) records the buffer of the member allocated last
    lane0: int = 0
    lanes: int = 1

    @property
    def granules(self) -> int:
        return self.n_rows * self.n_cols


@dataclass(slots=True)
class Region:
    """One operand's footprint in a tracked buffer: rows ``[r, r + r_span)`` and bytes
    ``[c, c + c_span)`` where ``r`` and ``c`` are affine in the loop environment.  ``slot``
    is the scheduler's record of which buffer the accessed tensor holds now (its tracked
    buffer's ``lane0`` plus its ``lane``)."""

    tracked: Tracked
    lane: int  # the accessed tensor's lane in the tracked buffer (Placement.lane)
    r_const: int
    r_terms: Terms
    r_span: int
    c_const: int
    c_terms: Terms
    c_span: int
    # after granule sizes are known: a precomputed list when the region never moves
    fixed: tuple[int, ...] | None = None
    slot: int = 0


def split_affine(a: Affine, shape: tuple[int, ...], env: dict[Sym, int]) -> tuple[int, Terms, int]:
    """(lowest value at env = 0, env terms, span) of an affine index over a tile of ``shape``."""
    lo = hi = a.const
    axis: dict[int, int] = {}
    terms: list[tuple[int, int]] = []
    for s, c in a.terms:
        if isinstance(s, Axis):
            axis[s.k] = axis.get(s.k, 0) + c
        elif s in env:
            terms.append((env[s], c))
    for k, c in axis.items():
        top = c * (shape[k] - 1) if k < len(shape) else 0
        lo += min(0, top)
        hi += max(0, top)
    return lo, tuple(terms), hi - lo + 1


def row_major(shape: tuple[int, ...]) -> list[int]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


def flat_offset(a: Access, dims: list[int], stride: list[int]) -> Affine:
    """The row-major offset (in elements) of tile element 0.. over tensor dims ``dims``."""
    out = Affine()
    for d, s in zip(dims, stride):
        out = out + a.index[d] * s
    return out


def tile_pf(a: Access) -> tuple[int, int]:
    """(partitions, elements per partition) of an access.  For an on-chip tensor the
    partitions are the tile axis that walks the tensor's partition dimension (a whole-tensor
    access of a blocked tensor has it in the middle)."""
    total = prod(a.shape)
    t = a.tensor
    if t.buffer in ("sbuf", "psum") and t.shape:
        idx = a.index[t.par_axis]
        for s, c in idx.terms:
            if isinstance(s, Axis) and c != 0 and s.k < len(a.shape):
                p = a.shape[s.k]
                return p, total // p if p else 0
        return 1, total
    p = a.shape[0] if a.shape else 1
    return p, total // p if p else 0


def unit_stride(a: Access) -> bool:
    """True when the innermost tile axis walks consecutive elements of the tensor."""
    t = a.tensor
    if len(a.shape) < 2 or a.shape[-1] == 1:
        return True
    dims = (
        [d for d in range(len(t.shape)) if d != t.par_axis]
        if t.buffer in ("sbuf", "psum")
        else list(range(len(t.shape)))
    )
    free_shape = [t.shape[d] for d in dims]
    flat = flat_offset(a, dims, row_major(free_shape))
    last = Axis(len(a.shape) - 1)
    return abs(flat.coef(last)) == 1


def inner_stride_bytes(a: Access) -> int:
    if len(a.shape) < 2 or a.shape[-1] == 1:
        return 0
    t = a.tensor
    dims = [d for d in range(len(t.shape)) if d != t.par_axis]
    flat = flat_offset(a, dims, row_major([t.shape[d] for d in dims]))
    return abs(flat.coef(Axis(len(a.shape) - 1))) * t.dtype.itemsize


def choose_granules(tr: Tracked) -> None:
    """Choose granule sizes that keep distinct tiles apart and the count small."""
    onchip = not tr.tensor.is_hbm
    max_rows = MAX_ONCHIP_ROW_GRANULES if onchip else MAX_HBM_ROW_GRANULES
    rg = 0
    cg = 0
    for r in tr.regions:
        rg = gcd(rg, r.r_const, r.r_span, *(c for _, c in r.r_terms))
        cg = gcd(cg, r.c_const, r.c_span, *(c for _, c in r.c_terms))
    rg, cg = max(rg, 1), max(cg, 1)
    rg = _at_least(rg, math.ceil(tr.rows / max_rows))
    cg = _at_least(cg, math.ceil(tr.cols / MAX_COL_GRANULES))
    tr.row_g, tr.col_g = rg, cg
    tr.n_rows = max(1, math.ceil(tr.rows / rg))
    tr.n_cols = max(1, math.ceil(tr.cols / cg))
    for r in tr.regions:
        if not r.r_terms and not r.c_terms:
            r.fixed = tuple(_cells(tr, r.r_const, r.r_span, r.c_const, r.c_span))


def _at_least(g: int, floor: int) -> int:
    return g if g >= floor else g * math.ceil(floor / g)


def _cells(tr: Tracked, r: int, rspan: int, c: int, cspan: int) -> list[int]:
    r0 = min(max(r // tr.row_g, 0), tr.n_rows - 1)
    r1 = min(max((r + rspan - 1) // tr.row_g, 0), tr.n_rows - 1)
    c0 = min(max(c // tr.col_g, 0), tr.n_cols - 1)
    c1 = min(max((c + cspan - 1) // tr.col_g, 0), tr.n_cols - 1)
    nc = tr.n_cols
    return [rr * nc + cc for rr in range(r0, r1 + 1) for cc in range(c0, c1 + 1)]
