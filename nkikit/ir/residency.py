"""Lifetimes of on-chip tensors, and the SBUF bytes that must stay resident at each statement.

One walk serves the verifier's capacity rule and the compiler's allocator, so that what the
verifier accepts the allocator can place, spilling if it must.

*Program points* number the statements of a kernel in program order, depth first: every
``Alloc``, ``Op`` and ``Loop`` is one point, and a loop's body follows its own point.  A
tensor's *uses* are the statements of its own body (the body it was created in) that touch
it, as point intervals: an op is one point; a loop nested in that body that touches it
anywhere inside is the loop's whole span, since any iteration may touch it.  A tensor lives
from its ``Alloc`` (or first use, if it has none) to its last use (:class:`Lifetime`).

Spilling (the Neuron compiler saves a tile to HBM and reloads it before its next use [PM,
MEM]) can free a tensor's SBUF between two uses with at least one statement between them,
and nowhere else.  So with every such stretch spilled, a tensor holds SBUF only over its
*resident segments*: from its first use to the end of its last use, cut at every such
stretch.  The bytes of the segments covering a point are a floor no allocation can go
below; :func:`resident_overflow` finds the first statement where that floor exceeds the
capacity.  A kernel with such a statement cannot run, spilled or not; any other kernel the
allocator places, spilling as needed (``nkikit/compiler/allocate.py``).  Sizes are bytes per
partition rounded up to the allocation alignment, as the allocator places them.

PSUM is not spilled (its tiles are accumulation groups in flight), so none of this applies
to it: a PSUM tensor holds its bytes over its whole lifetime.

A tensor with a ``user_span`` (a direct allocation: ``nki.compiler.sbuf/psum.mod_alloc`` or
``alloc``) occupies that span: blocks beyond the allocated tiles alias, so an SBUF tensor
takes the span's bytes (:func:`sbuf_size`), and a PSUM tensor stays at its banks for the whole
kernel -- user allocations may overlap (the program orders them), so they take the banks of
their union, and automatically allocated PSUM goes above the highest of them
(:func:`psum_user_top`), in the verifier's capacity rule and in the allocator alike.  An
automatically placed PSUM tensor whose blocks are live a part of the kernel at a time takes
the most blocks in use at once (:func:`psum_blocks_in_use`), in both alike.

Cost: one walk, O(statements x loop depth + accesses), and a sweep over the segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

from ..errors import UNKNOWN_LOC, NkiError, SourceLoc
from ..targets import Target
from .affine import Affine, Axis, LoopVar
from .core import ON_CHIP, Access, Alloc, Kernel, Loop, Op, Stmt, Tensor


@dataclass(slots=True)
class Lifetime:
    """Where one on-chip tensor lives, in program points.

    ``lo``..``hi``: from its allocation to its last use; ``execs``: how many times its
    ``Alloc`` runs per kernel instance; ``pipelined``: its innermost enclosing loop is an
    ``affine_range``; ``outer_end``: the last point of its outermost enclosing loop (``hi`` at
    top level); ``uses``: the statements of its own body that touch it (see the module
    docstring), disjoint and in program order."""

    tensor: Tensor
    lo: int
    hi: int
    execs: int
    pipelined: bool
    outer_end: int
    uses: list[tuple[int, int]] = field(default_factory=list)

    def gaps(self) -> list[int]:
        """The ``j`` for which the tensor may be spilled between uses ``j`` and ``j + 1``:
        at least one statement lies between them."""
        u = self.uses
        return [j for j in range(len(u) - 1) if u[j][1] + 1 < u[j + 1][0]]

    def resident(self) -> list[tuple[int, int]]:
        """Its resident segments: the points it holds memory at when every gap is spilled."""
        u = self.uses
        if not u:
            return [(self.lo, self.lo)]
        out, start = [], u[0][0]
        for j in self.gaps():
            out.append((start, u[j][1]))
            start = u[j + 1][0]
        out.append((start, u[-1][1]))
        return out


@dataclass(slots=True)
class Timeline:
    """The statement at every program point (``stmts[p]``; point 0 is the kernel entry, no
    statement) and the lifetime of every on-chip tensor, by uid, in order of first sight."""

    stmts: list[Stmt | None]
    lifetimes: dict[int, Lifetime]


def timeline(kernel: Kernel) -> Timeline:
    """Number the statements of ``kernel`` and record every on-chip tensor's lifetime."""
    scan = _TimelineScan()
    scan.body(kernel.body, ())
    return Timeline(scan.stmts, scan.lifetimes)


class _TimelineScan:
    """The walk of :func:`timeline`: one pass over the statements, depth first (a method that
    calls itself, not a recursive closure: a closure that calls itself is a reference cycle,
    and with the collector paused, as the compiler and the verifier run, it would keep every
    lifetime alive long after the timeline)."""

    __slots__ = ("stmts", "lifetimes", "starts", "ends")

    def __init__(self) -> None:
        self.stmts: list[Stmt | None] = [None]
        self.lifetimes: dict[int, Lifetime] = {}
        self.starts: dict[int, int] = {}  # id(loop) -> its point
        self.ends: dict[int, int] = {}  # id(loop) -> the last point of its body

    def body(self, body: list[Stmt], loops: tuple[Loop, ...]) -> None:
        stmts = self.stmts
        lifetimes = self.lifetimes
        ends = self.ends
        depth_here = len(loops)
        for s in body:
            point = len(stmts)
            stmts.append(s)
            tp = type(s)
            if tp is Op:
                for a in (*s.outs, *s.ins):
                    if not isinstance(a, Access):
                        continue
                    t = a.tensor
                    if t.buffer not in ON_CHIP:
                        continue
                    lt = lifetimes.get(t.uid)
                    if lt is None:  # used without an Alloc statement: live from its first use
                        end = ends[id(loops[0])] if loops else point
                        lt = lifetimes[t.uid] = Lifetime(t, point, point, 1, False, end)
                    # a use from a loop nested in the tensor's own body is the loop's span
                    depth = len(t.scope)
                    if depth_here > depth:
                        lp = loops[depth]
                        lo, hi = self.starts[id(lp)], ends[id(lp)]
                    else:
                        lo = hi = point
                    uses = lt.uses
                    if not uses or uses[-1] != (lo, hi):
                        uses.append((lo, hi))
                    if hi > lt.hi:
                        lt.hi = hi
                    if lt.hi > lt.outer_end:
                        lt.outer_end = lt.hi
            elif tp is Alloc:
                t = s.tensor
                if t.buffer in ON_CHIP:
                    execs = prod(lp.trip for lp in loops) if loops else 1
                    pipelined = bool(loops) and loops[-1].kind == "affine"
                    end = ends[id(loops[0])] if loops else point
                    lifetimes[t.uid] = Lifetime(t, point, point, execs, pipelined, end)
            elif tp is Loop:
                self.starts[id(s)] = point
                ends[id(s)] = point + _count(s.body)
                self.body(s.body, loops + (s,))


def _count(body: list[Stmt]) -> int:
    n = 0
    for s in body:
        n += 1
        if isinstance(s, Loop):
            n += _count(s.body)
    return n


def sbuf_size(t: Tensor, target: Target) -> int:
    """Bytes per partition one buffer of SBUF tensor ``t`` takes, alignment included: its
    user allocation's span if it has one (aliasing blocks share bytes)."""
    a = target.sbuf_align
    return -(-max(footprint(t), 1) // a) * a


def footprint(t: Tensor) -> int:
    """Bytes per partition ``t`` occupies: its user allocation's span, else the whole tensor."""
    if t.user_span is not None:
        return t.user_span[1] - t.user_span[0]
    return t.bytes_per_partition


def psum_user_top(kernel: Kernel) -> int:
    """The end (bytes per partition) of the highest PSUM bank a user allocation of ``kernel``
    holds, 0 without any: automatically allocated PSUM tensors go above it."""
    top = 0
    for t in kernel.tensors:
        if t.buffer == "psum" and t.user_span is not None:
            top = max(top, t.user_span[1])
    for s, _ in kernel.walk():
        if isinstance(s, Alloc) and s.tensor.buffer == "psum" and s.tensor.user_span is not None:
            top = max(top, s.tensor.user_span[1])
    return top


@dataclass(frozen=True, slots=True)
class Overflow:
    """The first statement whose resident SBUF tensors exceed the capacity."""

    point: int
    loc: SourceLoc
    used: int  # resident bytes per partition there
    limit: int
    tensors: tuple[Tensor, ...]  # resident there, biggest first

    def error(self) -> NkiError:
        """``err_sbuf_capacity_exceeded`` at the statement, naming what it needs at once."""
        shown = ", ".join(
            f"{t.name} ({t.bytes_per_partition} B, {t.loc or '?'})" for t in self.tensors[:6]
        )
        if len(self.tensors) > 6:
            shown += f", and {len(self.tensors) - 6} more"
        shown += " (all in use here: spilling cannot free them; use smaller tiles)"
        return NkiError(
            "err_sbuf_capacity_exceeded",
            self.loc,
            buffer="SBUF",
            used=self.used,
            limit=self.limit,
            tensors=shown,
        )


def resident_overflow(tl: Timeline, target: Target, capacity: int | None = None) -> Overflow | None:
    """The first statement (an instruction if any qualifies) where the resident segments of
    the SBUF tensors need more than ``capacity`` (default: the target's SBUF) bytes per
    partition, or None when every statement fits.  The partition ranges of the tensors are
    not considered: their bytes add up as if they all shared one partition.

    Vectorized: the uses of every SBUF tensor in one array (in the order of
    ``tl.lifetimes``), cut into resident segments where a gap lies between two uses, and the
    bytes resident at every point as a prefix sum over the segments' ends."""
    limit = target.sbuf_bytes if capacity is None else capacity
    n = len(tl.stmts)
    owners: list[Lifetime] = []
    sizes: list[int] = []
    counts: list[int] = []
    los: list[int] = []
    his: list[int] = []
    size_of: dict[tuple, int] = {}  # sbuf_size by the facts it reads
    for lt in tl.lifetimes.values():
        t = lt.tensor
        if t.buffer != "sbuf":
            continue
        key = (t.shape, t.dtype, t.par_axis, t.user_span)
        size = size_of.get(key)
        if size is None:
            size = size_of[key] = sbuf_size(t, target)
        owners.append(lt)
        sizes.append(size)
        u = lt.uses
        if u:
            counts.append(len(u))
            for a, b in u:
                los.append(a)
                his.append(b)
        else:  # never used: resident at its allocation only
            counts.append(1)
            los.append(lt.lo)
            his.append(lt.lo)
    if not owners:
        return None
    lo = np.array(los, dtype=np.int64)
    hi = np.array(his, dtype=np.int64)
    owner = np.repeat(np.arange(len(owners)), counts)
    size = np.array(sizes, dtype=np.int64)[owner]
    # a segment starts at a tensor's first use and after every gap (a statement between two
    # uses), and ends at its last use and before every gap (``Lifetime.resident``)
    same = owner[1:] == owner[:-1]
    gap = same & (hi[:-1] + 1 < lo[1:])
    start = np.ones(len(lo), dtype=bool)
    start[1:] = ~same | gap
    stop = np.ones(len(lo), dtype=bool)
    stop[:-1] = ~same | gap
    seg_lo, seg_hi = lo[start], hi[stop]
    seg_owner, seg_size = owner[start], size[start]
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, seg_lo, seg_size)
    np.add.at(delta, seg_hi + 1, -seg_size)
    total = np.cumsum(delta[:n])
    over = np.flatnonzero(total > limit)
    if not len(over):
        return None
    p = next((int(q) for q in over if isinstance(tl.stmts[q], Op)), int(over[0]))
    used = int(total[p])
    covering = seg_owner[(seg_lo <= p) & (p <= seg_hi)]
    here = sorted(
        {owners[i].tensor.uid: owners[i].tensor for i in covering.tolist()}.values(),
        key=lambda t: -t.bytes_per_partition,
    )
    s = tl.stmts[p]
    if isinstance(s, Op | Loop):
        loc = s.loc
    elif isinstance(s, Alloc) and s.tensor.loc is not None:
        loc = s.tensor.loc
    else:
        loc = here[0].loc if here and here[0].loc else UNKNOWN_LOC
    return Overflow(p, loc, used, limit, tuple(here))


def psum_blocks_in_use(kernel: Kernel) -> dict[int, int]:
    """PSUM tensors whose blocks are live a part of the kernel at a time, by uid: the most
    blocks in use at once.

    The Neuron compiler allocates an automatically placed PSUM tensor block by block (a
    block lives from its first write to its last read).  nkikit sees that for a tensor with
    block dimensions (those before the partition axis) when its accesses fall into *groups*
    that name the same blocks, the blocks of any two groups are disjoint, and each group
    either lies in no rolled loop entered after the tensor's creation, or its outermost such
    loop moves the group's blocks (each iteration its own blocks).  A group then holds its
    blocks from its first to its last access, a loop nested below that level counting whole
    (any iteration may touch them); the tensor needs, at each statement, the blocks of the
    groups holding theirs there.  Otherwise (e.g. blocks a later loop nest reads again, or
    blocks an outer loop revisits) the whole tensor counts."""
    uses: dict[int, dict[tuple, list]] = {}  # uid -> key -> [(loops, point), ...]
    tensors: dict[int, Tensor] = {}
    span: dict[int, list[int]] = {}  # id(loop) -> [first point, last point]
    for point, (s, loops) in enumerate(kernel.walk()):
        for lp in loops:
            span[id(lp)][1] = point
        if isinstance(s, Loop):
            span[id(s)] = [point, point]
        if not isinstance(s, Op):
            continue
        for a in (*s.outs, *s.ins):
            if not isinstance(a, Access):
                continue
            t = a.tensor
            if t.buffer != "psum" or t.user_span is not None or t.par_axis == 0:
                continue
            tensors[t.uid] = t
            key = (a.index[: t.par_axis], _block_extents(a, t.par_axis))
            # a loop of one iteration has no back edge: its body is straight-line code here
            rolled = tuple(lp for lp in loops if lp.var.trip > 1)
            uses.setdefault(t.uid, {}).setdefault(key, []).append((rolled, point))
    out: dict[int, int] = {}
    for uid, groups in uses.items():
        t = tensors[uid]
        if len(groups) > _MAX_GROUPS:
            continue
        held = [_held(t, key, acc, span) for key, acc in groups.items()]
        if any(h is None for h in held):
            continue
        keys = list(groups)
        if any(not _disjoint(keys[i], keys[j]) for i in range(len(keys)) for j in range(i)):
            continue
        events = sorted(
            ev
            for key, (lo, hi) in zip(keys, held)
            for ev in ((lo, -prod(key[1])), (hi + 1, prod(key[1])))
        )
        most = cur = 0
        for _, d in events:  # at one point, starts (negative) sort before ends
            cur -= d
            most = max(most, cur)
        out[uid] = most
    return out


def _held(t: Tensor, key: tuple, acc: list, span: dict[int, list[int]]) -> tuple | None:
    """The points a group holds its blocks at (see :func:`psum_blocks_in_use`), or None when
    its outermost loop after ``t``'s creation leaves its blocks in place."""
    index, ext = key
    depth = sum(1 for v in t.scope if v.trip > 1)
    first = acc[0][0]
    common = min(len(lv) for lv, _ in acc)
    for lv, _ in acc[1:]:
        k = 0
        while k < common and lv[k] is first[k]:
            k += 1
        common = k
    if common > depth:
        var = first[depth].var
        if not any(abs(b.coef(var)) >= e for b, e in zip(index, ext)):
            return None
        depth += 1
    lo, hi = None, 0
    for loops, point in acc:
        a, b = span[id(loops[depth])] if len(loops) > depth else (point, point)
        lo = a if lo is None else min(lo, a)
        hi = max(hi, b)
    return lo, hi


_MAX_GROUPS = 64  # beyond this many block groups a tensor counts whole (pairwise checks)


def _block_extents(a: Access, par_axis: int) -> tuple[int, ...]:
    """How many blocks the access spans along each block dimension."""
    ranges = {Axis(k): n for k, n in enumerate(a.shape)}
    out = []
    for b in a.index[:par_axis]:
        lo, hi = _axis_part(b).bounds(ranges)
        out.append(hi - lo + 1)
    return tuple(out)


def _axis_part(a: Affine) -> Affine:
    return Affine(tuple((s, c) for s, c in a.terms if isinstance(s, Axis)), a.const)


def _range(b: Affine, extent: int) -> tuple[int, int] | None:
    """The blocks an index reaches over its loops' iterations, or None (a program id)."""
    lo, hi = _axis_part(b).const, _axis_part(b).const
    for s, c in b.terms:
        if isinstance(s, LoopVar):
            top = c * (s.trip - 1)
            lo, hi = lo + min(0, top), hi + max(0, top)
        elif not isinstance(s, Axis):
            return None
    return lo, hi + extent - 1


def _disjoint(g: tuple, h: tuple) -> bool:
    """Two groups' blocks never meet: along some block dimension their indices differ by a
    constant at least as large as the extent below."""
    for bg, bh, eg, eh in zip(g[0], h[0], g[1], h[1]):
        rg, rh = _range(bg, eg), _range(bh, eh)
        if rg is not None and rh is not None and (rg[1] < rh[0] or rh[1] < rg[0]):
            return True
        d = _axis_part(bg) - _axis_part(bh)
        same_loops = {x for x in bg.terms if not isinstance(x[0], Axis)} == {
            x for x in bh.terms if not isinstance(x[0], Axis)
        }
        if same_loops and d.is_const and (d.const >= eh or -d.const >= eg):
            return True
    return False
