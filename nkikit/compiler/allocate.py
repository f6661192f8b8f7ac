"""SBUF and PSUM allocation: a partition range and a byte offset for every on-chip tensor.

Contract of :func:`allocate`:

* Every SBUF/PSUM tensor of the kernel gets a :class:`Placement`: first partition, partition
  count, byte offset (the same in every partition it spans [PM, A2]), bytes per buffer and
  a buffer count.  Buffer ``k`` lives at ``offset + k * size``.
* Tensors allocated in an ``affine_range`` body get up to ``target.max_buffers`` buffers
  (one per in-flight iteration), so that iteration ``i + 1`` can load while iteration ``i``
  computes, as the Neuron compiler pipelines affine loops.  ``sequential_range`` bodies and
  top-level tensors get one buffer.  When memory is short the biggest multi-buffered
  tensors lose buffers first, tiles computed on chip before tiles a DMA loads (a load is
  the long-latency producer that buffering overlaps with compute).
* **Address rotation.**  Unrolled code (``range`` / ``nl.static_range``) allocates a new
  tensor at the same source line in every step.  Such tensors -- same line, same variable,
  shape, dtype, memory and enclosing rolled loops -- form one *rotation group*: they share
  one placement of up to ``target.max_buffers`` buffers and the ``k``-th allocation of the
  group takes buffer ``k mod buffers``, the way the Neuron compiler rotates the addresses
  of unrolled allocations (NKI 0.7 ``CompileConfig(address_rotation=...)``).  An unrolled
  loop then pipelines like the same loop written with ``nl.affine_range``.  A group keeps
  at least as many buffers as it has members live at once (so rotation never puts two
  live members on one buffer); if the groups do not fit, every tensor is placed on its own
  (no rotation) before giving up.  ``Placement.rotation`` / ``rotations`` say where a
  tensor is in its group and how big the group is.
* Two placements that overlap in memory never hold tensors that are live at the same time.
  Liveness is static: a tensor lives from its allocation to its last use, and a use inside
  a loop that the tensor is declared outside of keeps it live for the whole loop.  The first
  attempt also refuses to share memory between tensors of a common loop (their iterations
  may overlap once pipelined); only if that does not fit is plain static liveness used.
* A tensor placed by a user allocation (``Tensor.user_span``: ``nki.compiler.sbuf`` /
  ``psum`` ``mod_alloc`` or ``alloc``) keeps its address, one buffer, never spilled; the
  other SBUF tensors go above the highest user SBUF span or below the lowest, whichever
  range is larger (:func:`_user_sbuf_free`), the other PSUM tensors above the highest user
  bank, each taking the most blocks it has in use
  at once (``nkikit/ir/residency.py``: the verifier's capacity rule counts the same).
* A PSUM tensor NKI 0.x placed by hand (``Tensor.address``: ``nl.ndarray(address=)``) keeps
  its bytes, one buffer, over its own lifetime (placed tensors may share bytes: the program
  orders them); automatically placed PSUM avoids the placed ranges live with it
  (:func:`_pinned_at`), as the verifier counts them (``ir/verify.py``: ``_psum_liveness``).
* A PSUM tile never straddles a 2 KiB bank: tiles are padded to a power of two and aligned
  to it, and tiles of a bank or more start on a bank boundary [A2, MIG].
* Partition starts follow the hardware rule: 0 when P > 64, 0 or 64 when P > 32, a multiple
  of 32 otherwise [A2].
* **Spilling.**  If SBUF does not fit even with one buffer per tensor and plain static
  liveness, tensors that are live but idle at the fullest point are spilled, as the Neuron
  compiler spills to the next memory tier [PM, MEM]: saved to HBM after one use and
  reloaded before the next, so that their SBUF lifetime splits there (one at a time, until
  it fits, packing biggest-first before spilling more so that fragmentation alone never
  causes a spill; a saved segment keeps its memory through the next instruction when that
  fits, so the save overlaps it; see :func:`_plan_spills`).  :attr:`Allocation.spills` lists them; the segments of
  a spilled tensor have a placement each (:attr:`Allocation.segments`).  PSUM is never
  spilled.  Lifetimes and uses come from :mod:`nkikit.ir.residency`, which the verifier's
  capacity rule shares: a kernel it accepts fits once every idle stretch is spilled.
* If nothing fits, :class:`~nkikit.errors.NkiError` ``err_sbuf_capacity_exceeded`` (at the
  first statement whose tensors in use exceed SBUF, as the verifier reports it) or
  ``err_psum_total_capacity_exceeded`` names the live tensors with sizes and lines.

Cost: O(n log n + n * w) for n placement groups of which at most w are live at once (first
fit against the live set, swept in program order); kernels with at most
``_VECTOR_FIT_MAX`` groups also try biggest-first placement, checked with one vector test
per group against all placed ones.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from math import prod

import numpy as np

from ..errors import UNKNOWN_LOC, NkiError
from ..ir.core import Kernel, Op, Tensor
from ..ir.prims import engine_of
from ..ir.residency import (
    Lifetime,
    footprint,
    psum_blocks_in_use,
    psum_user_top,
    resident_overflow,
    timeline,
)
from ..targets import Target

# Up to this many placement groups per memory, biggest-first placement is tried too (one
# vector test against every placed group each); beyond it only the program-order sweep runs.
_VECTOR_FIT_MAX = 2048


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one on-chip tensor lives.

    The tensors of a rotation group share one placement's buffers: each allocation of any
    of them takes the next buffer.  ``rotation`` is this tensor's position among the
    ``rotations`` tensors of its group (allocation order) and ``lane`` is ``rotation`` modulo
    the most members live at once: tensors of one lane are never live together, so they
    may share the record of which buffer is theirs.  A tensor outside any group has
    ``rotation == lane == 0`` and ``rotations == 1``.
    """

    tensor: Tensor
    memory: str  # "sbuf" | "psum"
    partition: int
    partitions: int
    offset: int  # byte offset of buffer 0 in each partition
    size: int  # bytes per partition of one buffer, padding included
    buffers: int
    live: tuple[int, int]  # static program points [first, last]
    rotation: int = 0
    rotations: int = 1
    lane: int = 0

    def address(self, buffer: int = 0) -> int:
        return self.offset + (buffer % self.buffers) * self.size

    @property
    def end(self) -> int:
        return self.offset + self.size * self.buffers

    @property
    def bank(self) -> int | None:
        """The first PSUM bank (None for SBUF)."""
        return self.offset // 2048 if self.memory == "psum" else None

    def to_dict(self) -> dict:
        d = {
            "tensor": self.tensor.name,
            "memory": self.memory,
            "partition": self.partition,
            "partitions": self.partitions,
            "offset": self.offset,
            "size": self.size,
            "buffers": self.buffers,
        }
        if self.rotations > 1:
            d["rotations"] = self.rotations
        return d


@dataclass(frozen=True, slots=True)
class Spill:
    """One spill of an SBUF tensor: saved to HBM after the statement of its body that ends
    at program point ``save_after`` (a use) and reloaded before the statement that starts
    at ``reload_before`` (its next use).  ``depth`` is the number of rolled loops around
    that body (the spill runs once per execution of it)."""

    tensor: Tensor
    save_after: int
    reload_before: int
    depth: int


@dataclass(slots=True)
class Allocation:
    """The placements of a kernel.

    ``leader[uid]`` is the uid of the first tensor of ``uid``'s rotation group (itself when
    it rotates with no one): the tensors of one group are one buffer set to the lowering and
    the scheduler, like one tensor of a rolled loop.  Two placements may overlap in memory
    only when their tensors are never live together; the scheduler orders the tenants of a
    piece of memory (see :mod:`.schedule`).
    """

    placements: dict[int, Placement]
    used: dict[str, int]
    mode: str
    leader: dict[int, int]
    rotation: bool = True  # False when the groups did not fit and were placed one by one
    spills: list[Spill] = field(default_factory=list)
    # spilled tensors: one placement per SBUF lifetime segment, in program order (the
    # first is also in ``placements``)
    segments: dict[int, list[Placement]] = field(default_factory=dict)

    def __getitem__(self, t: Tensor) -> Placement:
        return self.placements[t.uid]

    def __contains__(self, t: Tensor) -> bool:
        return t.uid in self.placements

    def buffers(self, t: Tensor) -> int:
        p = self.placements.get(t.uid)
        return p.buffers if p else 1

    def groups(self) -> list[Placement]:
        """One placement per rotation group (its first tensor's), in placement order."""
        return [p for uid, p in self.placements.items() if self.leader.get(uid, uid) == uid]

    def overlap(self, a: Tensor, b: Tensor) -> bool:
        """Do any buffers of ``a`` and ``b`` share a byte of a partition?"""
        p, q = self.placements.get(a.uid), self.placements.get(b.uid)
        if p is None or q is None or p.memory != q.memory:
            return False
        if not (
            p.partition < q.partition + q.partitions and q.partition < p.partition + p.partitions
        ):
            return False
        return p.offset < q.end and q.offset < p.end


# ---------------------------------------------------------------------------------------------
# liveness


# a tensor's lifetime (or that of one SBUF segment of a spilled tensor), from the walk the
# verifier's capacity rule shares
_Info = Lifetime


# ---------------------------------------------------------------------------------------------
# sizes


def _layout(t: Tensor, target: Target, blocks_in_use: dict[int, int]) -> tuple[int, int]:
    """(bytes per partition of one buffer, alignment).  A PSUM tensor whose blocks live one
    loop iteration at a time takes the blocks in use at once (``blocks_in_use``)."""
    if t.buffer == "psum":
        blocks = blocks_in_use.get(t.uid, prod(t.shape[: t.par_axis]))
        tile = prod(t.shape[t.par_axis + 1 :]) * t.dtype.itemsize
        bank = target.psum_bank_bytes
        if tile > bank:
            raise NkiError(
                "err_psum_capacity_exceeded",
                t.loc or UNKNOWN_LOC,
                tensor=t.name,
                used=tile,
                limit=bank,
            )
        padded = 1 << max(tile - 1, 1).bit_length()
        padded = min(max(padded, 4), bank)
        return blocks * padded, padded
    return max(footprint(t), 1), target.sbuf_align


def _starts(partitions: int, total: int) -> tuple[int, ...]:
    # [A2]: a tensor starts at partition 0 if P > 64, 0/64 if P > 32, a multiple of 32 otherwise
    if partitions > 64:
        return (0,)
    if partitions > 32:
        return tuple(p for p in (0, 64) if p + partitions <= total)
    return tuple(p for p in (0, 32, 64, 96) if p + partitions <= total)


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


# ---------------------------------------------------------------------------------------------
# rotation groups


@dataclass(slots=True)
class _Group:
    """Tensors that share one placement: a rotation group, or one tensor on its own."""

    members: list[_Info]  # in allocation order
    lo: int
    hi: int
    outer_end: int
    scope: int  # uid of the outermost enclosing rolled loop, -1 at top level
    allocs: int  # allocations of all members per kernel instance
    pipelined: bool
    live_at_once: int  # most members live at one time: the fewest buffers rotation allows

    @property
    def tensor(self) -> Tensor:
        return self.members[0].tensor


def _site(t: Tensor) -> tuple:
    """What makes two tensors allocations of one place in successive unrolled steps: the
    line, the variable (``x``, ``x.1``, ``x.2`` ...), the tile type and the rolled loops."""
    base, dot, suffix = t.name.rpartition(".")
    name = base if dot and suffix.isdigit() else t.name
    return (t.buffer, t.loc, name, t.shape, t.dtype, t.par_axis, t.scope)


def _groups(infos: list[_Info], rotate: bool) -> list[_Group]:
    sites: dict[tuple, list[_Info]] = {}
    for info in infos:
        t = info.tensor
        key = _site(t) if rotate and t.loc is not None else (t.uid,)
        sites.setdefault(key, []).append(info)
    out = []
    for members in sites.values():
        members.sort(key=lambda m: m.lo)
        first = members[0]
        if len(members) == 1:
            lo, hi, end, depth = first.lo, first.hi, first.outer_end, 1
        else:
            los = np.fromiter((m.lo for m in members), np.int64, len(members))
            his = np.fromiter((m.hi for m in members), np.int64, len(members))
            # member i and the member allocated d later may share a buffer only if i is
            # dead by then: d must exceed the members that start before i ends
            later = np.searchsorted(los, his, side="right") - np.arange(len(members))
            lo, hi, depth = int(los[0]), int(his.max()), int(later.max())
            end = max(m.outer_end for m in members)
        scope = first.tensor.scope[0].uid if first.tensor.scope else -1
        out.append(
            _Group(
                members,
                lo,
                hi,
                end,
                scope,
                first.execs * len(members),
                first.pipelined,
                depth,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# first fit


@dataclass(slots=True)
class _Item:
    group: _Group
    size: int
    align: int
    buffers: int
    partitions: int
    want: int = 1
    floor: int = 1  # fewest buffers it may have
    unit: int = 1  # buffers of one copy of what it holds (a group: all its members)
    loaded: bool = False  # first written by a DMA: keeps its buffers longest when shedding

    @property
    def footprint(self) -> int:
        return self.size * self.buffers


def _lowest_gap(rects: list[tuple[int, int]], footprint: int, align: int) -> int:
    """Lowest aligned offset where ``footprint`` bytes clear every (lo, hi) in ``rects``."""
    off = 0
    for r_lo, r_hi in sorted(rects):
        if off + footprint <= r_lo:
            break
        if r_hi > off:
            off = _align(r_hi, align)
    return off


def _vector_fit(
    items: list[_Item], mode: str, total_partitions: int, pinned: tuple = ()
) -> tuple[list[tuple[int, int]], int]:
    """Biggest first: place every item at the lowest offset that clears conflicting placed
    items, found with one vector test against all placed items, and the ``pinned`` byte
    ranges (``(lo, hi, start, end)``: points, bytes) live with it."""
    order = sorted(range(len(items)), key=lambda k: (-items[k].footprint, items[k].group.lo))
    n = len(order)
    lo = np.empty(n, np.int64)
    hi = np.empty(n, np.int64)
    scope = np.empty(n, np.int64)  # outermost enclosing loop, -1 for none
    part = np.empty(n, np.int64)
    parts = np.empty(n, np.int64)
    off_lo = np.empty(n, np.int64)
    off_hi = np.empty(n, np.int64)
    result: list[tuple[int, int]] = [(0, 0)] * len(items)
    high = 0
    for k, i in enumerate(order):
        it = items[i]
        g = it.group
        hit = (lo[:k] <= g.hi) & (hi[:k] >= g.lo)
        if mode == "pipelined" and g.scope != -1:
            hit |= scope[:k] == g.scope
        idx = np.flatnonzero(hit)
        best: tuple[int, int] | None = None
        for pstart in _starts(it.partitions, total_partitions):
            sel = idx[(part[idx] < pstart + it.partitions) & (pstart < part[idx] + parts[idx])]
            rects = list(zip(off_lo[sel].tolist(), off_hi[sel].tolist()))
            off = _lowest_gap(rects + _pinned_at(pinned, g), it.footprint, it.align)
            if best is None or off < best[1]:
                best = (pstart, off)
        assert best is not None
        lo[k], hi[k], scope[k] = g.lo, g.hi, g.scope
        part[k], parts[k] = best[0], it.partitions
        off_lo[k], off_hi[k] = best[1], best[1] + it.footprint
        result[i] = best
        high = max(high, best[1] + it.footprint)
    return result, high


def _sweep_fit(
    items: list[_Item], mode: str, total_partitions: int, *, nested: bool = False, pinned=()
) -> tuple[list[tuple[int, int]], int]:
    """Program order: place every item at the lowest offset that clears the placed items
    still live when it starts.  Those are kept in a heap by the last point they block
    (their last use, or in pipelined mode the end of their outermost loop, since the
    iterations of a pipelined loop may overlap), so each item meets only the live ones.
    Items that start together go biggest first, or with ``nested`` longest first: then the
    items live when one starts all contain it, and if the lifetimes nest (each two disjoint
    or one inside the other) no item ends above the bytes live at once at its points."""
    if nested:
        key = lambda k: (items[k].group.lo, -items[k].group.hi, -items[k].footprint)  # noqa: E731
    else:
        key = lambda k: (items[k].group.lo, -items[k].footprint)  # noqa: E731
    order = sorted(range(len(items)), key=key)
    pipelined = mode == "pipelined"
    active: list[tuple[int, int]] = []  # (last blocked point, item index)
    where: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(items)  # part, parts, lo, hi
    result: list[tuple[int, int]] = [(0, 0)] * len(items)
    high = 0
    for i in order:
        it = items[i]
        g = it.group
        while active and active[0][0] < g.lo:
            heapq.heappop(active)
        live = [where[j] for _, j in active]
        best: tuple[int, int] | None = None
        for pstart in _starts(it.partitions, total_partitions):
            rects = [
                (o_lo, o_hi)
                for p, ps, o_lo, o_hi in live
                if p < pstart + it.partitions and pstart < p + ps
            ]
            off = _lowest_gap(rects + _pinned_at(pinned, g), it.footprint, it.align)
            if best is None or off < best[1]:
                best = (pstart, off)
        assert best is not None
        where[i] = (best[0], it.partitions, best[1], best[1] + it.footprint)
        result[i] = best
        high = max(high, best[1] + it.footprint)
        blocks = g.outer_end if pipelined and g.scope != -1 else g.hi
        heapq.heappush(active, (blocks, i))
    return result, high


def _pinned_at(pinned, g: _Group) -> list[tuple[int, int]]:
    """The byte ranges of the hand-placed tensors live while ``g`` is (``Tensor.address``:
    they keep their bytes; every partition counts as theirs)."""
    return [(a, b) for lo, hi, a, b in pinned if lo <= g.hi and g.lo <= hi]


# ---------------------------------------------------------------------------------------------
# the allocator


def allocate(kernel: Kernel, target: Target, *, rotation: bool = True) -> Allocation:
    """Place every SBUF and PSUM tensor of ``kernel`` (see the module docstring).

    ``rotation=False`` places every tensor on its own (no address rotation of unrolled
    allocations), like NKI 0.7's ``CompileConfig(address_rotation=...)`` turned off."""
    tl = timeline(kernel)
    loaded = _dma_fed(tl)
    infos: dict[str, list[_Info]] = {"sbuf": [], "psum": []}
    fixed: list[_Info] = []  # tensors a user allocation placed: kept at their addresses
    pinned: list[_Info] = []  # PSUM tensors NKI 0.x placed by hand: kept at their bytes
    for info in tl.lifetimes.values():
        t = info.tensor
        if t.user_span is not None:
            fixed.append(info)
        elif t.buffer == "psum" and t.address is not None:
            pinned.append(info)
        else:
            infos[t.buffer].append(info)
    top = psum_user_top(kernel, tl.scan)
    sbuf_base, sbuf_room = _user_sbuf_free(fixed, target)
    blocks = psum_blocks_in_use(kernel, tl.scan)
    capacity = {"sbuf": sbuf_room, "psum": target.psum_bytes - top}
    base = {"sbuf": sbuf_base, "psum": top}
    # (first point, last point, first byte, end) of each, as the packers avoid them
    pins = tuple(
        (
            i.lo,
            i.hi,
            i.tensor.address - top,
            i.tensor.address - top + _layout(i.tensor, target, {})[0],
        )
        for i in pinned
    )

    placements: dict[int, Placement] = {}
    leader: dict[int, int] = {}
    used: dict[str, int] = {}
    modes: list[str] = []
    spills: list[Spill] = []
    segments: dict[int, list[Placement]] = {}
    rotated = True
    for memory, mem_infos in infos.items():
        for rotate in (True, False) if rotation else (False,):
            its = _items(_groups(mem_infos, rotate), target, loaded, blocks)
            placed, high, mode = _fit(
                its, capacity[memory], target.partitions, pins if memory == "psum" else ()
            )
            if placed is not None:
                break
            if not any(len(it.group.members) > 1 for it in its):
                break  # nothing rotates: placing one by one is what was just tried
        rotated = rotated and rotation and rotate
        if placed is None and memory == "sbuf":
            its, placed, high, spilled = _plan_spills(
                mem_infos, target, capacity[memory], _next_ops(tl)
            )
            mode = "static"
            spills.extend(spilled)
            if placed is None:
                over = resident_overflow(tl, target, capacity[memory])
                if over is not None:  # what the verifier rejects (with another target's limits)
                    raise over.error()
        if placed is None:
            _fail(memory, its, high, capacity[memory])
        used[memory] = high + base[memory]
        modes.append(mode)
        for it, (p, off) in zip(its, placed):
            off += base[memory]
            g = it.group
            n = len(g.members)
            head = g.members[0].tensor.uid
            for k, m in enumerate(g.members):
                place = Placement(
                    m.tensor,
                    memory,
                    p,
                    it.partitions,
                    off,
                    it.size,
                    it.buffers,
                    (m.lo, m.hi),
                    k,
                    n,
                    k % g.live_at_once,
                )
                uid = m.tensor.uid
                if uid in placements:  # a later SBUF segment of a spilled tensor
                    segments.setdefault(uid, [placements[uid]]).append(place)
                    continue
                placements[uid] = place
                if n > 1:
                    leader[uid] = head
    for info in fixed:
        t = info.tensor
        lo, hi = t.user_span
        placements[t.uid] = Placement(
            t, t.buffer, 0, t.partitions, lo, hi - lo, 1, (info.lo, info.hi)
        )
    for info, (_, _, start, end) in zip(pinned, pins):
        t = info.tensor
        placements[t.uid] = Placement(
            t, "psum", 0, t.partitions, start + top, end - start, 1, (info.lo, info.hi)
        )
        used["psum"] = max(used.get("psum", 0), end + top)
    for segs in segments.values():
        segs.sort(key=lambda q: q.live[0])
    for uid, segs in segments.items():
        placements[uid] = segs[0]
    mode = "static" if "static" in modes else "pipelined"
    return Allocation(placements, used, mode, leader, rotated, spills, segments)


def _user_sbuf_free(fixed: list[_Info], target: Target) -> tuple[int, int]:
    """Where automatically placed SBUF tensors go beside the users' SBUF spans: (first byte,
    bytes) of the larger of the range below the lowest span and the range above the highest
    (all of SBUF without any), so no placement of nkikit's overlaps a user's.  A span past
    ``target``'s SBUF (a kernel traced for a bigger SBUF than the one compiled for) is
    ``err_allocation_out_of_bounds`` at the tensor's line.  User allocations may overlap each
    other: NKI trusts them, the program orders their tenants."""
    lo, hi = target.sbuf_bytes, 0
    for info in fixed:
        t = info.tensor
        if t.buffer != "sbuf":
            continue
        start, end = t.user_span
        if end > target.sbuf_bytes:
            raise NkiError(
                "err_allocation_out_of_bounds",
                t.loc or UNKNOWN_LOC,
                what=f"bytes [{start}, {end}) of each SBUF partition, which has "
                f"{target.sbuf_bytes} on {target.name}",
            )
        lo, hi = min(lo, start), max(hi, end)
    if hi == 0:
        return 0, target.sbuf_bytes
    above = _align(hi, target.sbuf_align)
    below = lo - lo % target.sbuf_align
    if below > target.sbuf_bytes - above:
        return 0, below
    return above, target.sbuf_bytes - above


def _dma_fed(tl) -> frozenset[int]:
    """Uids of the on-chip tensors whose first use is a DMA writing them (loads)."""
    out = set()
    for uid, info in tl.lifetimes.items():
        if not info.uses:
            continue
        first = info.uses[0]
        st = tl.stmts[first[0]] if first[0] == first[1] else None
        if isinstance(st, Op) and engine_of(st) == "dma":
            if any(a.tensor.uid == uid for a in st.outs):
                out.add(uid)
    return frozenset(out)


def _items(
    groups: list[_Group],
    target: Target,
    loaded: frozenset[int] = frozenset(),
    blocks_in_use: dict[int, int] | None = None,
) -> list[_Item]:
    """Buffers wanted per group.  A tensor of a loop wants one buffer per iteration in flight
    (``max_buffers`` in an ``affine_range``, ``sequential_buffers`` in a
    ``sequential_range``); a rotation group inside a loop wants that for each of its
    members, exactly as its tensors would on their own.  Straight-line code rotates through
    ``max_buffers`` sets of what it holds live at once, as if it were an ``affine_range``
    whose iterations are the unrolled steps."""
    items = []
    for g in groups:
        t = g.tensor
        size, align = _layout(t, target, blocks_in_use or {})
        n = len(g.members)
        execs = g.allocs // n
        if execs > 1:
            per = target.max_buffers if g.pipelined else target.sequential_buffers
            unit = n
            want = n * min(per, execs)
        else:
            unit = g.live_at_once
            want = min(unit * target.max_buffers, g.allocs) if n > 1 else 1
        if t.buffer == "psum":
            want = min(want, unit * target.psum_banks)
        want = max(want, g.live_at_once, 1)
        items.append(
            _Item(g, size, align, want, t.partitions, want, g.live_at_once, unit, t.uid in loaded)
        )
    return items


def _fit(items: list[_Item], capacity: int, partitions: int, pinned: tuple = ()):
    """Try generous plans first: pipelined liveness while shedding buffers, then static;
    around the ``pinned`` byte ranges (see :func:`_pinned_at`)."""
    if not items:
        return [], 0, "pipelined"
    high = 0
    both = len(items) <= _VECTOR_FIT_MAX
    for mode in ("pipelined", "static"):
        for it in items:
            it.buffers = it.want
        while True:
            if both:
                placed, high = _vector_fit(items, mode, partitions, pinned)
                if high <= capacity:
                    return placed, high, mode
            placed, high = _sweep_fit(items, mode, partitions, pinned=pinned)
            if high <= capacity:
                return placed, high, mode
            multi = [it for it in items if it.buffers > it.floor]
            if not multi:
                break
            # keep double buffering as long as possible: shed the third and fourth buffers
            # of every tensor before any tensor drops to a single buffer; tiles computed
            # on chip before tiles loaded by DMA (a load is the long-latency producer that
            # buffering overlaps with compute, as the Neuron compiler pipelines loads); the
            # biggest first, an eighth of them per round so that kernels with thousands of
            # tiles converge.  A rotation group sheds one buffer per member at a time, then
            # an eighth of the rest per round, down to the members it holds live at once.
            multi.sort(
                key=lambda it: (it.buffers > 2 * it.unit, not it.loaded, it.footprint, it.size),
                reverse=True,
            )
            for it in multi[: max(1, len(multi) // 8)]:
                if it.buffers > it.unit:
                    step = it.unit
                else:
                    step = max(1, (it.buffers - it.floor) // 8)
                it.buffers = max(it.floor, it.buffers - step)
    return None, high, "static"


# ---------------------------------------------------------------------------------------------
# spilling


def _next_ops(tl) -> list[int]:
    """For every program point, the point of the next instruction (``Op``) after it."""
    n = len(tl.stmts)
    out = [n] * (n + 1)
    nxt = n
    for p in range(n - 1, -1, -1):
        out[p] = nxt
        if isinstance(tl.stmts[p], Op):
            nxt = p
    return out


def _plan_spills(
    infos: list[_Info], target: Target, capacity: int, next_op: list[int] | None = None
) -> tuple[list[_Item], list[tuple[int, int]] | None, int, list[Spill]]:
    """Split the SBUF lifetimes of idle tensors until everything fits with one buffer each
    under static liveness: (items, their placements, bytes used, spills).

    A tensor's SBUF lifetime runs from its first use (not its ``Alloc``: nothing is stored
    before it) to its last, and may split between two uses with a statement between them
    (:meth:`Lifetime.gaps`).  Each round places everything (in program order, longer
    lifetimes first among those that start together) and, if that does not fit, spills one
    live tensor not used at the fullest point -- the one idle longest, then the biggest
    (Belady's rule) -- or, when every tensor there is in use, one idle where the placement
    overflowed.  When no tensor is idle anywhere it overflows, every remaining gap is spilled:
    the segments then nest like the loops (a use is one op or one whole loop), so placing them
    in that order needs no more than the bytes resident at the fullest statement
    (:func:`~nkikit.ir.residency.resident_overflow`, which the verifier checks).  The
    placements are None if even that does not fit."""
    # per tensor: its segments (lo, hi, first use index, last use index)
    segs: dict[int, list[tuple[int, int, int, int]]] = {}
    by_uid = {i.tensor.uid: i for i in infos}
    for i in infos:
        n = len(i.uses)
        lo = i.uses[0][0] if n else i.lo
        segs[i.tensor.uid] = [(lo, i.hi, 0, n - 1)]
    spills: list[Spill] = []
    everything = False  # every gap spilled

    def plan(hold: bool) -> tuple[list[_Item], list[tuple[int, int]], int]:
        # ``hold``: a segment that ends in a save keeps its memory through the next instruction
        items.clear()
        where.clear()
        for uid, lst in segs.items():
            info = by_uid[uid]
            for k, (lo, hi, _, _) in enumerate(lst):
                end = hi
                if hold and next_op is not None and k + 1 < len(lst) and hi < len(next_op):
                    end = min(next_op[hi], info.hi)
                seg = _Info(info.tensor, lo, end, info.execs, info.pipelined, end)
                items.extend(_items(_groups([seg], False), target))
                where.append((uid, k))
        for it in items:
            it.buffers = it.want = it.floor = 1
        placed, high = _sweep_fit(items, "static", target.partitions, nested=True)
        if high > capacity and len(items) <= _VECTOR_FIT_MAX:
            # biggest first packs small tiles into the gaps the program-order sweep leaves;
            # a spill costs DMA traffic, fragmentation alone must not cause one
            by_size, high_by_size = _vector_fit(items, "static", target.partitions)
            if high_by_size <= capacity:
                return items, by_size, high_by_size
        return items, placed, high

    items: list[_Item] = []
    where: list[tuple[int, int]] = []
    while True:
        if spills:
            # the save of a segment reads it after its last use: keep the next statement
            # out of its memory if that fits, so the save overlaps it instead of delaying it
            held = plan(True)
            if held[2] <= capacity:
                return *held, spills
        items, placed, high = plan(False)
        if high <= capacity:
            return items, placed, high, spills
        if everything:
            return items, None, high, spills
        hot = [_fullest_point(items)]
        hot += sorted(
            {it.group.lo for it, (_, off) in zip(items, placed) if off + it.size > capacity}
        )
        best = None
        for pt in hot:
            best = _idlest(items, where, segs, by_uid, pt)
            if best is not None:
                break
        if best is None:  # nothing idle where it overflows: spill every gap left
            everything = True
            for uid, lst in segs.items():
                info = by_uid[uid]
                for k in range(len(lst) - 1, -1, -1):
                    for j in reversed(_gaps_in(info, lst[k])):
                        _split(segs, info, k, j, spills)
            continue
        _, uid, k, j = best
        _split(segs, by_uid[uid], k, j, spills)


def _gaps_in(info: _Info, seg: tuple[int, int, int, int]) -> list[int]:
    """The gaps (:meth:`Lifetime.gaps`) of ``info`` inside one of its segments."""
    _, _, u0, u1 = seg
    iv = info.uses
    return [j for j in range(u0, u1) if iv[j][1] + 1 < iv[j + 1][0]]


def _idlest(items, where, segs, by_uid, pt: int):
    """The best spill at point ``pt``: ((idle points, size), uid, segment, gap) of the live
    tensor idle there the longest (then the biggest), or None if every one is in use."""
    best = None
    for it, (uid, k) in zip(items, where):
        g = it.group
        if not g.lo <= pt <= g.hi:
            continue
        _, _, u0, u1 = segs[uid][k]
        iv = by_uid[uid].uses
        j = next((j for j in range(u0, u1) if iv[j][1] < pt < iv[j + 1][0]), None)
        if j is None:
            continue
        score = (iv[j + 1][0] - iv[j][1], it.size)
        if best is None or score > best[0]:
            best = (score, uid, k, j)
    return best


def _split(segs, info: _Info, k: int, j: int, spills: list[Spill]) -> None:
    """Spill ``info``'s tensor between its uses ``j`` and ``j + 1`` (in its segment ``k``)."""
    uid = info.tensor.uid
    lo, hi, u0, u1 = segs[uid][k]
    iv = info.uses
    segs[uid][k : k + 1] = [(lo, iv[j][1], u0, j), (iv[j + 1][0], hi, j + 1, u1)]
    t = info.tensor
    spills.append(Spill(t, iv[j][1], iv[j + 1][0], len(t.scope)))


def _fullest_point(items: list[_Item]) -> int:
    """The program point where the live items' bytes (one buffer each) add up most."""
    order = sorted(range(len(items)), key=lambda k: items[k].group.lo)
    ending: list[tuple[int, int]] = []
    total = best = 0
    best_pt = items[order[0]].group.lo if items else 0
    k = 0
    while k < len(order):
        pt = items[order[k]].group.lo
        while k < len(order) and items[order[k]].group.lo == pt:
            it = items[order[k]]
            total += it.footprint
            heapq.heappush(ending, (it.group.hi, it.footprint))
            k += 1
        while ending and ending[0][0] < pt:
            total -= heapq.heappop(ending)[1]
        if total > best:
            best, best_pt = total, pt
    return best_pt


def _fail(memory: str, items: list[_Item], high: int, capacity: int) -> None:
    # Report what is live at the fullest program point: that is what does not fit.  The
    # points where something starts are swept in order with the live set's bytes.
    order = sorted(range(len(items)), key=lambda k: items[k].group.lo)
    ending: list[tuple[int, int]] = []  # (last point, size)
    total = 0
    best_bytes, best_pt = -1, 0
    k = 0
    while k < len(order):
        pt = items[order[k]].group.lo
        while k < len(order) and items[order[k]].group.lo == pt:
            it = items[order[k]]
            total += it.size
            heapq.heappush(ending, (it.group.hi, it.size))
            k += 1
        while ending and ending[0][0] < pt:
            total -= heapq.heappop(ending)[1]
        if total > best_bytes:
            best_bytes, best_pt = total, pt
    best = [it for it in items if it.group.lo <= best_pt <= it.group.hi]
    best.sort(key=lambda it: -it.size)
    shown = ", ".join(
        f"{it.group.tensor.name} ({it.size} B, {_where(it.group.tensor)})" for it in best[:6]
    )
    if len(best) > 6:
        shown += f", and {len(best) - 6} more"
    loc = best[0].group.tensor.loc if best and best[0].group.tensor.loc else UNKNOWN_LOC
    used = max(high, best_bytes)
    if memory == "psum":
        raise NkiError(
            "err_psum_total_capacity_exceeded",
            loc,
            used=used,
            limit=capacity,
            banks=capacity // 2048,
            tensors=shown,
        )
    raise NkiError(
        "err_sbuf_capacity_exceeded", loc, buffer="SBUF", used=used, limit=capacity, tensors=shown
    )


def _where(t: Tensor) -> str:
    return str(t.loc) if t.loc else "?"
