"""numpy reference for RMSNorm, computed in float64."""

from __future__ import annotations

import numpy as np


def rmsnorm(x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """``x / sqrt(mean(x**2, axis=-1) + eps) * weight`` in float64 (x: [..., D], weight: [D])."""
    x64 = np.asarray(x, dtype=np.float64)
    ms = np.mean(x64 * x64, axis=-1, keepdims=True)
    return x64 / np.sqrt(ms + eps) * np.asarray(weight, dtype=np.float64)


def add_rmsnorm(
    x: np.ndarray, residual: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """``h = x + residual`` and ``rmsnorm(h, weight)``, in float64; returns ``(out, h)``."""
    h = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    return rmsnorm(h, weight, eps=eps), h


def rmsnorm_backward(
    grad_out: np.ndarray, x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Analytic gradients of :func:`rmsnorm` in float64: ``(grad_x, grad_weight)``."""
    g = np.asarray(grad_out, np.float64)
    x64 = np.asarray(x, np.float64)
    w = np.asarray(weight, np.float64)
    d = x64.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    gw = g * w
    gx = r * gw - x64 * r**3 * np.sum(gw * x64, axis=-1, keepdims=True) / d
    return gx, np.sum((g * x64 * r).reshape(-1, d), axis=0)


def add_rmsnorm_backward(
    grad_y: np.ndarray,
    grad_h: np.ndarray,
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray,
    *,
    eps: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Analytic gradients of :func:`add_rmsnorm` in float64: ``(grad_x, grad_residual,
    grad_weight)``; ``grad_x = grad_residual`` = rmsnorm's input gradient at ``h`` plus
    ``grad_h``."""
    h = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    gh, gw = rmsnorm_backward(grad_y, h, weight, eps=eps)
    gx = gh + np.asarray(grad_h, np.float64)
    return gx, gx.copy(), gw
