"""``nkikit.isa`` — NKI's ``nki.isa``: one function per NeuronCore instruction."""

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


def get_nc_version():
    """The NeuronCore generation of the current target (``NEURON_PLATFORM_TARGET_OVERRIDE``)."""
    import os

    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    return {"trn1": nc_version.gen2, "inf2": nc_version.gen2, "trn3": nc_version.gen4}.get(
        target, nc_version.gen3
    )
