"""The four steps of the NKI matrix-multiplication tutorial [T-MM], written for nkikit.

Each kernel computes ``lhsT.T @ rhs`` for ``lhsT`` of shape [K, M] (the left operand delivered
transposed, so the contraction dimension K is on the partitions) and ``rhs`` of shape
[K, N].  They follow the tutorial's loop nests, tile sizes, load placement and blocking so
that their modeled times can be compared with the published measurements:

1. ``matmul_tiled``: every (m, n, k) tile loads its own operands.
2. ``matmul_hoisted``: a column of lhsT tiles is loaded once per m, a column of rhs tiles
   once per (m, n).
3. ``matmul_blocked_free``: M and N are blocked (2 x 128 rows, 2 x 512 columns), so each
   loaded rhs block serves two output row tiles.
4. ``matmul_fully_blocked``: M, N and K are blocked (2048 x 1024 x 1024 by default), K blocks
   run in a sequential loop and partial sums accumulate in SBUF.
"""

from __future__ import annotations

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

# TensorE tile limits: stationary free size, contraction (partitions), moving free size.
TM = nl.tile_size.gemm_stationary_fmax  # 128
TK = nl.tile_size.pmax  # 128
TN = nl.tile_size.gemm_moving_fmax  # 512


def _dims(lhsT, rhs):
    k, m = lhsT.shape
    k2, n = rhs.shape
    assert k == k2, "lhsT and rhs must share the contraction dimension"
    return k, m, n


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Step 1: one PSUM accumulation per output tile; both operands loaded for every k."""
    K, M, N = _dims(lhsT, rhs)
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mi in nl.affine_range(M // TM):
        for ni in nl.affine_range(N // TN):
            acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(K // TK):
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                a[...] = nl.load(lhsT[ki * TK : (ki + 1) * TK, mi * TM : (mi + 1) * TM])
                b[...] = nl.load(rhs[ki * TK : (ki + 1) * TK, ni * TN : (ni + 1) * TN])
                acc += nl.matmul(a[...], b[...], transpose_x=True)
            tile = nl.copy(acc, dtype=out.dtype)
            nl.store(out[mi * TM : (mi + 1) * TM, ni * TN : (ni + 1) * TN], value=tile)
    return out


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """Step 2: loads hoisted out of the innermost loop (lhsT per m, rhs per (m, n))."""
    K, M, N = _dims(lhsT, rhs)
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    nk = K // TK
    for mi in nl.affine_range(M // TM):
        a_col = nl.ndarray((nk, nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for ki in nl.affine_range(nk):
            a_col[ki, :, :] = nl.load(lhsT[ki * TK : (ki + 1) * TK, mi * TM : (mi + 1) * TM])
        for ni in nl.affine_range(N // TN):
            b_col = nl.ndarray((nk, nl.par_dim(TK), TN), dtype=rhs.dtype, buffer=nl.sbuf)
            for ki in nl.affine_range(nk):
                b_col[ki, :, :] = nl.load(rhs[ki * TK : (ki + 1) * TK, ni * TN : (ni + 1) * TN])
            acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(nk):
                acc[...] += nl.matmul(a_col[ki, :, :], b_col[ki, :, :], transpose_x=True)
            tile = nl.copy(acc, dtype=out.dtype)
            nl.store(out[mi * TM : (mi + 1) * TM, ni * TN : (ni + 1) * TN], value=tile)
    return out


@nki.jit
def matmul_blocked_free(lhsT, rhs, BM=2, BN=2):
    """Step 3: blocks of BM row tiles and BN column tiles share their loads."""
    K, M, N = _dims(lhsT, rhs)
    assert M % (BM * TM) == 0 and N % (BN * TN) == 0
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    nk = K // TK
    for mb in nl.affine_range(M // (BM * TM)):
        a_blk = nl.ndarray((BM, nk, nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for bm in nl.affine_range(BM):
            col = (mb * BM + bm) * TM
            for ki in nl.affine_range(nk):
                a_blk[bm, ki, :, :] = nl.load(lhsT[ki * TK : (ki + 1) * TK, col : col + TM])
        for nb in nl.affine_range(N // (BN * TN)):
            b_blk = nl.ndarray((BN, nk, nl.par_dim(TK), TN), dtype=rhs.dtype, buffer=nl.sbuf)
            for bn in nl.affine_range(BN):
                col = (nb * BN + bn) * TN
                for ki in nl.affine_range(nk):
                    b_blk[bn, ki, :, :] = nl.load(rhs[ki * TK : (ki + 1) * TK, col : col + TN])
            for bm in nl.affine_range(BM):
                for bn in nl.affine_range(BN):
                    acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
                    for ki in nl.affine_range(nk):
                        acc += nl.matmul(a_blk[bm, ki, :, :], b_blk[bn, ki, :, :], transpose_x=True)
                    tile = nl.copy(acc, dtype=out.dtype)
                    row = (mb * BM + bm) * TM
                    col = (nb * BN + bn) * TN
                    nl.store(out[row : row + TM, col : col + TN], value=tile)
    return out


@nki.jit
def matmul_fully_blocked(lhsT, rhs, BM=16, BN=2, BK=8):
    """Step 4: all three dimensions blocked; K blocks accumulate into SBUF partial sums."""
    K, M, N = _dims(lhsT, rhs)
    block_m, block_n, block_k = BM * TM, BN * TN, BK * TK
    assert M % block_m == 0 and N % block_n == 0 and K % block_k == 0
    nbm, nbn, nbk = M // block_m, N // block_n, K // block_k
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for nb in nl.affine_range(nbn):
        partial = nl.zeros((nbm, BM, BN, nl.par_dim(TM), TN), dtype=lhsT.dtype, buffer=nl.sbuf)
        # the K blocks stay in order: each one adds into the same partial sums
        for kb in nl.sequential_range(nbk):
            # one wide load per 128 contraction rows keeps the DMAs large
            b_blk = nl.ndarray((BK, nl.par_dim(TK), block_n), dtype=rhs.dtype, buffer=nl.sbuf)
            for bk in nl.affine_range(BK):
                row = (kb * BK + bk) * TK
                b_blk[bk, :, :] = nl.load(rhs[row : row + TK, nb * block_n : (nb + 1) * block_n])
            for mb in nl.affine_range(nbm):
                a_blk = nl.ndarray((BK, nl.par_dim(TK), block_m), dtype=lhsT.dtype, buffer=nl.sbuf)
                for bk in nl.affine_range(BK):
                    row = (kb * BK + bk) * TK
                    a_blk[bk, :, :] = nl.load(
                        lhsT[row : row + TK, mb * block_m : (mb + 1) * block_m]
                    )
                for bn in nl.affine_range(BN):
                    for bm in nl.affine_range(BM):
                        acc = nl.zeros((TM, TN), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(BK):
                            acc[...] += nisa.nc_matmul(
                                a_blk[bk, :, bm * TM : (bm + 1) * TM],
                                b_blk[bk, :, bn * TN : (bn + 1) * TN],
                            )
                        partial[mb, bm, bn, :, :] += acc[:, :]
        # pack the BN column tiles of each output row tile into one wide store
        for mb in nl.affine_range(nbm):
            for bm in nl.affine_range(BM):
                packed = nl.ndarray((TM, block_n), dtype=partial.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(BN):
                    packed[:, bn * TN : (bn + 1) * TN] = nl.copy(partial[mb, bm, bn, :, :])
                row = (mb * BM + bm) * TM
                nl.store(out[row : row + TM, nb * block_n : (nb + 1) * block_n], value=packed[:, :])
    return out


KERNELS = {
    "tiled": matmul_tiled,
    "hoisted_load": matmul_hoisted,
    "blocked_free_dim": matmul_blocked_free,
    "fully_optimized": matmul_fully_blocked,
}
