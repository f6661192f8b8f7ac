"""Lowering: every IR op becomes a static instruction on the engine that runs it.

Ops are data.  :data:`PRIMS` has one :class:`Lowering` per IR primitive: the engine (or
``None`` when the op's ``engine`` attribute decides), the opcode, the cost formula in cycles
of that engine and, for TensorE, the FLOPs.  Cost formulas are the legacy "Estimated
instruction cost" column of the ISA docs [LISA] (nki.md §3.3) with the §4.5 constants held
by the :class:`~nkikit.targets.Target`.  Bytes per memory come from the operands
themselves and need no table; a masked op counts only the elements its mask keeps (averaged
over the loop iterations and programs the mask depends on, see :func:`mask_fraction`).

:func:`lower` walks the kernel once and returns a :class:`LoweredKernel`: a tree of steps
(ops, allocations, rolled loops) mirroring the IR, where each op step holds a
:class:`StaticInstr` whose cost, bytes, FLOPs and operand regions are computed once.  The
scheduler replays the tree per loop iteration with integer arithmetic only.

Ops lowered alike (same line, primitive, attributes, operand tiles -- the steps of unrolled
code) share one :class:`InstrKind`; a :class:`StaticInstr` adds only its operand regions.
A spilled SBUF tensor (see :mod:`.allocate`) has a tracked buffer per SBUF segment; its
saves and reloads are DMA steps (opcodes ``..._SPILL_SAVE`` / ``..._SPILL_RELOAD``, through
an HBM area of the tensor's shape) after and before the uses they separate.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from math import prod

import numpy as np

from .. import dtypes
from ..errors import UNKNOWN_LOC
from ..ir import prims
from ..ir.affine import Affine, Axis, LoopVar, ProgramId, Sym
from ..ir.core import Access, Alloc, Kernel, Loop, Op, Tensor
from ..targets import Target
from .allocate import Allocation, Spill
from .costs import (
    OpView,
    c_bn_aggr,
    c_broadcast,
    c_elementwise,
    c_exponential,
    c_gpsimd,
    c_local_gather,
    c_matmul,
    c_matmul_mx,
    c_memset,
    c_partition_reduce,
    c_plain_n,
    c_quantize_mx,
    c_reciprocal,
    c_reduce,
    c_scalar_tensor_tensor,
    c_select,
    c_tensor_tensor,
    c_topk,
    c_transpose,
    c_two_pass,
    dma_ns_per_partition,
    f_broadcast,
    f_matmul,
    f_matmul_mx,
    f_transpose,
)
from .regions import (
    Region,
    Terms,
    Tracked,
    choose_granules,
    flat_offset,
    inner_stride_bytes,
    row_major,
    split_affine,
    tile_pf,
)

ENGINES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "sync")
TENSOR, VECTOR, SCALAR, GPSIMD, SYNC = range(5)
DMA = len(ENGINES)  # pseudo engine code of a whole DMA (its pieces run on queues)
_ENGINE_CODE = {name: k for k, name in enumerate(ENGINES)}


@dataclass(frozen=True, slots=True)
class Lowering:
    """How one IR primitive runs on its engine (which the primitive's record in
    ``nkikit/ir/prims.py`` names): opcode, cost in engine cycles, TensorE FLOPs (hardware,
    model)."""

    opcode: str
    cost: Callable[[OpView], float]
    flops: Callable[[OpView], tuple[float, float]] | None = None


PRIMS: dict[str, Lowering] = {
    "nc_matmul": Lowering("MATMUL", c_matmul, f_matmul),
    "nc_matmul_mx": Lowering("MATMUL_MX", c_matmul_mx, f_matmul_mx),
    "quantize_mx": Lowering("QUANTIZE_MX", c_quantize_mx),
    "nc_transpose": Lowering("TRANSPOSE", c_transpose, f_transpose),
    "partition_broadcast": Lowering("BROADCAST_MATMUL", c_broadcast, f_broadcast),
    "activation": Lowering("ACTIVATE", c_elementwise),
    "tensor_copy": Lowering("TENSOR_COPY", c_elementwise),
    "memset": Lowering("MEMSET", c_memset),
    "tensor_tensor": Lowering("TENSOR_TENSOR", c_tensor_tensor),
    "tensor_scalar": Lowering("TENSOR_SCALAR", c_elementwise),
    "scalar_tensor_tensor": Lowering("SCALAR_TENSOR_TENSOR", c_scalar_tensor_tensor),
    "tensor_reduce": Lowering("TENSOR_REDUCE", c_reduce),
    "tensor_tensor_scan": Lowering("TENSOR_TENSOR_SCAN", c_two_pass),
    "reciprocal": Lowering("RECIPROCAL", c_reciprocal),
    "select": Lowering("SELECT", c_select),
    "range_select": Lowering("RANGE_SELECT", c_elementwise),
    "select_reduce": Lowering("SELECT_REDUCE", c_elementwise),
    "bn_stats": Lowering("BN_STATS", c_elementwise),
    "bn_aggr": Lowering("BN_AGGR", c_bn_aggr),
    "dropout": Lowering("DROPOUT", c_elementwise),
    # random numbers: one pass over the destination (rng, rand2) on the engine's ALU; the
    # state moves are one short instruction [nki-0x.md §4.12; cost: guess, as dropout]
    "rng": Lowering("RNG", c_elementwise),
    "rand2": Lowering("RAND2", c_elementwise),
    "set_rng_seed": Lowering("SET_RNG_SEED", c_plain_n),
    "rand_set_state": Lowering("RAND_SET_STATE", c_plain_n),
    "rand_get_state": Lowering("RAND_GET_STATE", c_plain_n),
    "scalar_arith": Lowering("SCALAR_ARITH", c_gpsimd),
    "max8": Lowering("MAX8", c_plain_n),
    "nc_find_index8": Lowering("FIND_INDEX8", c_plain_n),
    "nc_match_replace8": Lowering("MATCH_REPLACE8", c_plain_n),
    "nc_stream_shuffle": Lowering("STREAM_SHUFFLE", c_elementwise),
    "iota": Lowering("IOTA", c_gpsimd),
    "affine_select": Lowering("AFFINE_SELECT", c_gpsimd),
    "tensor_partition_reduce": Lowering("PARTITION_REDUCE", c_partition_reduce),
    "local_gather": Lowering("LOCAL_GATHER", c_local_gather),
    "nc_n_gather": Lowering("N_GATHER", c_gpsimd),
    # a register instruction on the engine's sequencer, charged as a one-element GpSimd op
    "register_move": Lowering("REGISTER_MOVE", c_gpsimd),
    "rank_id": Lowering("RANK_ID", c_gpsimd),
    "ring_rank_id": Lowering("RING_RANK_ID", c_gpsimd),
    # guess: one GpSimd pass over each core's partition, as iota's cost
    "nonzero_with_count": Lowering("NONZERO_WITH_COUNT", c_gpsimd),
    "activate2": Lowering("ACTIVATE2", c_elementwise),
    "exponential": Lowering("EXPONENTIAL", c_exponential),
    # guess: one VectorE pass, the running value kept in the accumulator
    "tensor_scalar_cumulative": Lowering("TENSOR_SCALAR_CUMULATIVE", c_elementwise),
    # guess: one GpSimd pass over the ids, as iota's cost
    "sequence_bounds": Lowering("SEQUENCE_BOUNDS", c_gpsimd),
    "topk": Lowering("TOPK", c_topk),
}
"""Compute primitives.  DMA primitives run on the DMA queues (see :func:`_lower_dma`);
the ones no engine runs (``device_print``) exist only in simulation and lower to nothing."""

SKIPPED = prims.names_where(lambda p: not p.engines)


# ---------------------------------------------------------------------------------------------
# static instructions


@dataclass(slots=True)
class InstrKind:
    """What every op lowered alike shares: engine, opcode, cost, bytes, FLOPs, source line,
    operand description (one row of the Program's static table).  The steps of unrolled
    code are lowered alike, so a kernel has about as many kinds as lines of code."""

    index: int
    engine: int  # engine code, or DMA
    opcode: str
    duration_ns: float  # compute: whole instruction; DMA: transfer time of one partition
    partitions: int
    elements: int
    bytes: dict[str, int]  # totals per memory field of the profiler's Instruction
    flops: float
    model_flops: float
    dtype: str
    source: str
    text: str
    operands: str
    cycles: float = 0.0
    tensor_name: str = ""
    hbm_part_stride: int = 0  # HBM bytes between consecutive partitions of the tile
    same_engine_raw_ns: float = 0.0
    wait_ns: float = 0.0  # semaphore latency when waiting on another engine


@dataclass(slots=True, eq=False)
class StaticInstr:
    """An IR op, lowered: its :class:`InstrKind` plus its operand regions and HBM offset.
    Compute ops have a fixed duration; a DMA has a duration per partition and is split over
    the queues at schedule time.  The kind's fields the scheduler reads per instruction are
    copied here; the rest are properties.

    Ops lowered to the same kind, regions and HBM offset share one (the steps of unrolled
    code touch the same few tiles again and again): a kernel of a million ops holds a
    handful of these, not one per op (:attr:`LoweredKernel.instrs` pairs them with ops)."""

    kind: InstrKind
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    hbm_const: int = 0  # byte offset of the first HBM element at env = 0
    hbm_terms: Terms = ()
    index: int = 0  # the kind's index
    engine: int = 0
    duration_ns: float = 0.0
    partitions: int = 0
    tensor_name: str = ""
    hbm_part_stride: int = 0
    same_engine_raw_ns: float = 0.0
    wait_ns: float = 0.0

    @classmethod
    def of(
        cls, kind: InstrKind, reads: tuple, writes: tuple, hconst: int, hterms: Terms
    ) -> StaticInstr:
        k = kind
        return cls(
            k,
            reads,
            writes,
            hconst,
            hterms,
            k.index,
            k.engine,
            k.duration_ns,
            k.partitions,
            k.tensor_name,
            k.hbm_part_stride,
            k.same_engine_raw_ns,
            k.wait_ns,
        )

    @property
    def is_dma(self) -> bool:
        return self.engine == DMA

    @property
    def opcode(self) -> str:
        return self.kind.opcode

    @property
    def elements(self) -> int:
        return self.kind.elements

    @property
    def bytes(self) -> dict[str, int]:
        return self.kind.bytes

    @property
    def flops(self) -> float:
        return self.kind.flops

    @property
    def model_flops(self) -> float:
        return self.kind.model_flops

    @property
    def dtype(self) -> str:
        return self.kind.dtype

    @property
    def source(self) -> str:
        return self.kind.source

    @property
    def text(self) -> str:
        return self.kind.text

    @property
    def operands(self) -> str:
        return self.kind.operands

    @property
    def cycles(self) -> float:
        return self.kind.cycles


@dataclass(frozen=True, slots=True)
class LoweredOp:
    """One IR op (``op``) and the :class:`StaticInstr` it lowered to; reads the instruction's
    fields (``engine``, ``opcode``, ...) through."""

    op: Op
    instr: StaticInstr

    def __getattr__(self, name: str):
        if name in ("op", "instr"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.instr, name)


# A step of the lowered program: (OP, StaticInstr) | (ALLOC, Tracked, lane) |
# (LOOP, env slot, trip, steps).  OP and ALLOC steps are shared like their StaticInstr.
OP, ALLOC, LOOP = 0, 1, 2


@dataclass(slots=True)
class LoweredKernel:
    """The lowered program: the step tree the scheduler replays, the instruction kinds and
    the tracked buffers.  ``ops[i]`` lowered to ``lowered[i]`` (spill saves and reloads
    included, as DMA ops made by the compiler)."""

    kernel: Kernel
    target: Target
    allocation: Allocation
    steps: list
    ops: list[Op]
    lowered: list[StaticInstr]
    kinds: list[InstrKind]  # what they share, indexed by StaticInstr.index
    tracked: list[Tracked]
    env_size: int
    grid: tuple[int, ...]
    notes: list[str] = field(default_factory=list)

    @property
    def instrs(self) -> list[LoweredOp]:
        """One :class:`LoweredOp` per lowered IR op, in program order (made when asked)."""
        return [LoweredOp(op, si) for op, si in zip(self.ops, self.lowered)]


class _Lowerer:
    def __init__(self, kernel: Kernel, target: Target, alloc: Allocation) -> None:
        self.kernel = kernel
        self.target = target
        self.alloc = alloc
        self.env: dict[Sym, int] = {}
        for i, _ in enumerate(kernel.grid):
            self.env[ProgramId(i)] = i
        self.tracked: dict[int, Tracked] = {}
        self.regions: dict[tuple, Region] = {}
        self.ops: list[Op] = []  # every lowered op, and its instruction (shared)
        self.lowered: list[StaticInstr] = []
        self.shared: dict[tuple, tuple] = {}  # what identifies an instruction -> its OP step
        self.alloc_steps: dict[tuple[int, int], tuple] = {}  # (tracked, lane) -> ALLOC step
        self.kinds: list[InstrKind] = []
        self.kind_of: dict[tuple, InstrKind] = {}
        self.names: dict[int, str] = {}  # tensor uid -> name it is described by
        self.dtype_names: dict[object, str] = {}
        # spills, by (loop depth, program point) of the statement they follow / precede
        self.point = 0
        self.saves: dict[tuple[int, int], list[Spill]] = {}
        self.reloads: dict[tuple[int, int], list[Spill]] = {}
        for sp in alloc.spills:
            self.saves.setdefault((sp.depth, sp.save_after), []).append(sp)
            self.reloads.setdefault((sp.depth, sp.reload_before), []).append(sp)
        self.spill_areas: dict[int, Tensor] = {}
        self.notes: list[str] = []
        self.folded = _folded_memsets(kernel)
        self.psum_resident = _psum_broadcasts(kernel, target)
        self.flat_roots = {t.root.uid for t in kernel.tensors if t.base is not None}
        # the engine of every op whose engine the kernel left to the compiler, by id(op)
        self.placed: dict[int, str] = {}
        self.placed = _balance(self, kernel)

    # -- tracked buffers -------------------------------------------------------------------
    def track(self, t: Tensor) -> Tracked | None:
        root = t.root
        # the tensors of a rotation group are one buffer set, like one tensor of a loop
        key = self.alloc.leader.get(root.uid, root.uid)
        segs = self.alloc.segments.get(root.uid)
        if segs is not None:  # spilled: each SBUF segment is a buffer of its own
            return self._segment(root, segs)
        tr = self.tracked.get(key)
        if tr is not None:
            return tr
        if root.is_hbm:
            if root.kind in ("input", "const") and not root.mutable:
                return None  # never written: reads need no ordering
            if root.uid in self.flat_roots:
                rows, cols = 1, max(prod(root.shape), 1) * root.dtype.itemsize
            else:
                rows = root.shape[0] if root.shape else 1
                cols = (prod(root.shape[1:]) if len(root.shape) > 1 else 1) * root.dtype.itemsize
            tr = Tracked(len(self.tracked), root, 1, rows, cols)
        else:
            rows = root.shape[root.par_axis] if root.shape else 1
            place = self.alloc.placements.get(key)
            tr = Tracked(
                len(self.tracked),
                place.tensor if place is not None else root,
                place.buffers if place is not None else 1,
                rows,
                max(root.bytes_per_partition, 1),
                placement=place,
            )
        self.tracked[key] = tr
        return tr

    def _segment(self, t: Tensor, segs: list) -> Tracked:
        """The tracked buffer of the SBUF segment of spilled ``t`` live at this point."""
        k = next((k for k, q in enumerate(segs) if q.live[0] <= self.point <= q.live[1]), None)
        if k is None:
            k = max([0, *(k for k, q in enumerate(segs) if q.live[0] <= self.point)])
        key = ("segment", t.uid, k)
        tr = self.tracked.get(key)
        if tr is None:
            place = segs[k]
            rows = t.shape[t.par_axis] if t.shape else 1
            tr = Tracked(
                len(self.tracked),
                t,
                place.buffers,
                rows,
                max(t.bytes_per_partition, 1),
                placement=place,
            )
            self.tracked[key] = tr
        return tr

    def _spill_ops(self, spill: Spill, save: bool) -> list:
        """The steps of one spill: the save (a DMA to the tensor's HBM spill area) or the
        allocation of its next SBUF segment and the reload into it."""
        t = spill.tensor
        hbm = self.spill_areas.get(t.uid)
        if hbm is None:
            hbm = self.spill_areas[t.uid] = Tensor(
                f"{t.name}.spill", t.shape, t.dtype, "shared_hbm", kind="hbm", loc=t.loc
            )
        tile, area = Access.whole(t), Access.whole(hbm)
        loc = t.loc or UNKNOWN_LOC
        op = (
            Op("dma_copy", [area], [tile], {}, loc)
            if save
            else Op("dma_copy", [tile], [area], {}, loc)
        )
        steps: list = []
        if not save:
            steps.append(self._alloc_step(self.track(t), 0))
        key = ("spill", save, self._access_key(tile), self._access_key(area), loc)
        kind = self.kind_of.get(key)
        if kind is None:
            kind = self.kind_of[key] = self._dma_kind(op)
            kind.opcode += "_SPILL_SAVE" if save else "_SPILL_RELOAD"
            kind.tensor_name = ""  # not the kernel's data: no input-reload analysis
        steps.append(self._op_step(kind, op, *self._hbm_offset(op)))
        return steps

    def region(self, a: Access) -> Region | None:
        tr = self.track(a.tensor)
        if tr is None:
            return None
        t = a.tensor
        if a.indirect is not None:
            # rows chosen at run time: the whole tensor, so every access that may overlap
            # is ordered before / after it
            return self._region(tr, self._lane(t, tr), 0, (), tr.rows, 0, (), tr.cols)
        item = t.dtype.itemsize
        if t.is_hbm and tr.tensor.uid in self.flat_roots:
            # accessed through reshaped views: only the flat byte offset is comparable
            row: Affine = Affine()
            dims = list(range(len(t.shape)))
            const, terms = _linear(a, dims, row_major(list(t.shape)))
        elif t.is_hbm:
            row = a.index[0] if t.shape else Affine()
            rest = list(range(1, len(t.shape)))
            const, terms = _linear(a, rest, row_major([t.shape[d] for d in rest]))
        else:
            row = a.index[t.par_axis]
            rest = [d for d in range(len(t.shape)) if d != t.par_axis]
            const, terms = _linear(a, rest, row_major([t.shape[d] for d in rest]))
        r0, rterms, rspan = split_affine(row, a.shape, self.env)
        c0, cterms, cspan = _split(const, terms, a.shape, self.env)
        return self._region(
            tr,
            self._lane(t, tr),
            r0,
            rterms,
            rspan,
            c0 * item,
            _scale(cterms, item),
            cspan * item,
        )

    def _lane(self, t: Tensor, tr: Tracked) -> int:
        if tr.placement is None:
            return 0
        place = self.alloc.placements.get(t.root.uid)
        lane = place.lane if place is not None else 0
        if lane >= tr.lanes:
            tr.lanes = lane + 1
        return lane

    def _region(self, tr: Tracked, *key) -> Region:
        # one Region per distinct footprint: the steps of unrolled code touch the same
        # tiles again and again, and a region per access would hold memory per instruction
        full = (tr.index, *key)
        reg = self.regions.get(full)
        if reg is None:
            reg = self.regions[full] = Region(tr, *key)
            tr.regions.append(reg)
        return reg

    # -- ops ---------------------------------------------------------------------------------
    def lower_op(self, op: Op) -> tuple | None:
        """The OP step of ``op`` (None if it lowers to nothing)."""
        if op.prim in SKIPPED or id(op) in self.folded:
            return None
        key = self._key(op)
        kind = self.kind_of.get(key) if key is not None else None
        if kind is None:
            kind = self._kind(op)
            if key is not None:
                self.kind_of[key] = kind
        hconst, hterms = self._hbm_offset(op) if kind.engine == DMA else (0, ())
        return self._op_step(kind, op, hconst, hterms)

    def _op_step(self, kind: InstrKind, op: Op, hconst: int, hterms: Terms) -> tuple:
        """``(OP, instruction)`` for ``op`` lowered to ``kind``, shared with every op lowered
        alike; records the pair in ``ops`` / ``lowered``."""
        reads, writes = self._regions(op)
        # regions are unique per footprint (see _region), so their ids identify them
        key = (kind.index, *map(id, reads), None, *map(id, writes), hconst, hterms)
        step = self.shared.get(key)
        if step is None:
            step = self.shared[key] = (
                OP,
                StaticInstr.of(kind, tuple(reads), tuple(writes), hconst, hterms),
            )
        self.ops.append(op)
        self.lowered.append(step[1])
        return step

    def _alloc_step(self, tr: Tracked, lane: int) -> tuple:
        step = self.alloc_steps.get((tr.index, lane))
        if step is None:
            step = self.alloc_steps[tr.index, lane] = (ALLOC, tr, lane)
        return step

    def _key(self, op: Op) -> tuple | None:
        """What the kind of ``op`` depends on: everything but where its operands are (the
        constant parts of their indices, which only move regions and HBM offsets).  None
        when something in it cannot be hashed (then the op gets a kind of its own)."""
        parts: list = [op.prim, op.loc, op.mask, self.placed.get(id(op))]
        for x in (*op.outs, None, *op.ins):
            if isinstance(x, Access):
                parts.append(self._access_key(x))
            else:
                parts.append((type(x), x))
        try:
            parts.append(tuple(sorted(op.attrs.items())))
            key = tuple(parts)
            hash(key)
        except TypeError:
            return None
        return key

    def _access_key(self, a: Access) -> tuple:
        t = a.tensor
        who = self.alloc.leader.get(t.uid, t.uid)  # a rotation group lowers alike
        axes = tuple(tuple((s.k, c) for s, c in ix.terms if isinstance(s, Axis)) for ix in a.index)
        ind = self._access_key(a.indirect) if a.indirect is not None else None
        return (who, a.shape, axes, ind, a.indirect_dim)

    def _kind(self, op: Op) -> InstrKind:
        # the one answer the verifier and the cost model share (for an unassigned op, one
        # of the engines the verifier checked it on, picked by _balance)
        engine = self.placed.get(id(op)) or prims.engine_of(op)
        if engine == "dma":
            return self._dma_kind(op)
        engine, rule, view, p, n, cycles = self._cost(op, engine)
        flops, model = rule.flops(view) if rule.flops else (0.0, 0.0)
        main = next((a for a in op.ins if isinstance(a, Access)), op.outs[0] if op.outs else None)
        out_p = tile_pf(op.outs[0])[0] if op.outs else p
        byts = _bytes(op, mask_fraction(op, self.kernel.grid))
        dtype = (
            op.ins[0].tensor.dtype
            if op.prim in ("nc_matmul", "nc_matmul_mx")
            else (op.outs[0].tensor.dtype if op.outs else main.tensor.dtype)
        )
        eng = _ENGINE_CODE[engine]
        t = self.target
        return self._new(
            op,
            eng,
            rule.opcode,
            t.cycles_ns(engine, cycles),
            max(p, out_p),
            n,
            byts,
            flops,
            model,
            dtype,
            cycles=cycles,
            same_engine_raw_ns=t.cycles_ns(engine, t.dependent_cycles(engine)),
            wait_ns=t.cycles_ns(engine, t.semaphore_cycles),
        )

    def _cost(self, op: Op, engine: str) -> tuple:
        """(engine, rule, view, p, n, cycles) of compute op ``op`` placed on ``engine``."""
        rule = PRIMS[op.prim]
        accesses = [a for a in op.ins if isinstance(a, Access)] + list(op.outs)
        main = next((a for a in op.ins if isinstance(a, Access)), op.outs[0] if op.outs else None)
        p, n = tile_pf(main) if main is not None else (1, 1)
        if (
            op.prim == "partition_broadcast"
            and op.outs[0].tensor.root.uid not in self.psum_resident
        ):
            # wider than a PSUM bank: TensorE broadcasts bank by bank into PSUM and each bank
            # is evacuated to SBUF by a VectorE copy; the copies are the critical path (the
            # TensorE part overlaps them), so the op is modeled as that copy
            engine, rule = "vector", Lowering("BROADCAST_EVACUATE", c_elementwise)
            p, n = tile_pf(op.outs[0])
        view = OpView(op, self.target, engine, n, p, accesses, self.psum_resident)
        cycles = float(rule.cost(view))
        if engine != "tensor":
            cycles += self.target.access_overhead_cycles  # per-instruction access request [A2]
            if any(inner_stride_bytes(a) > 16 for a in accesses if not a.tensor.is_hbm):
                cycles *= 1.5  # innermost stride > 16 B halves SBUF/PSUM bandwidth [A2]
        return engine, rule, view, p, n, cycles

    def engine_ns(self, op: Op, engine: str) -> tuple[str, float]:
        """(the engine that runs it, its time in ns) for a compute op placed on ``engine``."""
        engine, _, _, _, _, cycles = self._cost(op, engine)
        return engine, self.target.cycles_ns(engine, cycles)

    def _dma_kind(self, op: Op) -> InstrKind:
        t = self.target
        dst, src = op.outs[0], op.ins[0]
        on_chip = dst if not dst.tensor.is_hbm else src
        parts, n = tile_pf(on_chip)
        parts = max(parts, 1)
        # a masked DMA moves only the elements its mask keeps
        kept = mask_fraction(op, self.kernel.grid)
        byts = _bytes(op, kept)
        # the transfer itself: source and destination (an index tile is read by the DGE)
        moved = _bytes(Op(op.prim, [dst], [src], op.attrs, op.loc), kept)
        total = max(
            sum(v for k, v in moved.items() if k.endswith("read_bytes")),
            sum(v for k, v in moved.items() if k.endswith("write_bytes")),
        )
        per_part = total / parts
        transpose = bool(op.attrs.get("transpose"))
        indirect = dst.indirect is not None or src.indirect is not None
        ns_per_part = dma_ns_per_partition(
            t,
            per_part,
            hbm=dst.tensor.is_hbm or src.tensor.is_hbm,
            transpose=transpose,
            from_hbm=src.tensor.is_hbm,
            indirect=indirect,
            hbm_both=dst.tensor.is_hbm and src.tensor.is_hbm,
        )
        opcode = (
            "DMA_"
            + ("HBM" if src.tensor.is_hbm else src.tensor.buffer.upper())
            + "_TO_"
            + ("HBM" if dst.tensor.is_hbm else dst.tensor.buffer.upper())
        )
        if transpose:
            opcode += "_TRANSPOSE"
        if op.attrs.get("rmw_op"):
            opcode += "_RMW"
        if indirect:
            opcode += "_INDIRECT"
        h = _hbm_side(op)
        name, hstride = "", 0
        if h is not None:
            ht = h.tensor
            flat = flat_offset(h, list(range(len(ht.shape))), row_major(list(ht.shape)))
            hstride = flat.coef(Axis(0)) * ht.dtype.itemsize
            name = ht.root.name
        return self._new(
            op,
            DMA,
            opcode,
            ns_per_part,
            parts,
            n,
            byts,
            0.0,
            0.0,
            on_chip.tensor.dtype,
            tensor_name=name,
            hbm_part_stride=hstride,
            # the descriptor generator starts when the index tile (a dependency) is ready
            # and needs the target's dma_dge_ns before the transfer's fixed cost begins
            wait_ns=self.target.dma_dge_ns if indirect else 0.0,
            same_engine_raw_ns=self.target.dma_dge_ns if indirect else 0.0,
        )

    def _hbm_offset(self, op: Op) -> tuple[int, Terms]:
        """Byte offset of the first HBM element a DMA touches: a constant and env terms."""
        h = _hbm_side(op)
        if h is None:
            return 0, ()
        ht = h.tensor
        item = ht.dtype.itemsize
        const, terms = _linear(h, list(range(len(ht.shape))), row_major(list(ht.shape)))
        hterms = tuple(
            (self.env[s], c * item)
            for s, c in terms.items()
            if not isinstance(s, Axis) and s in self.env
        )
        return const * item, hterms

    def _regions(self, op: Op) -> tuple[list[Region], list[Region]]:
        reads = [r for a in op.ins if isinstance(a, Access) and (r := self.region(a)) is not None]
        writes = [r for a in op.outs if (r := self.region(a)) is not None]
        if prims.reads_dst(op):
            reads.extend(writes)  # read-modify-write of the destination
        return reads, writes

    def _new(self, op, engine, opcode, dur, parts, n, byts, flops, model, dtype, **kw) -> InstrKind:
        operands = ", ".join(
            self._describe(a) for a in (*op.outs, *(x for x in op.ins if isinstance(x, Access)))
        )
        kind = InstrKind(
            len(self.kinds),
            engine,
            opcode,
            dur,
            parts,
            n,
            byts,
            flops,
            model,
            self._dtype_name(dtype),
            str(op.loc),
            op.loc.text,
            operands,
            **kw,
        )
        self.kinds.append(kind)
        return kind

    def _dtype_name(self, dt) -> str:
        name = self.dtype_names.get(dt)
        if name is None:
            name = self.dtype_names[dt] = dtypes.name(dt)
        return name

    def _describe(self, a: Access) -> str:
        """``name[shape] dtype @buffer``; a rotation group's tensors go by its first one's
        name (they are the same tile of successive unrolled steps)."""
        t = a.tensor
        name = self.names.get(t.uid)
        if name is None:
            who = self.alloc.leader.get(t.uid)
            name = self.names[t.uid] = (
                self.alloc.placements[who].tensor.name if who is not None else t.name
            )
        shape = "x".join(map(str, a.shape))
        return f"{name}[{shape}] {self._dtype_name(t.dtype)} @{t.buffer}"

    # -- the tree ----------------------------------------------------------------------------
    def body(self, stmts: list, depth: int = 0) -> list:
        steps: list = []
        for s in stmts:
            self.point += 1  # numbered as the allocator numbers them
            for spill in self.reloads.get((depth, self.point), ()):
                steps.extend(self._spill_ops(spill, save=False))
            if isinstance(s, Op):
                seen = len(self.tracked)
                step = self.lower_op(s)
                if step is not None:
                    # an on-chip tensor first seen here had no Alloc: it claims its memory
                    # from the scheduler just before this first use
                    new = len(self.tracked) > seen
                    for tr in itertools.islice(self.tracked.values(), seen, None) if new else ():
                        if tr.placement is not None:
                            tr.implicit = True
                            steps.append(self._alloc_step(tr, 0))
                    steps.append(step)
            elif isinstance(s, Alloc):
                if s.tensor.buffer in ("sbuf", "psum"):
                    tr = self.track(s.tensor)
                    if tr is not None:
                        steps.append(self._alloc_step(tr, self._lane(s.tensor, tr)))
            elif isinstance(s, Loop):
                slot = self.env[s.var] = len(self.env)
                inner = self.body(s.body, depth + 1)
                if inner:
                    steps.append((LOOP, slot, s.trip, inner))
            for spill in self.saves.get((depth, self.point), ()):
                steps.extend(self._spill_ops(spill, save=True))
        return steps


def _balance(lw: _Lowerer, kernel: Kernel) -> dict[int, str]:
    """The engine of every op whose engine the kernel left to the compiler (an unassigned
    copy, :func:`~nkikit.ir.prims.engines_of`), by ``id(op)``.

    The Neuron compiler places such instructions to balance the engines' load.  The model:
    the work of the assigned ops is summed per engine (time x executions per kernel
    instance); the unassigned ones are then placed biggest first, each on the candidate
    engine that ends up least loaded with it (longest-processing-time-first list
    scheduling).  The unit placed is a source line: the unrolled steps of a loop (``range``,
    ``static_range``) go where the one op of the same loop kept rolled (``affine_range``)
    goes, with the same total work, so the loop forms model alike.  Ops sharing a source line
    and shape cost alike, so the time of each distinct op is computed once."""
    grid = prod(kernel.grid) if kernel.grid else 1
    load: dict[str, float] = {}
    cache: dict[tuple, tuple[str, float]] = {}

    def cost(op: Op, eng: str) -> tuple[str, float]:
        key = lw._key(op)
        if key is None:
            return lw.engine_ns(op, eng)
        key = (key, eng)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = lw.engine_ns(op, eng)
        return hit

    stmts = [(s, loops) for s, loops in kernel.walk() if isinstance(s, Op)]
    if not any(len(prims.engines_of(s)) > 1 for s, _ in stmts):
        return {}
    # per source line (and engine choices): its ops, their summed time per engine, first index
    groups: dict[tuple, tuple[list[Op], dict[str, float], int]] = {}
    for k, (stmt, loops) in enumerate(stmts):
        choices = prims.engines_of(stmt)
        if not choices or choices == ("dma",):
            continue
        runs = grid * prod(lp.trip for lp in loops)
        if len(choices) == 1:
            eng, ns = cost(stmt, choices[0])
            load[eng] = load.get(eng, 0.0) + ns * runs
            continue
        line = (stmt.loc.file, stmt.loc.line, choices) if stmt.loc is not None else (id(stmt),)
        ops, times, _ = groups.setdefault(line, ([], dict.fromkeys(choices, 0.0), k))
        ops.append(stmt)
        for e in choices:
            times[e] += cost(stmt, e)[1] * runs
    placed: dict[int, str] = {}
    order = sorted(groups.values(), key=lambda g: (-max(g[1].values()), g[2]))
    for ops, times, _ in order:
        best = min(times, key=lambda e: (load.get(e, 0.0) + times[e], e != next(iter(times))))
        load[best] = load.get(best, 0.0) + times[best]
        for op in ops:
            placed[id(op)] = best
    return placed


def _scale(terms: Terms, k: int) -> Terms:
    return tuple((e, c * k) for e, c in terms)


def _hbm_side(op: Op) -> Access | None:
    """A DMA's HBM operand, if it has one with static rows (an indirect DMA's HBM rows are
    unknown here: no offsets, and no input-reload analysis, which compares them)."""
    dst, src = op.outs[0], op.ins[0]
    h = src if src.tensor.is_hbm else dst if dst.tensor.is_hbm else None
    return h if h is not None and h.indirect is None else None


def _linear(a: Access, dims: list[int], strides: list[int]) -> tuple[int, dict]:
    """``flat_offset(a, dims, strides)`` as (constant, {symbol: coefficient}) without building
    Affine objects (the lowering computes it for every operand of every op)."""
    const = 0
    terms: dict = {}
    index = a.index
    for d, st in zip(dims, strides):
        ix = index[d]
        const += ix.const * st
        for s, c in ix.terms:
            terms[s] = terms.get(s, 0) + c * st
    return const, {s: c for s, c in terms.items() if c != 0}


def _split(const: int, terms: dict, shape: tuple[int, ...], env: dict) -> tuple[int, Terms, int]:
    """:func:`~.regions.split_affine` of ``const + sum(terms)``."""
    lo = hi = const
    env_terms = []
    for s, c in terms.items():
        if isinstance(s, Axis):
            top = c * (shape[s.k] - 1) if s.k < len(shape) else 0
            lo += min(0, top)
            hi += max(0, top)
        elif s in env:
            env_terms.append((env[s], c))
    return lo, tuple(env_terms), hi - lo + 1


# Evaluating a mask costs one numpy pass over its axes per combination of loop / program
# values; past this many combinations (or elements) they are sampled evenly instead.
_MASK_COMBOS = 1024
_MASK_ELEMENTS = 1 << 22


def mask_fraction(op: Op, grid: tuple[int, ...] = ()) -> float:
    """Share of ``op``'s elements its mask keeps, averaged over every value of the loop
    variables and program ids it depends on (1.0 without a mask).

    The mask is over the axes of the op's output tile (of its first input for reductions,
    as the simulator evaluates it).  Axes the mask does not mention factor out."""
    mask = op.mask
    if mask is None:
        return 1.0
    ref = prims.mask_ref(op)
    shape = ref.shape
    axes = [s for s in mask.syms if isinstance(s, Axis) and s.k < len(shape)]
    outer: list[tuple[Sym, int]] = []
    for s in mask.syms:
        if isinstance(s, LoopVar):
            outer.append((s, s.trip))
        elif isinstance(s, ProgramId) and s.axis < len(grid):
            outer.append((s, grid[s.axis]))
    axis_grid: dict[Sym, object] = {}
    for i, a in enumerate(axes):
        view = [1] * len(axes)
        view[i] = shape[a.k]
        axis_grid[a] = np.arange(shape[a.k]).reshape(view)
    per_combo = prod(shape[a.k] for a in axes)
    combos = prod(n for _, n in outer)
    if combos == 0 or per_combo == 0:
        return 1.0
    most = min(_MASK_COMBOS, max(_MASK_ELEMENTS // per_combo, 1))
    picks = range(combos) if combos <= most else np.linspace(0, combos - 1, most).astype(int)
    kept = 0
    for pick in picks:
        env = dict(axis_grid)
        rest = int(pick)
        for sym, n in reversed(outer):
            env[sym] = rest % n
            rest //= n
        kept += int(
            np.count_nonzero(np.broadcast_to(mask.evaluate(env), [shape[a.k] for a in axes]))
        )
    return kept / (len(picks) * per_combo)


def _bytes(op: Op, kept: float = 1.0) -> dict[str, int]:
    """Bytes per memory the op reads and writes; ``kept``: the share of elements its mask keeps."""
    out = dict.fromkeys(
        (
            "hbm_read_bytes",
            "hbm_write_bytes",
            "sbuf_read_bytes",
            "sbuf_write_bytes",
            "psum_read_bytes",
            "psum_write_bytes",
        ),
        0,
    )

    def mem(t: Tensor) -> str:
        return "hbm" if t.is_hbm else t.buffer

    for a in op.ins:
        if isinstance(a, Access):
            out[f"{mem(a.tensor)}_read_bytes"] += (
                round(prod(a.shape) * kept) * a.tensor.dtype.itemsize
            )
    for a in op.outs:
        n = round(prod(a.shape) * kept) * a.tensor.dtype.itemsize
        out[f"{mem(a.tensor)}_write_bytes"] += n
        if prims.reads_dst(op):  # the destination's old value is read too
            out[f"{mem(a.tensor)}_read_bytes"] += n
    return out


def _psum_broadcasts(kernel: Kernel, target: Target) -> frozenset[int]:
    """Tensors that stay in PSUM where the TensorE wrote them: the results of partition
    broadcasts (TensorE writes only PSUM [A2]) that fit one PSUM bank per partition.  Their
    readers read PSUM (the cheaper VectorE rates of [LISA]); a wider broadcast is evacuated
    to SBUF (see ``_Lowerer._kind``)."""
    out: set[int] = set()

    def walk(stmts: list) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                walk(s.body)
            elif isinstance(s, Op) and s.prim == "partition_broadcast":
                t = s.outs[0].tensor
                if t.buffer == "sbuf" and tile_pf(Access.whole(t))[1] * t.dtype.itemsize <= (
                    target.psum_bank_bytes
                ):
                    out.add(t.root.uid)

    walk(kernel.body)
    return frozenset(out)


def _folded_memsets(kernel: Kernel) -> set[int]:
    """``nl.zeros(..., buffer=nl.psum)`` followed by ``+= matmul``: the zero fill becomes the
    first matmul's PSUM-zero flag (the profiler shows ``acc_flags psum_zero``), not an op."""
    folded: set[int] = set()

    def first_use(stmts: Iterable, t: Tensor) -> Op | None:
        for s in stmts:
            if isinstance(s, Op):
                if any(isinstance(a, Access) and a.tensor is t for a in (*s.outs, *s.ins)):
                    return s
            elif isinstance(s, Loop):
                got = first_use(s.body, t)
                if got is not None:
                    return got
        return None

    def walk(stmts: list) -> None:
        for i, s in enumerate(stmts):
            if isinstance(s, Loop):
                walk(s.body)
            elif (
                isinstance(s, Op)
                and s.prim == "memset"
                and s.attrs.get("value") == 0.0
                and s.mask is None
                and s.outs
                and s.outs[0].tensor.buffer == "psum"
                and s.outs[0].is_whole
            ):
                # (islice, not a slice: a copy of the rest of an unrolled body per memset
                # would be quadratic)
                nxt = first_use(itertools.islice(stmts, i + 1, None), s.outs[0].tensor)
                if (
                    nxt is not None
                    and nxt.prim == "nc_matmul"
                    and nxt.attrs.get("accumulate")
                    and nxt.outs[0].tensor is s.outs[0].tensor
                    and nxt.outs[0].shape == s.outs[0].tensor.shape
                ):
                    folded.add(id(s))

    walk(kernel.body)
    return folded


def count_instructions(steps: list, target: Target) -> int:
    """How many instructions replaying ``steps`` produces (DMA pieces counted per queue)."""
    n = 0
    for st in steps:
        if st[0] == OP:
            si = st[1]
            if si.engine == DMA:
                n += min(target.dma_queues, -(-si.partitions // target.dma_partitions_per_queue))
            else:
                n += 1
        elif st[0] == LOOP:
            n += st[2] * count_instructions(st[3], target)
    return n


def lower(kernel: Kernel, target: Target, allocation: Allocation) -> LoweredKernel:
    """Lower ``kernel`` for ``target`` with on-chip tensors placed by ``allocation``."""
    lw = _Lowerer(kernel, target, allocation)
    steps = lw.body(kernel.body)
    if kernel.grid:
        for axis in reversed(range(len(kernel.grid))):  # instances run one after another [PM]
            steps = [(LOOP, axis, kernel.grid[axis], steps)]
    tracked = sorted(lw.tracked.values(), key=lambda tr: tr.index)
    lanes = 0
    for tr in tracked:
        choose_granules(tr)
        tr.lane0 = lanes
        lanes += tr.lanes
        for reg in tr.regions:
            reg.slot = tr.lane0 + reg.lane
    return LoweredKernel(
        kernel,
        target,
        allocation,
        steps,
        lw.ops,
        lw.lowered,
        lw.kinds,
        tracked,
        len(lw.env),
        kernel.grid,
        lw.notes,
    )
