"""numpy reference for the SwiGLU gate, computed in float64."""

from __future__ import annotations

import numpy as np


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free form of 1 / (1 + exp(-x))


def swiglu(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * sigmoid(a) * b`` in float64."""
    a64 = np.asarray(a, dtype=np.float64)
    return a64 * _sigmoid(a64) * np.asarray(b, dtype=np.float64)


def swiglu_backward(grad: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(grad * b * silu'(a), grad * silu(a))`` in float64."""
    g = np.asarray(grad, dtype=np.float64)
    a64 = np.asarray(a, dtype=np.float64)
    s = _sigmoid(a64)
    dsilu = s * (1.0 + a64 * (1.0 - s))
    return g * np.asarray(b, dtype=np.float64) * dsilu, g * a64 * s
