"""Compile-time plans over the whole kernel: poisoning, memory, forwarding and shadows.

* **Poisoning.**  A buffer whose first touch is a write of every element (proved by
  enumerating the writes' tiles) is not NaN-filled; every other buffer is, as in the
  reference.
* **Memory.**  Temporaries share one arena wherever their lifetimes do not overlap.
* **Forwarding.**  A tile that is only a copy of HBM data becomes a view of it, and a tile
  computed only to be stored is computed straight into its destination.
* **Shadows.**  A narrow float tile read much more often than written keeps an fp32 copy.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math

import numpy as np

from ... import dtypes
from ...ir.affine import Axis, Sym
from ...ir.core import Access, Alloc, Kernel, Loop, Op, Tensor
from ...ir.prims import PRIMS, reads_dst, writes_partially
from . import table as _table
from .executors import executor
from .keys import OpShapes

# Largest buffer (elements) and number of loop iterations the coverage proof enumerates;
# beyond them the buffer is simply poisoned, as the reference does.
_COVER_MAX_ELEMS = 1 << 26
_COVER_MAX_ITERS = 1 << 16


# how an op touches a temporary, for the poison plan (``Planner._touch``)
_UNTOUCHED, _POISON, _WHOLE, _PARTIAL = "untouched", "poison", "whole", "partial"
# what the forwarding plan does with a tile (``Planner._forward_check``)
_LOAD, _STORE, _KEEP = "load", "store", "keep"


def writes_all(op: Op) -> bool:
    """Whether ``op``'s rule returns one whole array per output (its record declares
    outputs, and this op writes no part of them partially), so an unmasked ``op`` writes
    every element of each."""
    return bool(PRIMS[op.prim].outs) and not writes_partially(op)


def _positions(stmts: list) -> dict[int, int]:
    """id(op) -> the position in ``stmts`` of the statement that is or holds the op."""
    out: dict[int, int] = {}
    for j, s in enumerate(stmts):
        if type(s) is Op:
            out[id(s)] = j
        elif type(s) is Loop:
            stack = [s]
            while stack:
                for x in stack.pop().body:
                    if type(x) is Op:
                        out[id(x)] = j
                    elif type(x) is Loop:
                        stack.append(x)
    return out


def _loops_in(s: Loop):
    """(loop, depth) for ``s`` and every loop nested in it."""
    out = [(s, 0)]
    for x in s.body:
        if isinstance(x, Loop):
            out.extend(_loops_in(x))
    return out


class _Gaps:
    """The free bytes of an arena below its top (the end of the highest live tile), as
    disjoint gaps by offset.  ``take(size)`` is first fit: the lowest offset where ``size``
    bytes lie free, the top when no gap holds them."""

    def __init__(self) -> None:
        self.lo: list[int] = []  # gap starts, ascending
        self.hi: list[int] = []  # their ends (exclusive)
        self.top = 0

    def take(self, size: int) -> int:
        lo, hi = self.lo, self.hi
        for i in range(len(lo)):
            if hi[i] - lo[i] >= size:
                off = lo[i]
                if hi[i] - off == size:
                    del lo[i], hi[i]
                else:
                    lo[i] = off + size
                return off
        off = self.top
        self.top = off + size
        return off

    def release(self, start: int, end: int) -> None:
        lo, hi = self.lo, self.hi
        i = bisect.bisect_left(lo, start)
        if i and hi[i - 1] == start:  # joins the gap below
            i -= 1
            start = lo[i]
            del lo[i], hi[i]
        if i < len(lo) and lo[i] == end:  # and the one above
            end = hi[i]
            del lo[i], hi[i]
        if end == self.top:  # the top falls to the highest live tile's end
            self.top = start
        else:
            lo.insert(i, start)
            hi.insert(i, end)


class Planner(OpShapes):
    """The kernel-wide plans (see the module docstring); ``plan_forwarding`` and
    ``plan_shadows`` fill ``forwarded``, ``load_fwd``, ``store_fwd``, ``store_skip`` and
    ``shadow``, which code generation follows."""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        self.forwarded: set[int] = set()
        self._whole: dict[int, bool] = {}
        self._clean: dict[int, bool] = {}  # id(op) -> _clean_writer(op)
        self._touch_memo: dict[tuple[int, int], object] = {}  # (op shape, position) -> touch
        self._forward_memo: dict[tuple, object] = {}  # see _forward_kind
        self._where: dict[int, tuple[list, dict[int, int]]] = {}  # id(body) -> (it, _positions)
        self._touch_at: dict[tuple[int, int, bool], list[int]] = {}  # see _touching

    def whole(self, acc: Access) -> bool:
        """``acc.is_whole``, remembered (the plans ask for most accesses more than once)."""
        w = self._whole.get(id(acc))
        if w is None:
            # ``is_whole`` without building an ``Affine.of(Axis(k))`` per dimension: each
            # index is exactly ``1 * Axis(k) + 0``
            w = acc.indirect is None and acc.shape == acc.tensor.shape
            if w:
                for k, a in enumerate(acc.index):
                    terms = a.terms
                    if a.const != 0 or len(terms) != 1:
                        w = False
                        break
                    s, c = terms[0]
                    if c != 1 or s.__class__ is not Axis or s.k != k:
                        w = False
                        break
            self._whole[id(acc)] = w
        return w

    # -- poisoning ------------------------------------------------------------------------------
    def _cover(self, t: Tensor, writes: list[Access], free: set[Sym]) -> bool:
        """Do ``writes`` (unmasked, in bounds), over every value of the symbols in ``free``,
        write every element of ``t``?"""
        n = int(np.prod(t.shape)) if t.shape else 1
        if n > _COVER_MAX_ELEMS:
            return False
        cov = np.zeros(t.shape, dtype=bool)
        return self._mark(cov, t, writes, free) and bool(cov.all())

    def _mark(self, cov: np.ndarray, t: Tensor, writes: list[Access], free: set[Sym]) -> bool:
        """Set ``cov`` where ``writes`` write; False when that cannot be enumerated."""
        seen: set[tuple] = set()
        for acc in writes:
            # an unrolled kernel writes the same few regions again and again: mark each once
            key = (acc.tensor.uid, acc.shape, acc.index)
            if key in seen:
                continue
            seen.add(key)
            syms = [s for s in acc.syms if not isinstance(s, Axis)]
            if any(s not in free for s in syms):
                return False
            trips = [self.ranges[s] for s in syms]
            if math.prod(trips) > _COVER_MAX_ITERS:
                return False
            target = cov
            if acc.tensor is not t:
                if math.prod(acc.tensor.shape) != cov.size:
                    return False  # a dtype view (other element size): not enumerated
                target = cov.reshape(acc.tensor.shape)
            for vals in itertools.product(*(range(x) for x in trips)):
                env = dict(zip(syms, vals))
                idx = []
                for a in acc.index:
                    ax = [(s.k, c) for s, c in a.terms if isinstance(s, Axis)]
                    base = a.const + sum(c * env[s] for s, c in a.terms if not isinstance(s, Axis))
                    if ax:
                        k, c = ax[0]
                        idx.append(slice(base, base + c * (acc.shape[k] - 1) + 1, c))
                    else:
                        idx.append(base)
                target[tuple(idx)] = True
        return True

    def _touches(self, stmts: list, t_root: Tensor) -> tuple[bool, list[tuple[Op, Access]], bool]:
        """(reads, writes, all writes compilable-unmasked) of tensor ``t_root`` in ``stmts``.
        An op that reads its destination (accumulation, atomic read-modify-write) counts as
        a read, which already rules out skipping the poison."""
        reads = False
        writes: list[tuple[Op, Access]] = []
        clean = True
        stack = list(stmts)
        while stack:
            s = stack.pop()
            if isinstance(s, Loop):
                stack.extend(s.body)
                continue
            if not isinstance(s, Op):
                continue
            for x in s.ins:
                if isinstance(x, Access) and x.tensor.root is t_root:
                    reads = True
            for o in s.outs:
                if o.tensor.root is t_root:
                    if reads_dst(s):
                        reads = True
                    mp = self.mask_plan(s)
                    if mp is None or mp[0] == "dynamic":
                        clean = False
                    if not writes_all(s) or self.static_shape(o, True) is None:
                        clean = False
                    writes.append((s, o))
        return reads, writes, clean

    def _mentions(self, s: Op | Loop | Alloc, root: Tensor, reads_only: bool) -> bool:
        """Does ``s`` read ``root`` (``_touches``'s reads), or when not ``reads_only`` read
        or write it -- without ``_touches``'s other findings."""
        if isinstance(s, Loop):
            return any(self._mentions(x, root, reads_only) for x in s.body)
        if not isinstance(s, Op):
            return False
        for x in s.ins:
            if isinstance(x, Access) and x.tensor.root is root:
                return True
        for o in s.outs:
            if o.tensor.root is root and (not reads_only or reads_dst(s)):
                return True
        return False

    def needs_poison_hbm(self, t: Tensor) -> bool:
        """``_touches`` over the whole body, from the read and write index ``plan_forwarding``
        built (the coverage proof does not depend on the writes' order)."""
        if t.uid in self.reads:
            return True
        writes = []
        clean = True
        for s in {id(op): op for op in self.writes.get(t.uid, [])}.values():
            for o in s.outs:
                if o.tensor.root is t:
                    mp = self.mask_plan(s)
                    if mp is None or mp[0] == "dynamic":
                        clean = False
                    if not writes_all(s) or self.static_shape(o, True) is None:
                        clean = False
                    writes.append(o)
        if not clean or not writes:
            return True
        return not self._cover(t, writes, set(self.ranges))

    def needs_poison_temp(self, t: Tensor, stmts: list, start: int) -> bool:
        """Whether the Alloc of ``t`` just before ``stmts[start]`` (in its body ``stmts``)
        must poison: yes unless the write-only statements before the first read write every
        element."""
        # an unrolled kernel writes most tiles whole in the statement after their Alloc
        ws = self.writes.get(t.uid)
        if start < len(stmts) and ws and ws[0] is stmts[start]:
            kind = self._touch(ws[0], t)
            if kind is _WHOLE:
                return False
            if kind is _POISON:
                return True
        cov = None
        at = self._touching(t.uid, stmts, False)
        for j in at[bisect.bisect_left(at, start) :]:
            s = stmts[j]
            if type(s) is Op:
                kind = self._touch(s, t)
                if kind is _UNTOUCHED:
                    continue
                if kind is _POISON:
                    return True
                if kind is _WHOLE:
                    return False  # what _mark would find without enumerating
                writes = [o for o in s.outs if o.tensor.root is t]
                free: set[Sym] = set()
            elif type(s) is Loop:
                reads, found, clean = self._touches([s], t)
                if not reads and not found:
                    continue
                if reads or not clean:
                    return True
                writes = [w for _, w in found]
                if any(self.whole(w) for w in writes):
                    return False
                free = {x.var for x, _ in _loops_in(s)}
            else:
                continue
            if cov is None:
                if math.prod(t.shape) > _COVER_MAX_ELEMS:
                    return True
                cov = np.zeros(t.shape, dtype=bool)
            if not self._mark(cov, t, writes, free):
                return True
            if cov.all():
                return False
        return cov is not None and not cov.all()

    def _body_positions(self, stmts: list) -> dict[int, int]:
        """``_positions(stmts)``, built once per body."""
        where = self._where.get(id(stmts))
        if where is None:
            where = self._where[id(stmts)] = (stmts, _positions(stmts))
        return where[1]

    def _find(self, stmts: list, s: Op, start: int) -> int | None:
        """The position of op ``s`` as a statement of ``stmts`` (not inside one of its
        loops) from ``start`` on.  From the body's position index: a store that is not in
        this body would otherwise be searched for to the body's end, once per tile."""
        if start < len(stmts) and stmts[start] is s:
            return start
        j = self._body_positions(stmts).get(id(s))
        return j if j is not None and j >= start and stmts[j] is s else None

    def _touching(self, uid: int, stmts: list, reads_only: bool) -> list[int]:
        """The positions, ascending and each once, of the statements of ``stmts`` that hold
        an op reading (or, unless ``reads_only``, writing) tensor ``uid`` or a view of it --
        from the read and write index, built once per tensor and body: a tile written in
        pieces over many statements is not scanned statement by statement."""
        key = (uid, id(stmts), reads_only)
        hit = self._touch_at.get(key)
        if hit is None:
            where = self._body_positions(stmts)
            ops = self.reads.get(uid, [])
            if not reads_only:
                ops = ops + self.writes.get(uid, [])
            hit = sorted({j for op in ops if (j := where.get(id(op))) is not None})
            self._touch_at[key] = hit
        return hit

    def _touched_in(self, root: Tensor, stmts: list, lo: int, hi: int, reads_only: bool) -> bool:
        """Whether a statement of ``stmts[lo:hi]`` reads ``root`` (or, unless ``reads_only``,
        writes it): ``_mentions`` over the few statements of a short span, else the index."""
        if hi - lo <= 8:
            return any(self._mentions(x, root, reads_only) for x in stmts[lo:hi])
        at = self._touching(root.uid, stmts, reads_only)
        k = bisect.bisect_left(at, lo)
        return k < len(at) and at[k] < hi

    def _touch(self, s: Op, t: Tensor) -> object:
        """How op ``s`` touches temporary ``t`` for the poison plan: not at all, a read or a
        write that may leave poison (``_POISON``), a clean write of all of ``t``
        (``_WHOLE``) or clean partial writes (``_PARTIAL``).  Remembered per kind of op and
        position of ``t`` in it (when ``t`` is a temporary of which no view exists: keys name
        other tensors and views by uid)."""
        key = None
        if t.uid not in self.aliased and t.kind == "temp" and t.base is None:
            shape = self.op_shape(s)
            if shape is not None:
                uids = shape[1]
                if t.uid not in uids:
                    return _UNTOUCHED
                key = (shape[0], uids.index(t.uid))
                kind = self._touch_memo.get(key)
                if kind is not None and not _table.CHECK_MEMO:
                    return kind
        found = self._touch_scan(s, t)
        if key is not None:
            known = self._touch_memo.setdefault(key, found)
            assert known is found, f"touch memo: {known} != {found} for {s!r}"
        return found

    def _touch_scan(self, s: Op, t: Tensor) -> object:
        """``_touch``, found by looking at every access of ``s``."""
        writes = None
        for x in s.ins:
            if type(x) is Access:
                u = x.tensor
                if u is t or (u.base is not None and u.root is t):
                    return _POISON
        for o in s.outs:
            u = o.tensor
            if u is t or (u.base is not None and u.root is t):
                if writes is None:
                    writes = []
                writes.append(o)
        if writes is None:
            return _UNTOUCHED
        if not self._clean_writer(s):
            return _POISON
        for o in writes:
            if self.static_shape(o, True) is None:
                return _POISON
        return _WHOLE if any(self.whole(w) for w in writes) else _PARTIAL

    def _clean_writer(self, op: Op) -> bool:
        """Whether ``op``'s writes could leave no poison behind: it does not read its
        destination, its mask needs no per-element test, and it writes whole outputs."""
        ok = self._clean.get(id(op))
        if ok is None:
            mp = self.mask_plan(op)
            ok = self._clean[id(op)] = (
                not reads_dst(op) and mp is not None and mp[0] != "dynamic" and writes_all(op)
            )
        return ok

    # -- memory -------------------------------------------------------------------------------
    def plan_arena(self, temps: list[Tensor]) -> tuple[dict[int, int], int]:
        """Byte offsets of the temporaries in one arena, sharing memory between tiles whose
        lifetimes do not overlap (the reference allocates a fresh buffer at every Alloc and
        lets the last one die; a fixed buffer per tile would hold every unrolled tile's
        memory at once).

        A tile lives from its Alloc to its last use; a use inside a loop that does not
        contain the Alloc keeps it alive to the end of that loop (the next iteration comes
        back to it).  Tiles never share while both live, so no tile sees another's data
        except where the reference would see poison -- and poison is filled explicitly.
        """
        uids = {t.uid for t in temps}
        start: dict[int, int] = {}
        depth: dict[int, int] = {}
        end: dict[int, int] = {}  # last use outside loops that do not contain the Alloc
        in_loops: list[tuple[int, Loop]] = []  # (uid, loop it is used in, not allocated in)
        loop_end: dict[int, int] = {}
        pos = 0

        def walk(stmts: list, loops: list[Loop]) -> None:
            nonlocal pos
            n = len(loops)
            for st in stmts:
                p = pos
                pos += 1
                ts = type(st)
                if ts is Op:
                    for a in (*st.outs, *st.ins):
                        if type(a) is not Access:
                            continue
                        t = a.tensor
                        while t.base is not None:  # t.root, without the property call
                            t = t.base
                        uid = t.uid
                        if uid in uids:
                            if n and n > depth.get(uid, 0):
                                in_loops.append((uid, loops[depth.get(uid, 0)]))
                            else:
                                end[uid] = p
                elif ts is Alloc:
                    if st.tensor.uid in uids:
                        start[st.tensor.uid] = p
                        depth[st.tensor.uid] = n
                elif ts is Loop:
                    walk(st.body, loops + [st])
                    loop_end[id(st)] = pos - 1

        walk(self.k.body, [])
        for uid, lp in in_loops:
            e = loop_end[id(lp)]
            if e > end.get(uid, -1):
                end[uid] = e
        live: list[tuple[int, int, int, int, int]] = []  # (start, end, offset, size, uid)
        itemsize: dict[
            int, int
        ] = {}  # id(dtype) -> storage itemsize (equal dtypes may differ in metadata)
        for t in temps:
            b = start.get(t.uid, 0)
            e = max(b, end.get(t.uid, b))
            isz = itemsize.get(id(t.dtype))
            if isz is None:
                isz = itemsize[id(t.dtype)] = dtypes.storage_dtype(t.dtype).itemsize
            size = -(-math.prod(t.shape) * isz // 64) * 64
            live.append((b, e, 0, max(size, 64), t.uid))
        live.sort()
        # first fit against the tiles still live when each one starts (tiles are taken in
        # order of their start, so those are the placed ones that end at or after it): a
        # heap by end keeps the live set, and the free bytes between live tiles are kept as
        # a few gaps -- a kernel with a thousand long-lived tiles and a tile per step stays
        # linear instead of walking every live tile for each new one
        active: list[tuple[int, int, int]] = []  # (end, offset, size)
        free = _Gaps()
        offsets: dict[int, int] = {}
        total = 0
        for b, e, _, size, uid in live:
            while active and active[0][0] < b:
                _, o, sz = heapq.heappop(active)
                free.release(o, o + sz)
            off = free.take(size)
            heapq.heappush(active, (e, off, size))
            offsets[uid] = off
            total = max(total, off + size)
        return offsets, total

    # -- forwarding ---------------------------------------------------------------------------
    def plan_forwarding(self, scan: bool = True) -> None:
        """Find tiles that can live in HBM memory instead of their own buffer (with ``scan``
        False: none, every tile keeps its buffer).

        *Load forwarding*: a tile whose only write is a same-dtype copy of a whole region of
        an HBM tensor that nothing in the kernel writes becomes a view of that region.
        *Store forwarding*: a tile written once and then only stored (whole, same dtype) to
        HBM is computed straight into the destination.  Either way the data and (checked at
        run time: C-contiguous) the layout are those of the reference's own buffer; the
        copy is what disappears.  Dead writes (temporaries nobody reads) are dropped too.
        """
        # tensors viewed through a reshape (NKI 0.x views of on-chip tiles): their accesses
        # name the reshape, so forwarding and shadow copies, which follow the tile's own
        # accesses, do not apply
        self.aliased = {t.root.uid for t in self.tensors.values() if t.base is not None}
        self.forwarded: set[int] = set()
        self.load_fwd: dict[int, Tensor] = {}  # id(op) -> tile
        self.store_fwd: dict[int, tuple[Tensor, Op]] = {}  # id(writer op) -> (tile, store op)
        self.store_skip: dict[int, Tensor] = {}  # id(store op) -> tile
        if scan:
            self._scan_forwarding(self.k.body)

    def _plain_copy(self, op: Op) -> bool:
        """A copy of one tile (not a read-modify-write) whose mask, if any, always holds."""
        if not executor(op.prim).copy or reads_dst(op) or len(op.outs) != 1:
            return False
        mp = self.mask_plan(op)
        return mp is not None and mp[0] in ("none", "static") and isinstance(op.ins[0], Access)

    def _scan_forwarding(self, stmts: list) -> None:
        writes, reads, aliased = self.writes, self.reads, self.aliased
        for i, s in enumerate(stmts):
            if type(s) is Loop:
                self._scan_forwarding(s.body)
                continue
            if type(s) is not Alloc:
                continue
            t = s.tensor
            ws = writes.get(t.uid)
            if ws is None or len(ws) != 1 or t.base is not None or t.uid in aliased:
                continue  # aliased: read or written through a reshape, keep its buffer
            if dtypes.is_tf32(t.dtype):
                continue
            w = ws[0]
            # the writer must be a plain statement of this body, after the Alloc, with no
            # read of t in between (that read would see the poison)
            # (an unrolled kernel writes most tiles in the statement after their Alloc)
            pos = self._find(stmts, w, i + 1)
            if pos is None or (pos > i + 1 and self._touched_in(t, stmts, i + 1, pos, True)):
                continue
            rs = reads.get(t.uid, ())
            st_op = rs[0] if len(rs) == 1 else None
            spos = None if st_op is None else self._find(stmts, st_op, pos + 1)
            kind = self._forward_kind(t, w, st_op if spos is not None else None)
            if kind is _LOAD:
                self.load_fwd[id(w)] = t
                self.forwarded.add(t.uid)
                continue
            if kind is not _STORE:
                continue
            # nothing between the writer and the store may touch the destination
            droot = st_op.outs[0].tensor.root
            if spos > pos + 1 and self._touched_in(droot, stmts, pos + 1, spos, False):
                continue
            self.store_fwd[id(w)] = (t, st_op)
            self.store_skip[id(st_op)] = t
            self.forwarded.add(t.uid)

    def _forward_kind(self, t: Tensor, w: Op, st_op: Op | None) -> object:
        """``_forward_check``, remembered per kind of writer, position of ``t`` in it, kind
        of store and the temporaries the two share (when neither touches a view, whose
        owner keys do not show)."""
        key = None
        if t.kind == "temp":
            sw = self.op_shape(w)
            ss = None if st_op is None else self.op_shape(st_op)
            if (
                sw is not None
                and sw[2]
                and t.uid in sw[1]
                and (st_op is None or (ss is not None and ss[2]))
            ):
                uw = sw[1]
                written = self.writes
                key = (
                    sw[0],
                    uw.index(t.uid),
                    tuple([u in written for u in uw]),
                    None if ss is None else ss[0],
                    None if ss is None else tuple([uw.index(u) if u in uw else -1 for u in ss[1]]),
                )
                kind = self._forward_memo.get(key)
                if kind is not None and not _table.CHECK_MEMO:
                    return kind
        found = self._forward_check(t, w, st_op)
        if key is not None:
            known = self._forward_memo.setdefault(key, found)
            assert known is found, f"forwarding memo: {known} != {found} for {w!r}"
        return found

    def _forward_check(self, t: Tensor, w: Op, st_op: Op | None) -> object:
        """Whether tile ``t``, written only by ``w`` (the next statement that touches it)
        and read only by ``st_op`` (None: not by exactly one op after ``w`` in its body),
        is load-forwarded (``_LOAD``), store-forwarded (``_STORE``, when nothing between
        ``w`` and ``st_op`` touches the destination) or neither (``_KEEP``)."""
        out = w.outs[0] if len(w.outs) == 1 else None
        if self._plain_copy(w) and out is not None and out.tensor is t and self.whole(out):
            src = w.ins[0]
            root = src.tensor.root
            if (
                root.is_hbm
                and root.uid not in self.writes
                and src.shape == t.shape
                and src.tensor.dtype == t.dtype
                and t not in [x.tensor for x in w.ins[1:]]
            ):
                code = self.static_shape(src, False)
                if code is not None and code.layout_exact and "_bt(" not in code.expr:
                    return _LOAD
        # store forwarding: t written whole by w, then read only by one plain store
        if st_op is None or not any(o.tensor is t and self.whole(o) for o in w.outs):
            return _KEEP
        if not self._plain_copy(st_op) or st_op.ins[0].tensor is not t:
            return _KEEP
        src, dst = st_op.ins[0], st_op.outs[0]
        droot = dst.tensor.root
        if (
            not self.whole(src)
            or not droot.is_hbm
            or dst.shape != t.shape
            or dst.tensor.dtype != t.dtype
            or any(isinstance(x, Access) and x.tensor.root is droot for x in w.ins)
        ):
            return _KEEP
        # the writer must write every element of t unconditionally (else the reference
        # would leave poison where this would leave the destination's old data)
        if (
            not writes_all(w)
            or self.mask_plan(w) not in (("none", None), ("static", None))
            or any(self.static_shape(x, False) is None for x in w.ins if isinstance(x, Access))
            or any(self.static_shape(o, True) is None for o in w.outs)
            or executor(w.prim).reference
        ):
            return _KEEP
        code = self.static_shape(dst, True)
        if code is None or not code.layout_exact:
            return _KEEP
        return _STORE

    # -- shadows ------------------------------------------------------------------------------
    def plan_shadows(self) -> None:
        """Choose the bf16/fp16/fp8 tiles that keep an fp32 copy of themselves.

        The reference widens a narrow tile to fp32 every time an instruction reads it.  A
        tile read (much) more often than it is written -- a matmul operand block reused for
        every row block, K^T in attention -- keeps a widened shadow instead, refreshed after
        each write over the written region, and read wherever the reference's widened copy
        would have the same (C-contiguous) layout.
        """
        self.shadow: set[int] = set()
        narrow: dict[int, bool] = {}  # id(dtype) -> stored narrower than fp32 (an unrolled
        # kernel has a tile per step, of a few dtypes)

        def is_narrow(dt: np.dtype) -> bool:
            hit = narrow.get(id(dt))
            if hit is None:
                hit = narrow[id(dt)] = (
                    not dtypes.is_tf32(dt)
                    and dtypes.is_float(dt)
                    and dtypes.storage_dtype(dt) != np.float32
                )
            return hit

        candidates = [
            t
            for t in self.tensors.values()
            if t.kind == "temp"
            and t.base is None
            and is_narrow(t.dtype)
            and t.uid not in self.forwarded
            and t.uid not in self.aliased
        ]
        if not candidates:
            return
        execs: dict[int, int] = {}
        grid = math.prod(self.k.grid or (1,))
        for st, loops in self.k.walk():
            if isinstance(st, Op):
                execs[id(st)] = grid * math.prod(lp.trip for lp in loops)
        for t in candidates:
            r = sum(execs[id(op)] for op in self.reads.get(t.uid, []) if not PRIMS[op.prim].raw)
            w = sum(execs[id(op)] for op in self.writes.get(t.uid, []))
            if r > 2 * w:
                self.shadow.add(t.uid)
        if self.shadow:
            self._access_memo.clear()  # reads of these tiles now come from the shadows

    def dead(self, t: Tensor) -> bool:
        """A temporary no instruction ever reads."""
        return t.kind == "temp" and t.base is None and t.uid not in self.reads
