"""numpy reference for the row softmax, computed in float64."""

from __future__ import annotations

import numpy as np


def _softmax64(x64: np.ndarray) -> np.ndarray:
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax(x: np.ndarray, *, causal: bool = False, offset: int = 0) -> np.ndarray:
    """``exp(x - max) / sum(exp(x - max))`` along the last axis, in float64.  With ``causal``,
    row i of each [S, D] slice keeps columns ``j <= i + offset``; masked entries are 0."""
    x64 = np.asarray(x, dtype=np.float64)
    if causal:
        s, d = (x64.shape[-2] if x64.ndim >= 2 else 1), x64.shape[-1]
        keep = np.arange(d)[None, :] <= np.arange(s)[:, None] + offset
        x64 = np.where(keep, x64, -np.inf)
    return _softmax64(x64)


def softmax_backward(
    grad_out: np.ndarray, x: np.ndarray, *, causal: bool = False, offset: int = 0
) -> tuple[np.ndarray]:
    """``y * (grad - sum(grad * y))`` in float64 (one gradient, for x)."""
    y = softmax(x, causal=causal, offset=offset)
    g = np.asarray(grad_out, dtype=np.float64)
    return (y * (g - np.sum(g * y, axis=-1, keepdims=True)),)
