"""Three RMSNorm implementations for the demo: naive (one kernel per PyTorch-level op, each
through HBM), fused (the library kernel) and engine-tuned (ScalarE activation_reduce, gamma
broadcast on the TensorE, one VectorE instruction to apply both scales)."""

from __future__ import annotations

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
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


# --- engine-tuned --------------------------------------------------------------------------------


@nki.jit
def rmsnorm_tuned(x, gamma, eps=1e-6):
    """RMSNorm balanced across engines: the ScalarE squares-and-sums and applies 1/rms (its
    per-partition ``scale``), the VectorE only multiplies by gamma (a same-dtype tensor_tensor,
    the VectorE's fast mode in bf16), gamma is broadcast across partitions on the TensorE (a
    ones-vector matmul, once), and the row-tile loop is an affine_range the compiler
    multi-buffers, so loads of tile i+1 overlap compute on tile i.
    Rows are a multiple of 128; D a multiple of 512."""
    n, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, d)))
    ones = nl.ones((1, P), dtype=x.dtype)
    g_b = nl.ndarray((P, d), dtype=x.dtype)
    for j in nl.affine_range(d // 512):
        g_b[:, j * 512 : (j + 1) * 512] = nl.copy(
            nisa.nc_matmul(ones, g[:, j * 512 : (j + 1) * 512]), dtype=x.dtype
        )
    eps_col = nl.full((P, 1), eps, dtype=nl.float32)
    for i in nl.affine_range(n // P):
        t = nl.load(x[i * P : (i + 1) * P, :])
        sq_sum = nl.ndarray((P, 1), dtype=nl.float32)
        nisa.activation_reduce(op=nl.square, data=t, reduce_op=np.add, reduce_res=sq_sum)
        r = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / d, bias=eps_col)
        xn = nisa.activation(op=nl.copy, data=t, scale=r, dtype=x.dtype)
        y = nisa.tensor_tensor(xn, g_b, op=np.multiply)
        nl.store(out[i * P : (i + 1) * P, :], value=y)
    return out


def rmsnorm_reference(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    xf = x.astype(np.float32)
    return xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * gamma.astype(np.float32)
