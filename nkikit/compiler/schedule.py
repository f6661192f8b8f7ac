"""Dependencies and scheduling: replay the lowered kernel iteration by iteration and time
every instruction.

The model (all of it; the constants live in the Target):

* Each compute engine (Tensor, Vector, Scalar, GpSimd) executes its instructions in program
  order, one at a time, in parallel with the other engines [A2].
* An instruction starts when its engine is free and its data dependencies are done.
  Dependencies go through memory: read-after-write, write-after-read and write-after-write
  on the granules of the buffer an operand touches (see :class:`~.regions.Tracked`).  With
  multi-buffering, iteration ``i`` and ``i + k`` of a loop use different buffers and so do
  not depend on each other.
* Waiting on another engine costs a semaphore latency (``semaphore_cycles`` of the waiting
  engine).  Waiting on one's own engine costs nothing for TensorE (accumulation chains are
  pipelined) and ``dependent_overhead_cycles`` for Vector/Scalar/GpSimd (the result must
  leave the pipeline before it is read again) [A2, PG].
* A DMA is split by partitions over the DMA queues (``dma_partitions_per_queue`` each); its
  transfer starts ``dma_fixed_ns`` after its dependencies are met [DMA, DMABW].  Each queue
  moves one piece at a time; a piece that is ready earlier may fill an idle gap before
  pieces issued earlier in program order (queues are round-robin served rings, not one
  FIFO).  A piece is shown busy from when its fixed cost could begin on an idle queue to
  the end of its transfer (so pieces of one queue may overlap in the profile, as the
  profiler allows).  Dependents of a DMA wait for its last piece.
* On NeuronCore-v2 (trn1) VectorE and ScalarE cannot access PSUM at the same time (the
  compiler serializes them; TensorE may write PSUM alongside either) [A2]; NC-v3 lifts
  this [A3].  Their PSUM-touching instructions there take one shared PSUM port in turn.
* Two tensors sharing memory (disjoint lifetimes) are ordered: the first use of the later
  one waits for the last use of the earlier one.  On-chip memory is cut into cells (partition
  quadrant x byte range between placement boundaries); an allocation takes its buffer's
  cells over and waits for the last access of each cell's previous tenant, so the cost is
  per cell of the allocation, not per tensor the memory was ever shared with.  The tensors
  of one rotation group are one buffer set (one tracked buffer): their turns on a buffer
  are ordered by the data dependencies on its granules, as a rolled loop's iterations are.

Instructions are produced in program order with exact times in one pass; no graph is built.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence

from .lower import DMA, ENGINES, LOOP, OP, LoweredKernel, StaticInstr
from .regions import Region, Tracked

_MAX_DEPS = 6
_QUADRANT = 32  # partitions per quadrant: tensors start at multiples of 32 [A2]
_QUADRANTS = 4
_MAX_GAPS = 256
_MIN_GAP_NS = 1.0


class Trace:
    """The columns of the scheduled instruction stream (one entry per instruction), as
    compact arrays: a million instructions take tens of megabytes, not a Python object
    each.  ``deps`` is ragged: instruction ``i``'s dependencies are
    ``dep_ids[dep_ptr[i]:dep_ptr[i + 1]]``."""

    __slots__ = ("engine", "sid", "start", "end", "parts", "hbm_offset", "dep_ptr", "dep_ids")

    def __init__(self) -> None:
        # 32-bit where it suffices: build_program refuses more than 2^31 instructions
        self.engine = array("b")  # 0..4 compute engines, 5 + q for DMA queue q
        self.sid = array("i")  # instruction kind (static row)
        self.start = array("d")
        self.end = array("d")
        self.parts = array("i")
        self.hbm_offset = array("q")
        self.dep_ptr = array("q", [0])
        self.dep_ids = array("i")

    def __len__(self) -> int:
        return len(self.sid)

    def deps(self, i: int) -> tuple[int, ...]:
        return tuple(self.dep_ids[self.dep_ptr[i] : self.dep_ptr[i + 1]])


class Scheduler:
    """Times the instructions of one lowered kernel.  ``run()`` returns the :class:`Trace`."""

    def __init__(self, lk: LoweredKernel) -> None:
        self.lk = lk
        t = lk.target
        self.target = t
        self.env = [0] * max(lk.env_size, 1)
        self.free = [0.0] * 5  # compute engines
        self.q_tail = [0.0] * t.dma_queues  # when each queue is idle for good
        self.gap_start: list[list[float]] = [[] for _ in range(t.dma_queues)]
        self.gap_end: list[list[float]] = [[] for _ in range(t.dma_queues)]
        self.next_q = 0
        self.trace = Trace()
        # granule state, one flat list per field; index = tracked.base + buffer * granules + cell
        size = 0
        for tr in lk.tracked:
            tr.base = size
            size += tr.buffers * tr.granules
        self.w_end = [0.0] * size
        self.w_id = [-1] * size
        self.w_eng = [-1] * size
        self.r_end = [0.0] * size
        self.r_id = [-1] * size
        self.r_eng = [-1] * size
        n = len(lk.tracked)
        # current buffer of each lane of each tracked tensor (see Tracked.lanes)
        self.slot = [0] * sum(tr.lanes for tr in lk.tracked)
        self.count = [0] * n  # allocations so far
        self._tenancy(lk)
        self.dma_fixed = t.dma_fixed_ns
        # kinds that take the shared Vector/Scalar PSUM port (NC-v2 only), and when it frees
        shared = (ENGINES.index("vector"), ENGINES.index("scalar"))
        self.psum_port_kinds = frozenset(
            k.index
            for k in lk.kinds
            if t.nc_version <= 2
            and k.engine in shared
            and (k.bytes.get("psum_read_bytes", 0) or k.bytes.get("psum_write_bytes", 0))
        )
        self.psum_port = 0.0

    def _tenancy(self, lk: LoweredKernel) -> None:
        """Cells of on-chip memory and the tables that order their tenants.  A tenant is
        one buffer of one tracked on-chip tensor, numbered ``tr.tbase + buffer``."""
        self.tbase = [-1] * len(lk.tracked)
        self.cells: list[list[int]] = []  # per tenant: its cells
        onchip = [tr for tr in lk.tracked if tr.placement is not None]
        n_cells = 0
        for memory in ("sbuf", "psum"):
            mine = [tr for tr in onchip if tr.placement.memory == memory]
            bounds = sorted(
                {
                    a
                    for tr in mine
                    for b in range(tr.buffers)
                    for a in (tr.placement.address(b), tr.placement.address(b) + tr.placement.size)
                }
            )
            seg = {a: k for k, a in enumerate(bounds)}
            n_seg = max(len(bounds) - 1, 0)
            for tr in mine:
                p = tr.placement
                self.tbase[tr.index] = len(self.cells)
                quads = range(
                    p.partition // _QUADRANT, (p.partition + p.partitions - 1) // _QUADRANT + 1
                )
                for b in range(tr.buffers):
                    s0, s1 = seg[p.address(b)], seg[p.address(b) + p.size]
                    self.cells.append(
                        [n_cells + q * n_seg + c for q in quads for c in range(s0, s1)]
                    )
            n_cells += _QUADRANTS * n_seg
        self.owner = [-1] * n_cells  # tenant holding each cell
        n = len(self.cells)
        # per tenant: its last access (end, instruction, engine), and the floor set at its
        # allocation from the previous tenants of its cells (None: nothing to wait for)
        self.t_end = [0.0] * n
        self.t_id = [-1] * n
        self.t_eng = [-1] * n
        self.floor: list[tuple[float, int, int] | None] = [None] * n
        self.floors = 0  # tenants with a floor: skip the check while there are none

    # -- the replay --------------------------------------------------------------------------
    def run(self) -> Trace:
        self._steps(self.lk.steps)
        return self.trace

    def _steps(self, steps: list) -> None:
        env = self.env
        for st in steps:
            kind = st[0]
            if kind == OP:
                si: StaticInstr = st[1]
                if si.engine == DMA:
                    self._dma(si)
                else:
                    self._compute(si)
            elif kind == LOOP:
                _, slot, trip, body = st
                for i in range(trip):
                    env[slot] = i
                    self._steps(body)
            else:  # ALLOC
                self._alloc(st[1], st[2])

    def _alloc(self, tr: Tracked, lane: int) -> None:
        k = tr.index
        buf = self.count[k] % tr.buffers
        self.count[k] += 1
        self.slot[tr.lane0 + lane] = buf
        tb = self.tbase[k]
        if tb < 0:
            return
        me = tb + buf
        owner, t_end, t_id = self.owner, self.t_end, self.t_id
        best = -1
        for c in self.cells[me]:
            o = owner[c]
            if o != me:
                if o >= 0 and t_id[o] >= 0 and (best < 0 or t_end[o] > t_end[best]):
                    best = o
                owner[c] = me
        old = self.floor[me]
        if best >= 0:
            self.floor[me] = f = (t_end[best], t_id[best], self.t_eng[best])
            # what waited for the previous tenant waits for this one: its successors need
            # not look further back, even if this tenant is never accessed
            if f[0] >= t_end[me]:
                t_end[me], t_id[me], self.t_eng[me] = f
            self.floors += old is None
        elif old is not None:
            self.floor[me] = None
            self.floors -= 1

    # -- regions -------------------------------------------------------------------------------
    def _cells(self, reg: Region) -> Sequence[int]:
        tr = reg.tracked
        off = tr.base + self.slot[reg.slot] * tr.granules
        fixed = reg.fixed
        if fixed is not None:
            if len(fixed) == 1:
                return (off + fixed[0],)
            return [off + c for c in fixed]
        env = self.env
        r = reg.r_const
        for e, c in reg.r_terms:
            r += c * env[e]
        col = reg.c_const
        for e, c in reg.c_terms:
            col += c * env[e]
        nr, nc = tr.n_rows, tr.n_cols
        r0 = r // tr.row_g
        r1 = (r + reg.r_span - 1) // tr.row_g
        c0 = col // tr.col_g
        c1 = (col + reg.c_span - 1) // tr.col_g
        r0 = 0 if r0 < 0 else nr - 1 if r0 >= nr else r0
        r1 = 0 if r1 < 0 else nr - 1 if r1 >= nr else r1
        c0 = 0 if c0 < 0 else nc - 1 if c0 >= nc else c0
        c1 = 0 if c1 < 0 else nc - 1 if c1 >= nc else c1
        if r0 == r1:
            base = off + r0 * nc
            return range(base + c0, base + c1 + 1)
        return [off + rr * nc + cc for rr in range(r0, r1 + 1) for cc in range(c0, c1 + 1)]

    def _ready(
        self, si: StaticInstr, eng: int
    ) -> tuple[float, dict[int, float], tuple[list, list]]:
        """Earliest start allowed by data dependencies, the dependencies (id -> end) and the
        granules read and written."""
        ready = 0.0
        deps: dict[int, float] = {}
        w_end, w_id, w_eng = self.w_end, self.w_id, self.w_eng
        wait = si.wait_ns
        same = si.same_engine_raw_ns
        read_cells = []
        for reg in si.reads:
            cells = self._cells(reg)
            read_cells.append(cells)
            for g in cells:
                wid = w_id[g]
                if wid < 0:
                    continue
                e = w_end[g]
                t = e + (same if w_eng[g] == eng else wait)
                if t > ready:
                    ready = t
                if wid not in deps:
                    deps[wid] = e
        write_cells = []
        r_end, r_id, r_eng = self.r_end, self.r_id, self.r_eng
        for reg in si.writes:
            cells = self._cells(reg)
            write_cells.append(cells)
            for g in cells:
                wid = w_id[g]
                if wid >= 0:
                    e = w_end[g]
                    t = e if w_eng[g] == eng else e + wait
                    if t > ready:
                        ready = t
                    if wid not in deps:
                        deps[wid] = e
                rid = r_id[g]
                if rid >= 0:
                    e = r_end[g]
                    t = e if r_eng[g] == eng else e + wait
                    if t > ready:
                        ready = t
                    if rid not in deps:
                        deps[rid] = e
        if self.floors:
            floor, tbase, slot = self.floor, self.tbase, self.slot
            for reg in (*si.reads, *si.writes):
                k = reg.tracked.index
                if tbase[k] < 0:
                    continue
                f = floor[tbase[k] + slot[reg.slot]]
                if f is not None:
                    t = f[0] + (0.0 if f[2] == eng else wait)
                    if t > ready:
                        ready = t
                    deps.setdefault(f[1], f[0])
        return ready, deps, (read_cells, write_cells)

    def _commit(self, si: StaticInstr, end: float, iid: int, eng: int, cells) -> None:
        read_cells, write_cells = cells
        r_end, r_id, r_eng = self.r_end, self.r_id, self.r_eng
        for cs in read_cells:
            for g in cs:
                if end > r_end[g]:
                    r_end[g] = end
                    r_id[g] = iid
                    r_eng[g] = eng
        w_end, w_id, w_eng = self.w_end, self.w_id, self.w_eng
        for cs in write_cells:
            for g in cs:
                w_end[g] = end
                w_id[g] = iid
                w_eng[g] = eng
                r_id[g] = -1
                r_end[g] = 0.0
        tbase, slot, t_end = self.tbase, self.slot, self.t_end
        for reg in (*si.reads, *si.writes):
            k = reg.tracked.index
            if tbase[k] >= 0:
                me = tbase[k] + slot[reg.slot]
                if end >= t_end[me] or self.t_id[me] < 0:
                    t_end[me] = end
                    self.t_id[me] = iid
                    self.t_eng[me] = eng

    @staticmethod
    def _dep_ids(deps: dict[int, float]) -> tuple[int, ...]:
        if len(deps) <= _MAX_DEPS:
            return tuple(sorted(deps))
        # keep the dependencies that finish last: those are the ones that held it back
        return tuple(sorted(sorted(deps, key=deps.__getitem__)[-_MAX_DEPS:]))

    # -- compute engines ---------------------------------------------------------------------
    def _compute(self, si: StaticInstr) -> None:
        eng = si.engine
        ready, deps, cells = self._ready(si, eng)
        free = self.free[eng]
        start = ready if ready > free else free
        port = si.index in self.psum_port_kinds
        if port and self.psum_port > start:
            start = self.psum_port
        end = start + si.duration_ns
        self.free[eng] = end
        if port:
            self.psum_port = end
        tr = self.trace
        iid = len(tr.sid)
        tr.engine.append(eng)
        tr.sid.append(si.index)
        tr.start.append(start)
        tr.end.append(end)
        tr.parts.append(si.partitions)
        tr.hbm_offset.append(0)
        if deps:
            tr.dep_ids.extend(self._dep_ids(deps))
        tr.dep_ptr.append(len(tr.dep_ids))
        self._commit(si, end, iid, eng, cells)

    # -- DMA ---------------------------------------------------------------------------------------
    def _place(self, q: int, t: float, d: float, lead: float) -> tuple[float, float]:
        """Place a transfer of ``d`` ns that may start at ``t`` on queue ``q``; returns the
        (shown start, transfer start).

        The transfer goes into the first idle gap that fits, else after the last one.  The
        piece is shown busy from up to ``lead`` ns (its fixed cost) before the transfer, as
        far back as the queue was idle when it was placed; the fixed cost does not reserve
        the queue, so a later piece may still fill that time (DMA rows may overlap).  Only
        the latest ``_MAX_GAPS`` gaps are remembered (a ring's reordering window is finite),
        which also keeps this O(1).
        """
        tail = self.q_tail[q]
        gs, ge = self.gap_start[q], self.gap_end[q]
        if t >= tail:
            if t - tail > _MIN_GAP_NS:
                gs.append(tail)
                ge.append(t)
                if len(gs) > _MAX_GAPS:
                    del gs[0], ge[0]
            self.q_tail[q] = t + d
            return max(t - lead, tail), t
        i = bisect_right(ge, t)
        n = len(gs)
        while i < n:
            lo, hi = gs[i], ge[i]
            s = lo if lo > t else t
            if s + d <= hi:
                if s - lo > _MIN_GAP_NS:
                    ge[i] = s
                    if hi - (s + d) > _MIN_GAP_NS:
                        gs.insert(i + 1, s + d)
                        ge.insert(i + 1, hi)
                        if len(gs) > _MAX_GAPS:  # the bound holds here too: the list
                            del gs[0], ge[0]  # stays short, each call O(_MAX_GAPS)
                elif hi - (s + d) > _MIN_GAP_NS:
                    gs[i] = s + d
                else:
                    del gs[i], ge[i]
                return max(s - lead, lo), s
            i += 1
        self.q_tail[q] = tail + d
        return tail, tail

    def _dma(self, si: StaticInstr) -> None:
        ready, deps, cells = self._ready(si, DMA)
        t0 = ready + self.dma_fixed
        tgt = self.target
        nq = tgt.dma_queues
        parts = si.partitions
        per_q = tgt.dma_partitions_per_queue
        pieces = min(nq, -(-parts // per_q))
        q = self.next_q
        self.next_q = (q + pieces) % nq
        dep_ids = self._dep_ids(deps) if deps else ()
        hoff = 0
        if si.tensor_name:
            env = self.env
            hoff = si.hbm_const
            for e, c in si.hbm_terms:
                hoff += c * env[e]
        tr = self.trace
        first = len(tr.sid)
        last_end = 0.0
        last_id = -1
        p0 = 0
        base, extra = divmod(parts, pieces)
        dur, lead, stride = si.duration_ns, self.dma_fixed, si.hbm_part_stride
        # the pieces' columns, appended to the trace together
        queues, shown_at, ends, sizes, offsets = [], [], [], [], []
        for k in range(pieces):
            n = base + (1 if k < extra else 0)
            d = n * dur
            shown, s = self._place(q, t0, d, lead)
            e = s + d
            queues.append(5 + q)
            shown_at.append(shown)
            ends.append(e)
            sizes.append(n)
            offsets.append(hoff + p0 * stride)
            if e >= last_end:
                last_end, last_id = e, first + k
            p0 += n
            q = q + 1 if q + 1 < nq else 0
        tr.engine.extend(queues)
        tr.sid.extend([si.index] * pieces)
        tr.start.extend(shown_at)
        tr.end.extend(ends)
        tr.parts.extend(sizes)
        tr.hbm_offset.extend(offsets)
        at = len(tr.dep_ids)
        nd = len(dep_ids)
        if nd:
            tr.dep_ids.extend(dep_ids * pieces)
        tr.dep_ptr.extend(range(at + nd, at + nd * pieces + 1, nd) if nd else [at] * pieces)
        self._commit(si, last_end, last_id, DMA, cells)


def schedule(lk: LoweredKernel) -> Trace:
    """Time every instruction of ``lk`` (see the module docstring for the model)."""
    return Scheduler(lk).run()
