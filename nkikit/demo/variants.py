"""RMSNorm implementations for the demo: naive (one kernel per PyTorch-level op, each through
HBM) and fused (one kernel, written the obvious way).  The third, tuned, is the library kernel
(``nkikit.library.rmsnorm``)."""

from __future__ import annotations

import numpy as np

import nkikit as nki
import nkikit.language as nl

P = 128


# --- naive: five kernels, every intermediate goes to HBM and back -----------------------------


@nki.jit
def square(x):
    """x * x, tile by tile."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        nl.store(out[i * P : (i + 1) * P, :], value=nl.multiply(t, t))
    return out


@nki.jit
def mean_rows(x):
    """Mean of each row: [N, D] -> [N, 1]."""
    out = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        nl.store(out[i * P : (i + 1) * P, :], value=nl.mean(t, axis=1))
    return out


@nki.jit
def rsqrt_eps(x, eps):
    """1 / sqrt(x + eps) for a column [N, 1]."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        nl.store(out[i * P : (i + 1) * P, :], value=nl.rsqrt(nl.add(t, eps)))
    return out


@nki.jit
def scale_rows(x, r):
    """x * r with r a column [N, 1]."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        s = nl.load(r[i * P : (i + 1) * P, :])
        nl.store(out[i * P : (i + 1) * P, :], value=nl.multiply(t, s))
    return out


@nki.jit
def scale_cols(x, gamma):
    """x * gamma with gamma a row [D]."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, gamma.shape[0])))
    g_b = g.broadcast_to((P, gamma.shape[0]))
    for i in nl.affine_range(x.shape[0] // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        nl.store(out[i * P : (i + 1) * P, :], value=nl.multiply(t, g_b))
    return out


NAIVE_STEPS = ("square", "mean", "rsqrt", "multiply", "multiply")


def naive_calls(x, gamma, eps: float = 1e-6):
    """The naive pipeline as (kernel, args) pairs over abstract or real inputs."""
    import nkikit.typing as nt

    n, d = x.shape
    col = nt.tensor[[n, 1], x.dtype]
    return [
        (square, (x,)),
        (mean_rows, (x,)),
        (rsqrt_eps, (col, eps)),
        (scale_rows, (x, col)),
        (scale_cols, (x, gamma)),
    ]


def rmsnorm_naive(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Run the five naive kernels in sequence on real arrays."""
    sq = square(x)
    m = mean_rows(sq)
    r = rsqrt_eps(m, eps)
    y = scale_rows(x, r)
    return scale_cols(y, gamma)


# --- fused: one kernel, written the obvious way ------------------------------------------------


@nki.jit
def rmsnorm_fused(x, gamma, eps=1e-6):
    """RMSNorm in one kernel, the way one first writes it: per 128-row tile, load once, square,
    row-sum, rsqrt, scale by it and by gamma, store once.  HBM traffic is already minimal, but
    each step is its own pass over the tile on the VectorE.  Rows are a multiple of 128."""
    n, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, d))).broadcast_to((P, d))
    for i in nl.affine_range(n // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        sum_sq = nl.sum(nl.square(t), axis=1, keepdims=True)
        r = nl.rsqrt(nl.add(nl.multiply(sum_sq, 1.0 / d), eps))
        y = nl.multiply(nl.multiply(t, r), g, dtype=x.dtype)
        nl.store(out[i * P : (i + 1) * P, :], value=y)
    return out


def rmsnorm_reference(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    xf = x.astype(np.float32)
    return xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * gamma.astype(np.float32)
