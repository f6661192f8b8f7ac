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
* Two tensors sharing memory (disjoint lifetimes) are ordered: the first use of the later
  one waits for the last use of the earlier one.

Instructions are produced in program order with exact times in one pass; no graph is built.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from .lower import DMA, LOOP, OP, LoweredKernel, StaticInstr
from .regions import Region, Tracked

_MAX_DEPS = 6
_MAX_GAPS = 256
_MIN_GAP_NS = 1.0


class Trace:
    """The columns of the scheduled instruction stream (one entry per instruction)."""

    __slots__ = ("engine", "sid", "start", "end", "parts", "hbm_offset", "deps")

    def __init__(self) -> None:
        self.engine: list[int] = []  # 0..4 compute engines, 5 + q for DMA queue q
        self.sid: list[int] = []  # static instruction index
        self.start: list[float] = []
        self.end: list[float] = []
        self.parts: list[int] = []
        self.hbm_offset: list[int] = []
        self.deps: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return len(self.sid)


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
        self.slot = [0] * n  # current buffer of each tracked tensor
        self.count = [0] * n  # allocations so far
        # per (tracked, buffer): floor set at allocation from previous tenants of the memory
        self.floor: dict[tuple[int, int], tuple[float, int, int]] = {}
        # per (tensor uid, buffer): last access end, for tensors that share memory
        self.last: dict[tuple[int, int], tuple[float, int, int]] = {}
        self.dma_fixed = t.dma_fixed_ns

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
                self._alloc(st[1])

    def _alloc(self, tr: Tracked) -> None:
        k = tr.index
        buf = self.count[k] % tr.buffers
        self.count[k] += 1
        self.slot[k] = buf
        if not tr.shared:
            return
        best = (0.0, -1, -1)
        for uid, kb in self.lk.allocation.shared.get((tr.tensor.uid, buf), ()):
            got = self.last.get((uid, kb))
            if got is not None and got[0] > best[0]:
                best = got
        if best[1] >= 0:
            self.floor[(k, buf)] = best
        else:
            self.floor.pop((k, buf), None)

    # -- regions -------------------------------------------------------------------------------
    def _cells(self, reg: Region) -> Sequence[int]:
        tr = reg.tracked
        off = tr.base + self.slot[tr.index] * tr.granules
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
        if self.floor:
            for reg in (*si.reads, *si.writes):
                tr = reg.tracked
                f = self.floor.get((tr.index, self.slot[tr.index]))
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
        if self.lk.allocation.shared:
            for reg in (*si.reads, *si.writes):
                tr = reg.tracked
                if tr.shared:
                    key = (tr.tensor.uid, self.slot[tr.index])
                    old = self.last.get(key)
                    if old is None or end >= old[0]:
                        self.last[key] = (end, iid, eng)

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
        end = start + si.duration_ns
        self.free[eng] = end
        tr = self.trace
        iid = len(tr.sid)
        tr.engine.append(eng)
        tr.sid.append(si.index)
        tr.start.append(start)
        tr.end.append(end)
        tr.parts.append(si.partitions)
        tr.hbm_offset.append(0)
        tr.deps.append(self._dep_ids(deps) if deps else ())
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
        last_end = 0.0
        last_id = -1
        p0 = 0
        base, extra = divmod(parts, pieces)
        for k in range(pieces):
            n = base + (1 if k < extra else 0)
            d = n * si.duration_ns
            shown, s = self._place(q, t0, d, self.dma_fixed)
            e = s + d
            iid = len(tr.sid)
            tr.engine.append(5 + q)
            tr.sid.append(si.index)
            tr.start.append(shown)
            tr.end.append(e)
            tr.parts.append(n)
            tr.hbm_offset.append(hoff + p0 * si.hbm_part_stride)
            tr.deps.append(dep_ids)
            if e >= last_end:
                last_end, last_id = e, iid
            p0 += n
            q = q + 1 if q + 1 < nq else 0
        self._commit(si, last_end, last_id, DMA, cells)


def schedule(lk: LoweredKernel) -> Trace:
    """Time every instruction of ``lk`` (see the module docstring for the model)."""
    return Scheduler(lk).run()
