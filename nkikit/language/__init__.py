"""``nkikit.language`` — NKI Beta-1's ``nki.language`` (``import nkikit.language as nl``).

The package is also the home of the Beta-1 dialect's machinery under ``nl`` and ``nisa``: the
proxy tensor (``tile``), argument parsing shared with ``nisa`` (``operands``) and the
``@nki.jit`` kernel class (``jit``)."""

from types import SimpleNamespace as _SimpleNamespace

import numpy as np

from .. import dtypes as _dt
from ..targets import default_target as _default_target
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

fp32 = _SimpleNamespace(min=float(np.finfo(np.float32).min), max=float(np.finfo(np.float32).max))
bf16 = _SimpleNamespace(min=-3.3895313892515355e38, max=3.3895313892515355e38)


class _TileSize:
    """``nl.tile_size``: the architecture limits of the target the kernel is traced for
    (``NEURON_PLATFORM_TARGET_OVERRIDE``, else trn2; ``nki.compile(..., target=)`` traces for
    its target), read from ``nkikit.targets`` — the numbers the verifier checks."""

    __slots__ = ()

    @property
    def pmax(self) -> int:
        """Partitions a tile may span."""
        return _default_target().pmax

    @property
    def psum_fmax(self) -> int:
        """fp32 elements per partition of a PSUM tile (a matmul result)."""
        return _default_target().psum_tile_fmax

    @property
    def psum_bank_fmax(self) -> int:
        """fp32 elements per partition of one PSUM bank."""
        return _default_target().psum_bank_fmax

    @property
    def psum_bank_fmax_bytes(self) -> int:
        """Bytes per partition of one PSUM bank."""
        return _default_target().psum_bank_bytes

    @property
    def psum_num_banks(self) -> int:
        """PSUM banks per partition."""
        return _default_target().psum_banks

    @property
    def gemm_stationary_fmax(self) -> int:
        """Free size of nc_matmul's stationary operand."""
        return _default_target().gemm_stationary_fmax

    @property
    def gemm_moving_fmax(self) -> int:
        """Free size of nc_matmul's moving operand."""
        return _default_target().gemm_moving_fmax

    @property
    def bn_stats_fmax(self) -> int:
        """Elements per partition one bn_stats reads."""
        return _default_target().bn_stats_fmax

    @property
    def sbuf_fmax(self) -> int:
        """Elements per partition one Vector/Scalar/GpSimd instruction reads from SBUF."""
        return _default_target().sbuf_fmax

    @property
    def total_available_sbuf_size(self) -> int:
        """SBUF bytes per partition."""
        return _default_target().sbuf_bytes

    @property
    def sbuf_size_bytes(self) -> int:
        """SBUF bytes per partition (as ``total_available_sbuf_size``)."""
        return _default_target().sbuf_bytes

    def __repr__(self) -> str:
        return f"nl.tile_size({_default_target().name})"


tile_size = _TileSize()


def static_cast(ndarray, dtype) -> np.ndarray:  # noqa: F811 - NKI names the argument so
    """Host-side cast of a numpy array to an NKI dtype (``nl.bfloat16`` etc.), rounding to
    nearest even as the hardware does; for preparing kernel inputs, not inside a kernel."""
    from ..errors import NkiError, caller_loc
    from ..trace.builder import maybe_current

    if maybe_current() is not None:
        raise NkiError(
            "err_unsupported_api",
            caller_loc(),
            api="nl.static_cast inside a kernel",
            why="cast tiles with nisa.tensor_copy(x, dtype=...) or an op's dtype=",
        )
    return np.asarray(ndarray).astype(_dt.as_dtype(dtype))  # the argument, not nl.ndarray


from .unsupported import NotSupported as _NotSupported  # noqa: E402

rand = _NotSupported(
    "nl.rand", "random tensors are not simulated bit-exactly; pass random inputs to the kernel"
)
random_seed = _NotSupported("nl.random_seed", "the hardware RNG is not simulated")
dropout = _NotSupported(
    "nl.dropout", "the hardware RNG is not simulated; use nisa.dropout with an explicit rate"
)
gather_flattened = _NotSupported(
    "nl.gather_flattened", "gather with nisa.local_gather or an indirect nl.load"
)
all_reduce = _NotSupported(
    "nl.all_reduce", "collectives across NeuronCores are not simulated in the Beta-1 dialect"
)


loop_reduce = _NotSupported("nl.loop_reduce", "write `acc[...] += x` instead")
