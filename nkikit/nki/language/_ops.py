"""The ``op=`` constants of NKI 0.x (``nl.add``, ``nl.exp``, ...) and the experimental
high-level wrappers they double as (``nl.add(x, y)`` returns a new SBUF tensor).

Each constant is a function whose ``__name__`` is the ALU operator or activation function it
names, which is how ``nisa.*(op=...)`` reads it.  Called, it lowers to one or a few
``nki.isa`` instructions.
"""

from __future__ import annotations

import builtins

import numpy as np

from ...errors import caller_loc
from ...ir.opnames import ACTIVATIONS, ALU_OPS
from ..tensor import NkiTensor, require_tensor

_SCALAR = (int, float, np.integer, np.floating)  # numpy scalars, as NKI takes them

# ALU binary operators and their wrappers (VectorE tensor_tensor / tensor_scalar)
BINARY = (
    "add subtract multiply divide maximum minimum power mod fmod equal not_equal greater "
    "greater_equal less less_equal logical_and logical_or logical_xor bitwise_and bitwise_or "
    "bitwise_xor left_shift right_shift abs_max abs_min"
).split()
# activation functions (ScalarE activation)
ACTIVATION = (
    "exp log tanh sigmoid relu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid "
    "gelu_apprx_sigmoid_dx silu silu_dx erf erf_dx softplus mish sqrt rsqrt sin cos tan arctan "
    "sign square copy identity reciprocal ceil floor trunc"
).split()
OTHER = ["abs", "negative", "invert", "logical_not", "bypass", "average", "prelu"]


def _operand(x, op: str, what: str) -> None:
    """Refuse ``x`` (argument ``what`` of ``nl.op``) unless it is a tensor (a tile grid's
    ``.data`` is one; the grid itself has a shape of its own)."""
    if type(x) is not NkiTensor:
        require_tensor(x, caller_loc(), f"nl.{op}", what)


def _new_like(x: NkiTensor, dtype):
    from . import ndarray, sbuf

    return ndarray(x.shape, dtype or x.dtype, buffer=sbuf)


def _make_binary(name: str):
    def fn(x, y, dtype=None):
        from .. import isa

        if isinstance(x, _SCALAR) and isinstance(y, NkiTensor):
            out = _new_like(y, dtype)
            isa.tensor_scalar(out, y, fn, float(x), reverse0=True)
            return out
        _operand(x, name, "x")
        if not isinstance(y, _SCALAR):
            _operand(y, name, "y")
        out = _new_like(x, dtype)
        if isinstance(y, _SCALAR):
            isa.tensor_scalar(out, x, fn, float(y))
        elif (
            isinstance(y, NkiTensor)
            and y.size // builtins.max(y.shape[0], 1) == 1
            and x.size > x.shape[0]
        ):
            isa.tensor_scalar(out, x, fn, y)  # a (P, 1) operand broadcasts along the free axis
        else:
            isa.tensor_tensor(out, x, y, fn)
        return out

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``{name}(x, y)`` elementwise into a new SBUF tensor; also ``op={name}``."
    return fn


def _make_activation(name: str):
    def fn(x, dtype=None):
        from .. import isa

        _operand(x, name, "x")
        out = _new_like(x, dtype)
        isa.activation(out, fn, x)
        return out

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``{name}(x)`` on the ScalarE into a new SBUF tensor; also ``op={name}``."
    return fn


def _make_alu_unary(name: str):
    def fn(x, dtype=None):
        from .. import isa

        _operand(x, name, "x")
        out = _new_like(x, dtype)
        if name == "negative":
            isa.tensor_scalar(out, x, OPS["multiply"], -1.0)
        else:
            isa.tensor_scalar(out, x, fn, 0.0)
        return out

    fn.__name__ = fn.__qualname__ = name
    return fn


OPS: dict[str, object] = {}
for _n in BINARY:
    OPS[_n] = _make_binary(_n)
for _n in ACTIVATION:
    if _n not in OPS:
        OPS[_n] = _make_activation(_n)
for _n in OTHER:
    OPS[_n] = _make_alu_unary(_n)
globals().update(OPS)

# names the op tables must know: a check that the two lists above stay within them
assert all(
    n in ALU_OPS or n in ACTIVATIONS or n in ("abs_max", "abs_min", "average", "prelu") for n in OPS
), sorted(n for n in OPS if n not in ALU_OPS and n not in ACTIVATIONS)


def _reduce_wrapper(name: str, op: str):
    def fn(x, axis, dtype=None, keepdims=False):
        from .. import isa
        from . import ndarray, sbuf

        _operand(x, name, "x")
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a + x.ndim if a < 0 else a for a in axes)
        shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
        if not keepdims:
            kept = tuple(n for d, n in enumerate(x.shape) if d not in axes)
            shape = kept if len(kept) >= 2 else (x.shape[0], 1)
        out = ndarray(shape, dtype or x.dtype, buffer=sbuf)
        isa.tensor_reduce(out, OPS[op], x, axes, keepdims=keepdims)
        if name == "mean":
            n = 1
            for a in axes:
                n *= x.shape[a]
            isa.tensor_scalar(out, out, OPS["multiply"], 1.0 / n)
        return out

    fn.__name__ = fn.__qualname__ = name
    return fn


sum = _reduce_wrapper("sum", "add")  # noqa: A001
max = _reduce_wrapper("max", "maximum")  # noqa: A001
min = _reduce_wrapper("min", "minimum")  # noqa: A001
mean = _reduce_wrapper("mean", "add")
prod = _reduce_wrapper("prod", "multiply")


def load(src: NkiTensor, dtype=None) -> NkiTensor:
    """HBM -> a new SBUF tensor of the same shape (experimental wrapper over dma_copy)."""
    from .. import isa
    from . import ndarray, sbuf

    _operand(src, "load", "src")
    shape = src.shape if len(src.shape) >= 2 else (src.shape[0], 1)
    out = ndarray(shape, dtype or src.dtype, buffer=sbuf)
    isa.dma_copy(out, src)
    return out


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """SBUF -> HBM (experimental wrapper over dma_copy)."""
    from .. import isa

    isa.dma_copy(dst, value)


def copy(x: NkiTensor, dtype=None) -> NkiTensor:
    """A new SBUF copy of an on-chip tensor (VectorE tensor_copy, bit-exact for equal dtypes)."""
    from .. import isa

    _operand(x, "copy", "x")
    out = _new_like(x, dtype)
    isa.tensor_copy(out, x)
    return out


def transpose(x: NkiTensor, dtype=None) -> NkiTensor:
    """A 2-D partition <-> free transpose into a new PSUM tensor (TensorE)."""
    from .. import isa
    from . import ndarray, psum

    _operand(x, "transpose", "x")
    out = ndarray((x.shape[1], x.shape[0]), dtype or x.dtype, buffer=psum)
    isa.nc_transpose(out, x)
    return out


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False) -> NkiTensor:
    """``x @ y`` (or ``x.T @ y``) into a new fp32 PSUM tensor."""
    from .. import isa
    from . import float32, ndarray, psum, sbuf

    _operand(x, "matmul", "x")
    _operand(y, "matmul", "y")
    if not transpose_x:
        xt_psum = transpose(x)
        xt = ndarray(xt_psum.shape, x.dtype, buffer=sbuf)
        isa.tensor_copy(xt, xt_psum)
        x = xt
    out = ndarray((x.shape[1], y.shape[1]), float32, buffer=psum)
    isa.nc_matmul(out, x, y)
    return out


__all__ = [
    *OPS,
    "sum",
    "max",
    "min",
    "mean",
    "prod",
    "load",
    "store",
    "copy",
    "transpose",
    "matmul",
]
