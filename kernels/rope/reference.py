"""numpy reference for rotary position embedding, in float64."""

from __future__ import annotations

import numpy as np


def _pairs(d: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(d // 2)
    return (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, layout: str = "half") -> np.ndarray:
    """Rotate pairs ``(a, b)`` of x [..., S, D] to ``(a cos - b sin, b cos + a sin)``."""
    x64 = np.asarray(x, dtype=np.float64)
    c = np.asarray(cos, dtype=np.float64)
    s = np.asarray(sin, dtype=np.float64)
    f, g = _pairs(x64.shape[-1], layout)
    out = np.empty_like(x64)
    out[..., f] = x64[..., f] * c - x64[..., g] * s
    out[..., g] = x64[..., g] * c + x64[..., f] * s
    return out


def rope_backward(grad, x, cos, sin, *, layout: str = "half"):
    """``(grad rotated by -theta, 0, 0)``: cos/sin are constant tables."""
    gx = rope(grad, cos, -np.asarray(sin, dtype=np.float64), layout=layout)
    return gx, np.zeros(np.shape(cos)), np.zeros(np.shape(sin))
