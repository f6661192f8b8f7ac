"""Helpers shared by ``nl`` and ``nisa`` (Beta 1): turn user arguments into IR operands and
new tiles."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.affine import Affine, Axis, Predicate
from ..ir.core import Access
from ..trace.builder import current, maybe_current
from ..trace.index import Index, Pred
from .tile import Tile

Scalar = (int, float, np.integer, np.floating, bool)


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition dimension of a buffer's shape."""

    def __repr__(self) -> str:
        return f"par_dim({int(self)})"


def canon(shape: tuple[int, ...]) -> tuple[int, ...]:
    """On-chip tiles have a partition and at least one free dimension."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (shape[0], 1)
    return shape


def dtype_arg(dtype: object, loc: SourceLoc, api: str) -> np.dtype:
    """``dtype`` (an ``nl`` dtype, a numpy / ml_dtypes dtype, its name or a torch dtype) as a
    numpy dtype; a value that is not an NKI dtype is ``err_unsupported_dtype`` naming the
    ``dtype`` argument of ``api``."""
    try:
        return dtypes.as_dtype(dtype)
    except (TypeError, ValueError) as e:
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op=f"{api} (argument dtype)",
            dtype=repr(dtype),
            why=str(e),
        ) from None


def scalar_arg(x: object, loc: SourceLoc, api: str, arg: str) -> float:
    """A Python or numpy number (or bool) as a float; anything else is
    ``err_invalid_argument`` naming argument ``arg`` of ``api``."""
    if isinstance(x, Scalar):
        return float(x)
    raise NkiError(
        "err_invalid_argument",
        loc,
        op=api,
        why=f"{arg} must be a number, got {type(x).__name__} {x!r}",
    )


def shape_arg(shape: object, loc: SourceLoc, api: str) -> tuple[int, ...]:
    """``shape`` (an int, or a tuple / list of ints and ``nl.par_dim``) as a tuple of ints,
    each positive: a tensor has no zero-sized or negative dimension.  Anything else is
    ``err_invalid_argument`` naming the shape argument of ``api``."""
    items = shape if isinstance(shape, tuple | list) else (shape,)
    dims = []
    for s in items:
        if not isinstance(s, int | np.integer) or isinstance(s, bool):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=api,
                why=f"shape must be a tuple of ints, got {shape!r} ({type(s).__name__} {s!r})",
            )
        if int(s) <= 0:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=api,
                why=f"shape {tuple(int(x) for x in items)} has a dimension of size {int(s)}; "
                "every dimension needs at least one element",
            )
        dims.append(int(s))
    return tuple(dims)


def access_of(x: object, loc: SourceLoc, what: str = "operand") -> Access:
    """The IR access of tile ``x``, the operand ``what`` of an API call at ``loc``.  Outside
    a kernel every API is ``err_nki_api_outside_of_nki_kernel``; inside, a value that is not
    a tile is ``err_invalid_argument`` naming ``what``."""
    if maybe_current() is None:
        raise NkiError("err_nki_api_outside_of_nki_kernel", loc, api=what)
    if isinstance(x, Tile):
        acc = x.access
        current().check_scope(acc.tensor, loc)
        return acc
    raise NkiError(
        "err_invalid_argument", loc, op=what, why=f"expected a tile, got {type(x).__name__}"
    )


def as_tile_access(x: Access) -> Access:
    """View a 0-d/1-d access as a 2-d tile (P, 1)."""
    shape = canon(x.shape)
    if shape == x.shape:
        return x
    from ..trace.builder import reshape_access

    r = reshape_access(x, shape)
    assert r is not None
    return r


def broadcast_access(a: Access, shape: tuple[int, ...], loc: SourceLoc, op: str) -> Access:
    """Broadcast along free dimensions by repeating reads (stride 0)."""
    a = as_tile_access(a)
    if a.shape == shape:
        return a
    if len(a.shape) != len(shape):
        from ..trace.builder import reshape_access

        r = reshape_access(a, shape)
        if r is not None:
            return r
        raise NkiError(
            "err_invalid_argument", loc, op=op, why=f"shapes {a.shape} and {shape} do not broadcast"
        )
    if a.shape[0] != shape[0]:
        raise NkiError("err_num_partition_mismatch", loc, op=op, a=a.shape[0], b=shape[0])
    mapping = {}
    for k, (s, t) in enumerate(zip(a.shape, shape)):
        if s == t:
            continue
        if s != 1:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=op,
                why=f"shapes {a.shape} and {shape} do not broadcast",
            )
        mapping[Axis(k)] = Affine()
    return a.remap(shape, mapping)


def new_tile(
    shape: tuple[int, ...],
    dtype: np.dtype,
    loc: SourceLoc,
    buffer: str = "sbuf",
    fallback: str = "t",
) -> tuple[Tile, Access]:
    b = current()
    dt = dtype_arg(dtype, loc, fallback)
    t = b.new_tensor(canon(shape), dt, buffer, loc=loc, fallback=fallback)
    b.fresh.add(t.uid)
    tile = Tile.of(t)
    return tile, tile._access


def mask_of(mask: object, loc: SourceLoc) -> Predicate | None:
    if mask is None:
        return None
    if isinstance(mask, Pred):
        return mask.predicate
    if isinstance(mask, bool):
        if mask:
            return None
    raise NkiError("err_unsupported_expression_in_mask", loc, got=repr(mask))


def operand(x: object, loc: SourceLoc, what: str = "operand") -> Access | float:
    """A scalar immediate or a (P, 1) tile."""
    if isinstance(x, Scalar):
        return float(x)
    if isinstance(x, Index) and not x.sizes and x.affine.is_const:
        return float(x.affine.const)
    return as_tile_access(access_of(x, loc, what))


def dtype_of(x: object) -> np.dtype:
    if isinstance(x, Tile):
        return x.dtype
    if isinstance(x, Access):
        return x.dtype
    return dtypes.scalar_dtype(x)


def result_dtype(dtype: object, *xs: object) -> np.dtype:
    """``dtype`` if given (checked: ``dtype_arg``), else the promotion of the operands'."""
    if dtype is not None:
        return dtype_arg(dtype, caller_loc(), "result")
    out = None
    for x in xs:
        if x is None:
            continue
        d = dtype_of(x)
        out = d if out is None else dtypes.promote(out, d)
    return out if out is not None else dtypes.float32
