"""ALU operators and reductions as numpy functions on fp32 arrays (the simulator's table)."""

from __future__ import annotations

import numpy as np

from ..ir.opnames import ALU_UNARY


def _int(x):
    return np.asarray(x).astype(np.int64)


def _bits(fn):
    return lambda a, b: fn(_int(a), _int(b)).astype(np.float64)


def _cmp(fn):
    return lambda a, b: fn(a, b).astype(np.float32)


def _safe_pow(a, b):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(a, b)


def _abs_pick(larger: bool):
    """``abs_max`` / ``abs_min``: the operand (signed) of the larger / smaller magnitude, ties
    to the second operand [nki-0x.md §4.16]."""

    def fn(a, b):
        a, b = np.asarray(a), np.asarray(b)
        first = np.abs(a) > np.abs(b) if larger else np.abs(a) < np.abs(b)
        return np.where(first, a, b)

    return fn


def _abs_reduce(larger: bool):
    """The ``abs_max`` / ``abs_min`` reduction: a left fold of :func:`_abs_pick`, so among
    elements of equal magnitude the last one wins."""

    def fn(x, axis, keepdims):
        x = np.asarray(x)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        kept = [d for d in range(x.ndim) if d not in axes]
        flat = np.moveaxis(x, axes, range(x.ndim - len(axes), x.ndim))
        flat = flat.reshape(*[x.shape[d] for d in kept], -1)
        mag = np.abs(flat)[..., ::-1]  # reversed: argmax/argmin then finds the last tie
        pick = mag.argmax(axis=-1) if larger else mag.argmin(axis=-1)
        out = np.take_along_axis(flat, (flat.shape[-1] - 1 - pick)[..., None], axis=-1)[..., 0]
        if keepdims:
            out = np.expand_dims(out, axes)
        return out

    return fn


def _safe_div(a, b):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.divide(a, b)


ALU = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": _safe_div,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": _safe_pow,
    "mod": lambda a, b: np.mod(a, b),
    "fmod": lambda a, b: np.fmod(a, b),
    "equal": _cmp(np.equal),
    "not_equal": _cmp(np.not_equal),
    "greater": _cmp(np.greater),
    "greater_equal": _cmp(np.greater_equal),
    "less": _cmp(np.less),
    "less_equal": _cmp(np.less_equal),
    "logical_and": _cmp(lambda a, b: np.logical_and(a != 0, b != 0)),
    "logical_or": _cmp(lambda a, b: np.logical_or(a != 0, b != 0)),
    "logical_xor": _cmp(lambda a, b: np.logical_xor(a != 0, b != 0)),
    "bitwise_and": _bits(np.bitwise_and),
    "bitwise_or": _bits(np.bitwise_or),
    "bitwise_xor": _bits(np.bitwise_xor),
    "left_shift": _bits(np.left_shift),
    "right_shift": _bits(np.right_shift),
    "arith_shift_right": _bits(np.right_shift),
    "abs_max": _abs_pick(True),
    "abs_min": _abs_pick(False),
    # unary ALU ops ignore their second operand
    "bypass": lambda a, b: a,
    "abs": lambda a, b: np.abs(a),
    "square": lambda a, b: np.square(a),
    "relu": lambda a, b: np.maximum(a, 0),
    "invert": lambda a, b: np.invert(_int(a)).astype(np.float64),
    "logical_not": lambda a, b: np.asarray(a == 0).astype(np.float32),  # a may be a scalar
    "reciprocal": lambda a, b: _safe_div(1.0, a),
    "rsqrt": lambda a, b: _safe_div(1.0, np.sqrt(np.maximum(a, 0))),
}

REDUCE = {
    "add": (np.add.reduce, 0.0),
    "subtract": (np.add.reduce, 0.0),
    "multiply": (np.multiply.reduce, 1.0),
    "max": (np.maximum.reduce, -np.inf),
    "min": (np.minimum.reduce, np.inf),
    # activate2's magnitude reductions (not legal for tensor_reduce [nki-0x.md §4.16])
    "abs_max": (_abs_reduce(True), 0.0),
    "abs_min": (_abs_reduce(False), np.inf),
    "logical_and": (
        lambda x, axis, keepdims: np.logical_and.reduce(x != 0, axis=axis, keepdims=keepdims),
        1.0,
    ),
    "logical_or": (
        lambda x, axis, keepdims: np.logical_or.reduce(x != 0, axis=axis, keepdims=keepdims),
        0.0,
    ),
    "logical_xor": (
        lambda x, axis, keepdims: np.logical_xor.reduce(x != 0, axis=axis, keepdims=keepdims),
        0.0,
    ),
    "bitwise_and": (
        lambda x, axis, keepdims: np.bitwise_and.reduce(_int(x), axis=axis, keepdims=keepdims),
        -1.0,
    ),
    "bitwise_or": (
        lambda x, axis, keepdims: np.bitwise_or.reduce(_int(x), axis=axis, keepdims=keepdims),
        0.0,
    ),
    "bitwise_xor": (
        lambda x, axis, keepdims: np.bitwise_xor.reduce(_int(x), axis=axis, keepdims=keepdims),
        0.0,
    ),
}


# the ALU ops that read only their first operand
UNARY = ALU_UNARY


def alu(name: str, a, b, reverse: bool = False):
    fn = ALU[name]
    if not reverse:
        return fn(a, b)
    y = fn(b, a)
    if name in UNARY:
        # reversed, a unary op reads only the (scalar or per-partition) operand: every element
        # of the result is that operand's value
        y = np.broadcast_to(y, np.broadcast_shapes(np.shape(a), np.shape(b)))
    return y


def reduce(
    name: str, x: np.ndarray, axis, keepdims: bool, valid: np.ndarray | None = None
) -> np.ndarray:
    fn, identity = REDUCE[name]
    if valid is not None:
        x = np.where(valid, x, identity)
    out = fn(x, axis=axis, keepdims=keepdims)
    return np.asarray(out, dtype=np.float32) if np.asarray(out).dtype.kind != "f" else out


def scalar_alu(name: str, x, y):
    """Both operands are Python numbers: compute at trace time."""
    return float(ALU[name](np.float64(x), np.float64(y)))
