"""Tiled matmul ``lhsT.T @ rhs`` with PSUM accumulation over K.

The left operand is delivered transposed, ``lhsT`` [K, M], so the contraction dimension K is
on the partitions of both operands, as the TensorE requires (``nc_matmul`` computes
``stationary.T @ moving``).  Tiles: K by 128 (partitions), M by 128 (stationary free size),
N by 512 (moving free size = one fp32 PSUM bank).

Loop nest (all ``affine_range``: output tiles are independent, and the K loop only accumulates
into PSUM, which is not a loop-carried dependency):

    for n (512-column block):      load the rhs strip [K, 512] once (K/128 DMAs)
      for m (128-row block):       load the lhsT strip [K, 128] once
        psum = 0
        for k:                     psum += lhsT[k].T @ rhs[k]      (TensorE, fp32 in PSUM)
        copy PSUM -> SBUF in the output dtype (VectorE), store

The rhs strip, the larger operand, is loaded once per column block and reused by every row
block; only the smaller lhsT strip is reloaded.  Ragged sizes: a last K tile of K % 128
partitions is a separate, statically smaller matmul in the same accumulation group; ragged M
and N are masked in the loads, the matmul, the PSUM copy and the store.
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit import dtypes

# Entry points take numpy arrays or CPU torch tensors (annotated as numpy) and return the same kind.

DTYPES = ("float32", "bfloat16", "float16")
MAX_K = 8192  # the fp32 rhs strip [K, 512] and lhsT strip [K, 128] must fit SBUF together


@nki.jit
def matmul_kernel(lhsT, rhs):
    """``lhsT.T @ rhs`` for ``lhsT`` [K, M] and ``rhs`` [K, N] of one dtype; returns [M, N] in
    that dtype (accumulated in fp32)."""
    k_size, m_size = lhsT.shape
    _, n_size = rhs.shape
    out = nl.ndarray((m_size, n_size), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    tile_k = nl.tile_size.pmax
    tile_m = min(nl.tile_size.gemm_stationary_fmax, m_size)
    tile_n = min(nl.tile_size.gemm_moving_fmax, n_size)
    k_full, k_rest = divmod(k_size, tile_k)
    k_tiles = k_full + (k_rest > 0)

    i_k = nl.arange(tile_k)[:, None]
    i_k_rest = nl.arange(k_rest)[:, None]
    i_m = nl.arange(tile_m)[None, :]
    i_n = nl.arange(tile_n)[None, :]
    i_out = nl.arange(tile_m)[:, None]

    for n in nl.affine_range(math.ceil(n_size / tile_n)):
        cols = n * tile_n + i_n
        rhs_strip = nl.ndarray(
            (k_tiles, nl.par_dim(tile_k), tile_n), dtype=rhs.dtype, buffer=nl.sbuf
        )
        for k in nl.affine_range(k_full):
            rhs_strip[k, i_k, i_n] = nl.load(rhs[k * tile_k + i_k, cols], mask=cols < n_size)
        if k_rest:
            rhs_strip[k_full, i_k_rest, i_n] = nl.load(
                rhs[k_full * tile_k + i_k_rest, cols], mask=cols < n_size
            )

        for m in nl.affine_range(math.ceil(m_size / tile_m)):
            lhs_cols = m * tile_m + i_m
            lhsT_strip = nl.ndarray(
                (k_tiles, nl.par_dim(tile_k), tile_m), dtype=lhsT.dtype, buffer=nl.sbuf
            )
            for k in nl.affine_range(k_full):
                lhsT_strip[k, i_k, i_m] = nl.load(
                    lhsT[k * tile_k + i_k, lhs_cols], mask=lhs_cols < m_size
                )
            if k_rest:
                lhsT_strip[k_full, i_k_rest, i_m] = nl.load(
                    lhsT[k_full * tile_k + i_k_rest, lhs_cols], mask=lhs_cols < m_size
                )

            out_rows = m * tile_m + i_out
            inside = (out_rows < m_size) & (cols < n_size)
            acc = nl.zeros((tile_m, tile_n), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_full):
                acc += nisa.nc_matmul(lhsT_strip[k, i_k, i_m], rhs_strip[k, i_k, i_n], mask=inside)
            if k_rest:
                acc += nisa.nc_matmul(
                    lhsT_strip[k_full, i_k_rest, i_m], rhs_strip[k_full, i_k_rest, i_n], mask=inside
                )
            res = nl.copy(acc, dtype=out.dtype, mask=inside)
            nl.store(out[out_rows, cols], value=res, mask=inside)
    return out


def matmul(lhsT: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Matrix product ``lhsT.T @ rhs``, i.e. ``A @ B`` with ``A`` given transposed.

    Layout: ``lhsT`` is [K, M] (the left matrix **transposed**, contraction dimension first),
    ``rhs`` is [K, N]; the result is [M, N].  Numpy arrays or CPU torch tensors, both float32,
    both bfloat16 or both float16; 1 <= K <= 8192, any M and N.  Products accumulate in fp32
    (PSUM) and the result is rounded once to the input dtype.
    Raises ``ValueError`` for non-2-D or mismatched shapes and ``TypeError`` for an unsupported
    or mixed dtype.
    """
    if len(lhsT.shape) != 2 or len(rhs.shape) != 2:
        raise ValueError(
            f"matmul: lhsT and rhs must be 2-D, got {tuple(lhsT.shape)} and {tuple(rhs.shape)}"
        )
    (k_size, m_size), (k2, n_size) = tuple(lhsT.shape), tuple(rhs.shape)
    if k_size != k2:
        raise ValueError(
            f"matmul: lhsT [K, M] = {tuple(lhsT.shape)} and rhs [K, N] = {tuple(rhs.shape)} differ in K"
        )
    if not 1 <= k_size <= MAX_K:
        raise ValueError(f"matmul: K must be in [1, {MAX_K}], got {k_size}")
    if m_size == 0 or n_size == 0:
        raise ValueError(f"matmul: M and N must be positive, got M={m_size}, N={n_size}")
    names = {dtypes.name(dtypes.as_dtype(t.dtype)) for t in (lhsT, rhs)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"matmul: lhsT and rhs must share one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    return matmul_kernel(lhsT, rhs)
