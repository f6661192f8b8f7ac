"""``nkikit.language`` — NKI Beta-1's ``nki.language`` (``import nkikit.language as nl``)."""

from types import SimpleNamespace

import numpy as np

from .. import dtypes as _dt
from ..trace.index import arange, ds, mgrid  # noqa: F401
from . import ops as _ops
from .creation import (  # noqa: F401
    affine_range,
    empty_like,
    hbm,
    nc,
    ndarray,
    num_programs,
    ones,
    ones_like,
    par_dim,
    private_hbm,
    program_id,
    program_ndim,
    psum,
    sbuf,
    sequential_range,
    shared_constant,
    shared_hbm,
    shared_identity_matrix,
    spmd_dim,
    static_range,
    zeros,
    zeros_like,
)
from .ops import (  # noqa: F401
    all,
    atomic_rmw,
    broadcast_to,
    copy,
    device_print,
    expand_dims,
    full,
    load,
    load_transpose2d,
    matmul,
    max,
    mean,
    min,
    prod,
    reciprocal,
    rms_norm,
    softmax,
    store,
    sum,
    transpose,
    var,
    where,
)

for _name in _ops.BINARY + _ops.UNARY:
    globals()[_name] = getattr(_ops, _name)

bool_ = _dt.bool_
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, float32, bfloat16, tfloat32 = _dt.float16, _dt.float32, _dt.bfloat16, _dt.tfloat32
float8_e4m3, float8_e4m3fn, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e4m3fn, _dt.float8_e5m2

fp32 = SimpleNamespace(min=float(np.finfo(np.float32).min), max=float(np.finfo(np.float32).max))
bf16 = SimpleNamespace(min=-3.3895313892515355e38, max=3.3895313892515355e38)


class tile_size:  # noqa: N801 - NKI's name
    """Architecture tile limits (NeuronCore-v2/v3)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    sbuf_fmax = 65536
    total_available_sbuf_size = 192 * 1024
    sbuf_size_bytes = 192 * 1024


def loop_reduce(x, op, loop_indices, **kwargs):
    """Not supported: write the accumulation across iterations as ``acc[...] += x``."""
    from ..errors import NkiError, caller_loc

    raise NkiError(
        "err_unsupported_api",
        caller_loc(),
        api="nl.loop_reduce",
        why="write `acc[...] += x` instead",
    )
