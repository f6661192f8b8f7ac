"""ScalarE activation functions as numpy functions (computed in float64, rounded by the caller)."""

from __future__ import annotations

import numpy as np

from ..errors import SourceLoc, warn_at

_SQRT2 = np.sqrt(2.0)
_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def erf(x: np.ndarray) -> np.ndarray:
    """erf with absolute error < 1.5e-7 (Abramowitz & Stegun 7.1.26), enough for fp32 outputs."""
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return s * (1.0 - poly * np.exp(-a * a))


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _gelu(x):
    return 0.5 * x * (1.0 + erf(x / _SQRT2))


def _gelu_dx(x):
    return 0.5 * (1.0 + erf(x / _SQRT2)) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _silu_dx(x):
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _gelu_sigmoid_dx(x):
    s = _sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1.0 - s)


ACT = {
    "copy": lambda x: x,
    "identity": lambda x: x,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": _gelu,
    "gelu_dx": _gelu_dx,
    "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(1.702 * x),
    "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu": lambda x: x * _sigmoid(x),
    "silu_dx": _silu_dx,
    "erf": erf,
    "erf_dx": lambda x: 2.0 / np.sqrt(np.pi) * np.exp(-x * x),
    "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "square": np.square,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "arctan": np.arctan,
    "abs": np.abs,
    "sign": np.sign,
    "negative": np.negative,
    "trunc": np.trunc,
    "floor": np.floor,
    "ceil": np.ceil,
    "invert": lambda x: np.invert(np.asarray(x).astype(np.int64)).astype(np.float64),
    "logical_not": lambda x: (x == 0).astype(np.float64),
}


# ScalarE's periodic-looking functions are polynomials valid on one period, with no range
# reduction: outside it the hardware extrapolates the polynomial (AWS's simulator reproduces
# sin's: sin(9.0) ~ 27.65) [reference/nki-0x.md §4.16, §6.1].  nkikit computes the exact
# function there and warns at the instruction's line.  (The other limited ranges of the
# table, log's [2^-64, 2^64], sqrt's, rsqrt's, reciprocal's, exclude little beyond 0.)
# (bounds in fp32, as the engine reads them: fp32(pi) is a hair above pi, and a kernel that
# reduces its argument with ``(x + pi) % 2pi - pi`` in fp32 lands in [-fp32(pi), fp32(pi)])
VALID_RANGE = {
    "sin": (np.float32(-np.pi), np.float32(np.pi)),
    "arctan": (np.float32(-np.pi / 2), np.float32(np.pi / 2)),
}


def activate(name: str, x: np.ndarray, param=0.0) -> np.ndarray:
    """``name`` applied to ``x``; ``param`` is activate2's ``relu_param`` (a scalar or a
    per-partition column), the slope of ``prelu`` below 0.  ``activation`` has no such
    argument: its ``prelu`` is the default slope 0.0 (reading of [nki-0x.md §4.10], whose
    activation table lists prelu without saying where the slope comes from)."""
    with np.errstate(all="ignore"):
        if name == "prelu":
            return np.where(x >= 0, x, np.multiply(param, x))
        return ACT[name](x)


def warn_out_of_range(name: str, x, loc: SourceLoc, valid=None) -> None:
    """An ``NkiWarning`` at ``loc`` (the instruction's line) when an argument ``x`` of
    activation ``name`` (its elements where ``valid`` holds) is outside ``VALID_RANGE``."""
    bounds = VALID_RANGE.get(name)
    if bounds is None:
        return
    lo, hi = bounds
    x = np.asarray(x)
    with np.errstate(invalid="ignore"):
        outside = (x < lo) | (x > hi)
    if valid is not None:
        outside &= np.broadcast_to(valid, outside.shape)
    if outside.any():
        example = float(x[outside].flat[0])
        warn_at(
            loc,
            f"activation {name} read {example:g}, outside [{lo:.4g}, {hi:.4g}]: ScalarE's "
            f"{name} does no range reduction, so the hardware extrapolates its polynomial "
            f"there (AWS's simulator: sin(9.0) = 27.65); nkikit computes the exact {name}. "
            "Reduce the argument into the range first (nl.sin does for sin)",
        )


def scalar_activation(name: str, x) -> float:
    return float(activate(name, np.float64(x)))
