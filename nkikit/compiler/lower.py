"""Lowering: every IR op becomes a static instruction on the engine that runs it.

Ops are data.  :data:`PRIMS` has one :class:`Lowering` per IR primitive: the engine (or
``None`` when the op's ``engine`` attribute decides), the opcode, the cost formula in cycles
of that engine and, for TensorE, the FLOPs.  Cost formulas are the legacy "Estimated
instruction cost" column of the ISA docs [LISA] (nki.md §3.3) with the §4.5 constants held
by the :class:`~nkikit.compiler.targets.Target`.  Bytes per memory come from the operands
themselves and need no table.

:func:`lower` walks the kernel once and returns a :class:`LoweredKernel`: a tree of steps
(ops, allocations, rolled loops) mirroring the IR, where each op step holds a
:class:`StaticInstr` whose cost, bytes, FLOPs and operand regions are computed once.  The
scheduler replays the tree per loop iteration with integer arithmetic only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from math import gcd, prod

from .. import dtypes
from ..ir.affine import Affine, Axis, LoopVar, ProgramId, Sym
from ..ir.core import Access, Alloc, Kernel, Loop, Op, Tensor
from .allocate import Allocation
from .targets import Target

ENGINES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "sync")
TENSOR, VECTOR, SCALAR, GPSIMD, SYNC = range(5)
DMA = len(ENGINES)  # pseudo engine code of a whole DMA (its pieces run on queues)
_ENGINE_CODE = {name: k for k, name in enumerate(ENGINES)}

MAX_ONCHIP_ROW_GRANULES = 4  # partition quadrants
MAX_COL_GRANULES = 512  # enough to keep every tile of the tutorial kernels apart
MAX_HBM_ROW_GRANULES = 64

# ---------------------------------------------------------------------------------------------
# the cost formulas (engine cycles)


@dataclass(slots=True)
class OpView:
    """What a cost formula may look at: the op, its main operand's shape and the target."""

    op: Op
    target: Target
    engine: str
    n: int  # elements per partition of the main input (or of the output)
    p: int  # partitions of the main operand
    accesses: list[Access]  # every tensor operand, ins then outs

    @property
    def min_ii(self) -> int:
        return self.target.min_ii

    def dtypes(self) -> list:
        return [a.tensor.dtype for a in self.accesses]

    def all_16bit(self) -> bool:
        return all(d.itemsize == 2 and dtypes.is_float(d) for d in self.dtypes())

    def sbuf_16bit(self) -> bool:
        sb = [a.tensor.dtype for a in self.accesses if a.tensor.buffer == "sbuf"]
        return bool(sb) and all(d.itemsize == 2 and dtypes.is_float(d) for d in sb)

    def any_psum(self) -> bool:
        return any(a.tensor.buffer == "psum" for a in self.accesses)

    def ins_psum(self) -> bool:
        return any(isinstance(a, Access) and a.tensor.buffer == "psum" for a in self.op.ins)


def _vector_perf(v: OpView, kind: str) -> float:
    """NC-v3+ VectorE performance modes [A3]: the divisor applied to the legacy cost."""
    if not v.target.vector_perf_modes or v.engine != "vector":
        return 1.0
    if kind == "copy" and v.sbuf_16bit():
        return 2.0 if v.any_psum() or not all(_unit_stride(a) for a in v.accesses) else 4.0
    if kind == "tt" and not v.any_psum() and v.all_16bit():
        return 2.0
    return 1.0


def c_elementwise(v: OpView) -> float:
    """``max(MIN_II, N)``: one pass over the data (tensor_copy, tensor_scalar, activation ...)."""
    kind = "copy" if v.op.prim in ("tensor_copy", "tensor_scalar") else ""
    cost = max(v.min_ii, v.n) / _vector_perf(v, kind)
    if v.op.attrs.get("reduce_op") and v.op.prim in ("tensor_scalar", "activation"):
        cost += v.min_ii  # ActReadAccumulator / reduce readout [A2, LISA]
    return cost


def c_tensor_tensor(v: OpView) -> float:
    """``max(MIN_II, N)`` if an input is in PSUM or all-bf16 SBUF add/mul/sub, else 2N [LISA]."""
    fast = v.ins_psum() or (
        all(a.tensor.dtype == dtypes.bfloat16 for a in v.accesses)
        and v.op.attrs.get("op") in ("add", "multiply", "subtract")
    )
    return max(v.min_ii, v.n if fast else 2 * v.n) / _vector_perf(v, "tt")


def c_two_pass(v: OpView) -> float:
    """``max(MIN_II, 2N)``: ops that stream two inputs (scan, select) [LISA, A2]."""
    return max(v.min_ii, 2 * v.n)


def c_select(v: OpView) -> float:
    """where(): like tensor_copy_predicated, ``N`` with a PSUM side, else ``2N`` [LISA]."""
    return max(v.min_ii, v.n if v.any_psum() else 2 * v.n)


def c_scalar_tensor_tensor(v: OpView) -> float:
    """``N`` for bf16 subtract-then-multiply on even N, else ``2N`` [LISA]."""
    a = v.op.attrs
    fast = v.all_16bit() and a.get("op0") == "subtract" and a.get("op1") == "multiply" and v.n % 2 == 0
    return max(v.min_ii, v.n if fast else 2 * v.n)


def c_reduce(v: OpView) -> float:
    """``N/2`` for bf16 add/max, else ``N`` (at least MIN_II) [LISA]."""
    fast = v.all_16bit() and v.op.attrs.get("op") in ("add", "max")
    return max(v.min_ii, v.n / 2 if fast else v.n)


def c_memset(v: OpView) -> float:
    """``N/2`` for a zero fill of 16-bit data, else ``N`` (at least MIN_II) [LISA]."""
    out = v.op.outs[0].tensor.dtype
    fast = v.op.attrs.get("value") == 0.0 and out.itemsize == 2
    return max(v.min_ii, v.n / 2 if fast else v.n)


def c_reciprocal(v: OpView) -> float:
    """VectorE reciprocal: ``max(MIN_II, 8N)`` [LISA]."""
    return max(v.min_ii, 8 * v.n)


def c_bn_aggr(v: OpView) -> float:
    return max(v.min_ii, 13 * v.n / 3)


def c_plain_n(v: OpView) -> float:
    """``N`` (max8, find_index8, match_replace8) [LISA]."""
    return max(1, v.n)


def c_gpsimd(v: OpView) -> float:
    """``GPSIMD_START + N`` (iota, affine_select) [LISA]."""
    return v.target.gpsimd_start_cycles + v.n


def c_partition_reduce(v: OpView) -> float:
    # guess: each GpSimd core reduces its 16 partitions (N cycles), then the 8 cores combine (N)
    return v.target.gpsimd_start_cycles + 2 * v.n


def c_local_gather(v: OpView) -> float:
    # [LISA] 150 + nidx * nelem / C; C taken as 1 element per core per cycle (guess)
    idx = v.op.ins[1]
    n_idx = idx.free_size if isinstance(idx, Access) else 1
    return v.target.gpsimd_start_cycles + n_idx * int(v.op.attrs.get("num_elem_per_idx", 1))


def c_transpose(v: OpView) -> float:
    """TensorE ``max(P, min(64, F))``, VectorE ``max(MIN_II, N)`` [LISA]."""
    if v.engine == "tensor":
        f = v.n
        cycles = max(v.p, min(64, f))
        if v.op.ins[0].tensor.dtype.itemsize == 4:  # fp32 passes: 4x on v2, bit-exact 2x mode on v3+ [A3]
            cycles *= 4 if v.target.nc_version < 3 else 2
        return cycles
    return max(v.min_ii, v.n)


def c_matmul(v: OpView) -> float:
    """``max(min(64, N_stationary), N_moving)``; fp32 4x; fp8 double-row 2x faster [LISA, A3]."""
    st, mv = v.op.ins[0], v.op.ins[1]
    cycles = max(min(64, st.free_size), mv.free_size)
    if st.tensor.dtype.itemsize == 4 or mv.tensor.dtype.itemsize == 4:
        cycles *= 4
    elif v.op.attrs.get("perf_mode") == "double_row":
        cycles /= 2
    return cycles


def c_broadcast(v: OpView) -> float:
    """Partition broadcast = a matmul of a ones row by the (1, F) source: moving F = N."""
    return max(min(64, v.p), v.n)


def f_matmul(v: OpView) -> tuple[float, float]:
    st, mv = v.op.ins[0], v.op.ins[1]
    flops = 2.0 * st.partitions * st.free_size * mv.free_size
    return flops, flops


def f_transpose(v: OpView) -> tuple[float, float]:
    # executed as a matmul against the identity: K = P, M = F, N = P; no useful FLOPs
    if v.engine != "tensor":
        return 0.0, 0.0
    return 2.0 * v.p * v.n * v.p, 0.0


def f_broadcast(v: OpView) -> tuple[float, float]:
    return 2.0 * v.p * v.n, 0.0  # K = 1


@dataclass(frozen=True, slots=True)
class Lowering:
    """How one IR primitive runs: engine (None = the op's ``engine`` attribute, else
    ``default_engine``), opcode, cost in engine cycles, TensorE FLOPs (hardware, model)."""

    engine: str | None
    opcode: str
    cost: Callable[[OpView], float]
    flops: Callable[[OpView], tuple[float, float]] | None = None
    default_engine: str = "vector"


PRIMS: dict[str, Lowering] = {
    "nc_matmul": Lowering("tensor", "MATMUL", c_matmul, f_matmul),
    "nc_transpose": Lowering(None, "TRANSPOSE", c_transpose, f_transpose, "tensor"),
    "partition_broadcast": Lowering("tensor", "BROADCAST_MATMUL", c_broadcast, f_broadcast),
    "activation": Lowering("scalar", "ACTIVATE", c_elementwise),
    "tensor_copy": Lowering(None, "TENSOR_COPY", c_elementwise),
    "memset": Lowering(None, "MEMSET", c_memset),
    "tensor_tensor": Lowering(None, "TENSOR_TENSOR", c_tensor_tensor),
    "tensor_scalar": Lowering(None, "TENSOR_SCALAR", c_elementwise),
    "scalar_tensor_tensor": Lowering("vector", "SCALAR_TENSOR_TENSOR", c_scalar_tensor_tensor),
    "tensor_reduce": Lowering("vector", "TENSOR_REDUCE", c_reduce),
    "tensor_tensor_scan": Lowering("vector", "TENSOR_TENSOR_SCAN", c_two_pass),
    "reciprocal": Lowering("vector", "RECIPROCAL", c_reciprocal),
    "select": Lowering("vector", "SELECT", c_select),
    "range_select": Lowering("vector", "RANGE_SELECT", c_elementwise),
    "select_reduce": Lowering("vector", "SELECT_REDUCE", c_elementwise),
    "bn_stats": Lowering("vector", "BN_STATS", c_elementwise),
    "bn_aggr": Lowering("vector", "BN_AGGR", c_bn_aggr),
    "dropout": Lowering("vector", "DROPOUT", c_elementwise),
    "max8": Lowering("vector", "MAX8", c_plain_n),
    "nc_find_index8": Lowering("vector", "FIND_INDEX8", c_plain_n),
    "nc_match_replace8": Lowering("vector", "MATCH_REPLACE8", c_plain_n),
    "nc_stream_shuffle": Lowering("vector", "STREAM_SHUFFLE", c_elementwise),
    "iota": Lowering("gpsimd", "IOTA", c_gpsimd),
    "affine_select": Lowering("gpsimd", "AFFINE_SELECT", c_gpsimd),
    "tensor_partition_reduce": Lowering("gpsimd", "PARTITION_REDUCE", c_partition_reduce),
    "local_gather": Lowering("gpsimd", "LOCAL_GATHER", c_local_gather),
}
"""Compute primitives.  ``dma_copy`` runs on the DMA queues (see :func:`_lower_dma`);
``device_print`` exists only in simulation and lowers to nothing."""

SKIPPED = frozenset({"device_print"})


# ---------------------------------------------------------------------------------------------
# operand regions for dependency tracking

Terms = tuple[tuple[int, int], ...]  # (env slot, coefficient)


@dataclass(slots=True)
class Tracked:
    """A buffer whose accesses the scheduler orders: an on-chip tensor or a written HBM tensor.

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
    shared: bool = False  # shares memory with another tensor: track its last access

    @property
    def granules(self) -> int:
        return self.n_rows * self.n_cols


@dataclass(slots=True)
class Region:
    """One operand's footprint in a tracked buffer: rows ``[r, r + r_span)`` and bytes
    ``[c, c + c_span)`` where ``r`` and ``c`` are affine in the loop environment."""

    tracked: Tracked
    r_const: int
    r_terms: Terms
    r_span: int
    c_const: int
    c_terms: Terms
    c_span: int
    # after granule sizes are known: a precomputed list when the region never moves
    fixed: tuple[int, ...] | None = None


def _split(a: Affine, shape: tuple[int, ...], env: dict[Sym, int]) -> tuple[int, Terms, int]:
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


def _strides(shape: tuple[int, ...]) -> list[int]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


def _flat(a: Access, dims: list[int], strides: list[int]) -> Affine:
    out = Affine()
    for d, s in zip(dims, strides):
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


def _unit_stride(a: Access) -> bool:
    """True when the innermost tile axis walks consecutive elements of the tensor."""
    t = a.tensor
    if len(a.shape) < 2 or a.shape[-1] == 1:
        return True
    dims = [d for d in range(len(t.shape)) if d != t.par_axis] if t.buffer in ("sbuf", "psum") else list(range(len(t.shape)))
    free_shape = [t.shape[d] for d in dims]
    flat = _flat(a, dims, _strides(free_shape))
    last = Axis(len(a.shape) - 1)
    return abs(flat.coef(last)) == 1


# ---------------------------------------------------------------------------------------------
# static instructions


@dataclass(slots=True)
class StaticInstr:
    """One IR op, lowered.  Compute ops have a fixed duration; a DMA has a duration per
    partition and is split over the queues at schedule time."""

    index: int
    op: Op
    engine: int  # engine code, or DMA
    opcode: str
    duration_ns: float  # compute: whole instruction; DMA: transfer time of one partition
    partitions: int
    elements: int
    reads: list[Region]
    writes: list[Region]
    bytes: dict[str, int]  # totals per memory field of the profiler's Instruction
    flops: float
    model_flops: float
    dtype: str
    source: str
    text: str
    operands: str
    cycles: float = 0.0
    tensor_name: str = ""
    hbm_const: int = 0  # byte offset of the first HBM element at env = 0
    hbm_terms: Terms = ()
    hbm_part_stride: int = 0  # HBM bytes between consecutive partitions of the tile
    same_engine_raw_ns: float = 0.0
    wait_ns: float = 0.0  # semaphore latency when waiting on another engine

    @property
    def is_dma(self) -> bool:
        return self.engine == DMA


# A step of the lowered program: (OP, StaticInstr) | (ALLOC, Tracked) | (LOOP, env slot, trip, steps)
OP, ALLOC, LOOP = 0, 1, 2


@dataclass(slots=True)
class LoweredKernel:
    kernel: Kernel
    target: Target
    allocation: Allocation
    steps: list
    instrs: list[StaticInstr]
    tracked: list[Tracked]
    env_size: int
    grid: tuple[int, ...]
    notes: list[str] = field(default_factory=list)


class _Lowerer:
    def __init__(self, kernel: Kernel, target: Target, alloc: Allocation) -> None:
        self.kernel = kernel
        self.target = target
        self.alloc = alloc
        self.env: dict[Sym, int] = {}
        for i, _ in enumerate(kernel.grid):
            self.env[ProgramId(i)] = i
        self.tracked: dict[int, Tracked] = {}
        self.instrs: list[StaticInstr] = []
        self.notes: list[str] = []
        self.folded = _folded_memsets(kernel)
        self.flat_roots = {t.root.uid for t in kernel.tensors if t.base is not None}

    # -- tracked buffers -------------------------------------------------------------------
    def track(self, t: Tensor) -> Tracked | None:
        root = t.root
        tr = self.tracked.get(root.uid)
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
            tr = Tracked(len(self.tracked), root, self.alloc.buffers(root), rows, max(root.bytes_per_partition, 1))
        self.tracked[root.uid] = tr
        return tr

    def region(self, a: Access) -> Region | None:
        tr = self.track(a.tensor)
        if tr is None:
            return None
        t = a.tensor
        item = t.dtype.itemsize
        if t.is_hbm and tr.tensor.uid in self.flat_roots:
            # accessed through reshaped views: only the flat byte offset is comparable
            row: Affine = Affine()
            flat = _flat(a, list(range(len(t.shape))), _strides(list(t.shape)))
        elif t.is_hbm:
            row = a.index[0] if t.shape else Affine()
            rest = list(range(1, len(t.shape)))
            flat = _flat(a, rest, _strides([t.shape[d] for d in rest]))
        else:
            row = a.index[t.par_axis]
            rest = [d for d in range(len(t.shape)) if d != t.par_axis]
            flat = _flat(a, rest, _strides([t.shape[d] for d in rest]))
        r0, rterms, rspan = _split(row, a.shape, self.env)
        c0, cterms, cspan = _split(flat, a.shape, self.env)
        reg = Region(tr, r0, rterms, rspan, c0 * item, _scale(cterms, item), cspan * item)
        tr.regions.append(reg)
        return reg

    # -- ops ---------------------------------------------------------------------------------
    def lower_op(self, op: Op) -> StaticInstr | None:
        if op.prim in SKIPPED or id(op) in self.folded:
            return None
        if op.prim == "dma_copy":
            return self._lower_dma(op)
        rule = PRIMS.get(op.prim)
        if rule is None:
            rule = Lowering(None, op.prim.upper(), c_elementwise)
            self.notes.append(f"{op.loc}: no cost formula for {op.prim}; costed as one VectorE pass")
        engine = rule.engine or str(op.attrs.get("engine") or rule.default_engine)
        if engine not in _ENGINE_CODE:
            engine = rule.default_engine
        accesses = [a for a in op.ins if isinstance(a, Access)] + list(op.outs)
        main = next((a for a in op.ins if isinstance(a, Access)), op.outs[0] if op.outs else None)
        p, n = tile_pf(main) if main is not None else (1, 1)
        view = OpView(op, self.target, engine, n, p, accesses)
        cycles = float(rule.cost(view))
        if engine != "tensor":
            cycles += self.target.access_overhead_cycles  # per-instruction access request [A2]
            if any(_inner_stride_bytes(a) > 16 for a in accesses if not a.tensor.is_hbm):
                cycles *= 1.5  # innermost stride > 16 B halves SBUF/PSUM bandwidth [A2]
        flops, model = rule.flops(view) if rule.flops else (0.0, 0.0)
        out_p = tile_pf(op.outs[0])[0] if op.outs else p
        byts = _bytes(op)
        reads, writes = self._regions(op)
        dtype = op.ins[0].tensor.dtype if op.prim == "nc_matmul" else (op.outs[0].tensor.dtype if op.outs else main.tensor.dtype)
        eng = _ENGINE_CODE[engine]
        t = self.target
        return self._new(
            op, eng, rule.opcode, t.cycles_ns(engine, cycles), max(p, out_p), n, reads, writes, byts,
            flops, model, dtype, cycles=cycles,
            same_engine_raw_ns=t.cycles_ns(engine, t.dependent_overhead_cycles) if engine in ("vector", "scalar", "gpsimd") else 0.0,
            wait_ns=t.cycles_ns(engine, t.semaphore_cycles),
        )

    def _lower_dma(self, op: Op) -> StaticInstr:
        t = self.target
        dst, src = op.outs[0], op.ins[0]
        on_chip = dst if not dst.tensor.is_hbm else src
        parts, n = tile_pf(on_chip)
        parts = max(parts, 1)
        byts = _bytes(op)
        total = max(sum(v for k, v in byts.items() if k.endswith("read_bytes")), sum(v for k, v in byts.items() if k.endswith("write_bytes")))
        per_part = total / parts
        hbm = dst.tensor.is_hbm or src.tensor.is_hbm
        bw = t.dma_queue_bytes_per_ns
        if hbm:  # queues share the core's HBM bandwidth evenly
            bw = min(bw, t.hbm_bytes_per_ns / t.dma_queues)
        row_eff = per_part / (per_part + t.dma_row_overhead_bytes) if per_part > 0 else 1.0
        rate = bw * t.dma_efficiency * row_eff
        opcode = "DMA_" + ("HBM" if src.tensor.is_hbm else src.tensor.buffer.upper()) + "_TO_" + ("HBM" if dst.tensor.is_hbm else dst.tensor.buffer.upper())
        if op.attrs.get("transpose"):
            rate *= t.dma_transpose_factor if src.tensor.is_hbm else min(t.dma_transpose_factor, 0.5)
            opcode += "_TRANSPOSE"
        if op.attrs.get("rmw_op"):
            opcode += "_RMW"
        reads, writes = self._regions(op)
        h = src if src.tensor.is_hbm else dst if dst.tensor.is_hbm else None
        name, hconst, hterms, hstride = "", 0, (), 0
        if h is not None:
            ht = h.tensor
            item = ht.dtype.itemsize
            flat = _flat(h, list(range(len(ht.shape))), _strides(list(ht.shape)))
            at0 = flat.substitute({Axis(k): Affine() for k in range(len(h.shape))})
            hconst = at0.const * item
            hterms = tuple((self.env[s], c * item) for s, c in at0.terms if s in self.env)
            hstride = flat.coef(Axis(0)) * item
            name = ht.root.name
        return self._new(
            op, DMA, opcode, per_part / rate if rate > 0 else 0.0, parts, n, reads, writes, byts, 0.0, 0.0,
            on_chip.tensor.dtype, tensor_name=name, hbm_const=hconst, hbm_terms=hterms, hbm_part_stride=hstride,
        )

    def _regions(self, op: Op) -> tuple[list[Region], list[Region]]:
        reads = [r for a in op.ins if isinstance(a, Access) and (r := self.region(a)) is not None]
        writes = [r for a in op.outs if (r := self.region(a)) is not None]
        if op.attrs.get("accumulate") or op.attrs.get("rmw_op") or op.prim == "nc_stream_shuffle":
            reads.extend(writes)  # read-modify-write of the destination
        return reads, writes

    def _new(self, op, engine, opcode, dur, parts, n, reads, writes, byts, flops, model, dtype, **kw) -> StaticInstr:
        operands = ", ".join(_describe(a) for a in (*op.outs, *(x for x in op.ins if isinstance(x, Access))))
        si = StaticInstr(
            len(self.instrs), op, engine, opcode, dur, parts, n, reads, writes, byts, flops, model,
            dtypes.name(dtype), str(op.loc), op.loc.text, operands, **kw,
        )
        self.instrs.append(si)
        return si

    # -- the tree ----------------------------------------------------------------------------
    def body(self, stmts: list) -> list:
        steps: list = []
        for s in stmts:
            if isinstance(s, Op):
                si = self.lower_op(s)
                if si is not None:
                    steps.append((OP, si))
            elif isinstance(s, Alloc):
                if s.tensor.buffer in ("sbuf", "psum"):
                    tr = self.track(s.tensor)
                    if tr is not None:
                        steps.append((ALLOC, tr))
            elif isinstance(s, Loop):
                slot = self.env[s.var] = len(self.env)
                inner = self.body(s.body)
                if inner:
                    steps.append((LOOP, slot, s.trip, inner))
        return steps


def _scale(terms: Terms, k: int) -> Terms:
    return tuple((e, c * k) for e, c in terms)


def _inner_stride_bytes(a: Access) -> int:
    if len(a.shape) < 2 or a.shape[-1] == 1:
        return 0
    t = a.tensor
    dims = [d for d in range(len(t.shape)) if d != t.par_axis]
    flat = _flat(a, dims, _strides([t.shape[d] for d in dims]))
    return abs(flat.coef(Axis(len(a.shape) - 1))) * t.dtype.itemsize


def _describe(a: Access) -> str:
    t = a.tensor
    shape = "x".join(map(str, a.shape))
    return f"{t.name}[{shape}] {dtypes.name(t.dtype)} @{t.buffer}"


def _bytes(op: Op) -> dict[str, int]:
    out = dict.fromkeys(
        ("hbm_read_bytes", "hbm_write_bytes", "sbuf_read_bytes", "sbuf_write_bytes", "psum_read_bytes", "psum_write_bytes"), 0
    )

    def mem(t: Tensor) -> str:
        return "hbm" if t.is_hbm else t.buffer

    for a in op.ins:
        if isinstance(a, Access):
            out[f"{mem(a.tensor)}_read_bytes"] += prod(a.shape) * a.tensor.dtype.itemsize
    for a in op.outs:
        n = prod(a.shape) * a.tensor.dtype.itemsize
        out[f"{mem(a.tensor)}_write_bytes"] += n
        if op.attrs.get("accumulate") or op.attrs.get("rmw_op"):
            out[f"{mem(a.tensor)}_read_bytes"] += n
    return out


def _folded_memsets(kernel: Kernel) -> set[int]:
    """``nl.zeros(..., buffer=nl.psum)`` followed by ``+= matmul``: the zero fill becomes the
    first matmul's PSUM-zero flag (the profiler shows ``acc_flags psum_zero``), not an op."""
    folded: set[int] = set()

    def first_use(stmts: list, t: Tensor) -> Op | None:
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
                isinstance(s, Op) and s.prim == "memset" and s.attrs.get("value") == 0.0 and s.mask is None
                and s.outs and s.outs[0].tensor.buffer == "psum" and s.outs[0].is_whole
            ):
                nxt = first_use(stmts[i + 1 :], s.outs[0].tensor)
                if (
                    nxt is not None and nxt.prim == "nc_matmul" and nxt.attrs.get("accumulate")
                    and nxt.outs[0].tensor is s.outs[0].tensor and nxt.outs[0].shape == s.outs[0].tensor.shape
                ):
                    folded.add(id(s))

    walk(kernel.body)
    return folded


def _granules(tr: Tracked) -> None:
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


def lower(kernel: Kernel, target: Target, allocation: Allocation) -> LoweredKernel:
    """Lower ``kernel`` for ``target`` with on-chip tensors placed by ``allocation``."""
    lw = _Lowerer(kernel, target, allocation)
    steps = lw.body(kernel.body)
    if kernel.grid:
        for axis in reversed(range(len(kernel.grid))):  # instances run one after another [PM]
            steps = [(LOOP, axis, kernel.grid[axis], steps)]
    tracked = sorted(lw.tracked.values(), key=lambda tr: tr.index)
    for tr in tracked:
        _granules(tr)
        tr.shared = any(key[0] == tr.tensor.uid for key in allocation.shared)
    return LoweredKernel(kernel, target, allocation, steps, lw.instrs, tracked, len(lw.env), kernel.grid, lw.notes)


_ = LoopVar  # re-exported type used in annotations of callers
