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

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
FP8_DTYPES = ("float8_e4m3", "float8_e4m3fn", "float8_e5m2")
DTYPES = FLOAT_DTYPES + FP8_DTYPES
OUT_DTYPES = ("float32", "bfloat16", "float16")  # fp8 inputs: bfloat16 (default) or float32
MAX_K = 8192  # the fp32 rhs block [K, 512] and lhsT block [K, 128] must fit SBUF together
MAX_BLOCK_N = 4  # 512-column tiles per rhs block
MAX_BLOCK_M = 4  # 128-row tiles per lhsT block
# Autotuned (benchmarks/autotune/matmul_before.md: 42 shapes x 10 block configs on the trn2
# model): once an output tile takes this many TensorE passes over K (a pass per 128-row K tile,
# four for fp32, which the PE runs at 1/4 rate), the loads of one tile hide behind its matmuls
# and single-tile blocks win (1.00-1.14x the largest blocks that fit 96 KiB, the rule before):
# the first matmul starts after one tile's loads instead of a whole block's.  Below it, large
# blocks amortize the loads (the model puts them within 0.2-8% of the best block there).
COMPUTE_BOUND_PASSES = 8


def block_tiles(k_size: int, m_size: int, n_size: int, itemsize: int) -> tuple[int, int]:
    """(row tiles per lhsT block, column tiles per rhs block) for a problem size.

    One tile each when the matmuls of an output tile are long enough to hide its loads
    (``COMPUTE_BOUND_PASSES``), else the largest blocks (``MAX_BLOCK_M`` x ``MAX_BLOCK_N``
    tiles, fewer if M or N has fewer): every extra column tile is one less reload of the lhsT
    block, every extra row tile a wider lhsT DMA.  Below the threshold K has at most 7 tiles, so
    such blocks take at most 7 x (4 x 512 + 4 x 128) x 2 B = 35 KiB of SBUF per partition.
    """
    tn, tm, tk = nl.tile_size.gemm_moving_fmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax
    k_tiles = math.ceil(k_size / tk)
    if k_tiles * (4 if itemsize == 4 else 1) >= COMPUTE_BOUND_PASSES:
        return 1, 1
    return min(MAX_BLOCK_M, math.ceil(m_size / tm)), min(MAX_BLOCK_N, math.ceil(n_size / tn))


@nki.jit
def matmul_kernel(lhsT, rhs, out_dtype=None, block_m=0, block_n=0):
    """``lhsT.T @ rhs`` for ``lhsT`` [K, M] and ``rhs`` [K, N] of one dtype; returns [M, N] in
    ``out_dtype`` (default: the input dtype), accumulated in fp32 PSUM.

    ``block_m`` / ``block_n``: 128-row tiles per lhsT block and 512-column tiles per rhs block
    (meta-parameters; 0 picks them with :func:`block_tiles`)."""
    k_size, m_size = lhsT.shape
    _, n_size = rhs.shape
    out = nl.ndarray((m_size, n_size), dtype=out_dtype or lhsT.dtype, buffer=nl.shared_hbm)

    tile_k = nl.tile_size.pmax
    tile_m = min(nl.tile_size.gemm_stationary_fmax, m_size)
    tile_n = min(nl.tile_size.gemm_moving_fmax, n_size)
    k_full, k_rest = divmod(k_size, tile_k)
    k_tiles = k_full + (k_rest > 0)
    auto_m, auto_n = block_tiles(k_size, m_size, n_size, lhsT.itemsize)
    block_m, block_n = block_m or auto_m, block_n or auto_n
    width_m, width_n = block_m * tile_m, block_n * tile_n  # free sizes of the blocks

    i_k = nl.arange(tile_k)[:, None]
    i_k_rest = nl.arange(k_rest)[:, None]
    i_m = nl.arange(tile_m)[None, :]
    i_n = nl.arange(tile_n)[None, :]
    i_bm = nl.arange(width_m)[None, :]
    i_bn = nl.arange(width_n)[None, :]
    i_out = nl.arange(tile_m)[:, None]

    for nb in nl.affine_range(math.ceil(n_size / width_n)):
        # rhs block [K, width_n]: one DMA of width_n columns per 128 contraction rows
        cols = nb * width_n + i_bn
        rhs_blk = nl.ndarray(
            (k_tiles, nl.par_dim(tile_k), width_n), dtype=rhs.dtype, buffer=nl.sbuf
        )
        for k in nl.affine_range(k_full):
            rhs_blk[k, i_k, i_bn] = nl.load(rhs[k * tile_k + i_k, cols], mask=cols < n_size)
        if k_rest:
            rhs_blk[k_full, i_k_rest, i_bn] = nl.load(
                rhs[k_full * tile_k + i_k_rest, cols], mask=cols < n_size
            )

        for mb in nl.affine_range(math.ceil(m_size / width_m)):
            # lhsT block [K, width_m], loaded once and used by every column tile of the rhs block
            lhs_cols = mb * width_m + i_bm
            lhsT_blk = nl.ndarray(
                (k_tiles, nl.par_dim(tile_k), width_m), dtype=lhsT.dtype, buffer=nl.sbuf
            )
            for k in nl.affine_range(k_full):
                lhsT_blk[k, i_k, i_bm] = nl.load(
                    lhsT[k * tile_k + i_k, lhs_cols], mask=lhs_cols < m_size
                )
            if k_rest:
                lhsT_blk[k_full, i_k_rest, i_bm] = nl.load(
                    lhsT[k_full * tile_k + i_k_rest, lhs_cols], mask=lhs_cols < m_size
                )

            for bm in nl.affine_range(block_m):
                out_rows = (mb * block_m + bm) * tile_m + i_out
                row_ok = out_rows < m_size
                # the block's column tiles of this output row tile, coalesced for one wide store
                packed = nl.ndarray((nl.par_dim(tile_m), width_n), dtype=out.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(block_n):
                    inside = row_ok & (nb * width_n + bn * tile_n + i_n < n_size)
                    acc = nl.zeros((tile_m, tile_n), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(k_full):
                        acc += nisa.nc_matmul(
                            lhsT_blk[k, i_k, bm * tile_m + i_m],
                            rhs_blk[k, i_k, bn * tile_n + i_n],
                            mask=inside,
                        )
                    if k_rest:
                        acc += nisa.nc_matmul(
                            lhsT_blk[k_full, i_k_rest, bm * tile_m + i_m],
                            rhs_blk[k_full, i_k_rest, bn * tile_n + i_n],
                            mask=inside,
                        )
                    packed[i_out, bn * tile_n + i_n] = nl.copy(acc, dtype=out.dtype, mask=inside)
                valid = row_ok & (cols < n_size)
                nl.store(out[out_rows, cols], value=packed[i_out, i_bn], mask=valid)
    return out


def matmul(lhsT: np.ndarray, rhs: np.ndarray, *, out_dtype: str = "") -> np.ndarray:
    """Matrix product ``lhsT.T @ rhs``, i.e. ``A @ B`` with ``A`` given transposed.

    Layout: ``lhsT`` is [K, M] (the left matrix **transposed**, contraction dimension first),
    ``rhs`` is [K, N]; the result is [M, N].  Numpy arrays or CPU torch tensors of one dtype:
    float32, bfloat16, float16 or an fp8 format (float8_e4m3, float8_e4m3fn, float8_e5m2);
    1 <= K <= 8192, any M and N.  Products accumulate in fp32 (PSUM) and the result is rounded
    once to ``out_dtype``: one of float32, bfloat16, float16, or "" for the default (the input
    dtype; bfloat16 for fp8 inputs).
    Raises ``ValueError`` for non-2-D or mismatched shapes and ``TypeError`` for an unsupported
    or mixed dtype or an unsupported ``out_dtype``.
    """
    _check_shapes("matmul", lhsT, rhs)
    in_dtype = _common_dtype("matmul", lhsT, rhs)
    return matmul_kernel(lhsT, rhs, _out_dtype(in_dtype, out_dtype))


def matmul_backward(
    grad: np.ndarray, lhsT: np.ndarray, rhs: np.ndarray, *, out_dtype: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of ``out = lhsT.T @ rhs`` given ``grad`` = dL/d out [M, N]:

    - ``grad_lhsT`` [K, M] = ``rhs @ grad.T`` = ``matmul(rhs.T, grad.T)`` (contraction over N),
    - ``grad_rhs`` [K, N] = ``lhsT @ grad`` = ``matmul(lhsT.T, grad)`` (contraction over M),

    both computed by ``matmul_kernel`` (fp32 PSUM accumulation) and returned in the dtype of
    ``lhsT``/``rhs``.  The operand transposes (``rhs.T``, ``grad.T``, ``lhsT.T``) are host-side
    copies into the [contraction, free] layout the kernel takes.  The operands meet in the
    input dtype when ``grad`` has it, in ``grad``'s dtype for fp8 inputs with a bf16/fp16
    ``grad``, else in float32 (all widenings exact).  Needs M, N <= 8192 (they are the contraction sizes here).
    ``out_dtype`` is the forward's attribute (unused: the gradients take the input dtype).
    """
    del out_dtype
    _check_shapes("matmul_backward", lhsT, rhs)
    in_dtype = _common_dtype("matmul_backward", lhsT, rhs)
    (_, m_size), (_, n_size) = tuple(lhsT.shape), tuple(rhs.shape)
    if tuple(grad.shape) != (m_size, n_size):
        raise ValueError(
            f"matmul_backward: grad must have the output shape {(m_size, n_size)}, got {tuple(grad.shape)}"
        )
    if max(m_size, n_size) > MAX_K:
        raise ValueError(
            f"matmul_backward: M and N must be <= {MAX_K} (the backward contracts over them), "
            f"got M={m_size}, N={n_size}"
        )
    g_dtype = dtypes.name(dtypes.as_dtype(grad.dtype))
    if g_dtype == in_dtype:
        work = in_dtype
    elif in_dtype in FP8_DTYPES and g_dtype in ("bfloat16", "float16"):
        work = g_dtype  # fp8 widens exactly to bf16/fp16
    else:
        work = "float32"
    g, a, b = (_as(x, work) for x in (grad, lhsT, rhs))
    grad_lhsT = matmul_kernel(_transposed(b), _transposed(g), in_dtype)
    grad_rhs = matmul_kernel(_transposed(a), g, in_dtype)
    return grad_lhsT, grad_rhs


def _check_shapes(fn: str, lhsT: np.ndarray, rhs: np.ndarray) -> None:
    if len(lhsT.shape) != 2 or len(rhs.shape) != 2:
        raise ValueError(
            f"{fn}: lhsT and rhs must be 2-D, got {tuple(lhsT.shape)} and {tuple(rhs.shape)}"
        )
    (k_size, m_size), (k2, n_size) = tuple(lhsT.shape), tuple(rhs.shape)
    if k_size != k2:
        raise ValueError(
            f"{fn}: lhsT [K, M] = {tuple(lhsT.shape)} and rhs [K, N] = {tuple(rhs.shape)} differ in K"
        )
    if not 1 <= k_size <= MAX_K:
        raise ValueError(f"{fn}: K must be in [1, {MAX_K}], got {k_size}")
    if m_size == 0 or n_size == 0:
        raise ValueError(f"{fn}: M and N must be positive, got M={m_size}, N={n_size}")


def _common_dtype(fn: str, lhsT: np.ndarray, rhs: np.ndarray) -> str:
    names = {dtypes.name(dtypes.as_dtype(t.dtype)) for t in (lhsT, rhs)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: lhsT and rhs must share one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    return names.pop()


def _out_dtype(in_dtype: str, out_dtype: str) -> str:
    if not out_dtype:
        return "bfloat16" if in_dtype in FP8_DTYPES else in_dtype
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            f"matmul: out_dtype must be one of {', '.join(OUT_DTYPES)} or '', got {out_dtype!r}"
        )
    return out_dtype


def _as(x, dtype_name: str):  # noqa: ANN001, ANN202
    """``x`` (numpy array or CPU torch tensor) in an NKI dtype, as a numpy array."""
    a = x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)
    dt = dtypes.as_dtype(dtype_name)
    return a if a.dtype == dt else a.astype(np.float32).astype(dt)


def _transposed(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T)
