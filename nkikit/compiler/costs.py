"""Cost formulas: cycles of the engine that runs an instruction, and TensorE FLOPs.

Each formula is the legacy "Estimated instruction cost" of the ISA docs [LISA] (nki.md
§3.3), written against an :class:`OpView` (the op, its main operand's partitions ``p`` and
elements per partition ``n``, and the target's §4.5 constants).  Which primitive uses which
formula is the table in :mod:`.lower`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes
from ..ir.core import Access, Op, is_accumulator
from ..targets import Target
from .regions import unit_stride


@dataclass(slots=True)
class OpView:
    """What a cost formula may look at: the op, its main operand's shape and the target."""

    op: Op
    target: Target
    engine: str
    n: int  # elements per partition of the main input (or of the output)
    p: int  # partitions of the main operand
    accesses: list[Access]  # every tensor operand, ins then outs
    psum_resident: frozenset[int] = frozenset()  # SBUF tensors the compiler keeps in PSUM

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

    def in_psum(self, a: Access) -> bool:
        return a.tensor.buffer == "psum" or a.tensor.root.uid in self.psum_resident

    def any_psum(self) -> bool:
        return any(self.in_psum(a) for a in self.accesses)

    def ins_psum(self) -> bool:
        return any(isinstance(a, Access) and self.in_psum(a) for a in self.op.ins)


def _vector_perf(v: OpView, kind: str) -> float:
    """Performance modes: the divisor applied to the legacy cost.

    NC-v3+ VectorE [A3]: 4x for 16-bit SBUF-to-SBUF copies / tensor_scalar with unit inner
    stride, 2x when strided or one side is PSUM, 2x for all-16-bit SBUF tensor_tensor.
    NC-v4 ScalarE [A4]: 2x for 16-bit tensor_copy / tensor_scalar.
    """
    if not v.target.vector_perf_modes:
        return 1.0
    if v.engine == "scalar":
        return 2.0 if kind == "copy" and v.target.nc_version >= 4 and v.sbuf_16bit() else 1.0
    if v.engine != "vector":
        return 1.0
    if kind == "copy" and v.sbuf_16bit():
        return 2.0 if v.any_psum() or not all(unit_stride(a) for a in v.accesses) else 4.0
    if kind == "tt" and not v.any_psum() and v.all_16bit():
        return 2.0
    return 1.0


def c_elementwise(v: OpView) -> float:
    """``max(MIN_II, N)``: one pass over the data (tensor_copy, tensor_scalar, activation ...)."""
    kind = "copy" if v.op.prim in ("tensor_copy", "tensor_scalar") else ""
    cost = max(v.min_ii, v.n) / _vector_perf(v, kind)
    if v.op.attrs.get("reduce_op") and v.op.prim in ("tensor_scalar", "activation", "activate2"):
        # ActReadAccumulator / reduce readout [A2, LISA]; a reduction kept in the engine's
        # accumulators is read out by a copy of its own (nkikit/trace/accumulators.py)
        if len(v.op.outs) < 2 or not is_accumulator(v.op.outs[1].tensor):
            cost += v.min_ii
    return cost


def c_tensor_tensor(v: OpView) -> float:
    """``max(MIN_II, N)`` if an input is in PSUM or all-bf16 SBUF add/mul/sub, else 2N [LISA]."""
    fast = v.ins_psum() or (
        all(a.tensor.dtype == dtypes.bfloat16 for a in v.accesses)
        and v.op.attrs.get("op") in ("add", "multiply", "subtract")
    )
    per = 1.0 if fast else v.target.vector_two_input_cycles
    return max(v.min_ii, per * v.n) / _vector_perf(v, "tt")


def c_two_pass(v: OpView) -> float:
    """Ops that stream two SBUF inputs (scan): ``max(MIN_II, 2N)`` in [LISA], charged
    ``Target.vector_two_input_cycles`` per element like tensor_tensor."""
    return max(v.min_ii, v.target.vector_two_input_cycles * v.n)


def c_select(v: OpView) -> float:
    """where(): like tensor_copy_predicated, ``N`` with a PSUM side, else ``2N`` [LISA]."""
    return max(v.min_ii, v.n if v.any_psum() else 2 * v.n)


def c_scalar_tensor_tensor(v: OpView) -> float:
    """``N`` for bf16 subtract-then-multiply on even N, else ``2N`` [LISA]."""
    a = v.op.attrs
    fast = (
        v.all_16bit() and a.get("op0") == "subtract" and a.get("op1") == "multiply" and v.n % 2 == 0
    )
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


def c_exponential(v: OpView) -> float:
    """NC-v4 VectorE exp: 4x the ScalarE exp throughput [A4 via nki-0x.md §4.6], so
    ``max(MIN_II, N / 4)``, plus the read-out of a running sum like activation's."""
    cost = max(v.min_ii, v.n / 4)
    if len(v.op.outs) > 1 and not is_accumulator(v.op.outs[1].tensor):
        cost += v.min_ii
    return cost


def c_topk(v: OpView) -> float:
    """``4n + K`` GpSimd cycles [ISA via nki-0x.md §4.8], after the GpSimd start.  Reading:
    the 8 cores work on their 16-partition groups at once, each group's result once."""
    return v.target.gpsimd_start_cycles + 4 * v.op.attrs["n"] + v.op.attrs["k"]


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
        if (
            v.op.ins[0].tensor.dtype.itemsize == 4
        ):  # fp32 passes: 4x on v2, bit-exact 2x mode on v3+ [A3]
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


def c_matmul_mx(v: OpView) -> float:
    """``max(min(64, N_stationary), N_moving)`` in containers: one moving column per cycle as
    for nc_matmul, each carrying 4 contraction values, so MX runs at 4x the bf16 rate
    ("throughput 4x bf16" [nki-0x.md §4.5, A4]; trn3's fp8 peak is 4x bf16 too)."""
    st, mv = v.op.ins[0], v.op.ins[1]
    return max(min(64, st.free_size), mv.free_size)


def f_matmul_mx(v: OpView) -> tuple[float, float]:
    # contraction over K partitions x 4 packed values
    st, mv = v.op.ins[0], v.op.ins[1]
    flops = 2.0 * 4 * st.partitions * st.free_size * mv.free_size
    return flops, flops


def c_quantize_mx(v: OpView) -> float:
    """VectorE quantize_mx: 4 source elements per partition per cycle [A4 via nki.md §3.3
    table, nki-0x.md §4.11], at least MIN_II."""
    return max(v.min_ii, v.n / 4)


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


# -- indirect DMA -------------------------------------------------------------------------------
# An indirect DMA (nl.load / nl.store / nl.atomic_rmw with an index tile) cannot use the
# descriptors the compiler builds ahead of time (the static mode [A3, HISA]): its addresses
# are known only when the index tile has been written.  A descriptor generator (hardware DGE
# on NeuronCore-v3+, GpSimd software DGE before [A3]) reads the index tile and writes one
# descriptor per partition row, each row then moves as its own element run.  The model:
#
# * start: the DGE runs once the index tile is ready and takes ``Target.dma_dge_ns`` before
#   the first descriptor exists (the ~600 ns of a HW DGE instruction on NC-v3 [A3], assumed
#   for every generation; software DGE on trn1 is not modeled as GpSimd time);
# * transfer: every row pays the usual per-row overhead (``dma_row_overhead_bytes``) plus
#   ``Target.dma_indirect_descriptor_bytes`` for its runtime-written descriptor (guess: one
#   64-byte descriptor written by the DGE and fetched by the queue, on top of the static one),
#   so an indirect DMA is never faster than the same contiguous transfer and small rows (a
#   gather of one element per partition) are overhead-bound.


def dma_ns_per_partition(
    target: Target,
    bytes_per_partition: float,
    *,
    hbm: bool,
    transpose: bool = False,
    from_hbm: bool = True,
    indirect: bool = False,
    hbm_both: bool = False,
) -> float:
    """Transfer time of one partition's bytes on one DMA queue, in ns.

    rate = queue bandwidth (capped at an even share of the core's HBM bandwidth when HBM is
    involved; at half that share when both sides are in HBM: every byte moved is read from
    HBM and written to it) x ``dma_efficiency`` (``dma_store_efficiency`` for an on-chip -> HBM store,
    when the target sets one) x a row efficiency ``b / (b + dma_row_overhead_bytes)``
    for ``b`` bytes per partition (small rows are overhead-bound [DMABW, PG]); DMA
    transposes run at ``dma_transpose_factor`` of that (at most half SBUF -> SBUF [A3]).
    An ``indirect`` DMA's rows each also carry a runtime-generated descriptor
    (``dma_indirect_descriptor_bytes`` more overhead per row; see above).
    The fixed ~1.3 us start cost is a latency the scheduler adds, not part of this time.
    """
    t = target
    bw = t.dma_queue_bytes_per_ns
    if hbm:
        bw = min(bw, t.hbm_bytes_per_ns / t.dma_queues / (2 if hbm_both else 1))
    b = bytes_per_partition
    overhead = t.dma_row_overhead_bytes + (t.dma_indirect_descriptor_bytes if indirect else 0)
    row_eff = b / (b + overhead) if b > 0 else 1.0
    # a store (on-chip -> HBM) writes HBM: it is not held back by the HBM read round trip
    # that limits a load's queue, so it has its own efficiency (see Target)
    store = hbm and not from_hbm
    eff = t.dma_store_efficiency if store and t.dma_store_efficiency is not None else None
    rate = bw * (t.dma_efficiency if eff is None else eff) * row_eff
    if transpose:
        rate *= t.dma_transpose_factor if from_hbm else min(t.dma_transpose_factor, 0.5)
    return b / rate if rate > 0 else 0.0
