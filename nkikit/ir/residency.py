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

Cost: one walk (:func:`scan`; the verifier's own walk records it as it goes) that only
appends to flat lists, O(statements + accesses); everything after it is numpy over those
arrays (lifetimes, resident segments, the prefix sums) and C-level maps, with Python work
only per distinct kind of tensor, per loop and per error.  :class:`Lifetime` objects are
built only when asked for (``Timeline.lifetimes``, for the allocator).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from itertools import count, repeat
from math import prod
from operator import attrgetter, is_not

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


class Timeline:
    """The statement at every program point (``stmts[p]``; point 0 is the kernel entry, no
    statement) and the lifetime of every on-chip tensor, by uid, in order of first sight
    (``lifetimes``: built when first asked for; the scan's arrays serve
    :func:`resident_overflow` without them)."""

    __slots__ = ("scan", "_lifetimes")

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self._lifetimes: dict[int, Lifetime] | None = None

    @property
    def stmts(self) -> list[Stmt | None]:
        return self.scan.stmts

    @property
    def lifetimes(self) -> dict[int, Lifetime]:
        if self._lifetimes is None:
            lf = _lifetimes(self.scan)
            tensors = self.scan.tensors
            pairs = list(zip(lf.use_lo.tolist(), lf.use_hi.tolist()))
            cuts = np.searchsorted(lf.use_owner, np.arange(len(lf.order) + 1)).tolist()
            los, his, ends = lf.lo.tolist(), lf.hi.tolist(), lf.end0.tolist()
            self._lifetimes = {}
            for i, k in enumerate(lf.order.tolist()):
                t = tensors[k]
                self._lifetimes[t.uid] = Lifetime(
                    t,
                    los[i],
                    his[i],
                    lf.execs[i],
                    lf.pipelined[i],
                    max(ends[i], his[i]),
                    pairs[cuts[i] : cuts[i + 1]],
                )
        return self._lifetimes


def timeline(kernel: Kernel, sc: Scan | None = None) -> Timeline:
    """Number the statements of ``kernel`` and record every on-chip tensor's lifetime
    (from ``sc``, the kernel's :func:`scan`, if given)."""
    return Timeline(sc if sc is not None else scan(kernel))


# ---------------------------------------------------------------------------------------------
# the walk: flat facts, one pass


@dataclass(eq=False, slots=True)
class Scan:
    """The facts of one walk over a kernel's statements, as flat arrays.

    Program points as in the module docstring (``stmts[p]``; point 0 is the kernel entry).
    A *context* is one body: 0 the kernel's, and one per ``Loop`` (its body), numbered in
    program order.  ``chain[c]``: the contexts enclosing context ``c``, outermost first, ``c``
    last; ``loops[c]``: their loops; ``start[c]``/``end[c]``: the loop's point and the last
    point of its body (the kernel's: 0 and the last point).  ``tensors``: the on-chip tensors
    the kernel allocates or its ops touch, with ``psum`` (in PSUM, else SBUF) and ``user``
    (a user allocation placed it: ``Tensor.user_span``) for each.  A *touch* is one access of an op to one of them:
    ``touch_owner`` (index into ``tensors``), ``touch_point``, ``touch_ctx``, in program
    order; ``alloc_owner``/``alloc_point``/``alloc_ctx``: their ``Alloc`` statements, in
    program order.  ``psum_blocked``: the accesses to PSUM tensors with block dimensions an
    allocation does not fix, as (access, point, context), for :func:`psum_blocks_in_use`."""

    stmts: list[Stmt | None]
    chain: list[tuple[int, ...]]
    loops: list[tuple[Loop, ...]]
    start: list[int]
    end: list[int]
    tensors: list[Tensor]
    psum: np.ndarray
    user: np.ndarray
    touch_owner: np.ndarray
    touch_point: np.ndarray
    touch_ctx: np.ndarray
    alloc_owner: np.ndarray
    alloc_point: np.ndarray
    alloc_ctx: np.ndarray
    psum_blocked: list[tuple[Access, int, int]]
    _lifetimes: _Lifetimes | None = None

    def statement_at(self, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every touch, the statement at loop depth ``depth`` (per touch) that holds it:
        ``(body, lo, hi)``, the context of the body at that depth (-1 if the touch is
        shallower) and the statement's point span -- a loop nested in that body is its whole
        span, anything else the touch's own point."""
        ctx, point = self.touch_ctx, self.touch_point
        if len(self.chain) == 1:  # no loops: every touch is a statement of the kernel body
            return np.where(depth == 0, 0, -1), point, point
        width = max(len(c) for c in self.chain) + 1
        table = np.full((len(self.chain), width), -1, dtype=np.int64)
        for c, ch in enumerate(self.chain):
            table[c, : len(ch)] = ch
        cdepth = np.array([len(ch) - 1 for ch in self.chain], dtype=np.int64)[ctx]
        d = np.minimum(depth, width - 2)
        body = np.where(depth <= cdepth, table[ctx, d], -1)
        deep = cdepth > depth
        inner = table[ctx, d + 1]  # the loop at that depth, where ``deep``
        lo = np.where(deep, np.asarray(self.start, dtype=np.int64)[inner], point)
        hi = np.where(deep, np.asarray(self.end, dtype=np.int64)[inner], point)
        return body, lo, hi


def scan(kernel: Kernel) -> Scan:
    """Walk ``kernel`` once (see :class:`Scan`)."""
    rec = Recorder()
    rec.walk(kernel.body, 0)
    return rec.finish()


class Recorder:
    """What a walk over a kernel records for :class:`Scan`, in lists; :func:`scan` walks with
    one (``walk``), and the verifier's own walk records into one as it goes, so that a kernel
    is walked once.  A walk appends every statement to ``stmts`` (its point is its index),
    the tensor uid of every tile access of an op (any memory) to ``uids`` with the op's point
    in ``points`` (and the tensor to ``tensor_of``, at least once), every ``Alloc`` to
    ``allocs`` (statement, point, context), and calls ``enter``/``leave`` around a loop's
    body."""

    __slots__ = (
        "stmts",
        "uids",
        "points",
        "tensor_of",
        "runs",
        "allocs",
        "chain",
        "loops",
        "start",
        "end",
    )

    def __init__(self) -> None:
        self.stmts: list[Stmt | None] = [None]
        self.uids = array("q")  # int64 arrays, read by numpy without a copy
        self.points = array("q")
        self.tensor_of: dict[int, Tensor] = {}
        self.runs: list[tuple[int, int]] = [(0, 0)]  # (first access, context) of each run
        self.allocs: list[tuple[Alloc, int, int]] = []
        self.chain: list[tuple[int, ...]] = [(0,)]
        self.loops: list[tuple[Loop, ...]] = [()]
        self.start: list[int] = [0]
        self.end: list[int] = [0]

    def enter(self, loop: Loop, point: int, ctx: int) -> int:
        """The context of the body of ``loop`` (at ``point``, in context ``ctx``)."""
        inner = len(self.chain)
        self.chain.append((*self.chain[ctx], inner))
        self.loops.append((*self.loops[ctx], loop))
        self.start.append(point)
        self.end.append(point)
        self.runs.append((len(self.uids), inner))
        return inner

    def leave(self, inner: int, ctx: int) -> None:
        """The body of context ``inner`` ended; its parent ``ctx`` goes on."""
        self.end[inner] = len(self.stmts) - 1
        self.runs.append((len(self.uids), ctx))

    def walk(self, body: list[Stmt], ctx: int) -> None:
        """Record ``body`` (in context ``ctx``) and the bodies nested in it (a method that
        calls itself, not a recursive closure: a closure that calls itself is a reference
        cycle, and with the collector paused, as the compiler and the verifier run, it would
        keep what it holds alive)."""
        stmts, uids, points, tensor_of = self.stmts, self.uids, self.points, self.tensor_of
        for s in body:
            point = len(stmts)
            stmts.append(s)
            tp = type(s)
            if tp is Op:
                for a in (*s.outs, *s.ins):
                    if isinstance(a, Access):
                        t = a.tensor
                        uids.append(t.uid)
                        points.append(point)
                        tensor_of[t.uid] = t
            elif tp is Alloc:
                self.allocs.append((s, point, ctx))
            elif tp is Loop:
                inner = self.enter(s, point, ctx)
                self.walk(s.body, inner)
                self.leave(inner, ctx)

    def finish(self) -> Scan:
        """The scan of what was recorded: only accesses to on-chip tensors are touches.
        (Per-element work here is C-level maps and numpy: the walk itself only appends.)"""
        self.end[0] = len(self.stmts) - 1
        n = len(self.uids)
        alloc_stmts, alloc_points, alloc_ctxs = (
            zip(*self.allocs, strict=True) if self.allocs else ((), (), ())
        )
        alloc_tensors = list(map(_TENSOR, alloc_stmts))
        self.tensor_of.update(zip(map(_UID, alloc_tensors), alloc_tensors))
        uids = np.frombuffer(self.uids, dtype=np.int64) if n else np.zeros(0, np.int64)
        everything = np.concatenate(
            [uids, np.fromiter(map(_UID, alloc_tensors), np.int64, len(alloc_tensors))]
        )
        # every tensor the walk met (``tensor_of``), and where each first appears in the lists
        kinds = list(self.tensor_of.values())
        known = np.fromiter(self.tensor_of, dtype=np.int64, count=len(kinds))
        by_uid = np.argsort(known)
        inverse = by_uid[np.searchsorted(known[by_uid], everything)]
        first = np.full(len(kinds), len(everything), dtype=np.int64)
        np.minimum.at(first, inverse, np.arange(len(everything)))
        buffers = np.array(list(map(_BUFFER, kinds)), dtype=str)
        on_chip = np.isin(buffers, ON_CHIP) & (first < len(everything))
        # on-chip tensors, numbered in order of first sight in the lists
        chip = np.flatnonzero(on_chip)
        chip = chip[np.argsort(first[chip], kind="stable")]
        number = np.full(len(kinds), -1, dtype=np.int64)
        number[chip] = np.arange(len(chip))
        tensors = [kinds[i] for i in chip.tolist()]
        psum = buffers[chip] == "psum"
        par_axis = np.fromiter(map(_PAR_AXIS, tensors), dtype=np.int64, count=len(tensors))
        user = np.fromiter(
            map(is_not, map(_USER_SPAN, tensors), repeat(None)), dtype=bool, count=len(tensors)
        )
        owner = number[inverse[:n]]
        touched = owner >= 0
        run_at = np.array([i for i, _ in self.runs], dtype=np.int64)
        run_ctx = np.array([c for _, c in self.runs], dtype=np.int64)
        ctx = run_ctx[np.searchsorted(run_at, np.arange(n), side="right") - 1]
        points = np.frombuffer(self.points, dtype=np.int64) if n else np.zeros(0, np.int64)
        a_owner = number[inverse[n:]]
        a_mask = a_owner >= 0
        a_point = np.array(alloc_points, dtype=np.int64)
        a_ctx = np.array(alloc_ctxs, dtype=np.int64)
        blocked = psum & (par_axis > 0) & ~user
        psum_blocked = []
        if blocked.any():
            # the accesses to those tensors, op by op (an op's accesses in order)
            uid_blocked = {tensors[k].uid for k in np.flatnonzero(blocked).tolist()}
            at = np.flatnonzero(touched & blocked[owner.clip(0)])
            ops = dict.fromkeys(zip(points[at].tolist(), ctx[at].tolist()))
            for point, c in ops:
                op = self.stmts[point]
                for a in (*op.outs, *op.ins):
                    if isinstance(a, Access) and a.tensor.uid in uid_blocked:
                        psum_blocked.append((a, point, c))
        return Scan(
            self.stmts,
            self.chain,
            self.loops,
            self.start,
            self.end,
            tensors,
            psum,
            user,
            owner[touched],
            points[touched],
            ctx[touched],
            a_owner[a_mask],
            a_point[a_mask],
            a_ctx[a_mask],
            psum_blocked,
        )


_TENSOR = attrgetter("tensor")
_UID = attrgetter("uid")
_BUFFER = attrgetter("buffer")
_PAR_AXIS = attrgetter("par_axis")
_USER_SPAN = attrgetter("user_span")
_SCOPE = attrgetter("scope")
_SHAPE = attrgetter("shape")
_ITEMSIZE = attrgetter("dtype.itemsize")


# ---------------------------------------------------------------------------------------------
# lifetimes


@dataclass(eq=False, slots=True)
class _Lifetimes:
    """Every on-chip tensor's lifetime as arrays (what :class:`Lifetime` holds, per tensor).

    ``order``: the tensors (indices into ``Scan.tensors``) in order of first sight (an Alloc
    or a touch); per tensor in that order ``lo``,
    ``execs``, ``pipelined``, ``end0`` (``outer_end`` before any use) and ``hi``.  Its uses:
    ``use_owner`` (index into ``uids``, grouped by tensor in that order, each group in program
    order, repeats of one use dropped), ``use_lo``, ``use_hi``."""

    order: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    execs: list[int]
    pipelined: list[bool]
    end0: np.ndarray
    use_owner: np.ndarray
    use_lo: np.ndarray
    use_hi: np.ndarray


def _lifetimes(sc: Scan) -> _Lifetimes:
    """The lifetimes of :func:`timeline`, computed from the scan's arrays.

    As the walk would build them one statement at a time: an Alloc starts a tensor's lifetime
    afresh (so only the touches after its last Alloc are its uses); a tensor touched before
    any Alloc lives from its first touch; a touch is a use of the statement of the tensor's
    own body (depth ``len(tensor.scope)``) that holds it."""
    if sc._lifetimes is not None:
        return sc._lifetimes
    tensors = sc.tensors
    m = len(tensors)
    owner, point, ctx = sc.touch_owner, sc.touch_point, sc.touch_ctx
    a_owner, a_point, a_ctx = sc.alloc_owner, sc.alloc_point, sc.alloc_ctx
    # per context: the last point of its outermost loop (-1 in the kernel body), how many
    # times its body runs, whether its innermost loop is an affine_range
    outer_end = np.array([sc.end[ch[1]] if len(ch) > 1 else -1 for ch in sc.chain], np.int64)
    ctx_execs = np.array([prod(lp.trip for lp in loops) for loops in sc.loops], np.int64)
    ctx_pipelined = np.array([bool(lp) and lp[-1].kind == "affine" for lp in sc.loops], bool)
    last_alloc = np.full(m, -1, dtype=np.int64)
    np.maximum.at(last_alloc, a_owner, a_point)
    first = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)  # first sight
    np.minimum.at(first, owner, point)
    np.minimum.at(first, a_owner, a_point)
    depth = np.fromiter(map(len, map(_SCOPE, tensors)), dtype=np.int64, count=m)
    _, ulo, uhi = sc.statement_at(depth[owner])
    keep = point > last_alloc[owner]
    order = np.argsort(first, kind="stable")  # tensors in order of first sight
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    owner, point, ulo, uhi, ctx = owner[keep], point[keep], ulo[keep], uhi[keep], ctx[keep]
    by = np.argsort(rank[owner], kind="stable")
    owner, point, ulo, uhi, ctx = owner[by], point[by], ulo[by], uhi[by], ctx[by]
    new = np.ones(len(owner), dtype=bool)
    new[1:] = owner[1:] != owner[:-1]
    fresh = new.copy()
    fresh[1:] |= (ulo[1:] != ulo[:-1]) | (uhi[1:] != uhi[:-1])
    lo = last_alloc.copy()
    end0 = np.zeros(m, dtype=np.int64)
    execs = np.ones(m, dtype=np.int64)
    pipelined = np.zeros(m, dtype=bool)
    # a tensor without an Alloc lives from its first touch, in that touch's context
    heads = np.flatnonzero(new)
    heads = heads[lo[owner[heads]] < 0]
    h = owner[heads]
    lo[h] = point[heads]
    end0[h] = np.where(outer_end[ctx[heads]] >= 0, outer_end[ctx[heads]], point[heads])
    # an allocated tensor: its (last) Alloc's facts (repeated indices: the last write wins)
    end0[a_owner] = np.where(outer_end[a_ctx] >= 0, outer_end[a_ctx], a_point)
    execs[a_owner] = ctx_execs[a_ctx]
    pipelined[a_owner] = ctx_pipelined[a_ctx]
    hi = lo.copy()
    np.maximum.at(hi, owner, uhi)
    out = _Lifetimes(
        order,
        lo[order],
        hi[order],
        execs[order].tolist(),
        pipelined[order].tolist(),
        end0[order],
        rank[owner[fresh]],
        ulo[fresh],
        uhi[fresh],
    )
    sc._lifetimes = out
    return out


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


def psum_user_top(kernel: Kernel, sc: Scan | None = None) -> int:
    """The end (bytes per partition) of the highest PSUM bank a user allocation of ``kernel``
    holds, 0 without any: automatically allocated PSUM tensors go above it.  (``sc``: the
    kernel's :func:`scan`, if the caller has it.)"""
    top = 0
    for t in kernel.tensors:
        if t.buffer == "psum" and t.user_span is not None:
            top = max(top, t.user_span[1])
    sc = sc if sc is not None else scan(kernel)
    placed = np.zeros(len(sc.tensors), dtype=bool)
    placed[sc.alloc_owner] = True  # on-chip tensors with an Alloc
    for k in np.flatnonzero(placed & sc.psum & sc.user).tolist():
        top = max(top, sc.tensors[k].user_span[1])
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

    Vectorized over the lifetimes' arrays: the uses of the SBUF tensors cut into resident
    segments where a gap lies between two uses (``Lifetime.resident``), and the bytes
    resident at every point as a prefix sum over the segments' ends."""
    limit = target.sbuf_bytes if capacity is None else capacity
    n = len(tl.stmts)
    lf = _lifetimes(tl.scan)
    tensors = tl.scan.tensors
    order = lf.order.tolist()
    owners = [tensors[k] for k in order]
    sbuf = ~tl.scan.psum[lf.order]
    if not sbuf.any():
        return None
    # sbuf_size, once per distinct (shape, itemsize, partition axis, user span)
    facts = list(
        zip(
            map(_SHAPE, owners),
            map(_ITEMSIZE, owners),
            map(_PAR_AXIS, owners),
            map(_USER_SPAN, owners),
            strict=True,
        )
    )
    # each tensor's first tensor of the same facts (one hashing pass, at C level)
    rep = np.fromiter(map({}.setdefault, facts, count()), dtype=np.int64, count=len(facts))
    sizes = np.zeros(len(owners), dtype=np.int64)
    for k in np.unique(rep).tolist():
        sizes[k] = sbuf_size(owners[k], target)
    sizes = sizes[rep]
    sizes[~sbuf] = 0
    # uses of SBUF tensors; a tensor never used is resident at its allocation only
    take = sbuf[lf.use_owner]
    unused = np.flatnonzero(sbuf & (np.bincount(lf.use_owner, minlength=len(owners)) == 0))
    owner = np.concatenate([lf.use_owner[take], unused])
    lo = np.concatenate([lf.use_lo[take], lf.lo[unused]])
    hi = np.concatenate([lf.use_hi[take], lf.lo[unused]])
    by = np.argsort(owner, kind="stable")
    owner, lo, hi = owner[by], lo[by], hi[by]
    # a segment starts at a tensor's first use and after every gap (a statement between two
    # uses), and ends at its last use and before every gap
    same = owner[1:] == owner[:-1]
    cut = ~same | (hi[:-1] + 1 < lo[1:])
    first = np.ones(len(lo), dtype=bool)
    first[1:] = cut
    last = np.ones(len(lo), dtype=bool)
    last[:-1] = cut
    seg_lo, seg_hi, seg_owner = lo[first], hi[last], owner[first]
    seg_size = sizes[seg_owner]
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, seg_lo, seg_size)
    np.add.at(delta, seg_hi + 1, -seg_size)
    total = np.cumsum(delta[:n])
    over = np.flatnonzero(total > limit)
    if not len(over):
        return None
    p = next((int(q) for q in over if isinstance(tl.stmts[q], Op)), int(over[0]))
    used = int(total[p])
    covering = np.unique(seg_owner[(seg_lo <= p) & (p <= seg_hi)])  # in order of first sight
    here = sorted((owners[i] for i in covering.tolist()), key=lambda t: -t.bytes_per_partition)
    s = tl.stmts[p]
    if isinstance(s, Op | Loop):
        loc = s.loc
    elif isinstance(s, Alloc) and s.tensor.loc is not None:
        loc = s.tensor.loc
    else:
        loc = here[0].loc if here and here[0].loc else UNKNOWN_LOC
    return Overflow(p, loc, used, limit, tuple(here))


def psum_blocks_in_use(kernel: Kernel, sc: Scan | None = None) -> dict[int, int]:
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
    blocks an outer loop revisits) the whole tensor counts.  (``sc``: the kernel's
    :func:`scan`, if the caller has it.)"""
    if sc is None:
        sc = scan(kernel)
    uses: dict[int, dict[tuple, list]] = {}  # uid -> key -> [(loops, point), ...]
    tensors: dict[int, Tensor] = {}
    # id(loop) -> [first point, last point]
    span = {id(lp[-1]): [sc.start[c], sc.end[c]] for c, lp in enumerate(sc.loops) if lp}
    rolled_of: dict[int, tuple[Loop, ...]] = {}  # context -> its loops of more than one trip
    for a, point, ctx in sc.psum_blocked:
        t = a.tensor
        tensors[t.uid] = t
        key = (a.index[: t.par_axis], _block_extents(a, t.par_axis))
        # a loop of one iteration has no back edge: its body is straight-line code here
        rolled = rolled_of.get(ctx)
        if rolled is None:
            rolled = rolled_of[ctx] = tuple(lp for lp in sc.loops[ctx] if lp.var.trip > 1)
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
