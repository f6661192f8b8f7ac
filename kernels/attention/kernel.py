"""Flash attention (forward and backward) with online softmax, causal masking and grouped-query
heads: ``out = softmax(scale * q @ k.T [+ causal mask]) @ v`` per (batch, head).

Layout (the standard one): ``q`` [B, H, S, D], ``k`` and ``v`` [B, Hkv, S, D], ``out`` [B, H, S, D];
``Hkv`` divides ``H`` and query head ``h`` reads KV head ``h // (H // Hkv)``.  ``S`` is a multiple
of 128 (at most ``MAX_S``) and ``D <= 128``.  The TensorE contracts over the partition axis, so the
kernels relay out in SBUF: q and k tiles are loaded transposed (``nl.load_transpose2d``, D on the
partitions).

Forward, per (batch, KV head): K^T [D, S] and [V | 1] [128, S/128, D + 1] are loaded once and serve
the ``H // Hkv`` query heads of the group.  Per query head, the steps (query tile of 128 rows, KV
block of 512 keys) carry the online-softmax state of each query tile: ``u`` = minus the running
row max and the fp32 accumulator ``acc = [sum p v, sum p]``.  Each step (``_STAGES``):

    s      = q @ k.T [128 q, 512 k]                     TensorE (PSUM), for the row max only
    u_new  = min(u, -rowmax(s))                         VectorE (max), GpSimd
    s.T+u  = k @ q.T + ones.T @ diag(u_new)             TensorE, keys on the partitions
    p.T    = exp(scale * (s.T + u_new))                 ScalarE, PSUM -> SBUF (matmul dtype)
    alpha  = exp(scale * (u_new - u))                   ScalarE
    acc    = acc * alpha + p @ [v | 1]                  TensorE, ScalarE, VectorE
    out    = acc[:, :D] / acc[:, D],  lse = log(l) - scale * u

With ``causal`` the KV blocks after a query tile are never computed, a diagonal tile computes keys
up to its last row only, and its last 128 keys get a causal bias (built once with
``nisa.affine_select``) added in PSUM by an identity matmul.  The steps are unrolled at trace time
and software-pipelined (stage s of step t issued with stage s-1 of step t+1).  Matmul inputs are
in the input dtype (bf16 stays bf16, fp32 runs the fp32 TensorE path); PSUM, the statistics and
the accumulators are fp32 (``u`` is rounded to the matmul dtype once, so every use agrees).

Backward (FlashAttention-2 style, recomputing probabilities from the saved log-sum-exp): the
forward kernel is rerun with ``with_lse=True``; then one kernel per (batch, KV head) loops over KV
tiles outside and (query head of the group, query tile) inside, recomputing
``p = exp(scale * s - lse)`` and accumulating ``dV = sum p.T @ dO`` and
``dK = scale * sum ds.T @ q`` in PSUM, with ``ds = p * (dO @ v.T - rowsum(dO * out))``; a second
kernel loops over query tiles outside and KV tiles inside and accumulates
``dQ = scale * sum ds @ k`` in PSUM.
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit import dtypes

# Entry points take numpy arrays or CPU torch tensors (annotated as numpy) and return the same kind.

DTYPES = ("float32", "bfloat16")
TILE = 128  # query and key rows per tile (partitions)
MAX_D = 128  # head dim: the contraction of q @ k.T runs over the partitions
MAX_S = 4096  # a head's K^T, Q^T, [V | 1], accumulators and output stay in SBUF; the
# forward's (query tile, KV block) steps are unrolled at trace time
NEG_BIG = -3.0e38  # masked scores (and minus the running max before the first block)
KV_BLOCK = 512  # keys per online-softmax step: one fp32 PSUM bank of scores [128, 512]


def _forward_head(q_t, k_t, v_ext, o_sb, lse_sb, consts, causal, scale, mm_dt):
    """Online-softmax attention of one query head (all its query tiles) against one KV head.

    ``q_t`` [D, S] and ``k_t`` [D, S] (transposed), ``v_ext`` [128, S/128, D + 1] (V with a
    column of ones, so the P @ V matmul also sums the probabilities of each row); results go to
    ``o_sb`` [128, S/128, D] and ``lse_sb`` [128, S/128].

    The steps (query tile i, KV block j) run in the order of the blocks; each step is a chain
    of stages on four engines (``_STAGES``).  The steps are unrolled and software-pipelined:
    stage s of step t is issued together with stage s-1 of step t+1, so that while the VectorE
    reduces one tile's scores the ScalarE exponentiates the previous one and the TensorE
    multiplies the one before (engines run their instructions in program order)."""
    seq = k_t.shape[1]
    n_q = seq // TILE
    n_blocks = math.ceil(seq / KV_BLOCK)
    per_block = KV_BLOCK // TILE
    steps = []  # (query tile, block, key width, diagonal offset or None, last step of the tile)
    for j in range(n_blocks):
        w = min(KV_BLOCK, seq - j * KV_BLOCK)
        for i in range(n_q):
            c = i - j * per_block
            if causal and c < 0:
                continue  # the whole block is after every query of the tile
            if causal and c < w // TILE:
                steps.append([i, j, (c + 1) * TILE, c])  # diagonal: keys up to the tile's end
            else:
                steps.append([i, j, w, None])
    last = {}
    for n, st in enumerate(steps):
        last[st[0]] = n
    for n, st in enumerate(steps):
        st.append(last[st[0]] == n)

    ctx = {
        "q_t": q_t,
        "k_t": k_t,
        "v_ext": v_ext,
        "o_sb": o_sb,
        "lse_sb": lse_sb,
        "consts": consts,
        "scale": scale,
        "mm_dt": mm_dt,
        "u": {},
        "acc": {},
    }
    live = [dict() for _ in steps]  # the tiles one step passes from stage to stage
    n_stages = len(_STAGES)
    for tick in range(len(steps) + n_stages - 1):
        for stage in reversed(range(n_stages)):
            n = tick - stage
            if 0 <= n < len(steps):
                _STAGES[stage](ctx, steps[n], live[n])


def _stage_scores(ctx, step, t):
    """TensorE: s = q @ k.T [128 q, width] fp32 in PSUM, for the row max only; a diagonal tile
    adds the causal bias (0 / NEG_BIG) to its last 128 columns with an identity matmul."""
    i, j, width, diag, _ = step
    d = ctx["q_t"].shape[0]
    i_p = nl.arange(TILE)[:, None]
    i_f = nl.arange(TILE)[None, :]
    i_dp = nl.arange(d)[:, None]
    i_w = nl.arange(width)[None, :]
    s_ps = nl.ndarray((nl.par_dim(TILE), width), dtype=nl.float32, buffer=nl.psum)
    s_ps[i_p, i_w] = nisa.nc_matmul(
        ctx["q_t"][i_dp, i * TILE + i_f], ctx["k_t"][i_dp, j * KV_BLOCK + i_w]
    )
    if diag is not None:
        c = ctx["consts"]
        s_ps[i_p, diag * TILE + i_f] += nisa.nc_matmul(c["ident"], c["mask"])
    t["s"] = s_ps


def _stage_max(ctx, step, t):
    """VectorE: the row max of s; GpSimd: u_new = min(u, -rowmax) (u = minus the running max,
    kept in the matmul dtype so that every use below sees the same value), diag(u_new) and
    u_new - u_old."""
    i = step[0]
    mm_dt = ctx["mm_dt"]
    gp = nisa.engine.gpsimd
    bmax = nisa.tensor_reduce(nl.max, t["s"], axis=(1,), dtype=nl.float32, keepdims=True)
    u_old = ctx["u"].get(i)
    t["u_old"] = u_old
    if u_old is None:
        u_new = nisa.tensor_scalar(bmax, nl.multiply, -1.0, dtype=mm_dt, engine=gp)
    else:
        u_new = nisa.tensor_scalar(
            bmax, nl.multiply, -1.0, op1=nl.minimum, operand1=u_old, dtype=mm_dt, engine=gp
        )
        t["du"] = nisa.tensor_tensor(u_new, u_old, op=nl.subtract, dtype=nl.float32, engine=gp)
    ctx["u"][i] = t["u"] = u_new
    t["u_diag"] = nisa.tensor_scalar(
        ctx["consts"]["ident"], nl.multiply, u_new, dtype=mm_dt, engine=gp
    )


def _stage_scores_t(ctx, step, t):
    """TensorE: s.T + u per 128 keys, [128 k, width] fp32 in PSUM: k_tile @ q.T, plus
    ones.T @ diag(u) (adds u[q] to every key row), plus the transposed causal bias on a
    diagonal tile.  With the keys on the partitions, exp of this tile is already the
    stationary operand of P @ V: no transpose of the probabilities."""
    i, j, width, diag, _ = step
    d = ctx["q_t"].shape[0]
    c_ = ctx["consts"]
    i_p = nl.arange(TILE)[:, None]
    i_f = nl.arange(TILE)[None, :]
    i_dp = nl.arange(d)[:, None]
    st_ps = nl.ndarray((nl.par_dim(TILE), width), dtype=nl.float32, buffer=nl.psum)
    for c in nl.static_range(width // TILE):
        cols = c * TILE + i_f
        st_ps[i_p, cols] = nisa.nc_matmul(
            ctx["k_t"][i_dp, j * KV_BLOCK + c * TILE + i_f], ctx["q_t"][i_dp, i * TILE + i_f]
        )
        st_ps[i_p, cols] += nisa.nc_matmul(c_["ones"], t["u_diag"])
        if diag is not None and c == diag:
            st_ps[i_p, cols] += nisa.nc_matmul(c_["ident"], c_["mask_t"])
    t["st"] = st_ps


def _stage_exp(ctx, step, t):
    """ScalarE: p.T = exp(scale * (s.T + u)) into SBUF in the matmul dtype, and
    alpha = exp(scale * (u_new - u_old)), the factor that rescales the accumulator."""
    t["p_t"] = nisa.activation(nl.exp, t["st"], scale=ctx["scale"], dtype=ctx["mm_dt"])
    if t["u_old"] is not None:
        t["alpha"] = nisa.activation(nl.exp, t["du"], scale=ctx["scale"], dtype=nl.float32)


def _stage_pv(ctx, step, t):
    """TensorE: [p @ v | rowsum(p)] accumulated in PSUM over the block's key tiles."""
    _, j, width, _, _ = step
    v_ext = ctx["v_ext"]
    d1 = v_ext.shape[-1]
    i_p = nl.arange(TILE)[:, None]
    i_f = nl.arange(TILE)[None, :]
    i_d1 = nl.arange(d1)[None, :]
    pv = nl.zeros((TILE, d1), dtype=nl.float32, buffer=nl.psum)
    for c in nl.static_range(width // TILE):
        pv += nisa.nc_matmul(
            t["p_t"][i_p, c * TILE + i_f], v_ext[i_p, j * (KV_BLOCK // TILE) + c, i_d1]
        )
    t["pv"] = pv


def _stage_acc(ctx, step, t):
    """acc = acc * alpha (ScalarE) + [p @ v | rowsum(p)] (VectorE, one PSUM operand); the last
    step of a query tile then writes out = acc[:, :D] / l (GpSimd) and lse = log(l) -
    scale * u (ScalarE, GpSimd)."""
    i, _, _, _, is_last = step
    acc_old = ctx["acc"].get(i)
    if acc_old is None:
        acc = nisa.activation(nl.copy, t["pv"], dtype=nl.float32)
    else:
        scaled = nisa.activation(nl.copy, acc_old, scale=t["alpha"], dtype=nl.float32)
        acc = nisa.tensor_tensor(scaled, t["pv"], op=nl.add, dtype=nl.float32)
    ctx["acc"][i] = acc
    if is_last:
        gp = nisa.engine.gpsimd
        d = ctx["o_sb"].shape[-1]
        i_p = nl.arange(TILE)[:, None]
        i_d = nl.arange(d)[None, :]
        l_col = acc[i_p, nl.arange(1)[None, :] + d]
        ctx["o_sb"][i_p, i, i_d] = nisa.tensor_scalar(
            acc[i_p, i_d], nl.divide, l_col, dtype=ctx["o_sb"].dtype, engine=gp
        )
        if ctx["lse_sb"] is not None:
            log_l = nisa.activation(nl.log, l_col, dtype=nl.float32)
            minus_m = nisa.tensor_scalar(
                ctx["u"][i], nl.multiply, ctx["scale"], dtype=nl.float32, engine=gp
            )
            ctx["lse_sb"][i_p, i] = nisa.tensor_tensor(
                log_l, minus_m, op=nl.subtract, dtype=nl.float32, engine=gp
            )


_STAGES = (_stage_scores, _stage_max, _stage_scores_t, _stage_exp, _stage_pv, _stage_acc)


@nki.jit
def flash_attention_fwd_kernel(q, k, v, causal, scale, with_lse):
    """Attention forward for ``q`` [B, H, S, D], ``k``/``v`` [B, Hkv, S, D] (one dtype, S a
    multiple of 128, D <= 128).  Returns ``out`` [B, H, S, D] in q's dtype, and with
    ``with_lse`` also the log-sum-exp of the scaled scores, [B, H, S] fp32."""
    b_size, n_heads, seq, d = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    pmax = TILE
    n_q = seq // pmax
    n_blocks = math.ceil(seq / KV_BLOCK)
    mm_dt = q.dtype
    out = nl.ndarray((b_size, n_heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((b_size, n_heads, seq), dtype=nl.float32, buffer=nl.shared_hbm)

    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(pmax)[None, :]
    i_dp = nl.arange(d)[:, None]
    i_d = nl.arange(d)[None, :]
    i_q = nl.arange(n_q)[None, :]
    # 3-D [128 rows, tile, D] views of a [S, D] head: row t * 128 + p
    i_p3 = nl.arange(pmax)[:, None, None]
    i_t3 = nl.arange(n_q)[None, :, None]
    i_d3 = nl.arange(d)[None, None, :]

    # constants: the causal bias of a diagonal tile (0 where key <= query, else NEG_BIG) and its
    # transpose, built once with affine_select and added to the diagonal score tiles in PSUM
    # by identity matmuls; a ones tile for the broadcast of u along the keys
    zeros = nl.zeros((pmax, pmax), dtype=mm_dt, buffer=nl.sbuf)
    consts = {
        "ident": nl.load(nl.shared_identity_matrix(pmax, dtype=mm_dt)[i_p, i_f]),
        "mask": nisa.affine_select(
            pred=(i_p - i_f >= 0), on_true_tile=zeros, on_false_value=NEG_BIG, dtype=mm_dt
        ),
        "mask_t": nisa.affine_select(
            pred=(i_f - i_p >= 0), on_true_tile=zeros, on_false_value=NEG_BIG, dtype=mm_dt
        ),
        "ones": nl.ones((pmax, pmax), dtype=mm_dt, buffer=nl.sbuf),
    }

    for b in nl.affine_range(b_size):
        for g in nl.affine_range(n_kv):
            # K^T [D, S] and [V | 1] [128, S/128, D + 1] of this KV head, loaded once for the
            # group of query heads
            k_t = nl.ndarray((nl.par_dim(d), seq), dtype=mm_dt, buffer=nl.sbuf)
            for j in nl.static_range(n_blocks):
                w = min(KV_BLOCK, seq - j * KV_BLOCK)
                k_t[i_dp, j * KV_BLOCK + nl.arange(w)[None, :]] = nl.load_transpose2d(
                    k[b, g, j * KV_BLOCK + nl.arange(w)[:, None], i_d]
                )
            v_ext = nl.ndarray((nl.par_dim(pmax), n_q, d + 1), dtype=mm_dt, buffer=nl.sbuf)
            v_ext[i_p3, i_t3, i_d3] = nl.load(v[b, g, i_t3 * pmax + i_p3, i_d3])
            v_ext[i_p3, i_t3, nl.arange(1)[None, None, :] + d] = nisa.memset(
                (pmax, n_q, 1), 1.0, dtype=mm_dt, engine=nisa.engine.gpsimd
            )

            for hh in nl.affine_range(group):
                h = g * group + hh
                q_t = nl.ndarray((nl.par_dim(d), seq), dtype=mm_dt, buffer=nl.sbuf)
                for j in nl.static_range(n_blocks):
                    w = min(KV_BLOCK, seq - j * KV_BLOCK)
                    q_t[i_dp, j * KV_BLOCK + nl.arange(w)[None, :]] = nl.load_transpose2d(
                        q[b, h, j * KV_BLOCK + nl.arange(w)[:, None], i_d]
                    )
                o_sb = nl.ndarray((nl.par_dim(pmax), n_q, d), dtype=q.dtype, buffer=nl.sbuf)
                lse_sb = None
                if with_lse:
                    lse_sb = nl.ndarray((nl.par_dim(pmax), n_q), dtype=nl.float32, buffer=nl.sbuf)
                _forward_head(q_t, k_t, v_ext, o_sb, lse_sb, consts, causal, scale, mm_dt)
                nl.store(out[b, h, i_t3 * pmax + i_p3, i_d3], value=o_sb)
                if with_lse:
                    nl.store(lse[b, h, i_q * pmax + i_p], value=lse_sb)
    if with_lse:
        return out, lse
    return out


def _check(fn: str, q, k, v, scale: float) -> tuple[int, int, int, int, int, float]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            raise ValueError(f"{fn}: {name} must be 4-D [B, heads, S, D], got {tuple(t.shape)}")
    b, h, s, d = tuple(q.shape)
    hkv = k.shape[1]
    if tuple(k.shape) != (b, hkv, s, d) or tuple(v.shape) != (b, hkv, s, d):
        raise ValueError(
            f"{fn}: k and v must both be [B, Hkv, S, D] = [{b}, Hkv, {s}, {d}] to match q "
            f"{tuple(q.shape)}, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if hkv == 0 or h % hkv:
        raise ValueError(f"{fn}: the KV heads ({hkv}) must divide the query heads ({h})")
    if not 1 <= d <= MAX_D:
        raise ValueError(f"{fn}: the head dim D must be in [1, {MAX_D}], got {d}")
    if s == 0 or s % TILE or s > MAX_S:
        raise ValueError(
            f"{fn}: the sequence length must be a positive multiple of {TILE} up to {MAX_S}, got {s}"
        )
    if b == 0:
        raise ValueError(f"{fn}: the batch must not be empty")
    names = {dtypes.name(dtypes.as_dtype(t.dtype)) for t in (q, k, v)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: q, k and v must share one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    scale = float(scale) if scale else 1.0 / math.sqrt(d)
    if not scale > 0:
        raise ValueError(f"{fn}: scale must be positive (0 means 1/sqrt(D)), got {scale}")
    return b, h, hkv, s, d, scale


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True, scale: float = 0.0
) -> np.ndarray:
    """Scaled dot-product attention ``softmax(scale * q @ k.T [+ causal mask]) @ v``.

    ``q``: [B, H, S, D]; ``k``, ``v``: [B, Hkv, S, D] with ``Hkv`` dividing ``H`` (grouped-query
    attention: query head ``h`` uses KV head ``h // (H // Hkv)``); ``S`` a multiple of 128,
    ``1 <= D <= 128``.  Numpy arrays or CPU torch tensors, all float32 or all bfloat16.
    ``causal``: query ``i`` attends to keys ``j <= i`` only.  ``scale``: multiplies the scores;
    ``0.0`` (the default) means ``1 / sqrt(D)``.  Returns [B, H, S, D] in the input dtype.
    Raises ``ValueError`` for bad shapes or scale and ``TypeError`` for an unsupported or mixed
    dtype.
    """
    *_, scale = _check("attention", q, k, v, scale)
    return flash_attention_fwd_kernel(q, k, v, bool(causal), scale, False)


def _probs_and_dscores(q_t, k_t, v_t, do_t, neg_lse, di, scale, mm_dt, diagonal):
    """Recompute ``p = exp(scale * q k^T - lse)`` and ``ds = p * (dO v^T - rowsum(dO * out))``
    for one [128 q, 128 k] tile pair, both in the matmul dtype (q on the partitions)."""
    pmax = TILE
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(pmax)[None, :]
    s = nisa.nc_matmul(q_t, k_t)
    if diagonal:
        s = nisa.affine_select(
            pred=(i_p - i_f >= 0), on_true_tile=s, on_false_value=NEG_BIG, dtype=nl.float32
        )
    p = nisa.activation(nl.exp, s, bias=neg_lse, scale=scale, dtype=mm_dt)
    dp = nisa.nc_matmul(do_t, v_t)
    ds = nisa.scalar_tensor_tensor(
        data=dp, op0=nl.subtract, operand0=di, op1=nl.multiply, operand1=p, dtype=mm_dt
    )
    return p, ds


def _row_stats(o_ap, do_ap, lse_ap, mm_dt):
    """``-lse`` and ``rowsum(dO * out)`` ([128, 1] fp32) of one query tile."""
    do_sb = nl.load(do_ap)
    o_sb = nl.load(o_ap)
    prod = nisa.tensor_tensor(do_sb, o_sb, op=nl.multiply, dtype=nl.float32)
    di = nisa.tensor_reduce(nl.add, prod, axis=(1,), dtype=nl.float32, keepdims=True)
    neg_lse = nisa.tensor_scalar(nl.load(lse_ap), nl.multiply, -1.0, dtype=nl.float32)
    return neg_lse, di


@nki.jit
def flash_attention_bwd_dkdv_kernel(q, k, v, o, do, lse, causal, scale):
    """``dk``, ``dv`` [B, Hkv, S, D] (k's dtype) of attention, from the inputs, the forward's
    ``out`` and log-sum-exp ``lse`` [B, H, S, 1] and the output gradient ``do``.  KV tiles
    outside; the group's query heads and the query tiles inside, accumulated in PSUM."""
    b_size, n_heads, seq, d = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    pmax = TILE
    n_tiles = seq // pmax
    mm_dt = q.dtype
    dk = nl.ndarray((b_size, n_kv, seq, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((b_size, n_kv, seq, d), dtype=v.dtype, buffer=nl.shared_hbm)

    i_p = nl.arange(pmax)[:, None]
    i_d = nl.arange(d)[None, :]

    for b in nl.affine_range(b_size):
        for g in nl.affine_range(n_kv):
            for j in nl.static_range(n_tiles):
                keys = j * pmax + i_p
                k_t = nl.load_transpose2d(k[b, g, keys, i_d], dtype=mm_dt)  # [D, 128 k]
                v_t = nl.load_transpose2d(v[b, g, keys, i_d], dtype=mm_dt)
                dk_ps = nl.zeros((pmax, d), dtype=nl.float32, buffer=nl.psum)
                dv_ps = nl.zeros((pmax, d), dtype=nl.float32, buffer=nl.psum)
                for hh in nl.affine_range(group):
                    h = g * group + hh
                    if causal:  # query tiles before j see none of these keys: skipped
                        rows = j * pmax + i_p
                        _dkdv_tile(
                            q, o, do, lse, b, h, rows, k_t, v_t, dk_ps, dv_ps, scale, mm_dt, True
                        )
                    first = j + 1 if causal else 0
                    for i in nl.affine_range(n_tiles - first):
                        rows = (first + i) * pmax + i_p
                        _dkdv_tile(
                            q, o, do, lse, b, h, rows, k_t, v_t, dk_ps, dv_ps, scale, mm_dt, False
                        )
                dk_sb = nisa.tensor_scalar(dk_ps, nl.multiply, scale, dtype=k.dtype)
                nl.store(dk[b, g, keys, i_d], value=dk_sb)
                nl.store(dv[b, g, keys, i_d], value=nl.copy(dv_ps, dtype=v.dtype))
    return dk, dv


def _dkdv_tile(q, o, do, lse, b, h, rows, k_t, v_t, dk_ps, dv_ps, scale, mm_dt, diagonal):
    i_d = nl.arange(q.shape[3])[None, :]
    q_sb = nl.load(q[b, h, rows, i_d], dtype=mm_dt)
    q_t = nl.load_transpose2d(q[b, h, rows, i_d], dtype=mm_dt)
    do_sb = nl.load(do[b, h, rows, i_d], dtype=mm_dt)
    do_t = nl.load_transpose2d(do[b, h, rows, i_d], dtype=mm_dt)
    neg_lse, di = _row_stats(o[b, h, rows, i_d], do[b, h, rows, i_d], lse[b, h, rows], mm_dt)
    p, ds = _probs_and_dscores(q_t, k_t, v_t, do_t, neg_lse, di, scale, mm_dt, diagonal)
    dv_ps += nisa.nc_matmul(p, do_sb)  # [128 k, D]
    dk_ps += nisa.nc_matmul(ds, q_sb)


@nki.jit
def flash_attention_bwd_dq_kernel(q, k, v, o, do, lse, causal, scale):
    """``dq`` [B, H, S, D] (q's dtype) of attention.  Query tiles outside, KV tiles inside,
    accumulated in PSUM."""
    b_size, n_heads, seq, d = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    pmax = TILE
    n_tiles = seq // pmax
    mm_dt = q.dtype
    dq = nl.ndarray((b_size, n_heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)

    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(pmax)[None, :]
    i_d = nl.arange(d)[None, :]
    i_dp = nl.arange(d)[:, None]

    for b in nl.affine_range(b_size):
        for g in nl.affine_range(n_kv):
            k_sb = nl.ndarray((n_tiles, nl.par_dim(pmax), d), dtype=mm_dt, buffer=nl.sbuf)
            k_t = nl.ndarray((n_tiles, nl.par_dim(d), pmax), dtype=mm_dt, buffer=nl.sbuf)
            v_t = nl.ndarray((n_tiles, nl.par_dim(d), pmax), dtype=mm_dt, buffer=nl.sbuf)
            for j in nl.affine_range(n_tiles):
                keys = j * pmax + i_p
                k_sb[j, i_p, i_d] = nl.load(k[b, g, keys, i_d])
                k_t[j, i_dp, i_f] = nl.load_transpose2d(k[b, g, keys, i_d])
                v_t[j, i_dp, i_f] = nl.load_transpose2d(v[b, g, keys, i_d])
            for hh in nl.affine_range(group):
                h = g * group + hh
                for i in nl.static_range(n_tiles):
                    rows = i * pmax + i_p
                    q_t = nl.load_transpose2d(q[b, h, rows, i_d])
                    do_t = nl.load_transpose2d(do[b, h, rows, i_d])
                    neg_lse, di = _row_stats(
                        o[b, h, rows, i_d], do[b, h, rows, i_d], lse[b, h, rows], mm_dt
                    )
                    dq_ps = nl.zeros((pmax, d), dtype=nl.float32, buffer=nl.psum)
                    for j in nl.affine_range(i if causal else n_tiles):
                        _, ds = _probs_and_dscores(
                            q_t,
                            k_t[j, i_dp, i_f],
                            v_t[j, i_dp, i_f],
                            do_t,
                            neg_lse,
                            di,
                            scale,
                            mm_dt,
                            False,
                        )
                        ds_t = nl.copy(nisa.nc_transpose(ds), dtype=mm_dt)  # [128 k, 128 q]
                        dq_ps += nisa.nc_matmul(ds_t, k_sb[j, i_p, i_d])
                    if causal:
                        _, ds = _probs_and_dscores(
                            q_t,
                            k_t[i, i_dp, i_f],
                            v_t[i, i_dp, i_f],
                            do_t,
                            neg_lse,
                            di,
                            scale,
                            mm_dt,
                            True,
                        )
                        ds_t = nl.copy(nisa.nc_transpose(ds), dtype=mm_dt)
                        dq_ps += nisa.nc_matmul(ds_t, k_sb[i, i_p, i_d])
                    dq_sb = nisa.tensor_scalar(dq_ps, nl.multiply, scale, dtype=q.dtype)
                    nl.store(dq[b, h, rows, i_d], value=dq_sb)
    return dq


def attention_backward(
    grad: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    scale: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of ``attention(q, k, v, causal=causal, scale=scale)`` for the
    output gradient ``grad`` [B, H, S, D] (same dtype as the inputs); each gradient has its
    input's shape and dtype.  Reruns the forward kernel for ``out`` and the log-sum-exp, then
    the two backward kernels (dk/dv, dq).  Raises as ``attention``."""
    *_, scale = _check("attention_backward", q, k, v, scale)
    if tuple(grad.shape) != tuple(q.shape):
        raise ValueError(
            f"attention_backward: grad must have q's shape {tuple(q.shape)}, got {tuple(grad.shape)}"
        )
    _check_same_dtype("attention_backward", q, grad)
    causal = bool(causal)
    out, lse = flash_attention_fwd_kernel(q, k, v, causal, scale, True)
    dk, dv = flash_attention_bwd_dkdv_kernel(q, k, v, out, grad, lse, causal, scale)
    dq = flash_attention_bwd_dq_kernel(q, k, v, out, grad, lse, causal, scale)
    return dq, dk, dv


def _check_same_dtype(fn: str, a, b) -> None:
    if dtypes.as_dtype(a.dtype) != dtypes.as_dtype(b.dtype):
        raise TypeError(f"{fn}: grad must have the inputs' dtype {a.dtype}, got {b.dtype}")
