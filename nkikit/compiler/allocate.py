"""SBUF and PSUM allocation: a partition range and a byte offset for every on-chip tensor.

Contract of :func:`allocate`:

* Every SBUF/PSUM tensor of the kernel gets a :class:`Placement`: first partition, partition
  count, byte offset (the same in every partition it spans [PM, A2]), bytes per buffer and
  a buffer count.  Buffer ``k`` lives at ``offset + k * size``.
* Tensors allocated in an ``affine_range`` body get up to ``target.max_buffers`` buffers
  (one per in-flight iteration), so that iteration ``i + 1`` can load while iteration ``i``
  computes, as the Neuron compiler pipelines affine loops.  ``sequential_range`` bodies and
  top-level tensors get one buffer.  When memory is short the biggest multi-buffered
  tensors lose buffers first.
* Two placements that overlap in memory never hold tensors that are live at the same time.
  Liveness is static: a tensor lives from its allocation to its last use, and a use inside
  a loop that the tensor is declared outside of keeps it live for the whole loop.  The first
  attempt also refuses to share memory between tensors of a common loop (their iterations
  may overlap once pipelined); only if that does not fit is plain static liveness used.
* A PSUM tile never straddles a 2 KiB bank: tiles are padded to a power of two and aligned
  to it, and tiles of a bank or more start on a bank boundary [A2, MIG].
* Partition starts follow the hardware rule: 0 when P > 64, 0 or 64 when P > 32, a multiple
  of 32 otherwise [A2].
* If nothing fits, :class:`~nkikit.errors.NkiError` ``err_sbuf_capacity_exceeded`` or
  ``err_psum_total_capacity_exceeded`` names the live tensors with sizes and lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

from ..errors import UNKNOWN_LOC, NkiError
from ..ir.core import ON_CHIP, Access, Alloc, Kernel, Loop, Op, Tensor
from ..targets import Target


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one on-chip tensor lives."""

    tensor: Tensor
    memory: str  # "sbuf" | "psum"
    partition: int
    partitions: int
    offset: int  # byte offset of buffer 0 in each partition
    size: int  # bytes per partition of one buffer, padding included
    buffers: int
    live: tuple[int, int]  # static program points [first, last]

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
        return {
            "tensor": self.tensor.name,
            "memory": self.memory,
            "partition": self.partition,
            "partitions": self.partitions,
            "offset": self.offset,
            "size": self.size,
            "buffers": self.buffers,
        }


@dataclass(slots=True)
class Allocation:
    """The placements of a kernel plus which buffers share memory.

    ``shared[(uid, k)]`` lists the ``(uid2, k2)`` buffers of *other* tensors that overlap
    buffer ``k`` of tensor ``uid``: the scheduler makes a tensor's first use wait for the
    last use of whatever lived there before.
    """

    placements: dict[int, Placement]
    used: dict[str, int]
    mode: str
    shared: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)

    def __getitem__(self, t: Tensor) -> Placement:
        return self.placements[t.uid]

    def __contains__(self, t: Tensor) -> bool:
        return t.uid in self.placements

    def buffers(self, t: Tensor) -> int:
        p = self.placements.get(t.uid)
        return p.buffers if p else 1


# ---------------------------------------------------------------------------------------------
# liveness


@dataclass(slots=True)
class _Info:
    tensor: Tensor
    lo: int
    hi: int
    execs: int  # how many times the Alloc runs per kernel instance
    pipelined: bool  # innermost enclosing loop is an affine_range


def _liveness(kernel: Kernel) -> dict[int, _Info]:
    infos: dict[int, _Info] = {}
    point = 0

    def touch(t: Tensor, loops: tuple[Loop, ...], spans: dict[int, int]) -> None:
        if t.buffer not in ON_CHIP:
            return
        info = infos.get(t.uid)
        if info is None:  # used without an Alloc statement: live from first use
            info = infos[t.uid] = _Info(t, point, point, 1, False)
        depth = len(t.scope)
        hi = spans[id(loops[depth])] if len(loops) > depth else point
        info.hi = max(info.hi, hi)

    def walk(body: list, loops: tuple[Loop, ...], spans: dict[int, int]) -> None:
        nonlocal point
        for s in body:
            point += 1
            if isinstance(s, Alloc):
                t = s.tensor
                if t.buffer in ON_CHIP:
                    execs = prod(lp.trip for lp in loops)
                    pipelined = bool(loops) and loops[-1].kind == "affine"
                    infos[t.uid] = _Info(t, point, point, execs, pipelined)
            elif isinstance(s, Op):
                for a in (*s.outs, *s.ins):
                    if isinstance(a, Access):
                        touch(a.tensor, loops, spans)
            elif isinstance(s, Loop):
                spans[id(s)] = point + _count(s.body)
                walk(s.body, loops + (s,), spans)

    walk(kernel.body, (), {})
    return infos


def _count(body: list) -> int:
    n = 0
    for s in body:
        n += 1
        if isinstance(s, Loop):
            n += _count(s.body)
    return n


# ---------------------------------------------------------------------------------------------
# sizes


def _layout(t: Tensor, target: Target) -> tuple[int, int]:
    """(bytes per partition of one buffer, alignment)."""
    if t.buffer == "psum":
        blocks = prod(t.shape[: t.par_axis])
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
    return max(t.bytes_per_partition, 1), target.sbuf_align


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
# first fit


@dataclass(slots=True)
class _Item:
    info: _Info
    size: int
    align: int
    buffers: int
    partitions: int
    want: int = 1

    @property
    def footprint(self) -> int:
        return self.size * self.buffers


def _first_fit(
    items: list[_Item], mode: str, total_partitions: int, order: str
) -> tuple[dict[int, tuple[int, int]], int]:
    """Place every item at the lowest offset that clears conflicting placed items."""
    if order == "size":
        seq = sorted(items, key=lambda it: (-it.footprint, it.info.lo))
    else:
        seq = sorted(items, key=lambda it: (it.info.lo, -it.footprint))
    n = len(seq)
    # placed items as columns, so each item's conflicts are found with one vector test
    # (unrolled kernels have thousands of tiles; a Python scan per pair was quadratic)
    lo = np.empty(n, np.int64)
    hi = np.empty(n, np.int64)
    scope = np.empty(n, np.int64)  # id of the outermost enclosing loop, -1 for none
    part = np.empty(n, np.int64)
    parts = np.empty(n, np.int64)
    off_lo = np.empty(n, np.int64)
    off_hi = np.empty(n, np.int64)
    result: dict[int, tuple[int, int]] = {}
    high = 0
    for k, it in enumerate(seq):
        info = it.info
        mine = id(info.tensor.scope[0]) if info.tensor.scope else -1
        hit = (lo[:k] <= info.hi) & (hi[:k] >= info.lo)
        if mode == "pipelined" and mine != -1:
            hit |= scope[:k] == mine
        idx = np.flatnonzero(hit)
        best: tuple[int, int] | None = None
        for pstart in _starts(it.partitions, total_partitions):
            sel = idx[(part[idx] < pstart + it.partitions) & (pstart < part[idx] + parts[idx])]
            rects = sorted(zip(off_lo[sel].tolist(), off_hi[sel].tolist()))
            off = 0
            for r_lo, r_hi in rects:
                if off + it.footprint <= r_lo:
                    break
                if r_hi > off:
                    off = _align(r_hi, it.align)
            if best is None or off < best[1]:
                best = (pstart, off)
        assert best is not None
        lo[k], hi[k], scope[k] = info.lo, info.hi, mine
        part[k], parts[k] = best[0], it.partitions
        off_lo[k], off_hi[k] = best[1], best[1] + it.footprint
        result[info.tensor.uid] = best
        high = max(high, best[1] + it.footprint)
    return result, high


# ---------------------------------------------------------------------------------------------
# the allocator


def allocate(kernel: Kernel, target: Target) -> Allocation:
    """Place every SBUF and PSUM tensor of ``kernel`` (see the module docstring)."""
    infos = _liveness(kernel)
    items: dict[str, list[_Item]] = {"sbuf": [], "psum": []}
    for info in infos.values():
        t = info.tensor
        size, align = _layout(t, target)
        want = (
            min(target.max_buffers if info.pipelined else target.sequential_buffers, info.execs)
            if info.execs > 1
            else 1
        )
        if t.buffer == "psum":
            want = min(want, target.psum_banks)
        want = max(want, 1)
        items[t.buffer].append(_Item(info, size, align, want, t.partitions, want))
    capacity = {"sbuf": target.sbuf_bytes, "psum": target.psum_bytes}

    placements: dict[int, Placement] = {}
    used: dict[str, int] = {}
    modes: list[str] = []
    for memory, its in items.items():
        placed, high, mode = _fit(its, capacity[memory], target.partitions)
        if placed is None:
            _fail(memory, its, high, capacity[memory])
        used[memory] = high
        modes.append(mode)
        for it in its:
            p, off = placed[it.info.tensor.uid]
            placements[it.info.tensor.uid] = Placement(
                it.info.tensor,
                memory,
                p,
                it.partitions,
                off,
                it.size,
                it.buffers,
                (it.info.lo, it.info.hi),
            )
    mode = "static" if "static" in modes else "pipelined"
    return Allocation(placements, used, mode, _shared(placements))


def _fit(items: list[_Item], capacity: int, partitions: int):
    """Try generous plans first: pipelined liveness while shedding buffers, then static."""
    if not items:
        return {}, 0, "pipelined"
    high = 0
    for mode in ("pipelined", "static"):
        for it in items:
            it.buffers = it.want
        while True:
            for order in ("size", "start"):
                placed, high = _first_fit(items, mode, partitions, order)
                if high <= capacity:
                    return placed, high, mode
            multi = [it for it in items if it.buffers > 1]
            if not multi:
                break
            # keep double buffering as long as possible: shed the third and fourth buffers
            # of every tensor before any tensor drops to a single buffer; the biggest first,
            # an eighth of them per round so that kernels with thousands of tiles converge
            multi.sort(key=lambda it: (it.buffers > 2, it.footprint, it.size), reverse=True)
            for it in multi[: max(1, len(multi) // 8)]:
                it.buffers -= 1
    return None, high, "static"


def _shared(placements: dict[int, Placement]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    by_mem: dict[str, list[Placement]] = {}
    for p in placements.values():
        by_mem.setdefault(p.memory, []).append(p)
    shared: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for plist in by_mem.values():
        plist.sort(key=lambda p: p.offset)
        for i, a in enumerate(plist):
            for b in plist[i + 1 :]:
                if b.offset >= a.end:
                    break
                if not (
                    a.partition < b.partition + b.partitions
                    and b.partition < a.partition + a.partitions
                ):
                    continue
                for ka in range(a.buffers):
                    lo_a = a.address(ka)
                    for kb in range(b.buffers):
                        lo_b = b.address(kb)
                        if lo_a < lo_b + b.size and lo_b < lo_a + a.size:
                            shared.setdefault((a.tensor.uid, ka), []).append((b.tensor.uid, kb))
                            shared.setdefault((b.tensor.uid, kb), []).append((a.tensor.uid, ka))
    return shared


def _fail(memory: str, items: list[_Item], high: int, capacity: int) -> None:
    # Report what is live at the fullest program point: that is what does not fit.
    points = sorted({it.info.lo for it in items})
    best: list[_Item] = []
    best_bytes = -1
    for pt in points:
        live = [it for it in items if it.info.lo <= pt <= it.info.hi]
        total = sum(it.size for it in live)
        if total > best_bytes:
            best, best_bytes = live, total
    best.sort(key=lambda it: -it.size)
    shown = ", ".join(
        f"{it.info.tensor.name} ({it.size} B, {_where(it.info.tensor)})" for it in best[:6]
    )
    if len(best) > 6:
        shown += f", and {len(best) - 6} more"
    loc = best[0].info.tensor.loc if best and best[0].info.tensor.loc else UNKNOWN_LOC
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
