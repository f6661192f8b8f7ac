"""Fused self-attention for small heads (Stable Diffusion), written for nkikit after the
algorithm of the nki-samples reference kernel whose CI latency limit is the published figure
(``fused_self_attn_for_SD_small_head_size``; limit in ``test/unit/test_SD_attention_small_head.py``
of aws-neuron/nki-samples at 0898a77).

``out[s, :] = softmax(0.125 * q[:, s] . k.T) @ v`` for one head per program: ``q`` [bs, d, seq]
(head dim on the partitions), ``k`` and ``v`` [bs, seq, d], ``out`` [bs, seq, d]; d <= 128,
128 x 128 tiles.  Per 128-query tile: Q.K^T tiles on the TensorE into PSUM, copied to one
[128, seq] SBUF row of scores; a negated max per key tile and a min over those (VectorE);
one ScalarE ``exp(x - max)`` over the whole row, its sum (VectorE) and a cast to the
TensorE's bf16; the probabilities transposed tile by tile on the TensorE; P.V accumulated in
PSUM with the head dim on the partitions; the result scaled by the transposed reciprocal sums
and stored transposed.  ``v`` is loaded once (keys on the partitions), ``q`` once (scaled),
``k`` once through a transposing load.
"""

from __future__ import annotations

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

T = 128  # query, key and value tile
SCALE = 0.125


@nki.jit
def sd_attention_small_head(q, k, v):
    """One program per batch element (launch with ``[bs]``)."""
    bs, d, seq = q.shape
    assert d <= 128 and tuple(k.shape) == (bs, seq, d) and tuple(v.shape) == (bs, seq, d)
    dt = q.dtype
    pe = nl.bfloat16  # TensorE operands in bf16, accumulation in fp32 PSUM
    out = nl.ndarray((bs, seq, d), dtype=dt, buffer=nl.shared_hbm)
    b = nl.program_id(0)
    n = seq // T

    v_all = nl.ndarray((nl.par_dim(T), n, d), dtype=pe, buffer=nl.sbuf)
    for j in nl.affine_range(n):
        v_all[:, j, :] = nl.load(v[b, j * T : (j + 1) * T, 0:d], dtype=pe)
    q_all = nl.ndarray((n, nl.par_dim(d), T), dtype=pe, buffer=nl.sbuf)
    for i in nl.affine_range(n):
        q_all[i, :, :] = nl.multiply(nl.load(q[b, 0:d, i * T : (i + 1) * T], dtype=pe), SCALE)
    k_all = nl.ndarray((n, nl.par_dim(d), T), dtype=pe, buffer=nl.sbuf)
    for j in nl.affine_range(n):
        k_all[j, :, :] = nl.load_transpose2d(k[b, j * T : (j + 1) * T, 0:d], dtype=pe)

    for i in nl.affine_range(n):
        scores = nl.ndarray((nl.par_dim(T), seq), dtype=dt, buffer=nl.sbuf)
        neg_max = nl.ndarray((nl.par_dim(T), n), dtype=dt, buffer=nl.sbuf)
        for j in nl.affine_range(n):
            qk = nl.ndarray((nl.par_dim(T), T), dtype=nl.float32, buffer=nl.psum)
            qk[...] = nisa.nc_matmul(q_all[i, :, :], k_all[j, :, :])
            scores[:, j * T : (j + 1) * T] = nl.copy(qk, dtype=dt)
            neg_max[:, j : j + 1] = nisa.tensor_reduce(
                nl.max, scores[:, j * T : (j + 1) * T], axis=(1,), negate=True, keepdims=True
            )
        row_neg_max = nisa.tensor_reduce(nl.min, neg_max, axis=(1,), keepdims=True)
        e = nisa.activation(op=nl.exp, data=scores, bias=row_neg_max)
        total = nisa.tensor_reduce(nl.add, e, axis=(1,), keepdims=True)
        probs = nl.copy(e, dtype=pe)
        inv = nl.copy(nl.reciprocal(total).broadcast_to((T, d)), dtype=dt)

        probs_t = nl.ndarray((nl.par_dim(T), n, T), dtype=pe, buffer=nl.sbuf)
        for j in nl.affine_range(n):
            probs_t[:, j, :] = nisa.nc_transpose(probs[:, j * T : (j + 1) * T])
        acc = nl.zeros((nl.par_dim(d), T), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(n):
            acc += nisa.nc_matmul(v_all[:, j, :], probs_t[:, j, :])
        res = nl.multiply(nl.copy(acc, dtype=dt), nisa.nc_transpose(inv))
        i_p = nl.arange(d)[:, None]
        i_f = nl.arange(T)[None, :]
        nl.store(out[b, i * T + i_f, i_p], value=res)
    return out


KERNELS = {"sd_attention_small_head": sd_attention_small_head}
