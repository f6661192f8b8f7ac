"""numpy reference for the row softmax, computed in float64."""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    """``exp(x - max) / sum(exp(x - max))`` along the last axis, in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
