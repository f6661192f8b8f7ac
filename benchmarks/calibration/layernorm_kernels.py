"""The two LayerNorm kernels of the NKI LayerNorm tutorial [T-LN], written for nkikit.

``out = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta`` over the last axis of a 2-D fp32
tensor [rows, cols]; rows go on the partitions (tiles of 128), ``gamma`` / ``beta`` are
loaded once and broadcast across the partitions.

1. ``layernorm_v1``: language-level ops only: the mean, the mean of the square (variance
   = mean(x^2) - mean^2), an ``rsqrt``, then a subtract and a multiply over the full width
   for the normalization.
2. ``layernorm_v2``: ``bn_stats`` per 512-column chunk and one ``bn_aggr`` for mean and
   variance, then one two-operator ``tensor_scalar`` (subtract the mean, multiply by the
   reciprocal standard deviation) before the same affine transform.
"""

from __future__ import annotations

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

P = nl.tile_size.pmax
EPS = 1e-5


def _affine_params(gamma, beta, cols):
    """gamma and beta broadcast to [128, cols], one PSUM bank (512 fp32) at a time, so the
    one-partition staging tiles stay small."""
    fmax = nl.tile_size.gemm_moving_fmax
    g = nl.ndarray((nl.par_dim(P), cols), dtype=gamma.dtype, buffer=nl.sbuf)
    b = nl.ndarray((nl.par_dim(P), cols), dtype=beta.dtype, buffer=nl.sbuf)
    g2, b2 = gamma.reshape((1, cols)), beta.reshape((1, cols))
    for c in nl.affine_range(cols // fmax):
        cs = slice(c * fmax, (c + 1) * fmax)
        g[:, cs] = nl.load(g2[0:1, cs]).broadcast_to((P, fmax))
        b[:, cs] = nl.load(b2[0:1, cs]).broadcast_to((P, fmax))
    return g, b


@nki.jit
def layernorm_v1(x, gamma, beta):
    """Mean and variance with nl.mean; normalization as separate full-width instructions."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _affine_params(gamma, beta, cols)
    for i in nl.affine_range(rows // P):
        t = nl.load(x[i * P : (i + 1) * P, 0:cols])
        mean = nl.mean(t, axis=[1], keepdims=True)
        y = nl.square(t)  # var = mean(x^2) - mean^2; the square's tile is reused for y
        var = nl.subtract(nl.mean(y, axis=[1], keepdims=True), nl.multiply(mean, mean))
        rstd = nl.rsqrt(nl.add(var, EPS))
        y[...] = nl.subtract(t, mean)
        y[...] = nl.multiply(y, rstd)
        y[...] = nl.multiply(y, g)
        y[...] = nl.add(y, b)
        nl.store(out[i * P : (i + 1) * P, 0:cols], value=y)
    return out


@nki.jit
def layernorm_v2(x, gamma, beta):
    """bn_stats / bn_aggr statistics and one fused shift-and-scale tensor_scalar."""
    rows, cols = x.shape
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (cols + fmax - 1) // fmax
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g, b = _affine_params(gamma, beta, cols)
    for i in nl.affine_range(rows // P):
        t = nl.load(x[i * P : (i + 1) * P, 0:cols])
        stats = nl.ndarray((P, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(chunks):
            stats[:, 6 * c : 6 * c + 6] = nisa.bn_stats(t[:, c * fmax : (c + 1) * fmax])
        mv = nisa.bn_aggr(stats)
        rstd = nl.rsqrt(nl.add(mv[:, 1:2], EPS))
        t[...] = nisa.tensor_scalar(
            t, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd
        )
        t[...] = nl.multiply(t, g)
        t[...] = nl.add(t, b)
        nl.store(out[i * P : (i + 1) * P, 0:cols], value=t)
    return out


KERNELS = {"v1": layernorm_v1, "v2": layernorm_v2}
