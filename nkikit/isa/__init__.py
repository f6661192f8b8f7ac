"""``nkikit.isa`` — NKI's ``nki.isa``: one function per NeuronCore instruction."""

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
    tensor_copy,
    tensor_partition_reduce,
    tensor_reduce,
    tensor_scalar,
    tensor_scalar_reduce,
    tensor_tensor,
    tensor_tensor_scan,
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
