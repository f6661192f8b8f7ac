"""The NKI Beta-1 kernels the simulator benchmark runs, with the same math in plain numpy.

Each kernel is written the way it would be for a NeuronCore: 128-partition tiles, fused
ScalarE/VectorE instructions (``activation`` with a bias and a free-axis reduction,
``tensor_scalar`` with two ALU stages), TensorE matmuls accumulating in PSUM, and
``affine_range`` loops so that iterations are known to be independent.

Contract of every ``numpy_*`` reference: it takes the same numpy arrays as the kernel
(bf16 arrays are ``ml_dtypes.bfloat16``), computes in fp32 and returns an array in the
input dtype -- the plain-numpy baseline the simulator is compared with.
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

P = 128  # partitions per tile (nl.tile_size.pmax)


# ---------------------------------------------------------------------------------------------
# RMSNorm: out = x / sqrt(mean(x^2) + eps) * w


@nki.jit
def rmsnorm_kernel(x, w, eps):
    """RMSNorm over the last axis of ``x`` [N, D] with weight ``w`` [D]."""
    n_rows, d = x.shape
    out = nl.ndarray((n_rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(P)[:, None]
    iy = nl.arange(d)[None, :]
    # the weight row is loaded once and broadcast to all partitions (TensorE broadcast)
    w_row = nl.load(w.reshape((1, d))[nl.arange(1)[:, None], iy])
    w_tile = w_row.broadcast_to((P, d))
    for i in nl.affine_range(math.ceil(n_rows / P)):
        rows = i * P + ip
        x_tile = nl.load(x[rows, iy], mask=(rows < n_rows))
        # one ScalarE pass: square every element and sum each row on the way out
        sq_sum = nl.ndarray((P, 1), dtype=nl.float32)
        nisa.activation_reduce(
            op=nl.square,
            data=x_tile,
            reduce_op=nl.add,
            reduce_res=sq_sum,
            dtype=nl.float32,
            mask=(rows < n_rows),
        )
        # rsqrt(sum / d + eps) in one activation (scale and bias are free on the ScalarE)
        inv_rms = nisa.activation(
            op=nl.rsqrt, data=sq_sum, scale=1.0 / d, bias=eps, mask=(rows < n_rows)
        )
        # (x * inv_rms) * w in one VectorE instruction
        y = nisa.scalar_tensor_tensor(
            data=x_tile,
            op0=nl.multiply,
            operand0=inv_rms,
            op1=nl.multiply,
            operand1=w_tile,
            dtype=x.dtype,
            mask=(rows < n_rows),
        )
        nl.store(out[rows, iy], value=y, mask=(rows < n_rows))
    return out


def numpy_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    xf, wf = x.astype(np.float32, copy=False), w.astype(np.float32, copy=False)
    inv = 1.0 / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + np.float32(eps))
    return (xf * inv * wf).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# softmax over the last axis


@nki.jit
def softmax_kernel(x):
    """Row softmax of ``x`` [N, D]."""
    n_rows, d = x.shape
    out = nl.ndarray((n_rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(P)[:, None]
    iy = nl.arange(d)[None, :]
    for i in nl.affine_range(math.ceil(n_rows / P)):
        rows = i * P + ip
        x_tile = nl.load(x[rows, iy], mask=(rows < n_rows))
        neg_max = nisa.tensor_reduce(
            np.max,
            x_tile,
            axis=1,
            negate=True,
            keepdims=True,
            dtype=nl.float32,
            mask=(rows < n_rows),
        )
        # exp(x - max) with the row sum accumulated by the same ScalarE instruction
        row_sum = nl.ndarray((P, 1), dtype=nl.float32)
        e = nisa.activation_reduce(
            op=nl.exp,
            data=x_tile,
            bias=neg_max,
            reduce_op=nl.add,
            reduce_res=row_sum,
            dtype=nl.float32,
            mask=(rows < n_rows),
        )
        inv_sum = nisa.reciprocal(row_sum, mask=(rows < n_rows))
        y = nisa.tensor_scalar(e, np.multiply, inv_sum, dtype=x.dtype, mask=(rows < n_rows))
        nl.store(out[rows, iy], value=y, mask=(rows < n_rows))
    return out


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float32, copy=False)
    e = np.exp(xf - xf.max(axis=1, keepdims=True))
    return (e * (1.0 / e.sum(axis=1, keepdims=True))).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# LayerNorm: (x - mean) / sqrt(var + eps) * g + b


@nki.jit
def layernorm_kernel(x, g, b, eps):
    """LayerNorm over the last axis of ``x`` [N, D] (D a multiple of 512 or below it)."""
    n_rows, d = x.shape
    out = nl.ndarray((n_rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(P)[:, None]
    iy = nl.arange(d)[None, :]
    i1 = nl.arange(1)[:, None]
    g_tile = nl.load(g.reshape((1, d))[i1, iy]).broadcast_to((P, d))
    b_tile = nl.load(b.reshape((1, d))[i1, iy]).broadcast_to((P, d))
    fmax = nl.tile_size.bn_stats_fmax
    n_chunks = math.ceil(d / fmax)
    i_chunk = nl.arange(fmax)[None, :]
    i_stat = nl.arange(6)[None, :]
    for i in nl.affine_range(math.ceil(n_rows / P)):
        rows = i * P + ip
        x_tile = nl.load(x[rows, iy], mask=(rows < n_rows))
        # BN statistics per 512-element chunk on the VectorE, then one aggregation
        stats = nl.ndarray((P, 6 * n_chunks), dtype=nl.float32)
        for c in nl.affine_range(n_chunks):
            stats[ip, c * 6 + i_stat] = nisa.bn_stats(
                x_tile[ip, c * fmax + i_chunk], mask=(c * fmax + i_chunk < d), dtype=nl.float32
            )
        mean_var = nisa.bn_aggr(stats)
        mean = mean_var[ip, 0]
        rstd = nisa.activation(op=nl.rsqrt, data=mean_var[ip, 1], bias=eps, mask=(rows < n_rows))
        # (x - mean) * rstd: two ALU stages of one tensor_scalar instruction
        xn = nisa.tensor_scalar(
            x_tile,
            np.subtract,
            mean,
            op1=np.multiply,
            operand1=rstd,
            dtype=nl.float32,
            mask=(rows < n_rows),
        )
        y = nisa.tensor_tensor(xn, g_tile, np.multiply, dtype=nl.float32, mask=(rows < n_rows))
        y2 = nisa.tensor_tensor(y, b_tile, np.add, dtype=x.dtype, mask=(rows < n_rows))
        nl.store(out[rows, iy], value=y2, mask=(rows < n_rows))
    return out


def numpy_layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    xf = x.astype(np.float32, copy=False)
    mean = xf.mean(axis=1, keepdims=True)
    var = xf.var(axis=1, keepdims=True)
    y = (xf - mean) * (1.0 / np.sqrt(var + np.float32(eps)))
    return (y * g.astype(np.float32) + b.astype(np.float32)).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# matmul: out = lhsT.T @ rhs  (lhsT [K, M], rhs [K, N]; K, M multiples of 128, N of 512)


@nki.jit
def matmul_kernel(lhsT, rhs):  # noqa: N803 - NKI's name for the transposed left operand
    """``lhsT.T @ rhs`` with the rhs column block held in SBUF and K accumulated in PSUM."""
    k_dim, m_dim = lhsT.shape
    _, n_dim = rhs.shape
    out = nl.ndarray((m_dim, n_dim), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    tk, tm, tn = P, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    nk = k_dim // tk
    ik, im, inn = nl.arange(tk)[:, None], nl.arange(tm)[None, :], nl.arange(tn)[None, :]
    iom = nl.arange(tm)[:, None]
    for n in nl.affine_range(n_dim // tn):
        # a K x 512 column block of rhs stays in SBUF while every row block of lhsT passes
        rhs_block = nl.ndarray((nk, nl.par_dim(tk), tn), dtype=rhs.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(nk):
            rhs_block[k, ik, inn] = nl.load(rhs[k * tk + ik, n * tn + inn])
        for m in nl.affine_range(m_dim // tm):
            lhs_block = nl.ndarray((nk, nl.par_dim(tk), tm), dtype=lhsT.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(nk):
                lhs_block[k, ik, im] = nl.load(lhsT[k * tk + ik, m * tm + im])
            acc = nl.zeros((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(nk):
                acc += nisa.nc_matmul(lhs_block[k, ik, im], rhs_block[k, ik, inn])
            res = nl.copy(acc, dtype=out.dtype)
            nl.store(out[m * tm + iom, n * tn + inn], value=res)
    return out


def numpy_matmul(lhsT: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: N803
    a = lhsT.astype(np.float32, copy=False)
    b = rhs.astype(np.float32, copy=False)
    return (a.T @ b).astype(lhsT.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# causal attention: softmax(q k^T / sqrt(d)) v per head, q/k/v [H, S, D] with D <= 128


@nki.jit
def attention_kernel(q, k, v):
    """Causal scaled dot-product attention for every head, 128 queries at a time.

    The query-tile loop is unrolled at trace time (``static_range``) so that query tile ``i``
    only visits the ``i + 1`` key tiles at or before it: the causal skip that halves the
    work.  Only the diagonal tile needs the mask (``affine_select``); the head loop stays
    rolled.
    """
    n_heads, seq, d = q.shape
    out = nl.ndarray((n_heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / math.sqrt(d)
    t = P  # query and key tile size
    ip, i_d, idp = nl.arange(P)[:, None], nl.arange(d)[None, :], nl.arange(d)[:, None]
    i_t = nl.arange(t)[None, :]
    for h in nl.affine_range(n_heads):
        # K^T [d, seq] (contraction dim on partitions) and V in 128-row tiles stay in SBUF
        k_t = nl.load_transpose2d(k[h, nl.arange(seq)[:, None], i_d])
        v_tiles = nl.ndarray((seq // t, nl.par_dim(t), d), dtype=v.dtype, buffer=nl.sbuf)
        for j in nl.affine_range(seq // t):
            v_tiles[j, ip, i_d] = nl.load(v[h, j * t + ip, i_d])
        for i in nl.static_range(seq // t):
            n_kv = (i + 1) * t
            q_t = nl.load_transpose2d(q[h, i * t + ip, i_d])  # [d, t]
            scores = nl.ndarray((P, n_kv), dtype=nl.float32, buffer=nl.sbuf)
            for j in nl.affine_range(i):
                # key tiles strictly before the diagonal: no mask
                s_psum = nisa.nc_matmul(q_t, k_t[idp, j * t + i_t])
                scores[ip, j * t + i_t] = nl.copy(s_psum, dtype=nl.float32)
            s_diag = nisa.nc_matmul(q_t, k_t[idp, i * t + i_t])
            # the diagonal tile: key f must not pass query p
            scores[ip, i * t + i_t] = nisa.affine_select(
                pred=(ip - i_t >= 0),
                on_true_tile=s_diag,
                on_false_value=-30000.0,
                dtype=nl.float32,
            )
            neg_max = nisa.tensor_reduce(np.max, scores, axis=1, negate=True, keepdims=True)
            neg_max_s = nisa.tensor_scalar(neg_max, np.multiply, scale)
            row_sum = nl.ndarray((P, 1), dtype=nl.float32)
            probs = nisa.activation_reduce(
                op=nl.exp,
                data=scores,
                bias=neg_max_s,
                scale=scale,
                reduce_op=nl.add,
                reduce_res=row_sum,
                dtype=q.dtype,
            )
            o_psum = nl.zeros((t, d), dtype=nl.float32, buffer=nl.psum)
            for j in nl.affine_range(i + 1):
                # P^T tile [keys, queries] through the TensorE, then accumulate P V
                p_t = nisa.nc_transpose(probs[ip, j * t + i_t])
                p_t_sb = nl.copy(p_t, dtype=q.dtype)
                o_psum += nisa.nc_matmul(p_t_sb, v_tiles[j, ip, i_d])
            inv_sum = nisa.reciprocal(row_sum)
            o = nisa.tensor_scalar(o_psum, np.multiply, inv_sum, dtype=q.dtype)
            nl.store(out[h, i * t + ip, i_d], value=o)
    return out


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    qf, kf, vf = (a.astype(np.float32, copy=False) for a in (q, k, v))
    seq, d = q.shape[1], q.shape[2]
    s = np.matmul(qf, kf.transpose(0, 2, 1)) * np.float32(1.0 / math.sqrt(d))
    s = np.where(np.tril(np.ones((seq, seq), dtype=bool)), s, np.float32(-np.inf))
    e = np.exp(s - s.max(axis=2, keepdims=True))
    p = e * (1.0 / e.sum(axis=2, keepdims=True))
    return np.matmul(p, vf).astype(q.dtype, copy=False)
