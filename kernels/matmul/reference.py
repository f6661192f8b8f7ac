"""numpy references for the matmul and its backward, computed in float64."""

from __future__ import annotations

import numpy as np


def matmul(lhsT: np.ndarray, rhs: np.ndarray, *, out_dtype: str = "") -> np.ndarray:
    """``lhsT.T @ rhs`` in float64 (lhsT: [K, M], rhs: [K, N] -> [M, N]); ``out_dtype`` only
    selects the kernel's output rounding, which the test tolerances cover."""
    del out_dtype
    return np.asarray(lhsT, dtype=np.float64).T @ np.asarray(rhs, dtype=np.float64)


def matmul_backward(
    grad: np.ndarray, lhsT: np.ndarray, rhs: np.ndarray, *, out_dtype: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """(dL/d lhsT, dL/d rhs) of ``out = lhsT.T @ rhs`` for ``grad`` = dL/d out, in float64:
    ``rhs @ grad.T`` [K, M] and ``lhsT @ grad`` [K, N]."""
    del out_dtype
    g, a, b = (np.asarray(x, dtype=np.float64) for x in (grad, lhsT, rhs))
    return b @ g.T, a @ g
