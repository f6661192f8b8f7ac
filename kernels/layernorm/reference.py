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


def layernorm_backward(
    grad_out: np.ndarray, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Analytic gradients of :func:`layernorm` in float64: ``(grad_x, grad_weight, grad_bias)``."""
    g = np.asarray(grad_out, np.float64)
    x64 = np.asarray(x, np.float64)
    d = x64.shape[-1]
    rstd = 1.0 / np.sqrt(x64.var(axis=-1, keepdims=True) + eps)
    xhat = (x64 - x64.mean(axis=-1, keepdims=True)) * rstd
    gw = g * np.asarray(weight, np.float64)
    gx = rstd * (gw - gw.mean(-1, keepdims=True) - xhat * (gw * xhat).mean(-1, keepdims=True))
    return gx, (g * xhat).reshape(-1, d).sum(0), g.reshape(-1, d).sum(0)
