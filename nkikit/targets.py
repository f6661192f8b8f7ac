"""Hardware targets: one table of per-NeuronCore numbers per Trainium generation.

The one place a generation's numbers live: the verifier's architecture limits (partitions,
matmul and PSUM tile sizes, per-instruction free sizes), the allocator's memory sizes and the
cost model's clocks, bandwidths and latencies all read the same :class:`Target`.

Every constant cites its source key in ``reference/nki.md`` (``[A2]``, ``[DMABW]``, ...).
``derived`` marks arithmetic on sourced numbers, ``guess`` a value no source gives, and
``fitted`` a value chosen so that the cost model reproduces a published measurement (the
fit is documented next to the constant and reproduced by ``benchmarks/calibration``).

``get_target(name)`` accepts the canonical names ``trn1``, ``trn2``, ``trn3`` and NKI's
aliases (``inf2``/``gen2``, ``gen3``, ``gen4``).  ``default_target_name()`` honours
``NEURON_PLATFORM_TARGET_OVERRIDE`` like the Neuron tools do [HTOP] and is trn2 otherwise.

While a kernel is traced, :func:`default_target` is the target it is being specialized for
(:func:`target_scope`, entered by ``@nki.jit``), so what a kernel reads at trace time
(``nl.tile_size``, ``nisa.get_nc_version()``) and what the verifier checks come from the same
record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from .target_info import COMPUTE_ENGINES, TargetInfo

KIB = 1024

ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT_TARGET = "trn2"

# NKI's names for the generations [HTOP, LISA nc_version].
ALIASES: dict[str, str] = {
    "trn1": "trn1",
    "inf2": "trn1",
    "gen2": "trn1",
    "trn2": "trn2",
    "gen3": "trn2",
    "trn3": "trn3",
    "gen4": "trn3",
}


class UnknownTargetError(ValueError):
    """A target name that is not a Trainium generation nkikit models."""


@dataclass(frozen=True, slots=True)
class Target:
    """Per-NeuronCore hardware numbers and cost-model constants of one generation.

    Clocks are in Hz, sizes in bytes per partition unless stated, bandwidths in bytes/ns
    (= GB/s), latencies in ns or in cycles of the engine that pays them.
    """

    name: str
    nc_version: int
    description: str
    clock_hz: dict[str, float]
    # -- memories
    partitions: int
    sbuf_bytes: int
    psum_bytes: int
    psum_banks: int
    psum_bank_bytes: int
    # -- engines
    tensor_rows: int  # PE array is rows x cols; one moving column per cycle
    tensor_cols: int
    vector_lanes: int
    gpsimd_cores: int
    vector_perf_modes: bool  # NC-v3+ auto 2x/4x VectorE modes for 16-bit data [A3]
    tensor_peak_flops: dict[str, float]  # per dtype class: bf16 / fp8 / fp32
    # -- DMA and HBM
    dma_queues: int
    dma_partitions_per_queue: int
    dma_queue_bytes_per_ns: float
    dma_fixed_ns: float
    dma_efficiency: float
    dma_transpose_factor: float
    hbm_bytes_per_ns: float
    # -- cost-model constants (engine cycles), shared by all generations unless overridden
    min_ii: int = 64
    access_overhead_cycles: int = 60
    # fitted: [PG] observes a 264-cycle II for dependent 1-element ScalarE instructions
    # = MIN_II 64 + access 60 + 140 (ScalarE and GpSimd)
    dependent_overhead_cycles: int = 140
    # fitted: VectorE streams dependent instructions back to back: the fused-Mamba v2 kernel
    # [T-MAMBA] is a chain of dependent VectorE instructions and runs VectorE 99.63% active
    # (rows mamba v2 seq 512-6144 and v3 seq 512-6144 of benchmarks/calibration)
    vector_dependent_overhead_cycles: int = 0
    # fitted: VectorE cycles per element of an fp32 instruction streaming two SBUF inputs
    # (tensor_tensor, tensor_tensor_scan); [LISA] says 2N, the fused-Mamba tutorial
    # [T-MAMBA] (VectorE-bound, 5 such instructions per step) implies ~1.4.  Fitted on the
    # mamba v2 / v3 rows of benchmarks/calibration (seq 512-6144), not on any single row.
    vector_two_input_cycles: float = 1.43
    gpsimd_start_cycles: int = 150
    semaphore_cycles: int = 100
    dma_row_overhead_bytes: int = 64
    # efficiency of a store (on-chip -> HBM); None: ``dma_efficiency`` (see trn1)
    dma_store_efficiency: float | None = None
    max_buffers: int = 4
    sequential_buffers: int = 2
    sbuf_align: int = 64
    # -- indirect DMA (see compiler/costs.py)
    dma_dge_ns: float = (
        600.0  # [A3] one hardware-DGE instruction ~600 ns (assumed on every generation)
    )
    dma_indirect_descriptor_bytes: int = 64  # guess: one runtime-written descriptor per row
    # -- instruction limits the verifier checks (elements per partition unless stated)
    psum_tile_bytes: int = 2 * KIB  # one matmul output / PSUM tile: a bank [A2, MIG]
    gemm_stationary_fmax: int = 128  # [HISA]
    gemm_moving_fmax: int = 512  # [HISA] (NC-v4: 4096 fp32)
    bn_stats_fmax: int = 512  # [HAPI]
    sbuf_fmax: int = 64 * KIB  # one Vector/Scalar/GpSimd instruction's SBUF free size
    psum_fmax: int = 4 * KIB  # the same in PSUM
    max_tile_dims: int = 5  # partition + a 4-D free access pattern
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def pmax(self) -> int:
        """Partitions an on-chip tile may span (``nl.tile_size.pmax``)."""
        return self.partitions

    @property
    def psum_bank_fmax(self) -> int:
        """fp32 elements per partition of one PSUM bank (``nl.tile_size.psum_bank_fmax``)."""
        return self.psum_bank_bytes // 4

    @property
    def psum_tile_fmax(self) -> int:
        """fp32 elements per partition of one PSUM tile (a matmul result), the limit the
        verifier checks (Beta-1 ``nl.tile_size.psum_fmax``): a bank up to NC-v3, the whole
        PSUM on NC-v4."""
        return self.psum_tile_bytes // 4

    def dependent_cycles(self, engine: str) -> int:
        """Cycles an instruction waits when it reads its own engine's previous result."""
        if engine == "vector":
            return self.vector_dependent_overhead_cycles
        return self.dependent_overhead_cycles if engine in ("scalar", "gpsimd") else 0

    def clock(self, engine: str) -> float:
        return self.clock_hz[engine]

    def cycles_ns(self, engine: str, cycles: float) -> float:
        """Duration in ns of ``cycles`` cycles of ``engine``."""
        return cycles * 1e9 / self.clock_hz[engine]

    @property
    def dma_bytes_per_ns(self) -> float:
        """Peak rate of all DMA queues together (before efficiency)."""
        return self.dma_queues * self.dma_queue_bytes_per_ns

    def target_info(self) -> TargetInfo:
        """The numbers the profiler's summary metrics divide by."""
        return TargetInfo(
            name=self.name,
            tensor_peak_flops=dict(self.tensor_peak_flops),
            hbm_bytes_per_s=self.hbm_bytes_per_ns * 1e9,
            engine_clock_hz={e: self.clock_hz[e] for e in COMPUTE_ENGINES},
            dma_queues=self.dma_queues,
        )

    def with_overrides(self, **changes: Any) -> Target:
        """A copy with some constants changed (for experiments and calibration)."""
        return replace(self, **changes)


def _peaks(
    tensor_hz: float, fp8_factor: float, rows: int = 128, cols: int = 128
) -> dict[str, float]:
    # derived: rows x cols PEs x 2 FLOP (multiply-add) per cycle; fp32 runs at 1/4 [A2, LISA]
    bf16 = rows * cols * 2 * tensor_hz
    return {"bf16": bf16, "fp8": bf16 * fp8_factor, "fp32": bf16 / 4}


TRN1 = Target(
    name="trn1",
    nc_version=2,
    description="Trainium / Inferentia2, NeuronCore-v2",
    clock_hz={
        "tensor": 2.8e9,  # [A2] TensorE 2.8 GHz
        "vector": 1.12e9,  # [A2] VectorE 1.12 GHz
        "scalar": 1.4e9,  # [A2] ScalarE 1.4 GHz
        "gpsimd": 1.4e9,  # [A2] GpSimd 1.4 GHz
        "sync": 1.4e9,  # guess: the Sync sequencer at the ScalarE/GpSimd clock
    },
    partitions=128,  # [PM, A2]
    sbuf_bytes=192 * KIB,  # [A2] 24 MiB = 128 x 192 KiB
    psum_bytes=16 * KIB,  # [A2] 2 MiB = 128 x 16 KiB
    psum_banks=8,  # [A2] 8 banks of 2 KiB per partition
    psum_bank_bytes=2 * KIB,  # [A2, MIG]
    tensor_rows=128,  # [A2] 128x128 systolic array
    tensor_cols=128,
    vector_lanes=128,  # [A2]
    gpsimd_cores=8,  # [A2] 8 cores x 16 partitions
    vector_perf_modes=False,  # [A3] performance modes are an NC-v3 feature
    tensor_peak_flops=_peaks(
        2.8e9, fp8_factor=1.0
    ),  # derived 91.75 TFLOPS ~ [A2] "~92"; cFP8 at bf16 rate [A2]
    dma_queues=16,  # [A2, DMA] 16 DMA engines per NeuronCore
    dma_partitions_per_queue=8,  # [DMA] each engine ~8 partitions of a 128-partition transfer
    dma_queue_bytes_per_ns=17.0,  # [DMA, DMABW] 17 B/ns per engine on Trn1
    dma_fixed_ns=1300.0,  # [DMABW] descriptor + sync + semaphore-to-start ~1300 ns
    # fitted: the four matmul tutorial kernels on Trn1 [T-MM] all move 100-106 GB/s of HBM
    # traffic (bytes / published time): ~0.4 of 16 queues x 17 B/ns.  0.41 minimizes the
    # largest time error of the three DMA-bound steps (scan: benchmarks/calibration/README.md).
    dma_efficiency=0.41,
    # fitted: the matmul rows and the fused-Mamba v1 row are loads at ~0.41 whatever their
    # row size (256 B - 2 KiB) or transfer size (2 - 16 KiB per queue), so no size curve
    # lets large transfers run faster; the LayerNorm rows [T-LN] (half of their 268 MB are
    # stores) need >= 136 GB/s.  A store writes HBM and does not wait on the read round trip
    # that limits a load's in-order queue [DMA: one queue per trigger engine, in order].
    # Fitted on rows layernorm_v1 / v2 4096x8192, bounded by row fully_optimized (its
    # output stores: above 0.6 it models more than 5% fast); scan in benchmarks/calibration.
    dma_store_efficiency=0.6,
    dma_transpose_factor=0.125,  # guess: legacy load_transpose2d has "much lower DMA BW" [LNL, PG]
    hbm_bytes_per_ns=410.0,  # derived: 820 GB/s per chip [TRN1, A2] / 2 NeuronCores (even split unconfirmed)
    notes={"hbm": "per-core share of chip HBM bandwidth is unconfirmed [nki.md 4.2]"},
)

TRN2 = Target(
    name="trn2",
    nc_version=3,
    description="Trainium2, NeuronCore-v3",
    clock_hz={
        "tensor": 2.4e9,  # [A3]
        "vector": 0.96e9,  # [A3]
        "scalar": 1.2e9,  # [A3]
        "gpsimd": 1.2e9,  # [A3]
        "sync": 1.2e9,  # guess: as ScalarE/GpSimd
    },
    partitions=128,
    sbuf_bytes=224 * KIB,  # [A3] 28 MiB = 128 x 224 KiB
    psum_bytes=16 * KIB,  # [A3] 2 MiB
    psum_banks=8,  # [A2, MIG] same bank structure
    psum_bank_bytes=2 * KIB,
    tensor_rows=128,
    tensor_cols=128,
    vector_lanes=128,
    gpsimd_cores=8,
    vector_perf_modes=True,  # [A3] auto 2x/4x modes for bf16/fp16
    tensor_peak_flops=_peaks(
        2.4e9, fp8_factor=2.0
    ),  # derived 78.6 ~ [A3] 79 bf16, 158 fp8, 20 fp32
    dma_queues=16,  # [A3, DMA]
    dma_partitions_per_queue=8,  # [DMA]
    dma_queue_bytes_per_ns=23.0,  # [DMA, DMABW] 23 B/ns per engine on Trn2
    dma_fixed_ns=1300.0,  # [DMABW]
    # guess: near peak; the trn2 profiling walkthrough [T-OPT] shows the fully optimized
    # matmul with DMA active only 21.54% of the time, which needs >= ~0.9 of peak.
    dma_efficiency=1.0,
    dma_transpose_factor=0.9,  # [A3] DMA transpose up to 90% of DMA bandwidth (HBM -> SBUF)
    hbm_bytes_per_ns=362.5,  # derived: 2.9 TB/s [TRN2] / 8 NeuronCores
)

TRN3 = Target(
    name="trn3",
    nc_version=4,
    description="Trainium3, NeuronCore-v4",
    clock_hz={
        "tensor": 2.4e9,  # [A4]
        "vector": 1.2e9,  # [A4]
        "scalar": 1.2e9,  # [A4]
        "gpsimd": 1.2e9,  # [A4]
        "sync": 1.2e9,  # guess
    },
    partitions=128,
    sbuf_bytes=256 * KIB,  # derived: 32 MiB [A4] / 128 partitions
    psum_bytes=16 * KIB,  # [A4] 2 MiB
    psum_banks=8,
    psum_bank_bytes=2 * KIB,
    tensor_rows=128,
    tensor_cols=128,
    vector_lanes=128,
    gpsimd_cores=8,
    vector_perf_modes=True,  # [A3, A4] kept from NC-v3
    tensor_peak_flops=_peaks(
        2.4e9, fp8_factor=4.0
    ),  # derived 78.6 ~ [A4] 79 bf16, 315 MXFP8, 20 fp32
    dma_queues=16,  # [A4, DMA]
    dma_partitions_per_queue=8,  # [DMA]
    dma_queue_bytes_per_ns=33.0,  # [DMA, DMABW] 33 B/ns per engine on Trn3
    dma_fixed_ns=1300.0,  # [DMABW]
    dma_efficiency=1.0,  # guess: as trn2
    dma_transpose_factor=0.9,  # [A3] (assumed unchanged on v4)
    hbm_bytes_per_ns=612.5,  # derived: 4.9 TB/s [TRN3] / 8 NeuronCores (arch guide: 4.7 TB/s [A4])
    # NC-v4: one matmul may fill the whole PSUM, 4096 fp32 moving columns [HISA, RN 0.5.0]
    psum_tile_bytes=16 * KIB,
    gemm_moving_fmax=4096,
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}


def _valid_names() -> str:
    aliases = ", ".join(f"{a} -> {c}" for a, c in ALIASES.items() if a != c)
    return f"{', '.join(TARGETS)} (aliases: {aliases})"


def canonical_name(name: str) -> str:
    """``trn1`` for ``trn1``/``inf2``/``gen2`` and so on; UnknownTargetError otherwise."""
    key = str(name).strip().lower()
    if key not in ALIASES:
        raise UnknownTargetError(f"unknown target {name!r}; valid targets: {_valid_names()}")
    return ALIASES[key]


def default_target_name(fallback: str = DEFAULT_TARGET) -> str:
    """The target named by ``NEURON_PLATFORM_TARGET_OVERRIDE``, else by ``NKI_NC_VERSION``
    (``gen2``/``gen3``/``gen4``, which the NKI Library's simulation harness sets from a test's
    platform, ``test/utils/simulation_setup.py``), else ``fallback``: a dialect's own default
    (``trn2``; NKI 0.x kernels ``trn3``, as AWS's 0.x simulator on a machine with no Neuron
    chip [reference/nki-0x.md §6.4])."""
    env = os.environ.get(ENV_VAR)
    if not env and os.environ.get("NKI_NC_VERSION") in ("gen2", "gen3", "gen4"):
        return ALIASES[os.environ["NKI_NC_VERSION"]]
    if env:
        try:
            return canonical_name(env)
        except UnknownTargetError:
            raise UnknownTargetError(
                f"{ENV_VAR}={env!r} is not a valid target; valid targets: {_valid_names()}"
            ) from None
    return fallback


def get_target(target: str | Target | None = None) -> Target:
    """The Target for a name or alias; ``None`` means :func:`default_target_name`."""
    if isinstance(target, Target):
        return target
    if target is None:
        return TARGETS[default_target_name()]
    return TARGETS[canonical_name(target)]


# The target of the kernel being traced; None outside a trace.
_SCOPED: ContextVar[Target | None] = ContextVar("nkikit_scoped_target", default=None)


@contextmanager
def target_scope(target: str | Target | None) -> Iterator[Target]:
    """Within the block, :func:`default_target` is ``target`` (``None``: the environment's).
    ``@nki.jit`` traces a kernel inside the scope of the target it specializes for."""
    t = get_target(target)
    token = _SCOPED.set(t)
    try:
        yield t
    finally:
        _SCOPED.reset(token)


def default_target() -> Target:
    """The target of the kernel being traced (see :func:`target_scope`); outside a trace, the
    one ``NEURON_PLATFORM_TARGET_OVERRIDE`` names, else trn2."""
    scoped = _SCOPED.get()
    return scoped if scoped is not None else get_target(None)
