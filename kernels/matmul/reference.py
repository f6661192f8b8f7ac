"""numpy reference for the matmul, computed in float64."""

from __future__ import annotations

import numpy as np


def matmul(lhsT: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``lhsT.T @ rhs`` in float64 (lhsT: [K, M], rhs: [K, N] -> [M, N])."""
    return np.asarray(lhsT, dtype=np.float64).T @ np.asarray(rhs, dtype=np.float64)
