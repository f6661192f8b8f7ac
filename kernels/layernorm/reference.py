"""numpy reference for LayerNorm, computed in float64."""

from __future__ import annotations

import numpy as np


def layernorm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, eps: float = 1e-5
) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis, population variance."""
    x64 = np.asarray(x, dtype=np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = x64.var(axis=-1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + eps) * np.asarray(weight, np.float64) + np.asarray(
        bias, np.float64
    )
