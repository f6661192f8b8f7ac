"""numpy reference for GELU (exact and tanh-approximated) and its derivative, in float64."""

from __future__ import annotations

import math

import numpy as np

_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """``torch.nn.functional.gelu`` in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        return 0.5 * x64 * (1.0 + np.tanh(_K0 * (x64 + _K1 * x64**3)))
    return 0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))


def gelu_backward(grad: np.ndarray, x: np.ndarray, *, approximate: str = "none"):
    """``(grad * gelu'(x),)`` in float64."""
    g = np.asarray(grad, dtype=np.float64)
    x64 = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        t = np.tanh(_K0 * (x64 + _K1 * x64**3))
        d = 0.5 * (1.0 + t) + 0.5 * x64 * (1.0 - t * t) * _K0 * (1.0 + 3.0 * _K1 * x64**2)
    else:
        d = 0.5 * (1.0 + _erf(x64 / math.sqrt(2.0))) + x64 * np.exp(-0.5 * x64**2) / math.sqrt(
            2.0 * math.pi
        )
    return (g * d,)
