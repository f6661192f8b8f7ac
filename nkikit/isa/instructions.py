"""``nki.isa``: one call, one NeuronCore instruction (one IR op).

Each function parses its NKI Beta-1 arguments, allocates its result tile (shaped by the
primitive's output spec where the result is not shaped like an input), broadcasts operands
along free dimensions and hands IR accesses to the primitive's emit function
(``nkikit/trace/instructions.py``), which normalizes operator names, picks and checks the
engine, does the checks both dialects share and builds the IR attributes.
"""

from __future__ import annotations

import enum

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.affine import Affine, Axis
from ..ir.core import Access
from ..ir.opnames import op_name
from ..ir.prims import out_specs
from ..language.operands import (
    Scalar,
    access_of,
    as_tile_access,
    broadcast_access,
    dtype_arg,
    mask_of,
    new_tile,
    operand,
    result_dtype,
    scalar_arg,
    shape_arg,
)
from ..language.tile import Tile
from ..targets import default_target as _default_target
from ..trace import accumulators as ACC
from ..trace import instructions as E
from ..trace.index import Index, Pred, int_arg


class engine(enum.IntEnum):  # noqa: N801 - NKI's names
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.IntEnum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.IntEnum):  # noqa: N801 - values as in NKI Beta 1 [LISA]
    none = 0
    swdge = 1
    hwdge = 2
    unknown = 3


class oob_mode(enum.IntEnum):  # noqa: N801
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


# the enums under names that arguments of the same name do not shadow
_OobMode, _DgeMode = oob_mode, dge_mode


def _engine_arg(e) -> str | None:
    """The engine name an ``engine=`` argument (a ``nisa.engine`` member, its value, or a
    name) asks for; None for the default (``engine.unknown``).  Whether the instruction runs
    there is its record's business (the emit layer checks)."""
    if e is None:
        return None
    if isinstance(e, str):
        return e
    if not isinstance(e, int | np.integer):  # an enum member is an int
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="engine",
            why=f"engine={e!r} is not a nisa.engine member"[:200],
        )
    if e == engine.unknown or e == 0:
        return None
    try:
        return engine(e).name
    except ValueError:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="engine",
            why=f"engine={e!r} is not a nisa.engine member",
        ) from None


def _tile(x, loc, what):
    return as_tile_access(access_of(x, loc, what))


def _result(
    prim: str,
    ins: list[Access],
    loc: SourceLoc,
    dtype=None,
    *,
    fallback: str,
    buffer: str = "sbuf",
    attrs: dict | None = None,
) -> tuple[Tile, Access]:
    """A new (partitions, elements per partition) tile for the first output of ``prim`` on
    ``ins``, as its record's output spec says, in ``dtype`` (default: the spec's).  A dtype the
    spec does not allow is ``err_unsupported_dtype``."""
    spec = out_specs(prim, ins, attrs or {})[0]
    dt = spec.dtype if dtype is None else dtype_arg(dtype, loc, f"nisa.{prim}")
    if spec.dtypes is not None and dtypes.name(dt) not in spec.dtypes:
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op=f"nisa.{prim}",
            dtype=dtypes.name(dt),
            why=f"its result is {' or '.join(sorted(spec.dtypes))}",
        )
    return new_tile((spec.partitions, spec.free), dt, loc, buffer=buffer, fallback=fallback)


# -- arguments nkikit knows but does not model -----------------------------------------------
# Every documented Beta-1 argument is in its function's signature.  One that nkikit does not
# model is accepted at its default and rejected otherwise (err_unsupported_api at the user's
# line), so a kernel never silently simulates something other than what it asked for.


def _unsupported(loc: SourceLoc, call: str, why: str) -> NkiError:
    return NkiError("err_unsupported_api", loc, api=f"nisa.{call}", why=why)


def _invalid(loc: SourceLoc, op: str, why: str) -> NkiError:
    return NkiError("err_invalid_argument", loc, op=f"nisa.{op}", why=why)


def _chain(
    engine_: str, cmd: object, reduce_op: str | None, a: Access, reduce_res, loc, prim: str
) -> ACC.Chain:
    """What the instruction does to its engine's accumulator registers (``reduce_cmd``,
    carried between instructions: ``nkikit/trace/accumulators.py``)."""
    r = None if reduce_res is None else _tile(reduce_res, loc, "reduce_res")
    name = ACC.command(cmd, loc, prim)
    return ACC.Chain(engine_, name, reduce_op, a.shape[0], r, loc=loc, op=prim)


def _swap_pf(mask: Pred | None, loc: SourceLoc):
    """A mask written over an input tile's (partition, free) axes, for a P/F-transposed
    output: the simulator evaluates masks over the output's axes."""
    m = mask_of(mask, loc)
    if m is None:
        return None
    return m.substitute({Axis(0): Affine.of(Axis(1)), Axis(1): Affine.of(Axis(0))})


def _two_d(a, loc: SourceLoc, what: str):
    if len(a.shape) != 2:
        raise NkiError(
            "err_exceed_max_supported_dimension",
            loc,
            what=f"{what} {list(a.shape)}",
            ndim=len(a.shape),
            limit=2,
        )
    return a


# --- TensorE -----------------------------------------------------------------------------


def nc_matmul_at(stationary, moving, loc: SourceLoc, mask=None, **attrs) -> Tile:
    """``nc_matmul`` at ``loc`` with extra IR attributes (``perf_mode``); used by ``nl.matmul``."""
    s = _two_d(_tile(stationary, loc, "nc_matmul stationary"), loc, "nc_matmul stationary")
    m = _two_d(_tile(moving, loc, "nc_matmul moving"), loc, "nc_matmul moving")
    tile, out = _result("nc_matmul", [s, m], loc, buffer="psum", fallback="matmul")
    E.emit_nc_matmul(out, s, m, **attrs, mask=mask_of(mask, loc), loc=loc)
    return tile


def nc_matmul(
    stationary,
    moving,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    tile_position=(),
    tile_size=(),
    *,
    mask=None,
    perf_mode=None,
) -> Tile:
    """``stationary.T @ moving`` on the TensorE into a new PSUM fp32 tile
    [stationary free size, moving free size].  Contraction is over the partition axis.

    ``is_stationary_onezero`` / ``is_moving_onezero`` are performance hints with no effect on
    the result (NKI: they matter only for float32 operands, which the hint lets the TensorE
    stream at twice the float32 rate); they are accepted and the cost model times the matmul as
    a plain one of the operands' dtypes -- an upper bound for a hinted float32 matmul.
    ``is_transpose=True`` (the TensorE transpose mode: ``moving`` is an identity matrix, so the
    result is ``stationary.T``) computes the same ``stationary.T @ moving`` and is timed as the
    matmul it is on the PE array.  PE tiling (``tile_position``, ``tile_size``) is not
    modeled: ``err_unsupported_api`` unless left at its defaults.  ``perf_mode`` (``nisa.matmul_perf_mode``; an NKI 2.22+ argument) is modeled by
    the cost model."""
    loc = caller_loc()
    for hint, flag in (
        ("is_stationary_onezero", is_stationary_onezero),
        ("is_moving_onezero", is_moving_onezero),
    ):
        if not isinstance(flag, bool | np.bool_):
            raise NkiError(
                "err_invalid_argument", loc, op="nisa.nc_matmul", why=f"{hint} must be a bool"
            )
    if not isinstance(is_transpose, bool | np.bool_):
        raise NkiError(
            "err_invalid_argument", loc, op="nisa.nc_matmul", why="is_transpose must be a bool"
        )
    for arg, v in (("tile_position", tile_position), ("tile_size", tile_size)):
        if not isinstance(v, tuple | list):
            raise _invalid(loc, "nc_matmul", f"{arg} must be a tuple, got {v!r}")
    if tuple(tile_position) or tuple(tile_size):
        raise _unsupported(
            loc,
            "nc_matmul(tile_position=, tile_size=)",
            "TensorE PE tiling (several small matmuls in parallel) is not modeled; leave both "
            "at () to use the whole PE array",
        )
    mode = None
    if perf_mode is not None:
        try:
            mode = matmul_perf_mode(getattr(perf_mode, "value", perf_mode))
        except ValueError:
            raise _invalid(
                loc, "nc_matmul", f"perf_mode={perf_mode!r} is not a nisa.matmul_perf_mode member"
            ) from None
        if mode is matmul_perf_mode.double_row and _default_target().nc_version < 3:
            raise _invalid(
                loc,
                "nc_matmul",
                "perf_mode=double_row needs NeuronCore-v3 or newer; the target is "
                f"{_default_target().name}",
            )
    return nc_matmul_at(
        stationary, moving, loc, mask=mask, perf_mode=None if mode is None else mode.value
    )


def nc_transpose_at(data, loc: SourceLoc, engine_: str = "tensor", dtype=None, mask=None) -> Tile:
    """``nc_transpose`` at ``loc``; ``mask`` is over ``data``'s (partition, free) axes."""
    a = _two_d(_tile(data, loc, "nc_transpose"), loc, "nc_transpose data")
    buffer = "psum" if engine_ == "tensor" else "sbuf"
    tile, out = _result("nc_transpose", [a], loc, dtype, buffer=buffer, fallback="transpose")
    E.emit_nc_transpose(out, a, engine=engine_, mask=_swap_pf(mask, loc), loc=loc)
    return tile


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown) -> Tile:  # noqa: A002
    """Swap partition and free axes: TensorE (up to 128x128, into PSUM) or VectorE (32x32).
    ``mask`` is written over ``data``'s axes (``mask=(i_p < n)`` keeps input partitions below
    n, i.e. output columns below n); masked-off output elements are not written."""
    loc = caller_loc()
    a = _tile(data, loc, "nc_transpose")
    default = (
        "vector"
        if a.shape[0] <= 32 and a.free_size <= 32 and a.tensor.buffer == "psum"
        else "tensor"
    )
    return nc_transpose_at(data, loc, _engine_arg(engine) or default, dtype, mask)


# --- ScalarE -------------------------------------------------------------------------------


def _activation(op, data, bias, scale, reduce_op, reduce_res, loc, dtype, mask, cmd) -> Tile:
    a = _tile(data, loc, "activation")
    fn = op_name(op, "activation")  # names the result tile (exp, tanh, ...)
    b = 0.0 if bias is None else operand(bias, loc, "activation bias")
    s = operand(scale, loc, "activation scale")
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback=fn)
    m = mask_of(mask, loc)
    if ACC.command(cmd, loc, "activation") == "idle":  # the instruction's own reduction
        r = None if reduce_res is None else _tile(reduce_res, loc, "reduce_res")
        E.emit_activation(out, a, b, s, op=fn, reduce_res=r, reduce_op=reduce_op, mask=m, loc=loc)
        return tile
    red = "add" if reduce_op is None else op_name(reduce_op, "reduce")  # ScalarE adds
    chain = _chain("scalar", cmd, red, a, reduce_res, loc, "activation")
    into = chain.into
    red = None if into is None else red
    op_ = E.emit_activation(out, a, b, s, op=fn, reduce_res=into, reduce_op=red, mask=m, loc=loc)
    chain.finish(op_)
    return tile


def activation(
    op,
    data,
    *,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,  # noqa: B008 - an enum member, NKI's default
    mask=None,
    dtype=None,
) -> Tile:
    """``op(data * scale + bias)`` on the ScalarE.  ``bias``: (P, 1) tile; ``scale``: scalar or
    (P, 1) tile.  With ``reduce_op`` (add), the free-axis reduction of this instruction's result
    is written to ``reduce_res`` (P, 1).  ``reduce_cmd`` (idle by default) says what it does to
    the ScalarE accumulator registers, which carry a reduction from one instruction to the
    next (``nkikit/trace/accumulators.py``)."""
    loc = caller_loc()
    return _activation(op, data, bias, scale, reduce_op, reduce_res, loc, dtype, mask, reduce_cmd)


def activation_reduce(
    op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None
) -> Tile:
    """``activation(..., reduce_cmd=reset_reduce)``: a free-axis reduction that starts the
    ScalarE accumulator registers afresh, read out into ``reduce_res``."""
    loc = caller_loc()
    cmd = reduce_cmd.reset_reduce
    return _activation(op, data, bias, scale, reduce_op, reduce_res, loc, dtype, mask, cmd)


# --- VectorE / GpSimd ------------------------------------------------------------------------


def tensor_tensor(data1, data2, op, *, mask=None, dtype=None, engine=engine.unknown) -> Tile:  # noqa: A002
    """Elementwise ``op(data1, data2)``; both tiles have the same shape."""
    loc = caller_loc()
    a, b = _tile(data1, loc, "tensor_tensor"), _tile(data2, loc, "tensor_tensor")
    b = _broadcast_free(b, a.shape, loc, "tensor_tensor")
    tile, out = new_tile(a.shape, result_dtype(dtype, data1, data2), loc, fallback="tt")
    m = mask_of(mask, loc)
    E.emit_tensor_tensor(out, a, b, op=op, engine=_engine_arg(engine), mask=m, loc=loc)
    return tile


def _broadcast_free(a: Access, shape: tuple[int, ...], loc: SourceLoc, op: str) -> Access:
    """``a`` broadcast along the free dimensions to ``shape``; a different partition count
    is ``err_num_partition_mismatch`` (partitions broadcast only through nl.broadcast_to)."""
    if a.shape[0] != shape[0]:
        raise NkiError("err_num_partition_mismatch", loc, op=op, a=shape[0], b=a.shape[0])
    return broadcast_access(a, shape, loc, op)


def tensor_scalar(
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    *,
    mask=None,
    dtype=None,
    engine=engine.unknown,
) -> Tile:  # noqa: A002
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) tiles.  Without
    ``op1`` only the first operation runs (``operand1`` and ``reverse1`` need ``op1``)."""
    loc = caller_loc()
    a = _tile(data, loc, "tensor_scalar")
    s0 = operand(operand0, loc)
    s1 = None if operand1 is None else operand(operand1, loc)
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="ts")
    E.emit_tensor_scalar(
        out,
        a,
        s0,
        s1,
        op0=op0,
        reverse0=reverse0,
        op1=op1,
        reverse1=reverse1,
        engine=_engine_arg(engine),
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_scalar_reduce(
    *, data, op0, operand0, reduce_op, reduce_res, reverse0=False, mask=None, dtype=None
) -> Tile:
    """``data op0 operand0`` plus a free-axis reduction of the result into ``reduce_res``."""
    loc = caller_loc()
    a = _tile(data, loc, "tensor_scalar_reduce")
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="tsr")
    E.emit_tensor_scalar(
        out,
        a,
        operand(operand0, loc),
        op0=op0,
        reverse0=reverse0,
        reduce_res=_tile(reduce_res, loc, "reduce_res"),
        reduce_op=reduce_op,
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def scalar_tensor_tensor(
    *, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, mask=None, dtype=None
) -> Tile:
    """``(data op0 operand0) op1 operand1`` where operand0 is a scalar / (P, 1) tile and
    operand1 a tile of data's shape."""
    loc = caller_loc()
    a = _tile(data, loc, "scalar_tensor_tensor")
    t1 = broadcast_access(_tile(operand1, loc, "operand1"), a.shape, loc, "scalar_tensor_tensor")
    tile, out = new_tile(a.shape, result_dtype(dtype, data, operand1), loc, fallback="stt")
    E.emit_scalar_tensor_tensor(
        out,
        a,
        operand(operand0, loc),
        t1,
        op0=op0,
        op1=op1,
        reverse0=reverse0,
        reverse1=reverse1,
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False) -> Tile:
    """Reduce free axes ``axis`` with ``op`` (optionally negating the result)."""
    from ..language.ops import reduce

    return reduce(op, data, axis, dtype, mask, keepdims, negate=negate, loc=caller_loc())


def tensor_partition_reduce(op, data, *, mask=None, dtype=None) -> Tile:
    """Reduce across partitions (GpSimd): (P, F) -> (1, F)."""
    loc = caller_loc()
    a = _tile(data, loc, "tensor_partition_reduce")
    tile, out = new_tile(
        (1,) + a.shape[1:], a.dtype if dtype is None else dtype, loc, fallback="preduce"
    )
    E.emit_tensor_partition_reduce(out, a, op=op, mask=mask_of(mask, loc), loc=loc)
    return tile


def tensor_tensor_scan(
    data0,
    data1,
    initial,
    op0,
    op1,
    reverse0: bool = False,
    reverse1: bool = False,
    *,
    mask=None,
    dtype=None,
) -> Tile:
    """Per-partition scan along the free axis: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])``
    with ``r[-1] = initial`` (scalar or (P, 1) tile).  ``reverse0`` / ``reverse1`` swap the
    operands of ``op0`` / ``op1``; modeled for commutative operators (where they change
    nothing), ``err_unsupported_api`` for the others."""
    loc = caller_loc()
    a = _tile(data0, loc, "tensor_tensor_scan")
    b = broadcast_access(
        _tile(data1, loc, "tensor_tensor_scan"), a.shape, loc, "tensor_tensor_scan"
    )
    tile, out = new_tile(a.shape, result_dtype(dtype, data0, data1), loc, fallback="scan")
    E.emit_tensor_tensor_scan(
        out,
        a,
        b,
        operand(initial, loc),
        op0=op0,
        op1=op1,
        reverse0=reverse0,
        reverse1=reverse1,
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown) -> Tile:  # noqa: A002
    """Copy (and cast) a tile on the Vector, Scalar or GpSimd engine."""
    loc = caller_loc()
    a = _tile(src, loc, "tensor_copy")
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="copy")
    m = mask_of(mask, loc)
    E.emit_tensor_copy(out, a, engine=_engine_arg(engine), mask=m, loc=loc)
    return tile


def reciprocal(data, *, mask=None, dtype=None) -> Tile:
    """1 / data on the VectorE."""
    loc = caller_loc()
    a = _tile(data, loc, "reciprocal")
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="reciprocal")
    E.emit_reciprocal(out, a, mask=mask_of(mask, loc), loc=loc)
    return tile


def iota(expr, dtype, *, mask=None) -> Tile:
    """A tile whose elements are the values of an affine index expression (GpSimd)."""
    loc = caller_loc()
    if not isinstance(expr, Index) or not expr.sizes:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="iota",
            why="expr must be an index expression of aranges",
        )
    shape = tuple(expr.sizes) if len(expr.sizes) > 1 else (expr.sizes[0], 1)
    shape_arg(shape, loc, "nisa.iota (the shape of expr)")
    tile, out = new_tile(shape, dtype, loc, fallback="iota")
    E.emit_iota(out, expr=expr.affine, mask=mask_of(mask, loc), loc=loc)
    return tile


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown) -> Tile:  # noqa: A002
    """A new tile filled with ``value``."""
    loc = caller_loc()
    tile, out = new_tile(shape_arg(shape, loc, "nisa.memset"), dtype, loc, fallback="memset")
    value = scalar_arg(value, loc, "nisa.memset", "value")
    m = mask_of(mask, loc)
    E.emit_memset(out, value=value, engine=_engine_arg(engine), mask=m, loc=loc)
    return tile


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None) -> Tile:
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value`` (GpSimd)."""
    loc = caller_loc()
    if not isinstance(pred, Pred):
        raise NkiError("err_unsupported_expression_in_mask", loc, got=repr(pred))
    a = _tile(on_true_tile, loc, "affine_select")
    if a.tensor.buffer == "psum":
        # GpSimd cannot read PSUM; NKI Beta-1 stages a PSUM input through SBUF (a copy).
        from ..language.ops import copy_at

        a = copy_at(Tile(a), loc).access
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="select")
    m = mask_of(mask, loc)
    on_false = scalar_arg(on_false_value, loc, "nisa.affine_select", "on_false_value")
    E.emit_affine_select(out, a, pred=pred.predicate, on_false=on_false, mask=m, loc=loc)
    return tile


_FP32_MIN = E.FP32_MIN


def range_select(
    *,
    on_true_tile,
    comp_op0,
    comp_op1,
    bound0,
    bound1,
    reduce_cmd=reduce_cmd.idle,  # noqa: B008 - an enum member, NKI's default
    reduce_res=None,
    reduce_op=np.amax,
    range_start=0,
    on_false_value=_FP32_MIN,
    mask=None,
    dtype=None,
) -> Tile:
    """Keep elements whose free index i satisfies ``(i comp_op0 bound0) and (i comp_op1 bound1)``
    (bounds are (P, 1) tiles), else ``on_false_value``; optionally max-reduce into
    ``reduce_res``.  As on the hardware, ``on_false_value`` must be ``nl.fp32.min`` and
    ``reduce_op`` ``np.max``; ``reduce_cmd`` (idle by default) says what it does to the VectorE
    accumulator registers (``nkikit/trace/accumulators.py``)."""
    loc = caller_loc()
    a = _tile(on_true_tile, loc, "range_select")
    chain = _chain(
        "vector",
        reduce_cmd,
        E.max_reduce_op("range_select", reduce_op, loc),
        a,
        reduce_res,
        loc,
        "range_select",
    )
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="range_select")
    op = E.emit_range_select(
        out,
        a,
        operand(bound0, loc),
        operand(bound1, loc),
        comp_op0=comp_op0,
        comp_op1=comp_op1,
        reduce_res=chain.into,
        reduce_op=reduce_op,
        on_false=scalar_arg(on_false_value, loc, "nisa.range_select", "on_false_value"),
        range_start=int_arg(range_start, "nisa.range_select", "range_start"),
        mask=mask_of(mask, loc),
        loc=loc,
    )
    chain.finish(op)
    return tile


def select_reduce(
    *,
    dst=None,
    predicate,
    on_true,
    on_false,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,  # noqa: B008 - an enum member, NKI's default
    reduce_op=np.amax,
    reverse_pred=False,
    mask=None,
    dtype=None,
) -> Tile:
    """``where(predicate, on_true, on_false)`` (``on_false``: a scalar or (P, 1) tile) written
    into ``dst``, plus an optional max reduction into ``reduce_res``; returns ``dst``.  Without
    ``dst`` (an nkikit convenience) the result is a new tile.  ``reduce_op`` must be np.max;
    ``reduce_cmd`` (idle by default) says what it does to the VectorE accumulator registers
    (``nkikit/trace/accumulators.py``)."""
    loc = caller_loc()
    p = _tile(predicate, loc, "select_reduce")
    red = E.max_reduce_op("select_reduce", reduce_op, loc)
    chain = _chain("vector", reduce_cmd, red, p, reduce_res, loc, "select_reduce")
    t = broadcast_access(_tile(on_true, loc, "on_true"), p.shape, loc, "select_reduce")
    f = (
        broadcast_access(_tile(on_false, loc, "on_false"), p.shape, loc, "select_reduce")
        if isinstance(on_false, Tile)
        else scalar_arg(on_false, loc, "nisa.select_reduce", "on_false")
    )
    if dst is None:
        tile, out = new_tile(p.shape, result_dtype(dtype, on_true), loc, fallback="select")
    else:
        out = _tile(dst, loc, "select_reduce dst")
        if dtype is not None and dtype_arg(dtype, loc, "nisa.select_reduce") != out.dtype:
            raise _invalid(
                loc,
                "select_reduce",
                f"dtype={dtypes.name(dtypes.as_dtype(dtype))} differs from dst's "
                f"{dtypes.name(out.dtype)}; the result takes dst's dtype",
            )
        if out.shape != p.shape:
            raise NkiError(
                "err_store_dst_shape_smaller_than_other_shape",
                loc,
                op="nisa.select_reduce",
                dst=out.shape,
                src=p.shape,
            )
        tile = dst
    op = E.emit_select_reduce(
        out,
        p,
        t,
        f,
        reduce_res=chain.into,
        reduce_op=reduce_op,
        reverse=reverse_pred,
        mask=mask_of(mask, loc),
        loc=loc,
    )
    chain.finish(op)
    return tile


def bn_stats(data, *, mask=None, dtype=None) -> Tile:
    """Per-partition statistics of up to 512 elements: 6 values
    (count, mean, count*var of the even elements, then of the odd elements)."""
    loc = caller_loc()
    a = _tile(data, loc, "bn_stats")
    tile, out = _result("bn_stats", [a], loc, dtype, fallback="stats")
    E.emit_bn_stats(out, a, mask=mask_of(mask, loc), loc=loc)
    return tile


def bn_aggr(data, *, mask=None, dtype=None) -> Tile:
    """Aggregate k groups of bn_stats (free size 6k... or 3k) into (mean, variance) per partition."""
    loc = caller_loc()
    a = _tile(data, loc, "bn_aggr")
    tile, out = _result("bn_aggr", [a], loc, dtype, fallback="mean_var")
    E.emit_bn_aggr(out, a, mask=mask_of(mask, loc), loc=loc)
    return tile


def dropout(data, prob, *, mask=None, dtype=None) -> Tile:
    """Zero each element with probability ``prob`` (scalar or (P, 1) tile).  Deterministic in
    simulation (seeded per kernel call)."""
    loc = caller_loc()
    a = _tile(data, loc, "dropout")
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="dropout")
    E.emit_dropout(out, a, operand(prob, loc), mask=mask_of(mask, loc), loc=loc)
    return tile


def max8(*, src, mask=None, dtype=None) -> Tile:
    """The 8 largest values of each partition, in descending order: (P, 8)."""
    loc = caller_loc()
    a = _tile(src, loc, "max8")
    tile, out = _result("max8", [a], loc, dtype, fallback="max8")
    E.emit_max8(out, a, mask=mask_of(mask, loc), loc=loc)
    return tile


def sequence_bounds(*, segment_ids, dtype=None) -> Tile:
    """GpSimd: for each element of ``segment_ids`` (1, n), the start and the end (exclusive)
    of its segment, as a (1, 2 * n) tile: the n starts, then the n ends; padding (id 0) gets
    start n and end -1 (fp32 or int32) [nki.md §2, nki-0x.md §4.7 sequence_bounds]."""
    loc = caller_loc()
    a = _tile(segment_ids, loc, "sequence_bounds")
    tile, out = _result("sequence_bounds", [a], loc, dtype, fallback="bounds")
    E.emit_sequence_bounds(out, a, loc=loc)
    return tile


def nc_find_index8(*, data, vals, mask=None, dtype=None) -> Tile:
    """Per partition, the index of the first occurrence of each of 8 values; ``dtype`` uint32
    (the default) or uint16."""
    loc = caller_loc()
    a, v = _tile(data, loc, "nc_find_index8"), _tile(vals, loc, "nc_find_index8")
    tile, out = _result("nc_find_index8", [a, v], loc, dtype, fallback="index8")
    E.emit_nc_find_index8(out, a, v, mask=mask_of(mask, loc), loc=loc)
    return tile


def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None) -> Tile:
    """Replace the first occurrence of each of 8 values in every partition by ``imm``."""
    loc = caller_loc()
    a, v = _tile(data, loc, "nc_match_replace8"), _tile(vals, loc, "nc_match_replace8")
    tile, out = new_tile(a.shape, a.dtype if dtype is None else dtype, loc, fallback="replaced")
    idx = None if dst_idx is None else _tile(dst_idx, loc, "dst_idx")
    imm = scalar_arg(imm, loc, "nisa.nc_match_replace8", "imm")
    E.emit_nc_match_replace8(out, a, v, idx, imm=imm, mask=mask_of(mask, loc), loc=loc)
    return tile


def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None) -> None:
    """Move partitions within each 32-partition quadrant: ``dst[i] = src[shuffle_mask[i]]``;
    255 keeps dst."""
    loc = caller_loc()
    a, d = _tile(src, loc, "nc_stream_shuffle"), _tile(dst, loc, "nc_stream_shuffle")
    if dtype is not None and dtype_arg(dtype, loc, "nisa.nc_stream_shuffle") != d.dtype:
        raise _invalid(
            loc,
            "nc_stream_shuffle",
            f"dtype={dtypes.name(dtypes.as_dtype(dtype))} differs from dst's "
            f"{dtypes.name(d.dtype)}; the result takes dst's dtype",
        )
    if not isinstance(shuffle_mask, tuple | list):
        raise _invalid(
            loc, "nc_stream_shuffle", f"shuffle_mask must be a list of ints, got {shuffle_mask!r}"
        )
    shuffle_mask = [int_arg(x, "nisa.nc_stream_shuffle", "shuffle_mask") for x in shuffle_mask]
    m = mask_of(mask, loc)
    E.emit_nc_stream_shuffle(d, a, shuffle_mask=shuffle_mask, mask=m, loc=loc)


def local_gather(
    src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None
) -> Tile:
    """GpSimd gather: each core (16 partitions) reads its partitions' uint16 ``index`` values
    column by column (the first ``num_valid_indices``, default all), and every partition takes
    ``num_elem_per_idx`` elements of its own ``src_buffer`` row at each of those element
    offsets; the result is (P, num_valid_indices * num_elem_per_idx)."""
    loc = caller_loc()
    s, ix = _tile(src_buffer, loc, "local_gather"), _tile(index, loc, "local_gather")
    num_elem_per_idx = int_arg(num_elem_per_idx, "nisa.local_gather", "num_elem_per_idx")
    if num_valid_indices is not None:
        num_valid_indices = int_arg(num_valid_indices, "nisa.local_gather", "num_valid_indices")
    attrs = {"num_elem_per_idx": int(num_elem_per_idx), "num_valid_indices": num_valid_indices}
    tile, out = _result("local_gather", [s, ix], loc, fallback="gather", attrs=attrs)
    E.emit_local_gather(
        out,
        s,
        ix,
        num_elem_per_idx=num_elem_per_idx,
        num_valid_indices=num_valid_indices,
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def dma_copy(
    *,
    dst,
    src,
    mask=None,
    dst_rmw_op=None,
    oob_mode=oob_mode.error,  # noqa: B008 - an enum member, NKI's default
    dge_mode=dge_mode.unknown,  # noqa: B008
) -> None:
    """Copy between HBM and SBUF (or SBUF and SBUF) on the DMA engines, casting through fp32
    when the dtypes differ.  ``dst_rmw_op=np.add`` adds into ``dst``.  An index tile on the
    partition dimension of ``src`` or ``dst`` gathers or scatters rows, bounds-checked when the
    kernel runs (``oob_mode.error``, the default); skipping out-of-bounds rows
    (``oob_mode.skip``) is not modeled.  ``dge_mode`` other than ``unknown`` (the compiler's
    choice) is not modeled by the cost model: ``err_unsupported_api``."""
    loc = caller_loc()
    d, s = access_of(dst, loc, "dma_copy dst"), access_of(src, loc, "dma_copy src")
    indirect = d.indirect is not None or s.indirect is not None
    oob = _enum_arg(_OobMode, oob_mode, loc, "oob_mode")
    dge = _enum_arg(_DgeMode, dge_mode, loc, "dge_mode")
    if oob is not _OobMode.error:
        if dst_rmw_op is not None:
            raise _invalid(loc, "dma_copy", "dst_rmw_op allows only oob_mode=oob_mode.error")
        if indirect:
            raise _unsupported(
                loc,
                "dma_copy(oob_mode=oob_mode.skip)",
                "skipping out-of-bounds rows of an indirect DMA is not modeled; keep the "
                "indices in bounds (checked when the kernel runs) or mask the DMA",
            )
        # a DMA without an index tile has no runtime bounds to skip: the mode changes nothing
    if dge is not _DgeMode.unknown:
        if dge is _DgeMode.hwdge and _default_target().nc_version < 3:
            raise _invalid(
                loc,
                "dma_copy",
                f"dge_mode=hwdge needs NeuronCore-v3 or newer; the target is "
                f"{_default_target().name}",
            )
        if dge is not _DgeMode.swdge and indirect:
            raise _invalid(
                loc,
                "dma_copy",
                f"a gather/scatter by an index tile needs software DGE, not dge_mode={dge.name}",
            )
        raise _unsupported(
            loc,
            f"dma_copy(dge_mode=dge_mode.{dge.name})",
            "choosing the descriptor-generation mode is not modeled by the cost model; leave "
            "dge_mode=dge_mode.unknown",
        )
    from ..trace.builder import reshape_access

    s2 = reshape_access(s, d.shape) or s
    E.emit_dma_copy(d, s2, rmw_op=dst_rmw_op, mask=mask_of(mask, loc), loc=loc)


def _enum_arg(kind: type[enum.IntEnum], value: object, loc: SourceLoc, arg: str):
    try:
        return kind(value)
    except ValueError:
        raise _invalid(
            loc, "dma_copy", f"{arg}={value!r} is not a nisa.{kind.__name__} member"
        ) from None


fp32 = type("fp32", (), {"min": float(np.finfo(np.float32).min)})

__all__ = [
    n for n in dir() if not n.startswith("_") and n not in ("annotations", "enum", "np", "dtypes")
]
_ = (Scalar, Affine, Axis)
