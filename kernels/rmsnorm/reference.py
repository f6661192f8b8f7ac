"""numpy reference for RMSNorm, computed in float64."""

from __future__ import annotations

import numpy as np


def rmsnorm(x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """``x / sqrt(mean(x**2, axis=-1) + eps) * weight`` in float64 (x: [..., D], weight: [D])."""
    x64 = np.asarray(x, dtype=np.float64)
    ms = np.mean(x64 * x64, axis=-1, keepdims=True)
    return x64 / np.sqrt(ms + eps) * np.asarray(weight, dtype=np.float64)
