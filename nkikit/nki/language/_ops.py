"""The ``op=`` constants of NKI 0.x (``nl.add``, ``nl.exp``, ...) and the experimental
high-level wrappers they double as (``nl.add(x, y)`` returns a new SBUF tensor).

Each constant is a function whose ``__name__`` is the ALU operator or activation function it
names, which is how ``nisa.*(op=...)`` reads it.  Called, it lowers to one or a few
``nki.isa`` instructions.
"""

from __future__ import annotations

import builtins

import numpy as np

from ...errors import NkiError, caller_loc
from ...ir.opnames import ACTIVATIONS, ALU_OPS
from ...trace.instructions import flag as _flag
from ..tensor import NkiTensor, as_dtype, require_tensor

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

    return ndarray(x.shape, x.dtype if dtype is None else dtype, buffer=sbuf)


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
assert builtins.all(
    n in ALU_OPS or n in ACTIVATIONS or n in ("abs_max", "abs_min", "average", "prelu") for n in OPS
), sorted(n for n in OPS if n not in ALU_OPS and n not in ACTIVATIONS)


def _reduce_wrapper(name: str, op: str):
    def fn(x, axis, dtype=None, keepdims=False):
        from .. import isa
        from . import ndarray, sbuf

        _operand(x, name, "x")
        axes = _axes(x, axis, name)
        shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
        if not keepdims:
            kept = tuple(n for d, n in enumerate(x.shape) if d not in axes)
            shape = kept if len(kept) >= 2 else (x.shape[0], 1)
        out = ndarray(shape, x.dtype if dtype is None else dtype, buffer=sbuf)
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
    out = ndarray(shape, src.dtype if dtype is None else dtype, buffer=sbuf)
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
    out = ndarray((x.shape[1], x.shape[0]), x.dtype if dtype is None else dtype, buffer=psum)
    isa.nc_transpose(out, x)
    return out


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False) -> NkiTensor:
    """``x @ y`` (or ``x.T @ y``) into a new fp32 PSUM tensor."""
    from .. import isa
    from . import float32, ndarray, psum, sbuf

    _operand(x, "matmul", "x")
    _operand(y, "matmul", "y")
    if not _flag(transpose_x, "transpose_x", "nc_matmul", caller_loc(), api="nl.matmul"):
        xt_psum = transpose(x)
        xt = ndarray(xt_psum.shape, x.dtype, buffer=sbuf)
        isa.tensor_copy(xt, xt_psum)
        x = xt
    out = ndarray((x.shape[1], y.shape[1]), float32, buffer=psum)
    isa.nc_matmul(out, x, y)
    return out


def _shape_of(shape, x: NkiTensor, op: str, loc) -> tuple[int, ...]:
    """``shape`` (the target of ``nl.broadcast_to``) as ints of ``x``'s rank, each dimension
    equal to ``x``'s or broadcast from 1; else ``err_invalid_argument`` at ``loc``."""
    try:
        target = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nl.{op}",
            why=f"shape {shape!r} is not a tuple of ints",
        ) from None
    if len(target) != x.ndim or any(a != b and a != 1 for a, b in zip(x.shape, target)):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nl.{op}",
            why=f"cannot broadcast {tuple(x.shape)} to {target}: the rank must match and each "
            "dimension be equal or 1",
        )
    return target


def _spread(x: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
    """A view of ``x`` whose free dimensions of size 1 repeat to ``shape``'s (stride 0)."""
    for d in builtins.range(1, x.ndim):
        if x.shape[d] == 1 and shape[d] != 1:
            x = x.broadcast(d, shape[d])
    return x


def broadcast_to(x, shape, dtype=None) -> NkiTensor:
    """``x`` repeated to ``shape`` (numpy rules, same rank) in a new SBUF tensor: free
    dimensions of size 1 by repeated reads (a VectorE copy), a single partition onto every
    partition by the TensorE's ones-row matmul (the shared emit layer's partition broadcast).
    ``x`` itself when the shape and dtype already match."""
    from ...trace import instructions as E
    from .. import isa
    from ..tensor import access_of

    loc = caller_loc()
    _operand(x, "broadcast_to", "x")
    target = _shape_of(shape, x, "broadcast_to", loc)
    if dtype is not None:
        dtype = as_dtype(dtype, loc, "nl.broadcast_to")
    if target == tuple(x.shape) and (dtype is None or dtype == x.dtype):
        return x
    src = _spread(x, target)
    out = _new_shape(target, x.dtype if dtype is None else dtype)
    if target[0] == x.shape[0]:
        isa.tensor_copy(out, src)
        return out
    from . import is_sbuf

    if not is_sbuf(x.buffer):  # the TensorE reads SBUF: a PSUM tile goes there first
        x = copy(x)
        src = _spread(x, target)
    row = NkiTensor(src._layout, (1, *target[1:]), src.strides, src.offset)
    E.emit_partition_broadcast(access_of(out, loc), access_of(row, loc), loc=loc)
    return out


def expand_dims(x, axis: int) -> NkiTensor:
    """A view of ``x`` with a new axis of size 1 at ``axis`` (``numpy.expand_dims``)."""
    _operand(x, "expand_dims", "x")
    nd = x.ndim
    if (
        not isinstance(axis, int | np.integer)
        or isinstance(axis, bool)
        or not -nd - 1 <= axis <= nd
    ):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.expand_dims",
            why=f"axis {axis!r} must be an int in [{-nd - 1}, {nd}] for a {nd}-D tensor",
        )
    return x.expand_dim(int(axis))


def _new_shape(shape, dtype) -> NkiTensor:
    from . import ndarray, sbuf

    return ndarray(tuple(shape), dtype, buffer=sbuf)


def _axes(x: NkiTensor, axis, op: str = "reduce") -> tuple[int, ...]:
    """``axis`` (an int or ints) as distinct non-negative axes of ``x``; anything else is
    ``err_invalid_argument`` at the caller's line."""
    nd = x.ndim
    if isinstance(axis, int | np.integer) and not isinstance(axis, bool):
        axes = (int(axis),)
    elif isinstance(axis, tuple | list) and builtins.all(
        isinstance(a, int | np.integer) and not isinstance(a, bool) for a in axis
    ):
        axes = tuple(int(a) for a in axis)
    else:
        axes = None
    if (
        axes is None
        or not axes
        or not builtins.all(-nd <= a < nd for a in axes)
        or len(set(a % nd for a in axes)) != len(axes)
    ):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=f"nl.{op}",
            why=f"axis {axis!r} must be distinct ints in [-{nd}, {nd}) for a {nd}-D tensor",
        )
    return tuple(a + nd if a < 0 else a for a in axes)


def _stat(x: NkiTensor, op: str, axes, dtype) -> NkiTensor:
    """The ``op`` reduction of ``x`` over ``axes``, kept as dimensions of size 1 (fp32
    unless ``dtype``), and the view of it repeated back to ``x``'s shape."""
    from .. import isa
    from . import float32

    shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    out = _new_shape(shape, dtype or float32)
    isa.tensor_reduce(out, OPS[op], x, axes, keepdims=True)
    return out


def where(condition, x, y, dtype=None) -> NkiTensor:
    """``x`` where ``condition`` is non-zero, else ``y`` (tensors or numbers), into a new
    SBUF tensor (a copy of ``y`` then a predicated copy of ``x``, VectorE)."""
    from .. import isa

    _operand(condition, "where", "condition")
    for v, what in ((x, "x"), (y, "y")):
        if not isinstance(v, _SCALAR):
            _operand(v, "where", what)
    like = next((v for v in (x, y) if isinstance(v, NkiTensor)), condition)
    out = _new_like(
        like if like is not condition else condition, (like.dtype if dtype is None else dtype)
    )
    if isinstance(y, _SCALAR):
        isa.memset(out, float(y))
    else:
        isa.tensor_copy(out, y)
    # nl.where takes any condition and operand dtypes: not tensor_copy_predicated's rules
    src = float(x) if isinstance(x, _SCALAR) else x
    isa._copy_predicated(out, src, condition, False, caller_loc(), strict=False)
    return out


def gather_flattened(data, indices, axis=0, dtype=None) -> NkiTensor:
    """``out[p, j] = flat(data[p])[indices[p, j]]`` (``data``'s free dimensions flattened per
    partition; ``indices`` uint32) into a new SBUF tensor of ``indices``' shape, in ``dtype``
    (default ``data``'s): ``nisa.nc_n_gather`` (GpSimd), then a copy when ``dtype`` differs.
    Only ``axis=0`` is modeled (the documented default); another is err_unsupported_api."""
    from .. import isa
    from . import ndarray, sbuf

    _operand(data, "gather_flattened", "data")
    _operand(indices, "gather_flattened", "indices")
    if type(axis) is not int or axis != 0:
        raise NkiError(
            "err_unsupported_api",
            caller_loc(),
            api=f"nl.gather_flattened(axis={axis!r})",
            why="only axis=0, the gather over each partition's flattened free elements, is modeled",
        )
    out = ndarray(indices.shape, data.dtype, buffer=sbuf)
    isa.nc_n_gather(out, data, indices)
    if dtype is None or as_dtype(dtype, caller_loc(), "nl.gather_flattened") == data.dtype:
        return out
    cast = ndarray(indices.shape, dtype, buffer=sbuf)
    isa.tensor_copy(cast, out)
    return cast


def softmax(x, axis=-1, dtype=None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (free dimensions), computed in fp32,
    into a new SBUF tensor of ``dtype`` (default ``x``'s)."""
    from .. import isa
    from . import float32

    _operand(x, "softmax", "x")
    axes = _axes(x, axis, "softmax")
    m = _stat(x, "maximum", axes, None)
    e = _new_shape(x.shape, float32)
    isa.tensor_tensor(e, x, _spread(m, x.shape), OPS["subtract"])
    isa.activation(e, OPS["exp"], e)
    s = _stat(e, "add", axes, None)
    isa.reciprocal(s, s)
    out = _new_like(x, dtype)
    isa.tensor_tensor(out, e, _spread(s, x.shape), OPS["multiply"])
    return out


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None) -> NkiTensor:
    """``x / sqrt(sum(x**2 along axis) / n + epsilon) * w`` into a new SBUF tensor; ``w``
    broadcasts to ``x``'s shape (numpy rules); computed in ``compute_dtype`` (fp32)."""
    from .. import isa
    from . import float32

    _operand(x, "rms_norm", "x")
    _operand(w, "rms_norm", "w")
    cdt = float32 if compute_dtype is None else compute_dtype
    axes = _axes(x, axis, "rms_norm")
    sq = _new_shape(x.shape, cdt)
    isa.tensor_tensor(sq, x, x, OPS["multiply"])
    ms = _stat(sq, "add", axes, cdt)
    if not isinstance(n, int | float | np.integer | np.floating) or not n > 0:
        raise NkiError(
            "err_invalid_argument", caller_loc(), op="nl.rms_norm", why=f"n must be > 0, got {n!r}"
        )
    isa.tensor_scalar(ms, ms, OPS["multiply"], 1.0 / float(n), op1=OPS["add"], operand1=epsilon)
    isa.activation(ms, OPS["rsqrt"], ms)
    isa.tensor_tensor(sq, x, _spread(ms, x.shape), OPS["multiply"])
    if tuple(w.shape) != tuple(x.shape):
        w = broadcast_to(w, x.shape)
    out = _new_like(x, dtype)
    isa.tensor_tensor(out, sq, w, OPS["multiply"])
    return out


def var(x, axis, dtype=None, keepdims=False) -> NkiTensor:
    """The (population) variance along ``axis``; the result keeps the reduced dimensions as
    size 1 (NKI ignores ``keepdims``)."""
    from .. import isa
    from . import float32

    _operand(x, "var", "x")
    axes = _axes(x, axis, "var")
    count = 1
    for a in axes:
        count *= x.shape[a]
    mu = _stat(x, "add", axes, None)
    isa.tensor_scalar(mu, mu, OPS["multiply"], 1.0 / count)
    d = _new_shape(x.shape, float32)
    isa.tensor_tensor(d, x, _spread(mu, x.shape), OPS["subtract"])
    isa.tensor_tensor(d, d, d, OPS["multiply"])
    out = _stat(d, "add", axes, x.dtype if dtype is None else dtype)
    isa.tensor_scalar(out, out, OPS["multiply"], 1.0 / count)
    return out


def all(x, axis, dtype=None) -> NkiTensor:  # noqa: A001
    """1 where every element along ``axis`` is non-zero, else 0 (a min-reduction of
    ``x != 0``)."""
    from .. import isa
    from . import float32

    _operand(x, "all", "x")
    nz = _new_shape(x.shape, float32)
    isa.tensor_scalar(nz, x, OPS["not_equal"], 0.0)
    return min(nz, axis, dtype=x.dtype if dtype is None else dtype)


def dropout(x, rate, dtype=None) -> NkiTensor:
    """``x`` with each element zeroed with probability ``rate`` (a number or a (P, 1)
    tensor), into a new SBUF tensor (``nisa.dropout``; no rescaling)."""
    from .. import isa

    _operand(x, "dropout", "x")
    out = _new_like(x, dtype)
    isa._dropout(out, x, rate, caller_loc(), strict=False)  # any dtype=, as before
    return out


def load_transpose2d(src, dtype=None) -> NkiTensor:
    """A 2-D HBM tensor ``(A, B)`` into a new SBUF tensor ``(B, A)`` (a DMA transpose; with
    ``dtype`` a VectorE copy converts it)."""
    from .. import isa

    _operand(src, "load_transpose2d", "src")
    if src.ndim != 2:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.load_transpose2d",
            why=f"src must be a 2-D tensor, got shape {tuple(src.shape)}",
        )
    if dtype is not None:
        dtype = as_dtype(dtype, caller_loc(), "nl.load_transpose2d")
    out = _new_shape((src.shape[1], src.shape[0]), src.dtype)
    isa.dma_transpose(out, src, axes=(1, 0))
    return out if dtype is None or dtype == src.dtype else copy(out, dtype)


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
    "broadcast_to",
    "expand_dims",
    "where",
    "gather_flattened",
    "softmax",
    "rms_norm",
    "var",
    "all",
    "dropout",
    "load_transpose2d",
]
