"""``nki.isa``: one call, one NeuronCore instruction (one IR op)."""

from __future__ import annotations

import enum

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.affine import Affine, Axis
from ..ir.opnames import op_name
from ..ir.prims import engine_choices
from ..trace.builder import current
from ..trace.emit import (
    Scalar,
    access_of,
    as_tile_access,
    broadcast_access,
    mask_of,
    new_tile,
    operand,
    result_dtype,
)
from ..trace.index import Index, Pred
from ..trace.tile import Tile


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


class dge_mode(enum.IntEnum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


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


def _engine_name(e, default: str, prim: str | None = None, loc=None) -> str:
    if e is None or e == engine.unknown or e == 0:
        return default
    name = engine(e).name if not isinstance(e, str) else e
    # the engines the instruction may run on: its record (nkikit/ir/prims.py) [HISA]
    allowed = engine_choices(prim) if prim else None
    if allowed is not None and name not in allowed:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{prim}",
            why=f"engine={name} is not one of its engines ({', '.join(allowed)})",
        )
    return name


def _emit(prim, outs, ins, attrs=None, mask=None, loc=None):
    return current(f"nisa.{prim}").emit(prim, outs, ins, attrs, mask=mask, loc=loc)


def _tile(x, loc, what):
    return as_tile_access(access_of(x, loc, what))


# --- TensorE -----------------------------------------------------------------------------


def nc_matmul_at(stationary, moving, loc: SourceLoc, mask=None, **attrs) -> Tile:
    s = _tile(stationary, loc, "nc_matmul stationary")
    m = _tile(moving, loc, "nc_matmul moving")
    tile, out = new_tile(
        (s.free_size, m.free_size), dtypes.float32, loc, buffer="psum", fallback="matmul"
    )
    s2 = s if len(s.shape) == 2 else _flatten(s)
    m2 = m if len(m.shape) == 2 else _flatten(m)
    _emit(
        "nc_matmul",
        [out],
        [s2, m2],
        {"accumulate": False, **attrs},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def _flatten(a):
    raise NkiError(
        "err_invalid_argument",
        caller_loc(),
        op="nc_matmul",
        why=f"operands must be 2-D tiles, got shape {a.shape}",
    )


def nc_matmul(
    stationary,
    moving,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    tile_position=(),
    tile_size=(),
    *,
    mask=None,
    perf_mode=None,
    **kwargs,
) -> Tile:
    """``stationary.T @ moving`` on the TensorE into a new PSUM fp32 tile
    [stationary free size, moving free size].  Contraction is over the partition axis."""
    return nc_matmul_at(
        stationary,
        moving,
        caller_loc(),
        mask=mask,
        perf_mode=None if perf_mode is None else str(getattr(perf_mode, "value", perf_mode)),
    )


def nc_transpose_at(data, loc: SourceLoc, engine_: str = "tensor", dtype=None) -> Tile:
    a = _tile(data, loc, "nc_transpose")
    if len(a.shape) != 2:
        raise NkiError(
            "err_invalid_argument", loc, op="nc_transpose", why=f"data must be 2-D, got {a.shape}"
        )
    buffer = "psum" if engine_ == "tensor" else "sbuf"
    tile, out = new_tile(
        (a.shape[1], a.shape[0]), dtype or a.dtype, loc, buffer=buffer, fallback="transpose"
    )
    _emit("nc_transpose", [out], [a], {"engine": engine_}, loc=loc)
    return tile


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, **kwargs) -> Tile:  # noqa: A002
    """Swap partition and free axes: TensorE (up to 128x128, into PSUM) or VectorE (32x32)."""
    loc = caller_loc()
    a = _tile(data, loc, "nc_transpose")
    default = (
        "vector"
        if a.shape[0] <= 32 and a.free_size <= 32 and a.tensor.buffer == "psum"
        else "tensor"
    )
    return nc_transpose_at(data, loc, _engine_name(engine, default, "nc_transpose", loc), dtype)


# --- ScalarE -------------------------------------------------------------------------------


def _activation(op, data, bias, scale, reduce_op, reduce_res, loc, dtype, mask) -> Tile:
    a = _tile(data, loc, "activation")
    fn = op_name(op, "activation")
    b = 0.0 if bias is None else operand(bias, loc, "activation bias")
    s = operand(scale, loc, "activation scale")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback=fn)
    outs = [out]
    if reduce_op is not None:
        if reduce_res is None:
            raise NkiError(
                "err_invalid_argument", loc, op="activation", why="reduce_op needs reduce_res"
            )
        outs.append(_tile(reduce_res, loc, "reduce_res"))
    _emit(
        "activation",
        outs,
        [a, b, s],
        {"op": fn, "reduce_op": None if reduce_op is None else op_name(reduce_op, "reduce")},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def activation(
    op,
    data,
    bias=None,
    scale=1.0,
    *,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=None,
    mask=None,
    dtype=None,
    **kwargs,
) -> Tile:
    """``op(data * scale + bias)`` on the ScalarE.  ``bias``: (P, 1) tile; ``scale``: scalar or
    (P, 1) tile.  With ``reduce_op`` (add), the free-axis reduction of the result is written to
    ``reduce_res`` (P, 1)."""
    return _activation(op, data, bias, scale, reduce_op, reduce_res, caller_loc(), dtype, mask)


def activation_reduce(
    op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, **kwargs
) -> Tile:
    """``activation`` plus a free-axis reduction into ``reduce_res``."""
    return _activation(op, data, bias, scale, reduce_op, reduce_res, caller_loc(), dtype, mask)


# --- VectorE / GpSimd ------------------------------------------------------------------------


def tensor_tensor(
    data1, data2, op, *, mask=None, dtype=None, engine=engine.unknown, **kwargs
) -> Tile:  # noqa: A002
    """Elementwise ``op(data1, data2)``; both tiles have the same shape."""
    loc = caller_loc()
    a, b = _tile(data1, loc, "tensor_tensor"), _tile(data2, loc, "tensor_tensor")
    if a.shape[0] != b.shape[0]:
        raise NkiError(
            "err_num_partition_mismatch", loc, op="tensor_tensor", a=a.shape[0], b=b.shape[0]
        )
    b = broadcast_access(b, a.shape, loc, "tensor_tensor")
    tile, out = new_tile(a.shape, result_dtype(dtype, data1, data2), loc, fallback="tt")
    _emit(
        "tensor_tensor",
        [out],
        [a, b],
        {"op": op_name(op), "engine": _engine_name(engine, "vector", "tensor_tensor", loc)},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


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
    **kwargs,
) -> Tile:  # noqa: A002
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) tiles."""
    loc = caller_loc()
    a = _tile(data, loc, "tensor_scalar")
    ins = [a, operand(operand0, loc)]
    if op1 is not None:
        ins.append(operand(operand1, loc))
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="ts")
    _emit(
        "tensor_scalar",
        [out],
        ins,
        {
            "op0": op_name(op0),
            "reverse0": bool(reverse0),
            "op1": None if op1 is None else op_name(op1),
            "reverse1": bool(reverse1),
            "engine": _engine_name(engine, "vector", "tensor_scalar", loc),
        },
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_scalar_reduce(
    *, data, op0, operand0, reduce_op, reduce_res, reverse0=False, mask=None, dtype=None, **kwargs
) -> Tile:
    """``data op0 operand0`` plus a free-axis reduction of the result into ``reduce_res``."""
    loc = caller_loc()
    a = _tile(data, loc, "tensor_scalar_reduce")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="tsr")
    _emit(
        "tensor_scalar",
        [out, _tile(reduce_res, loc, "reduce_res")],
        [a, operand(operand0, loc)],
        {
            "op0": op_name(op0),
            "reverse0": bool(reverse0),
            "op1": None,
            "reverse1": False,
            "reduce_op": op_name(reduce_op, "reduce"),
            "engine": "vector",
        },
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def scalar_tensor_tensor(
    *,
    data,
    op0,
    operand0,
    op1,
    operand1,
    reverse0=False,
    reverse1=False,
    mask=None,
    dtype=None,
    **kwargs,
) -> Tile:
    """``(data op0 operand0) op1 operand1`` where operand0 is a scalar / (P, 1) tile and
    operand1 a tile of data's shape."""
    loc = caller_loc()
    a = _tile(data, loc, "scalar_tensor_tensor")
    t1 = broadcast_access(_tile(operand1, loc, "operand1"), a.shape, loc, "scalar_tensor_tensor")
    tile, out = new_tile(a.shape, result_dtype(dtype, data, operand1), loc, fallback="stt")
    _emit(
        "scalar_tensor_tensor",
        [out],
        [a, operand(operand0, loc), t1],
        {
            "op0": op_name(op0),
            "op1": op_name(op1),
            "reverse0": bool(reverse0),
            "reverse1": bool(reverse1),
        },
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_reduce(
    op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, **kwargs
) -> Tile:
    """Reduce free axes ``axis`` with ``op`` (optionally negating the result)."""
    from ..language.ops import reduce

    return reduce(
        op_name(op, "reduce"), data, axis, dtype, mask, keepdims, negate=negate, loc=caller_loc()
    )


def tensor_partition_reduce(op, data, *, mask=None, dtype=None, **kwargs) -> Tile:
    """Reduce across partitions (GpSimd): (P, F) -> (1, F)."""
    loc = caller_loc()
    a = _tile(data, loc, "tensor_partition_reduce")
    tile, out = new_tile((1,) + a.shape[1:], dtype or a.dtype, loc, fallback="preduce")
    _emit(
        "tensor_partition_reduce",
        [out],
        [a],
        {"op": op_name(op, "reduce")},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_tensor_scan(data0, data1, initial, op0, op1, *, mask=None, dtype=None, **kwargs) -> Tile:
    """Per-partition scan along the free axis: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])``
    with ``r[-1] = initial`` (scalar or (P, 1) tile)."""
    loc = caller_loc()
    a = _tile(data0, loc, "tensor_tensor_scan")
    b = broadcast_access(
        _tile(data1, loc, "tensor_tensor_scan"), a.shape, loc, "tensor_tensor_scan"
    )
    tile, out = new_tile(a.shape, result_dtype(dtype, data0, data1), loc, fallback="scan")
    _emit(
        "tensor_tensor_scan",
        [out],
        [a, b, operand(initial, loc)],
        {"op0": op_name(op0), "op1": op_name(op1)},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown, **kwargs) -> Tile:  # noqa: A002
    """Copy (and cast) a tile on the Vector, Scalar or GpSimd engine."""
    loc = caller_loc()
    a = _tile(src, loc, "tensor_copy")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="copy")
    _emit(
        "tensor_copy",
        [out],
        [a],
        {"engine": _engine_name(engine, "vector", "tensor_copy", loc)},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def reciprocal(data, *, mask=None, dtype=None, **kwargs) -> Tile:
    """1 / data on the VectorE."""
    loc = caller_loc()
    a = _tile(data, loc, "reciprocal")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="reciprocal")
    _emit("reciprocal", [out], [a], mask=mask_of(mask, loc), loc=loc)
    return tile


def iota(expr, dtype, *, mask=None, **kwargs) -> Tile:
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
    tile, out = new_tile(shape, dtype, loc, fallback="iota")
    _emit("iota", [out], [], {"expr": expr.affine}, mask=mask_of(mask, loc), loc=loc)
    return tile


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown, **kwargs) -> Tile:  # noqa: A002
    """A new tile filled with ``value``."""
    loc = caller_loc()
    tile, out = new_tile(tuple(shape), dtype, loc, fallback="memset")
    _emit(
        "memset",
        [out],
        [],
        {"value": float(value), "engine": _engine_name(engine, "vector", "memset", loc)},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None, **kwargs) -> Tile:
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value`` (GpSimd)."""
    loc = caller_loc()
    if not isinstance(pred, Pred):
        raise NkiError("err_unsupported_expression_in_mask", loc, got=repr(pred))
    a = _tile(on_true_tile, loc, "affine_select")
    if a.tensor.buffer == "psum":
        # GpSimd cannot read PSUM; NKI Beta-1 stages a PSUM input through SBUF (a copy).
        from ..language.ops import copy_at

        a = copy_at(Tile(a), loc).access
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="select")
    _emit(
        "affine_select",
        [out],
        [a],
        {"pred": pred.predicate, "on_false": float(on_false_value)},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def range_select(
    *,
    on_true_tile,
    comp_op0,
    comp_op1,
    bound0,
    bound1,
    reduce_cmd=None,
    reduce_res=None,
    reduce_op=np.max,
    range_start=0,
    on_false_value=-3.4028234663852886e38,
    mask=None,
    dtype=None,
    **kwargs,
) -> Tile:
    """Keep elements whose free index i satisfies ``(i comp_op0 bound0) and (i comp_op1 bound1)``
    (bounds are (P, 1) tiles), else ``on_false_value``; optionally max-reduce into ``reduce_res``."""
    loc = caller_loc()
    a = _tile(on_true_tile, loc, "range_select")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="range_select")
    outs = [out] + ([_tile(reduce_res, loc, "reduce_res")] if reduce_res is not None else [])
    _emit(
        "range_select",
        outs,
        [a, operand(bound0, loc), operand(bound1, loc)],
        {
            "comp_op0": op_name(comp_op0),
            "comp_op1": op_name(comp_op1),
            "on_false": float(on_false_value),
            "range_start": int(range_start),
            "reduce_op": op_name(reduce_op, "reduce"),
        },
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def select_reduce(
    *,
    predicate,
    on_true,
    on_false,
    reduce_res=None,
    reduce_cmd=None,
    reduce_op=np.max,
    reverse_pred=False,
    mask=None,
    dtype=None,
    **kwargs,
) -> Tile:
    """``where(predicate, on_true, on_false)`` plus an optional max reduction into ``reduce_res``."""
    loc = caller_loc()
    p = _tile(predicate, loc, "select_reduce")
    t = broadcast_access(_tile(on_true, loc, "on_true"), p.shape, loc, "select_reduce")
    f = (
        broadcast_access(_tile(on_false, loc, "on_false"), p.shape, loc, "select_reduce")
        if isinstance(on_false, Tile)
        else float(on_false)
    )
    tile, out = new_tile(p.shape, result_dtype(dtype, on_true), loc, fallback="select")
    outs = [out] + ([_tile(reduce_res, loc, "reduce_res")] if reduce_res is not None else [])
    _emit(
        "select_reduce",
        outs,
        [p, t, f],
        {"reverse": bool(reverse_pred), "reduce_op": op_name(reduce_op, "reduce")},
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def bn_stats(data, *, mask=None, dtype=None, **kwargs) -> Tile:
    """Per-partition statistics of up to 512 elements: 6 values
    (count, mean, count*var of the even elements, then of the odd elements)."""
    loc = caller_loc()
    a = _tile(data, loc, "bn_stats")
    tile, out = new_tile((a.shape[0], 6), dtype or dtypes.float32, loc, fallback="stats")
    _emit("bn_stats", [out], [a], mask=mask_of(mask, loc), loc=loc)
    return tile


def bn_aggr(data, *, mask=None, dtype=None, **kwargs) -> Tile:
    """Aggregate k groups of bn_stats (free size 6k... or 3k) into (mean, variance) per partition."""
    loc = caller_loc()
    a = _tile(data, loc, "bn_aggr")
    tile, out = new_tile((a.shape[0], 2), dtype or dtypes.float32, loc, fallback="mean_var")
    _emit("bn_aggr", [out], [a], mask=mask_of(mask, loc), loc=loc)
    return tile


def dropout(data, prob, *, mask=None, dtype=None, **kwargs) -> Tile:
    """Zero each element with probability ``prob`` (scalar or (P, 1) tile).  Deterministic in
    simulation (seeded per kernel call)."""
    loc = caller_loc()
    a = _tile(data, loc, "dropout")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="dropout")
    _emit("dropout", [out], [a, operand(prob, loc)], mask=mask_of(mask, loc), loc=loc)
    return tile


def max8(*, src, mask=None, dtype=None, **kwargs) -> Tile:
    """The 8 largest values of each partition, in descending order: (P, 8)."""
    loc = caller_loc()
    a = _tile(src, loc, "max8")
    tile, out = new_tile((a.shape[0], 8), dtype or a.dtype, loc, fallback="max8")
    _emit("max8", [out], [a], mask=mask_of(mask, loc), loc=loc)
    return tile


def nc_find_index8(*, data, vals, mask=None, dtype=dtypes.uint32, **kwargs) -> Tile:
    """Per partition, the index of the first occurrence of each of 8 values (uint32)."""
    loc = caller_loc()
    a, v = _tile(data, loc, "nc_find_index8"), _tile(vals, loc, "nc_find_index8")
    tile, out = new_tile((a.shape[0], 8), dtype, loc, fallback="index8")
    _emit("nc_find_index8", [out], [a, v], mask=mask_of(mask, loc), loc=loc)
    return tile


def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None, **kwargs) -> Tile:
    """Replace the first occurrence of each of 8 values in every partition by ``imm``."""
    loc = caller_loc()
    a, v = _tile(data, loc, "nc_match_replace8"), _tile(vals, loc, "nc_match_replace8")
    tile, out = new_tile(a.shape, dtype or a.dtype, loc, fallback="replaced")
    outs = [out] + ([_tile(dst_idx, loc, "dst_idx")] if dst_idx is not None else [])
    _emit("nc_match_replace8", outs, [a, v], {"imm": float(imm)}, mask=mask_of(mask, loc), loc=loc)
    return tile


def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, **kwargs) -> None:
    """Move partitions within each 32-partition quadrant: ``dst[i] = src[shuffle_mask[i]]``;
    255 keeps dst."""
    loc = caller_loc()
    a, d = _tile(src, loc, "nc_stream_shuffle"), _tile(dst, loc, "nc_stream_shuffle")
    _emit(
        "nc_stream_shuffle",
        [d],
        [a],
        {"shuffle_mask": tuple(int(x) for x in shuffle_mask)},
        mask=mask_of(mask, loc),
        loc=loc,
    )


def local_gather(
    src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, **kwargs
) -> Tile:
    """GpSimd gather: each group of 16 partitions gathers elements of its own partitions by
    uint16 index (elements are numbered partition-major within the group)."""
    loc = caller_loc()
    s, ix = _tile(src_buffer, loc, "local_gather"), _tile(index, loc, "local_gather")
    n = ix.free_size * int(num_elem_per_idx)
    tile, out = new_tile((s.shape[0], n), s.dtype, loc, fallback="gather")
    _emit(
        "local_gather",
        [out],
        [s, ix],
        {
            "num_elem_per_idx": int(num_elem_per_idx),
            "num_valid_indices": None if num_valid_indices is None else int(num_valid_indices),
        },
        mask=mask_of(mask, loc),
        loc=loc,
    )
    return tile


def dma_copy(
    *, dst, src, mask=None, dst_rmw_op=None, oob_mode=None, dge_mode=None, **kwargs
) -> None:
    """Copy between HBM and SBUF (or SBUF and SBUF) on the DMA engines."""
    loc = caller_loc()
    d, s = access_of(dst, loc, "dma_copy dst"), access_of(src, loc, "dma_copy src")
    from ..trace.builder import reshape_access

    s2 = reshape_access(s, d.shape) or s
    attrs = {} if dst_rmw_op is None else {"rmw_op": op_name(dst_rmw_op)}
    _emit("dma_copy", [d], [s2], attrs, mask=mask_of(mask, loc), loc=loc)


fp32 = type("fp32", (), {"min": float(np.finfo(np.float32).min)})

__all__ = [
    n for n in dir() if not n.startswith("_") and n not in ("annotations", "enum", "np", "dtypes")
]
_ = (Scalar, Affine, Axis)
