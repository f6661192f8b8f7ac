"""``nkikit.isa`` — NKI's ``nki.isa``: one function per NeuronCore instruction."""

from ..language.unsupported import NotSupported as _NotSupported
from ..targets import default_target as _default_target
from .instructions import (  # noqa: F401
    activation,
    activation_reduce,
    affine_select,
    bn_aggr,
    bn_stats,
    dge_mode,
    dma_copy,
    dropout,
    engine,
    fp32,
    iota,
    local_gather,
    matmul_perf_mode,
    max8,
    memset,
    nc_find_index8,
    nc_match_replace8,
    nc_matmul,
    nc_stream_shuffle,
    nc_transpose,
    nc_version,
    oob_mode,
    range_select,
    reciprocal,
    reduce_cmd,
    scalar_tensor_tensor,
    select_reduce,
    sequence_bounds,
    tensor_copy,
    tensor_partition_reduce,
    tensor_reduce,
    tensor_scalar,
    tensor_scalar_reduce,
    tensor_tensor,
    tensor_tensor_scan,
)

tensor_copy_dynamic_src = _NotSupported(
    "nisa.tensor_copy_dynamic_src", "copy with a static index, or gather with nisa.local_gather"
)
tensor_copy_dynamic_dst = _NotSupported(
    "nisa.tensor_copy_dynamic_dst", "copy with a static index into the destination"
)
tensor_copy_predicated = _NotSupported(
    "nisa.tensor_copy_predicated", "select with nl.where(predicate, src, dst) and copy"
)
dma_transpose = _NotSupported(
    "nisa.dma_transpose", "transpose on the TensorE with nisa.nc_transpose or nl.load_transpose2d"
)

# NKI Beta-1's engine constants (later releases: ``engine.<name>``)
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def get_nc_version() -> nc_version:
    """The NeuronCore generation of the target the kernel is traced for
    (``NEURON_PLATFORM_TARGET_OVERRIDE``, else trn2): gen2 (trn1/inf2), gen3 (trn2), gen4
    (trn3)."""
    return nc_version(_default_target().nc_version)
