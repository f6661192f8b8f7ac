"""``nki.language`` operations.  Each call appends IR ops (the ISA instruction(s) the Neuron
compiler would emit for it) to the kernel being traced and returns a new tile; every op goes
through its primitive's emit function (``nkikit/trace/instructions.py``)."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.affine import Affine, Axis
from ..ir.core import Access
from ..ir.opnames import op_name
from ..trace import instructions as E
from ..trace.builder import current
from ..trace.index import int_arg
from .accumulation import matmul_accumulates
from .operands import (
    Scalar,
    access_of,
    as_tile_access,
    broadcast_access,
    canon,
    dtype_arg,
    mask_of,
    new_tile,
    operand,
    result_dtype,
    scalar_arg,
    shape_arg,
)
from .tile import Tile

# ---------------------------------------------------------------------------------------------
# memory


def load(src: Tile, *, mask=None, dtype=None) -> Tile:
    """HBM -> SBUF: a new SBUF tile with ``src``'s (canonical 2-D+) shape.  ``src`` may be
    indexed by an SBUF tile of integers on its partition dimension, ``t[idx_tile, i_f]``
    (an indirect DMA: a gather of one row per partition, bounds checked when it runs)."""
    loc = caller_loc()
    current("nl.load")
    a = access_of(src, loc, "load")
    if not a.tensor.is_hbm:
        raise NkiError(
            "err_unsupported_memory", loc, op="load", what="src", allowed="HBM", got=a.tensor.buffer
        )
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="load")
    E.emit_dma_copy(out, as_tile_access(a), mask=mask_of(mask, loc), loc=loc)
    return tile


def load_transpose2d(src: Tile, *, mask=None, dtype=None) -> Tile:
    """HBM -> SBUF with the two dimensions swapped (a DMA transpose)."""
    loc = caller_loc()
    a = as_tile_access(access_of(src, loc, "load_transpose2d"))
    if not a.tensor.is_hbm:
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op="load_transpose2d",
            what="src",
            allowed="HBM",
            got=a.tensor.buffer,
        )
    if len(a.shape) != 2:
        raise NkiError(
            "err_exceed_max_supported_dimension",
            loc,
            what=f"load_transpose2d src {list(a.shape)}",
            ndim=len(a.shape),
            limit=2,
        )
    swap = {Axis(0): Affine.of(Axis(1)), Axis(1): Affine.of(Axis(0))}
    t_src = a.remap((a.shape[1], a.shape[0]), swap)
    tile, out = new_tile(t_src.shape, a.dtype if dtype is None else dtype, loc, fallback="load_t")
    # the mask is written over src's axes, the simulator reads it over the (transposed) output's
    m = mask_of(mask, loc)
    m = None if m is None else m.substitute(swap)
    E.emit_dma_copy(out, t_src, transpose=True, mask=m, loc=loc)
    return tile


def store(dst: Tile, value, *, mask=None) -> None:
    """SBUF (or PSUM, through an implicit copy) -> HBM.  ``dst`` may be indexed by an index
    tile, ``t[idx_tile, i_f]`` (an indirect DMA: a scatter; rows sharing an index: the last
    partition's wins in simulation, unspecified on hardware)."""
    loc = caller_loc()
    current("nl.store")
    d = _hbm_dst(dst, loc, "store")
    d2, v = _fit_value(d, value, loc, "store", d.dtype)
    E.emit_dma_copy(d2, v, mask=mask_of(mask, loc), loc=loc)


def atomic_rmw(dst: Tile, value, op, *, mask=None) -> None:
    """``dst = op(dst, value)`` on HBM, atomically per element: ``dst`` is an HBM tensor
    indexed by an index tile (``t[idx_tile, i_f]``, the only form NKI supports), ``op`` is
    ``np.add`` (or ``nl.add``), ``value`` a tile of ``dst``'s shape or a scalar.  Rows that
    share an index all apply, one after another (a scatter-add, e.g. an embedding's
    gradient).  Raises ``err_invalid_argument`` for a destination without an index tile or
    another ``op``."""
    loc = caller_loc()
    d = _hbm_dst(dst, loc, "atomic_rmw")
    if d.indirect is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="atomic_rmw",
            why="dst must be indexed by an index tile (dst[idx_tile, i_f]); for a fixed "
            "destination, load it, add and store",
        )
    if op_name(op) != "add":
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="atomic_rmw",
            why=f"op must be np.add (the only atomic operation), got {op!r}",
        )
    # the add happens in the DMA, so a PSUM value keeps its precision until then
    d2, v = _fit_value(d, value, loc, "atomic_rmw", dtypes.float32, round_to_dst=False)
    E.emit_dma_copy(d2, v, rmw_op=op, mask=mask_of(mask, loc), loc=loc)


def _hbm_dst(dst: Tile, loc, op: str) -> Access:
    """The HBM destination of a store-like DMA (err_unsupported_memory otherwise)."""
    d = access_of(dst, loc, op)
    if not d.tensor.is_hbm:
        raise NkiError(
            "err_unsupported_memory", loc, op=op, what="dst", allowed="HBM", got=d.tensor.buffer
        )
    return d


def _fit_value(
    d: Access, value, loc, op: str, scalar_dtype, round_to_dst: bool = True
) -> tuple[Access, Access]:
    """``value`` as an on-chip access (a scalar filled in ``scalar_dtype``; PSUM copied to
    SBUF, as a DMA cannot read PSUM: in ``d``'s dtype when ``round_to_dst``, else in its own)
    and ``d`` reshaped to its shape."""
    if isinstance(value, Scalar):
        value = full(canon(d.shape), value, dtype=scalar_dtype)
    v = access_of(value, loc, f"{op} value")
    if v.tensor.buffer == "psum":
        v = copy(value, dtype=d.dtype if round_to_dst else v.dtype).access
    d2 = _fit(d, v.shape)
    if d2 is None:
        raise NkiError(
            "err_store_dst_shape_smaller_than_other_shape", loc, op=op, dst=d.shape, src=v.shape
        )
    return d2, v


def _fit(a: Access, shape: tuple[int, ...]) -> Access | None:
    from ..trace.builder import reshape_access

    return reshape_access(a, shape)


def copy_into(dst: Access, src: Access, *, loc: SourceLoc, mask=None) -> None:
    """``dst[...] = src``: an engine copy on chip, a DMA when HBM is involved."""
    src = (
        broadcast_access(src, canon(dst.shape), loc, "assignment")
        if dst.shape != src.shape
        else src
    )
    d = _fit(dst, src.shape)
    if d is None:
        raise NkiError(
            "err_store_dst_shape_smaller_than_other_shape",
            loc,
            op="assignment",
            dst=dst.shape,
            src=src.shape,
        )
    if d.tensor.is_hbm or src.tensor.is_hbm:
        E.emit_dma_copy(d, src, mask=mask, loc=loc)
    else:
        E.emit_tensor_copy(d, src, mask=mask, loc=loc)


def memset_into(dst: Access, value, *, loc: SourceLoc, mask=None) -> None:
    """``dst[...] = value``: a memset on the VectorE."""
    E.emit_memset(as_tile_access(dst), value=value, mask=mask, loc=loc)


def copy(src, *, mask=None, dtype=None) -> Tile:
    """Copy a tile (e.g. PSUM -> SBUF), casting to ``dtype``."""
    loc = caller_loc()
    a = as_tile_access(access_of(src, loc, "copy"))
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="copy")
    E.emit_tensor_copy(out, a, mask=mask_of(mask, loc), loc=loc)
    return tile


def broadcast_to(src, shape) -> Tile:
    """Broadcast a tile: free dims of size 1 by repeated reads, the partition dim (1 -> P)
    through the TensorE as the hardware does."""
    loc = caller_loc()
    shape = canon(shape_arg(shape, loc, "nl.broadcast_to"))
    a = as_tile_access(access_of(src, loc, "broadcast_to"))
    if a.shape[0] != shape[0]:
        if a.shape[0] != 1:
            raise NkiError(
                "err_num_partition_mismatch", loc, op="broadcast_to", a=a.shape[0], b=shape[0]
            )
        a1 = broadcast_access(a, (1,) + shape[1:], loc, "broadcast_to")
        tile, out = new_tile(shape, a.dtype, loc, fallback="bcast")
        E.emit_partition_broadcast(out, a1, loc=loc)
        return tile
    a1 = broadcast_access(a, shape, loc, "broadcast_to")
    tile, out = new_tile(shape, a.dtype, loc, fallback="bcast")
    E.emit_tensor_copy(out, a1, loc=loc)
    return tile


# ---------------------------------------------------------------------------------------------
# elementwise


def binary(name: str, x, y, dtype=None, mask=None, loc: SourceLoc | None = None) -> Tile:
    """``x <name> y`` for tiles and scalars, as tensor_tensor or tensor_scalar."""
    loc = loc or caller_loc()
    m = mask_of(mask, loc)
    x_is_tile, y_is_tile = isinstance(x, Tile), isinstance(y, Tile)
    if not x_is_tile and not y_is_tile:
        from ..sim.alu import scalar_alu

        return scalar_alu(name, scalar_arg(x, loc, name, "x"), scalar_arg(y, loc, name, "y"))
    out_dtype = result_dtype(dtype, x, y)
    if x_is_tile and y_is_tile:
        a = as_tile_access(access_of(x, loc, name))
        b = as_tile_access(access_of(y, loc, name))
        if a.shape[0] != b.shape[0]:
            raise NkiError("err_num_partition_mismatch", loc, op=name, a=a.shape[0], b=b.shape[0])
        if a.free_size == 1 and b.free_size > 1:
            return _tensor_scalar(b, name, a, True, out_dtype, m, loc)
        if b.free_size == 1 and a.free_size > 1:
            return _tensor_scalar(a, name, b, False, out_dtype, m, loc)
        shape = _broadcast_shape(a.shape, b.shape, loc, name)
        a, b = broadcast_access(a, shape, loc, name), broadcast_access(b, shape, loc, name)
        tile, out = new_tile(shape, out_dtype, loc, fallback=name)
        E.emit_tensor_tensor(out, a, b, op=name, mask=m, loc=loc)
        return tile
    if x_is_tile:
        return _tensor_scalar(
            as_tile_access(access_of(x, loc, name)), name, operand(y, loc), False, out_dtype, m, loc
        )
    return _tensor_scalar(
        as_tile_access(access_of(y, loc, name)), name, operand(x, loc), True, out_dtype, m, loc
    )


def _broadcast_shape(
    a: tuple[int, ...], b: tuple[int, ...], loc: SourceLoc, op: str
) -> tuple[int, ...]:
    """The shape two tile operands of an elementwise op broadcast to (numpy's rule, along
    free dimensions); ``err_invalid_argument`` naming both shapes when they do not."""
    if len(a) != len(b):
        return a  # one is re-expressed in the other's shape, or rejected (broadcast_access)
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=op,
            why=f"tile shapes {list(a)} and {list(b)} do not broadcast: free sizes must "
            "match or be 1",
        ) from None


def _tensor_scalar(data: Access, name: str, operand0, reverse: bool, dtype, mask, loc) -> Tile:
    tile, out = new_tile(data.shape, dtype, loc, fallback=name)
    E.emit_tensor_scalar(out, data, operand0, op0=name, reverse0=reverse, mask=mask, loc=loc)
    return tile


def unary(name: str, x, dtype=None, mask=None, loc: SourceLoc | None = None) -> Tile:
    """An elementwise function on ScalarE (``activation``)."""
    loc = loc or caller_loc()
    if not isinstance(x, Tile):
        from ..sim.activations import scalar_activation

        return scalar_activation(name, scalar_arg(x, loc, name, "x"))
    a = as_tile_access(access_of(x, loc, name))
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback=name)
    E.emit_activation(out, a, 0.0, 1.0, op=name, mask=mask_of(mask, loc), loc=loc)
    return tile


def accumulate(dst: Tile, other, name: str, *, loc: SourceLoc) -> Tile:
    """``dst += other`` (and -=, *=, /=).  A matmul result lands in PSUM with hardware
    accumulation (the first write to a region no instruction wrote since its allocation
    overwrites: ``accumulation.py``); anything else is one engine instruction that reads and
    writes ``dst``."""
    b = current()
    d = dst.access
    if isinstance(other, Tile):
        t = other._access.tensor
        op = b.last_op
        if (
            name == "add"
            and d.tensor.buffer == "psum"
            and op is not None
            and op.prim == "nc_matmul"
            and t.kind == "temp"
            and b.retarget(t, d)
        ):
            # an accumulation group: the first matmul write to a fresh region overwrites
            op.attrs["accumulate"] = matmul_accumulates(b, op, op.outs[0], loc)
            return dst
        o = as_tile_access(access_of(other, loc, name))
        dd = as_tile_access(d)
        if o.free_size == 1 and dd.free_size > 1:
            E.emit_tensor_scalar(dd, dd, o, op0=name, accumulate=True, loc=loc)
        else:
            o = broadcast_access(o, dd.shape, loc, name)
            E.emit_tensor_tensor(dd, dd, o, op=name, accumulate=True, loc=loc)
        return dst
    dd = as_tile_access(d)
    E.emit_tensor_scalar(dd, dd, operand(other, loc), op0=name, accumulate=True, loc=loc)
    return dst


def _make_binary(name: str):
    if name in ("mod", "fmod"):  # NKI Beta 1 spells these two without the "*"

        def fn(x, y, dtype=None, mask=None):
            return binary(name, x, y, dtype, mask, caller_loc())

    else:

        def fn(x, y, *, dtype=None, mask=None):
            return binary(name, x, y, dtype, mask, caller_loc())

    fn.__name__ = fn.__qualname__ = name
    fn.__nki_op__ = name
    fn.__doc__ = f"Elementwise ``{name}`` of two tiles, or a tile and a scalar / (P, 1) tile."
    return fn


def _make_unary(name: str):
    def fn(x, *, dtype=None, mask=None):
        return unary(name, x, dtype, mask, caller_loc())

    fn.__name__ = fn.__qualname__ = name
    fn.__nki_op__ = name
    fn.__doc__ = f"Elementwise ``{name}`` on the ScalarE."
    return fn


BINARY = """add subtract multiply divide power maximum minimum mod fmod equal not_equal greater
greater_equal less less_equal logical_and logical_or logical_xor bitwise_and bitwise_or
bitwise_xor left_shift right_shift""".split()
UNARY = """exp log tanh sigmoid relu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid
gelu_apprx_sigmoid_dx silu silu_dx erf erf_dx softplus mish sqrt rsqrt square sin cos tan arctan
abs sign negative trunc floor ceil invert logical_not""".split()

_ns = globals()
for _n in BINARY:
    _ns[_n] = _make_binary(_n)
for _n in UNARY:
    _ns[_n] = _make_unary(_n)


def reciprocal(x, *, dtype=None, mask=None) -> Tile:
    """1 / x on the VectorE."""
    loc = caller_loc()
    if not isinstance(x, Tile):
        if not isinstance(x, int | float | np.number) or isinstance(x, bool):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nl.reciprocal",
                why=f"x must be a tile or a number, got {type(x).__name__}",
            )
        return 1.0 / x
    a = as_tile_access(access_of(x, loc, "reciprocal"))
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="reciprocal")
    E.emit_reciprocal(out, a, mask=mask_of(mask, loc), loc=loc)
    return tile


reciprocal.__nki_op__ = "reciprocal"


def where(condition, x, y, *, dtype=None, mask=None) -> Tile:
    """``x`` where ``condition`` is non-zero, else ``y`` (tiles or scalars)."""
    loc = caller_loc()
    c = as_tile_access(access_of(condition, loc, "where"))
    shape = c.shape
    ins = [c]
    for v in (x, y):
        ins.append(
            broadcast_access(as_tile_access(access_of(v, loc, "where")), shape, loc, "where")
            if isinstance(v, Tile)
            else scalar_arg(v, loc, "nl.where", "x and y")
        )
    tile, out = new_tile(shape, result_dtype(dtype, x, y), loc, fallback="where")
    E.emit_select(out, *ins, mask=mask_of(mask, loc), loc=loc)
    return tile


# ---------------------------------------------------------------------------------------------
# reductions


def _axes(axis, ndim: int, loc) -> tuple[int, ...]:
    """The free axes ``axis`` names (None: all of them) of a tile of ``ndim`` dimensions,
    sorted.  An axis is an int (or a tuple / list of ints) in ``[-ndim, ndim)`` named once;
    anything else is ``err_invalid_argument`` (never wrapped around: ``axis=5`` of a 2-D
    tile is not axis 1)."""
    if axis is None:
        return tuple(range(1, ndim))
    items = axis if isinstance(axis, tuple | list) else (axis,)
    axes = []
    for a in items:
        if not isinstance(a, int | np.integer) or isinstance(a, bool):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reduction",
                why=f"axis must be an int or a tuple of ints, got {type(a).__name__} {a!r}",
            )
        if not -ndim <= int(a) < ndim:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reduction",
                why=f"axis {int(a)} is out of range for a tile of {ndim} dimensions "
                f"(its free axes are {list(range(1, ndim))}, or {list(range(1 - ndim, 0))})",
            )
        axes.append(int(a) % ndim)
    if not axes or len(set(axes)) != len(axes):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="reduction",
            why=f"axis={axis!r} must name each axis once, and at least one",
        )
    axes = sorted(axes)
    if 0 in axes:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="reduction",
            why="cannot reduce along the partition dimension (axis 0); use nisa.tensor_partition_reduce or transpose first",
        )
    return tuple(axes)


def reduce(name, x, axis, dtype=None, mask=None, keepdims=False, negate=False, loc=None) -> Tile:
    """A ``tensor_reduce`` of ``x`` with operator ``name`` (a name or an op function) over the
    free axes ``axis``."""
    loc = loc or caller_loc()
    name = op_name(name, "reduce")  # names the result tile (add, max, ...)
    a = as_tile_access(access_of(x, loc, name))
    axes = _axes(axis, len(a.shape), loc)
    keepdims = E.flag(keepdims, "keepdims", "tensor_reduce", loc)
    shape = (
        tuple(1 if k in axes else s for k, s in enumerate(a.shape))
        if keepdims
        else tuple(s for k, s in enumerate(a.shape) if k not in axes)
    )
    tile, out = new_tile(canon(shape), a.dtype if dtype is None else dtype, loc, fallback=name)
    E.emit_tensor_reduce(
        out,
        a,
        op=name,
        axes=axes,
        negate=negate,
        keepdims=keepdims,
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def _make_reduce(public: str, op: str, what: str):
    def fn(x, axis=None, *, dtype=None, mask=None, keepdims=False) -> Tile:
        return reduce(op, x, axis, dtype, mask, keepdims, loc=caller_loc())

    fn.__name__ = fn.__qualname__ = public
    fn.__nki_op__ = op
    fn.__doc__ = f"{what} along free axes ``axis`` (default: all free axes)."
    return fn


sum = _make_reduce("sum", "add", "Sum")  # noqa: A001 - NKI's names
max = _make_reduce("max", "max", "Maximum")  # noqa: A001
min = _make_reduce("min", "min", "Minimum")  # noqa: A001
prod = _make_reduce("prod", "multiply", "Product")
all = _make_reduce("all", "logical_and", "Logical and")  # noqa: A001


def mean(x, axis=None, *, dtype=None, mask=None, keepdims=False) -> Tile:
    """Arithmetic mean along free axes (a sum, then a scale by 1/n)."""
    loc = caller_loc()
    a = as_tile_access(access_of(x, loc, "mean"))
    axes = _axes(axis, len(a.shape), loc)
    n = int(np.prod([a.shape[k] for k in axes]))
    s = reduce("add", x, axes, dtypes.float32, mask, keepdims, loc=loc)
    return binary("multiply", s, 1.0 / n, a.dtype if dtype is None else dtype, mask, loc)


def var(x, axis=None, *, dtype=None, mask=None, keepdims=False) -> Tile:
    """Population variance along free axes: mean((x - mean(x))^2)."""
    loc = caller_loc()
    a = as_tile_access(access_of(x, loc, "var"))
    axes = _axes(axis, len(a.shape), loc)
    n = int(np.prod([a.shape[k] for k in axes]))
    s = reduce("add", x, axes, dtypes.float32, mask, True, loc=loc)
    m = binary("multiply", s, 1.0 / n, dtypes.float32, mask, loc)
    centered = binary("subtract", x, m, dtypes.float32, mask, loc)
    sq = unary("square", centered, dtypes.float32, mask, loc)
    s2 = reduce("add", sq, axes, dtypes.float32, mask, keepdims, loc=loc)
    return binary("multiply", s2, 1.0 / n, a.dtype if dtype is None else dtype, mask, loc)


# ---------------------------------------------------------------------------------------------
# fused and TensorE


def _to_sbuf(x, loc: SourceLoc, api: str):
    """``x`` as the TensorE can read it: a PSUM operand is first copied to a new SBUF tile --
    the copy the Neuron compiler inserts when a language-level call's result (``nl.matmul``,
    ``nl.transpose``: PSUM) feeds a TensorE instruction, which reads SBUF only."""
    a = access_of(x, loc, api)
    if a.tensor.buffer == "psum":
        return copy_at(x, loc)
    return x


def matmul(x, y, *, transpose_x: bool = False, mask=None) -> Tile:
    """``x @ y`` into a PSUM fp32 tile.  With ``transpose_x=True`` x is given as [K, M]
    (contraction on the partition axis); otherwise x is [M, K] and is transposed on the TensorE.
    Operands in PSUM (earlier ``nl.matmul`` / ``nl.transpose`` results) are copied to SBUF
    first, as the compiler places them; a 16-bit operand beside a float32 one is promoted to
    float32."""
    from ..isa import instructions as I

    loc = caller_loc()
    if not isinstance(transpose_x, bool | np.bool_):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.matmul",
            why=f"transpose_x must be a bool, got {type(transpose_x).__name__} {transpose_x!r}",
        )
    x, y = _to_sbuf(x, loc, "nl.matmul"), _to_sbuf(y, loc, "nl.matmul")
    if not transpose_x:
        xt = I.nc_transpose_at(x, loc)
        x = copy_at(xt, loc)
    # the TensorE multiplies fp32 only with fp32: a narrower operand beside an fp32 one is
    # promoted (NKI's type promotion: bf16 with fp32 gives fp32), as the compiler converts it
    wide = {"float32", "tfloat32"}
    xd, yd = (dtypes.name(access_of(t, loc, "nl.matmul").dtype) for t in (x, y))
    if (xd in wide) != (yd in wide):
        if xd in wide:
            y = copy_at(y, loc, dtype=dtypes.float32)
        else:
            x = copy_at(x, loc, dtype=dtypes.float32)
    return I.nc_matmul_at(x, y, loc, mask=mask)


def copy_at(x, loc: SourceLoc, dtype=None) -> Tile:
    a = as_tile_access(access_of(x, loc, "copy"))
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="copy")
    E.emit_tensor_copy(out, a, loc=loc)
    return tile


def transpose(x, *, dtype=None, mask=None) -> Tile:
    """2-D transpose on the TensorE (result in PSUM); ``mask`` is over ``x``'s axes.  An
    input in PSUM is copied to SBUF first (see :func:`matmul`)."""
    from ..isa import instructions as I

    loc = caller_loc()
    return I.nc_transpose_at(_to_sbuf(x, loc, "nl.transpose"), loc, dtype=dtype, mask=mask)


def _whole_free_axes(axis, a: Access, loc: SourceLoc, api: str) -> None:
    """``axis`` must name every free axis of ``a``: these fused ops reduce the whole free
    extent in one ScalarE instruction."""
    if _axes(axis, len(a.shape), loc) != tuple(range(1, len(a.shape))):
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"nl.{api}(axis={axis!r})",
            why=f"it reduces over every free axis of its input {list(a.shape)}; reshape the "
            "tile so the axis is its only free axis",
        )


def _compute_dtype(dtype, compute_dtype, loc: SourceLoc, api: str):
    """NKI: ``dtype`` and ``compute_dtype`` "behave the same, both set internal compute and
    return dtype"; one of them, or both equal."""
    if compute_dtype is None:
        return dtype
    if dtype is not None and dtype_arg(dtype, loc, f"nl.{api}") != dtype_arg(
        compute_dtype, loc, f"nl.{api}"
    ):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nl.{api}",
            why="dtype and compute_dtype are the same setting in NKI; give one of them",
        )
    return compute_dtype


def softmax(x, axis=-1, *, dtype=None, compute_dtype=None, mask=None) -> Tile:
    """softmax(x) along the free axis: max, exp(x - max) with a running sum, 1/sum, scale.
    ``compute_dtype`` is the same setting as ``dtype`` (as in NKI)."""
    loc = caller_loc()
    a = as_tile_access(access_of(x, loc, "softmax"))
    _whole_free_axes(axis, a, loc, "softmax")
    dtype = _compute_dtype(dtype, compute_dtype, loc, "softmax")
    neg_max = reduce("max", x, axis, dtypes.float32, mask, True, negate=True, loc=loc)
    e, s = activation_reduce_at("exp", x, neg_max, "add", dtypes.float32, loc)
    r = reciprocal_at(s, loc)
    return binary("multiply", e, r, a.dtype if dtype is None else dtype, mask, loc)


def rms_norm(
    x, w, axis=-1, n=None, epsilon: float = 1e-6, *, dtype=None, compute_dtype=None, mask=None
) -> Tile:
    """x / sqrt(sum(x^2) / n + epsilon) * w along the free axis (``n``: the element count,
    default the free size).  ``compute_dtype`` is the same setting as ``dtype`` (as in NKI)."""
    loc = caller_loc()
    a = as_tile_access(access_of(x, loc, "rms_norm"))
    _whole_free_axes(axis, a, loc, "rms_norm")
    dtype = _compute_dtype(dtype, compute_dtype, loc, "rms_norm")
    count = a.free_size if n is None else int_arg(n, "nl.rms_norm", "n")
    epsilon = scalar_arg(epsilon, loc, "nl.rms_norm", "epsilon")
    sq, ss = activation_reduce_at("square", x, 0.0, "add", dtypes.float32, loc)
    ms = binary("multiply", ss, 1.0 / count, dtypes.float32, None, loc)
    r = unary(
        "rsqrt",
        binary("add", ms, float(epsilon), dtypes.float32, None, loc),
        dtypes.float32,
        None,
        loc,
    )
    y = binary("multiply", x, r, dtypes.float32, mask, loc)
    wt = w
    if isinstance(w, Tile) and w.shape[0] != a.shape[0]:
        wt = broadcast_to(w, a.shape)
    return binary("multiply", y, wt, a.dtype if dtype is None else dtype, mask, loc)


def activation_reduce_at(fn: str, x, bias, reduce_op: str, dtype, loc) -> tuple[Tile, Tile]:
    a = as_tile_access(access_of(x, loc, fn))
    tile, out = new_tile(a.shape, dtype, loc, fallback=fn)
    red, rout = new_tile((a.shape[0], 1), dtypes.float32, loc, fallback=f"{fn}_{reduce_op}")
    b = operand(bias, loc)
    E.emit_activation(out, a, b, 1.0, op=fn, reduce_res=rout, reduce_op=reduce_op, loc=loc)
    return tile, red


def reciprocal_at(x, loc) -> Tile:
    a = as_tile_access(access_of(x, loc, "reciprocal"))
    tile, out = new_tile(a.shape, a.dtype, loc, fallback="reciprocal")
    E.emit_reciprocal(out, a, loc=loc)
    return tile


# ---------------------------------------------------------------------------------------------
# creation


def full(shape, fill_value, dtype=None, *, buffer=None, name: str = "") -> Tile:
    """A new tensor filled with ``fill_value`` (a memset); on-chip memories only."""
    return fill_at(shape, fill_value, dtype, buffer, name, caller_loc(), "nl.full")


def fill_at(shape, fill_value, dtype, buffer, name: str, loc: SourceLoc, api: str) -> Tile:
    """``nl.full`` (``nl.zeros``, ``nl.ones``: ``api``) for the user's line ``loc``."""
    from .creation import ndarray_at

    value = scalar_arg(fill_value, loc, api, "fill_value")
    t = ndarray_at(shape, dtypes.float32 if dtype is None else dtype, buffer, name, loc)
    if t.tensor.is_hbm:
        raise NkiError("err_hbm_tensor_with_init_value_not_supported", loc, api=api)
    memset_into(t.access, value, loc=loc)
    return t


def device_print(prefix: str, x, *, mask=None) -> None:
    """Print a tile's value while the kernel is simulated (all of it: ``mask`` is
    ``err_unsupported_api``)."""
    loc = caller_loc()
    if mask is not None:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api="nl.device_print(mask=)",
            why="printing part of a tile is not modeled; index the tile instead",
        )
    E.emit_device_print(access_of(x, loc, "device_print"), prefix=prefix, loc=loc)


def expand_dims(x, axis: int) -> Tile:
    """A view with a new unit axis."""
    if not isinstance(x, Tile):
        return np.expand_dims(x, axis)
    if not isinstance(axis, int | np.integer) or not -x.ndim - 1 <= axis <= x.ndim:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.expand_dims",
            why=f"axis must be an int from {-x.ndim - 1} to {x.ndim} for a tile of "
            f"{x.ndim} dimensions, got {axis!r}",
        )
    key = [slice(None)] * x.ndim
    key.insert(int(axis) if axis >= 0 else x.ndim + 1 + int(axis), None)
    return x[tuple(key)]
