"""Flash attention (forward and backward) with causal masking and grouped-query heads:
``out = softmax(scale * q @ k.T [+ causal mask]) @ v`` per (batch, head).

Layout (the standard one): ``q`` [B, H, S, D], ``k`` and ``v`` [B, Hkv, S, D], ``out`` [B, H, S, D];
``Hkv`` divides ``H`` and query head ``h`` reads KV head ``h // (H // Hkv)``.  ``1 <= S <= MAX_S``
(a ragged last 128-row tile is handled with static partial tiles) and ``D <= 128``.  The TensorE
contracts over the partition axis, so the kernels relay out in SBUF: q, k (and in the backward
v, dO) are also loaded transposed (``nl.load_transpose2d``, D on the partitions).

Forward, per (batch, KV head): K^T [D, S] and [V | 1] [128, S/128, D + 1] are loaded once and serve
the ``H // Hkv`` query heads of the group.  Two softmax algorithms (``softmax=``), with the same
matmuls and outputs.  ``"two_pass"`` (the default, ``_ForwardGroup``): each query tile (128 rows)
takes two passes over its key blocks (512 keys, one fp32 PSUM bank), so the exp pass knows the
exact row max and nothing is ever rescaled:

    max pass:  s = q @ k.T [128 q, 512 k]                 TensorE (PSUM)
               m = max over the blocks of rowmax(s)       VectorE (per block), GpSimd (combine)
               u = -m (matmul dtype), diag(u)             GpSimd
    exp pass:  (s + u).T = k @ q.T + ones.T @ diag(u)     TensorE, keys on the partitions
               p.T = exp(scale * (s + u).T)               ScalarE, PSUM -> SBUF (matmul dtype)
               acc += p @ [v | 1]                         TensorE, one PSUM tile over all blocks
               out = acc[:, :D] / acc[:, D]               ScalarE
               lse = log(acc[:, D]) - scale * u           ScalarE, GpSimd

With the keys on the partitions, exp of the scores is directly the stationary operand of P @ V
(no transpose), and the ones column of [V | 1] makes the same matmul sum the probabilities.
With ``causal`` the blocks after a query tile are never computed, a diagonal block stops at the
tile's last row, and its diagonal tile gets a causal bias (built once with
``nisa.affine_select``) added in PSUM by an identity matmul.  Both passes of all tiles of the
group's heads are unrolled at trace time and software-pipelined into one instruction stream per
engine (the exp pass of a tile runs ``FWD_LAG`` tiles behind its max pass).  Matmul inputs are in
the input dtype (bf16 stays bf16, fp32 runs the fp32 TensorE path); PSUM, the statistics and the
accumulators are fp32 (``u`` is rounded to the matmul dtype once, so every use agrees).

``"online"`` (flash-style, ``_OnlineForwardGroup``): one pass per query tile; the max-pass
scores of a block update a running max ``u`` (and diag(u)) that the same block's exp-pass
scores use at once, and before the block's P @ V the PSUM accumulator is rescaled in place by
``alpha = exp(scale * (u_new - u_old))`` (ScalarE; nothing to rescale after a tile's first
block).  Same TensorE work; the rescale and the per-block diag(u) cost ScalarE and GpSimd time.

Backward (FlashAttention-2 style, probabilities recomputed from the saved log-sum-exp): the
forward kernel is rerun with ``with_lse=True``; then one kernel (``_Backward``) per batch element
iterates, per KV head, key blocks outside and (query head, query tile) inside, with the query-side
tiles resident in SBUF: dK and dV accumulate in PSUM, dQ in SBUF (fp32).
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
SOFTMAX = ("two_pass", "online")  # the forward's algorithms; the first is the default
TILE = 128  # query and key rows per tile (partitions)
MAX_D = 128  # head dim: the contraction of q @ k.T runs over the partitions
MAX_S = 4096  # a head's K^T, Q^T, [V | 1] and output (forward) and the query-side tiles
# (backward) stay in SBUF; the (query tile, key block) steps are unrolled at trace time
NEG_BIG = -3.0e38  # the causal bias of masked scores
KV_BLOCK = 512  # keys per step: one fp32 PSUM bank of scores [128, 512]


# Forward software pipeline: pool depths (rotating on-chip buffers) and the lag of the exp pass
FWD_S_BUFS = 3  # PSUM banks of max-pass scores [128 q, 512 k]
FWD_ST_BUFS = 3  # PSUM banks of exp-pass scores.T [128 k, 4 x 128 q]
FWD_ACC_BUFS = 2  # PSUM [128 q, D + 1] accumulators (one per query tile in flight)
FWD_P_BUFS = 4  # SBUF exp(scores.T) tiles
FWD_LAG = 2  # query tiles between the max pass and the exp pass of a tile
ONLINE_ACC_BUFS = 3  # online forward: PSUM [128 q, D + 1] accumulators.  Not 4: the finish
# reads the 4-byte column D of a slot, so the profiler's scheduler tracks the pool in 4-byte
# granules; 4 slots (2064 bytes) exceed its 512 granules, it coarsens them to 8 bytes, and the
# column D of a slot then shares a granule with the next slot: false dependencies
ONLINE_TILES = 2  # online forward: query tiles whose steps are interleaved
STORE_TILES = 4  # query tiles per output store


def _rows(t: int, seq: int) -> int:
    """Rows of 128-row tile ``t`` of a length-``seq`` sequence (the last one may be ragged)."""
    return min(TILE, seq - t * TILE)


def _runs(t0: int, n: int, seq: int) -> list[tuple[int, int, int]]:
    """Tiles ``t0 .. t0 + n - 1`` as runs ``(first, count, rows)`` of equal row counts
    (``first`` counted from t0): the full tiles, then a ragged last tile."""
    full = max(0, min(n, seq // TILE - t0))
    runs = [(0, full, TILE)] if full else []
    if full < n:
        runs.append((full, n - full, _rows(t0 + full, seq)))
    return runs


def _move_tiles(sb, sb_t0: int, hbm, t0: int, n: int, seq: int, d: int, store: bool = False):
    """Copy 128-row tiles ``t0 .. t0 + n - 1`` of a [S, D] HBM tensor (``hbm(rows, cols)``
    indexes it) to / from ``sb[row, sb_t0 + tile, col]``: one DMA for the full tiles, one for
    a ragged last tile."""
    for k0, cnt, r in _runs(t0, n, seq):
        p3 = nl.arange(r)[:, None, None]
        t3 = nl.arange(cnt)[None, :, None]
        d3 = nl.arange(d)[None, None, :]
        rows = (t0 + k0 + t3) * TILE + p3
        if store:
            nl.store(hbm(rows, d3), value=sb[p3, sb_t0 + k0 + t3, d3])
        else:
            sb[p3, sb_t0 + k0 + t3, d3] = nl.load(hbm(rows, d3))


def _move_cols(sb, hbm, n: int, seq: int, store: bool = False):
    """Copy a [S] HBM vector (``hbm(rows)`` indexes it) to / from ``sb[row, tile]`` [128, n]
    (one DMA for the full tiles, one for a ragged last tile)."""
    full = seq // TILE
    runs = [(0, full, TILE)] if full else []
    if full < n:
        runs.append((full, 1, seq - full * TILE))
    for k0, cnt, r in runs:
        i_p = nl.arange(r)[:, None]
        i_t = nl.arange(cnt)[None, :]
        if store:
            nl.store(hbm((k0 + i_t) * TILE + i_p), value=sb[i_p, k0 + i_t])
        else:
            sb[i_p, k0 + i_t] = nl.load(hbm((k0 + i_t) * TILE + i_p))


def _blocks(i: int, seq: int, causal: bool) -> list[tuple[int, int, int | None]]:
    """``(key block j, keys, diagonal key tile or None)`` of query tile ``i``: with ``causal``
    the blocks after the tile are left out and the diagonal block stops at the tile's last
    row (the diagonal key tile is the last one of the block's keys)."""
    per = KV_BLOCK // TILE
    out = []
    for j in range(math.ceil(seq / KV_BLOCK)):
        w = min(KV_BLOCK, seq - j * KV_BLOCK)
        c = i - j * per
        if causal and c < 0:
            break
        if causal and c < math.ceil(w / TILE):
            out.append((j, min((c + 1) * TILE, w), c))
        else:
            out.append((j, w, None))
    return out


def _merge(counts: list[int], lag: float) -> list[tuple[str, int, int]]:
    """One program order for the two passes: the max-pass steps ``("max", tile, block)`` of
    tile ``t + lag`` interleaved evenly with the exp-pass steps ``("exp", tile, block)`` of
    tile ``t``."""
    keyed = []
    for t, n in enumerate(counts):
        for kk in range(n):
            keyed.append((t + (kk + 0.5) / n, 0, "max", t, kk))
            keyed.append((t + lag + (kk + 0.5) / n, 1, "exp", t, kk))
    keyed.sort()
    return [(kind, t, kk) for _, _, kind, t, kk in keyed]


# stage -> tick offset after the step's first instruction; engines run in program order, so the
# offsets give each engine an independent tile while the others finish theirs
_MAX_STAGES = {0: "scores", 1: "rowmax"}
_EXP_STAGES = {0: "scores_t", 1: "exp", 4: "pv", 5: "finish"}


class _ForwardGroup:
    """The forward of one (batch, KV head): the query heads of the group, all query tiles.

    Two passes per query tile (see the module docstring): the max pass finds the exact row
    max ``m`` (so the exp pass needs no rescaling), the exp pass computes ``p.T`` with the
    keys on the partitions and accumulates ``[p @ v | rowsum(p)]`` in one PSUM tile over all
    key blocks.  Both passes of all tiles are unrolled and software-pipelined into one
    instruction stream per engine."""

    ACC_BUFS = FWD_ACC_BUFS

    def __init__(self, q, k, v, out, lse, b, g, consts, causal, scale):
        self.q, self.out, self.lse, self.b = q, out, lse, b
        _, n_heads, seq, d = q.shape
        self.group = n_heads // k.shape[1]
        self.g, self.seq, self.d = g, seq, d
        self.n_q = math.ceil(seq / TILE)
        self.mm_dt = q.dtype
        self.consts, self.causal, self.scale = consts, causal, scale
        mm_dt = self.mm_dt
        i_dp = nl.arange(d)[:, None]
        i_d = nl.arange(d)[None, :]
        # K^T [D, S] and [V | 1] [128, S/128, D + 1], loaded once for the group's query heads
        self.k_t = nl.ndarray((nl.par_dim(d), seq), dtype=mm_dt, buffer=nl.sbuf)
        for j in range(math.ceil(seq / KV_BLOCK)):
            w = min(KV_BLOCK, seq - j * KV_BLOCK)
            self.k_t[i_dp, j * KV_BLOCK + nl.arange(w)[None, :]] = nl.load_transpose2d(
                k[b, g, j * KV_BLOCK + nl.arange(w)[:, None], i_d]
            )
        self.q_t: dict = {}
        self._load_q(0)  # before V: the first matmuls need K^T and Q^T only
        i_p3 = nl.arange(TILE)[:, None, None]
        i_t3 = nl.arange(self.n_q)[None, :, None]
        self.v_ext = nl.ndarray((nl.par_dim(TILE), self.n_q, d + 1), dtype=mm_dt, buffer=nl.sbuf)
        # the ones column first: the GpSimd then need not wait for the load of V
        self.v_ext[i_p3, i_t3, nl.arange(1)[None, None, :] + d] = nisa.memset(
            (TILE, self.n_q, 1), 1.0, dtype=mm_dt, engine=nisa.engine.gpsimd
        )
        _move_tiles(self.v_ext, 0, lambda r, c: v[b, g, r, c], 0, self.n_q, seq, d)
        # rotating buffers of the hot tiles
        f32 = nl.float32
        self.s_pool = nl.ndarray((FWD_S_BUFS, nl.par_dim(TILE), KV_BLOCK), f32, buffer=nl.psum)
        self.st_pool = nl.ndarray((FWD_ST_BUFS, nl.par_dim(TILE), KV_BLOCK), f32, buffer=nl.psum)
        self.acc_pool = nl.ndarray((self.ACC_BUFS, nl.par_dim(TILE), d + 1), f32, buffer=nl.psum)
        self.p_pool = nl.ndarray((FWD_P_BUFS, nl.par_dim(TILE), KV_BLOCK), mm_dt, buffer=nl.sbuf)
        self.o_sb: dict = {}
        self.lse_sb: dict = {}
        self.tiles = [(hh, i) for hh in range(self.group) for i in range(self.n_q)]
        self.blocks = [_blocks(i, seq, causal) for _, i in self.tiles]
        self.run: dict = {}  # running max of the max pass, per tile
        self.u: dict = {}  # -m in the matmul dtype, per tile
        self.u_diag: dict = {}  # diag(u): per tile (two-pass) or per (tile, block) (online)
        self.slots: dict = {}  # (kind, tile, block) -> pool slot
        self.n_steps = {"max": 0, "exp": 0, "acc": 0}

    # -- loads and stores --------------------------------------------------------------------
    def _load_q(self, hh: int) -> None:
        if hh >= self.group or hh in self.q_t:
            return
        d, seq = self.d, self.seq
        q_t = nl.ndarray((nl.par_dim(d), seq), dtype=self.mm_dt, buffer=nl.sbuf)
        h = self.g * self.group + hh
        for j in range(math.ceil(seq / KV_BLOCK)):
            w = min(KV_BLOCK, seq - j * KV_BLOCK)
            q_t[nl.arange(d)[:, None], j * KV_BLOCK + nl.arange(w)[None, :]] = nl.load_transpose2d(
                self.q[self.b, h, j * KV_BLOCK + nl.arange(w)[:, None], nl.arange(d)[None, :]]
            )
        self.q_t[hh] = q_t

    def _slot(self, kind: str, key, n: int) -> int:
        if key not in self.slots:
            self.slots[key] = self.n_steps[kind] % n
            self.n_steps[kind] += 1
        return self.slots[key]

    # -- stages --------------------------------------------------------------------------------
    def scores(self, t: int, kk: int) -> None:
        """TensorE: s = q @ k.T [128 q, keys] fp32 in PSUM, for the row max; a diagonal block
        adds the causal bias to its last key tile with an identity matmul."""
        hh, i = self.tiles[t]
        if i == 0 and kk == 0:
            self._load_q(hh)
            self._load_q(hh + 1)  # prefetch the next head
        j, w, diag = self.blocks[t][kk]
        rq = _rows(i, self.seq)
        s = self.s_pool[self._slot("max", ("max", t, kk), FWD_S_BUFS)]
        i_p = nl.arange(rq)[:, None]
        i_f = nl.arange(rq)[None, :]
        i_dp = nl.arange(self.d)[:, None]
        i_w = nl.arange(w)[None, :]
        s[i_p, i_w] = nisa.nc_matmul(
            self.q_t[hh][i_dp, i * TILE + i_f], self.k_t[i_dp, j * KV_BLOCK + i_w]
        )
        if diag is not None:  # the diagonal key tile has the query tile's rows
            c = self.consts
            s[i_p, diag * TILE + i_f] += nisa.nc_matmul(c["ident"][i_p, i_f], c["mask"][i_p, i_f])

    def rowmax(self, t: int, kk: int) -> None:
        """VectorE: the block's row max; GpSimd: the running max over the blocks, then
        u = -max in the matmul dtype (every use below sees this one value) and diag(u)."""
        gp = nisa.engine.gpsimd
        n = len(self.blocks[t])
        _, w, _ = self.blocks[t][kk]
        rq = _rows(self.tiles[t][1], self.seq)
        s = self.s_pool[self.slots[("max", t, kk)]]
        i_p = nl.arange(rq)[:, None]
        scores = s[i_p, nl.arange(w)[None, :]]
        if n == 1:
            u = nisa.tensor_reduce(
                nl.max, scores, axis=(1,), negate=True, dtype=self.mm_dt, keepdims=True
            )
        else:
            bmax = nisa.tensor_reduce(nl.max, scores, axis=(1,), dtype=nl.float32, keepdims=True)
            if kk == 0:
                self.run[t] = bmax
                return
            if kk < n - 1:
                self.run[t] = nisa.tensor_tensor(
                    self.run[t], bmax, op=nl.maximum, dtype=nl.float32, engine=gp
                )
                return
            u = nisa.tensor_scalar(
                bmax,
                nl.maximum,
                self.run.pop(t),
                op1=nl.multiply,
                operand1=-1.0,
                dtype=self.mm_dt,
                engine=gp,
            )
        self.u[t] = u
        self.u_diag[t] = nisa.tensor_scalar(
            self.consts["ident"][i_p, nl.arange(rq)[None, :]],
            nl.multiply,
            u,
            dtype=self.mm_dt,
            engine=gp,
        )

    def _key_tiles(self, w: int) -> list[tuple[int, int]]:
        """(key tile in the block, keys) of a block of ``w`` keys."""
        return [(c, min(TILE, w - c * TILE)) for c in range(math.ceil(w / TILE))]

    def _take_u_diag(self, t: int, kk: int):
        """diag(u) for the exp-pass scores of block ``kk`` of tile ``t``: one per tile,
        dropped after its last block."""
        if kk == len(self.blocks[t]) - 1:
            return self.u_diag.pop(t)
        return self.u_diag[t]

    def scores_t(self, t: int, kk: int) -> None:
        """TensorE: (s + u).T per 128 keys, [128 k, keys/128 x 128 q] fp32 in PSUM:
        k_tile @ q.T, plus ones.T @ diag(u) (adds u[q] to every key row), plus the transposed
        causal bias on the diagonal key tile."""
        hh, i = self.tiles[t]
        j, w, diag = self.blocks[t][kk]
        rq = _rows(i, self.seq)
        c_ = self.consts
        st = self.st_pool[self._slot("exp", ("exp", t, kk), FWD_ST_BUFS)]
        u_diag = self._take_u_diag(t, kk)
        i_q = nl.arange(rq)[None, :]
        i_dp = nl.arange(self.d)[:, None]
        for c, rk in self._key_tiles(w):
            i_k = nl.arange(rk)[:, None]
            cols = c * TILE + i_q
            st[i_k, cols] = nisa.nc_matmul(
                self.k_t[i_dp, j * KV_BLOCK + c * TILE + nl.arange(rk)[None, :]],
                self.q_t[hh][i_dp, i * TILE + i_q],
            )
            st[i_k, cols] += nisa.nc_matmul(
                c_["ones"][nl.arange(rq)[:, None], nl.arange(rk)[None, :]], u_diag
            )
            if diag == c:  # rk == rq
                st[i_k, cols] += nisa.nc_matmul(
                    c_["ident"][i_k, nl.arange(rk)[None, :]], c_["mask_t"][i_k, i_q]
                )

    def exp(self, t: int, kk: int) -> None:
        """ScalarE: p.T = exp(scale * (s + u).T), PSUM -> SBUF in the matmul dtype (one
        instruction for the block; per key tile when the tiles are ragged)."""
        _, w, _ = self.blocks[t][kk]
        rq = _rows(self.tiles[t][1], self.seq)
        slot = self.slots[("exp", t, kk)]
        if rq == TILE and w % TILE == 0:
            regions = [(TILE, nl.arange(w)[None, :])]
        else:
            regions = [(rk, c * TILE + nl.arange(rq)[None, :]) for c, rk in self._key_tiles(w)]
        for rk, cols in regions:
            i_k = nl.arange(rk)[:, None]
            self.p_pool[slot % FWD_P_BUFS, i_k, cols] = nisa.activation(
                nl.exp, self.st_pool[slot, i_k, cols], scale=self.scale, dtype=self.mm_dt
            )

    def pv(self, t: int, kk: int) -> None:
        """TensorE: [p @ v | rowsum(p)] accumulated in one PSUM tile over all key blocks."""
        j, w, _ = self.blocks[t][kk]
        rq = _rows(self.tiles[t][1], self.seq)
        slot = self.slots[("exp", t, kk)]
        acc = self.acc_pool[self._slot("acc", ("acc", t), self.ACC_BUFS)]
        d1 = self.d + 1
        i_p = nl.arange(rq)[:, None]
        i_q = nl.arange(rq)[None, :]
        i_d1 = nl.arange(d1)[None, :]
        p = self.p_pool[slot % FWD_P_BUFS]
        for c, rk in self._key_tiles(w):
            i_k = nl.arange(rk)[:, None]
            prod = nisa.nc_matmul(
                p[i_k, c * TILE + i_q], self.v_ext[i_k, j * (KV_BLOCK // TILE) + c, i_d1]
            )
            if kk == 0 and c == 0:
                acc[i_p, i_d1] = prod
            else:
                acc[i_p, i_d1] += prod

    def finish(self, t: int, kk: int) -> None:
        """After the last block of a tile: out = acc[:, :D] / l (ScalarE), lse = log(l) -
        scale * u; after the last tile of a head, the head's stores."""
        if kk != len(self.blocks[t]) - 1:
            return
        hh, i = self.tiles[t]
        d = self.d
        acc = self.acc_pool[self.slots.pop(("acc", t))]
        i_p = nl.arange(_rows(i, self.seq))[:, None]
        i_d = nl.arange(d)[None, :]
        l_col = acc[i_p, nl.arange(1)[None, :] + d]
        if hh not in self.o_sb:
            self.o_sb[hh] = nl.ndarray(
                (nl.par_dim(TILE), self.n_q, d), dtype=self.q.dtype, buffer=nl.sbuf
            )
            if self.lse is not None:
                self.lse_sb[hh] = nl.ndarray(
                    (nl.par_dim(TILE), self.n_q), dtype=nl.float32, buffer=nl.sbuf
                )
        recip = nisa.activation(nl.reciprocal, l_col, dtype=nl.float32)
        self.o_sb[hh][i_p, i, i_d] = nisa.activation(
            nl.copy, acc[i_p, i_d], scale=recip, dtype=self.q.dtype
        )
        u = self.u.pop(t)
        if self.lse is not None:
            log_l = nisa.activation(nl.log, l_col, dtype=nl.float32)
            self.lse_sb[hh][i_p, i] = nisa.tensor_scalar(
                u,
                nl.multiply,
                -self.scale,
                op1=nl.add,
                operand1=log_l,
                dtype=nl.float32,
                engine=nisa.engine.gpsimd,
            )
        if i == self.n_q - 1 or (i + 1) % STORE_TILES == 0:
            self._store(hh, i)

    def _store(self, hh: int, i: int) -> None:
        """Store query tiles ``i0..i`` of head ``hh`` (the last ones since the previous store,
        so the last head's tail waits for a short transfer only)."""
        h = self.g * self.group + hh
        i0 = (i // STORE_TILES) * STORE_TILES
        b = self.b
        _move_tiles(
            self.o_sb[hh],
            i0,
            lambda r, c: self.out[b, h, r, c],
            i0,
            i + 1 - i0,
            self.seq,
            self.d,
            store=True,
        )
        if i == self.n_q - 1 and self.lse is not None:  # one store per head: [128, S/128]
            _move_cols(self.lse_sb[hh], lambda r: self.lse[b, h, r], self.n_q, self.seq, True)
        if i == self.n_q - 1:
            del self.o_sb[hh], self.q_t[hh]
            self.lse_sb.pop(hh, None)

    def run_all(self) -> None:
        order = _merge([len(bl) for bl in self.blocks], FWD_LAG)
        stages = {"max": _MAX_STAGES, "exp": _EXP_STAGES}
        depth = max(max(s) for s in stages.values())
        for tick in range(len(order) + depth):
            for off in range(depth, -1, -1):
                n = tick - off
                if 0 <= n < len(order):
                    kind, t, kk = order[n]
                    name = stages[kind].get(off)
                    if name is not None:
                        getattr(self, name)(t, kk)


# The online (flash-style) forward: stage offsets of a step and the interleaving of tiles
# (a tick between the row max and the exp-pass scores: the GpSimd's u and diag(u) take about
# as long as the TensorE work of one tick, and the exp-pass matmuls need diag(u))
_ONLINE_STAGES = {
    0: "scores",
    1: "online_max",
    3: "scores_t",
    4: "alpha_exp",
    5: "rescale",
    6: "pv",
    7: "finish",
}


def _interleave(counts: list[int], width: int) -> list[tuple[int, int]]:
    """Program order of the online forward: the tiles in groups of ``width``, the steps
    ``(tile, block)`` of a group interleaved evenly, so that consecutive blocks of a tile are
    about ``width`` steps apart.  Every tile's last step sorts at its group's end, in tile
    order (tiles finish, and are stored, in order)."""
    keyed = []
    for t, n in enumerate(counts):
        for kk in range(n):
            keyed.append((t // width + (kk + 1) / n, t, kk))
    keyed.sort()
    return [(t, kk) for _, t, kk in keyed]


class _OnlineForwardGroup(_ForwardGroup):
    """The flash-style (online-softmax) forward of one (batch, KV head): one pass over the key
    blocks of each query tile, carrying ``u`` = minus the running row max (matmul dtype) and
    the accumulator ``acc = [sum p v | sum p]`` (fp32, PSUM).  Per step (query tile, key block):

        s            = q @ k.T [128 q, 512 k]                  TensorE (PSUM), for the row max
        u_new        = min(u, -rowmax(s)), diag(u_new)         VectorE, GpSimd
        (s + u_new).T = k @ q.T + ones.T @ diag(u_new)         TensorE, keys on the partitions
        alpha        = exp(scale * (u_new - u))                ScalarE
        p.T          = exp(scale * (s + u_new).T)              ScalarE, PSUM -> SBUF
        acc         *= alpha                                   ScalarE, in place in PSUM
        acc         += p @ [v | 1]                             TensorE

    The first block of a tile has nothing to rescale.  The accumulator stays in PSUM over all
    blocks, as in the two-pass forward, so the rescale is one ScalarE instruction on
    [128, D + 1] (no SBUF accumulator and no PSUM -> SBUF copy per block); ``finish`` is the
    same (``out = acc[:, :D] / acc[:, D]``, ``lse = log(acc[:, D]) - scale * u``).  The
    steps of ``ONLINE_TILES`` tiles are interleaved (``_interleave``) so that a rescale does
    not wait on the P @ V matmuls of the step just before it, and software-pipelined like the
    two-pass forward (``_ONLINE_STAGES``)."""

    ACC_BUFS = ONLINE_ACC_BUFS

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.du: dict = {}  # (tile, block) -> u_new - u (fp32)
        self.alpha: dict = {}  # (tile, block) -> exp(scale * (u_new - u))

    def online_max(self, t: int, kk: int) -> None:
        """VectorE: -rowmax of the block in the matmul dtype (rounding is monotone, so
        min(u, round(-max)) is the rounded running minimum); GpSimd: u_new = min(u, -rowmax),
        u_new - u and diag(u_new)."""
        gp = nisa.engine.gpsimd
        _, w, _ = self.blocks[t][kk]
        rq = _rows(self.tiles[t][1], self.seq)
        s = self.s_pool[self.slots[("max", t, kk)]]
        i_p = nl.arange(rq)[:, None]
        neg_max = nisa.tensor_reduce(
            nl.max,
            s[i_p, nl.arange(w)[None, :]],
            axis=(1,),
            negate=True,
            dtype=self.mm_dt,
            keepdims=True,
        )
        u_old = self.u[t] if kk > 0 else None
        u = neg_max
        if u_old is not None:
            u = nisa.tensor_tensor(u_old, neg_max, op=nl.minimum, dtype=self.mm_dt, engine=gp)
        self.u[t] = u
        self.u_diag[(t, kk)] = nisa.tensor_scalar(
            self.consts["ident"][i_p, nl.arange(rq)[None, :]],
            nl.multiply,
            u,
            dtype=self.mm_dt,
            engine=gp,
        )
        if u_old is not None:  # after diag(u_new): the exp-pass scores wait for that one
            self.du[(t, kk)] = nisa.tensor_tensor(
                u, u_old, op=nl.subtract, dtype=nl.float32, engine=gp
            )

    def _take_u_diag(self, t: int, kk: int):
        """diag(u) of block ``kk`` of tile ``t`` (one per block: u changes)."""
        return self.u_diag.pop((t, kk))

    def alpha_exp(self, t: int, kk: int) -> None:
        """ScalarE: alpha = exp(scale * (u_new - u)) (<= 1; not for a tile's first block),
        then p.T as in the two-pass exp pass."""
        if kk > 0:
            self.alpha[(t, kk)] = nisa.activation(
                nl.exp, self.du.pop((t, kk)), scale=self.scale, dtype=nl.float32
            )
        self.exp(t, kk)

    def rescale(self, t: int, kk: int) -> None:
        """ScalarE: acc *= alpha in place in PSUM, after the previous block's P @ V and before
        this block's (program order)."""
        if kk == 0:
            return
        acc = self.acc_pool[self.slots[("acc", t)]]
        i_p = nl.arange(_rows(self.tiles[t][1], self.seq))[:, None]
        i_d1 = nl.arange(self.d + 1)[None, :]
        acc[i_p, i_d1] = nisa.activation(
            nl.copy, acc[i_p, i_d1], scale=self.alpha.pop((t, kk)), dtype=nl.float32
        )

    def run_all(self) -> None:
        order = _interleave([len(bl) for bl in self.blocks], ONLINE_TILES)
        depth = max(_ONLINE_STAGES)
        for tick in range(len(order) + depth):
            for off in range(depth, -1, -1):
                n = tick - off
                if 0 <= n < len(order) and off in _ONLINE_STAGES:
                    getattr(self, _ONLINE_STAGES[off])(*order[n])


def _forward(q, k, v, causal, scale, with_lse, group_cls):
    """The body of both forward kernels: one ``group_cls`` pipeline per (batch, KV head)."""
    b_size, n_heads, seq, d = q.shape
    n_kv = k.shape[1]
    mm_dt = q.dtype
    out = nl.ndarray((b_size, n_heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((b_size, n_heads, seq), dtype=nl.float32, buffer=nl.shared_hbm)
    consts = _constants(mm_dt)
    for b in nl.affine_range(b_size):
        for g in nl.affine_range(n_kv):
            group_cls(
                q, k, v, out, lse if with_lse else None, b, g, consts, causal, scale
            ).run_all()
    if with_lse:
        return out, lse
    return out


@nki.jit
def flash_attention_fwd_kernel(q, k, v, causal, scale, with_lse):
    """Attention forward, two-pass exact-max softmax (``softmax="two_pass"``), for ``q``
    [B, H, S, D], ``k``/``v`` [B, Hkv, S, D] (one dtype, 1 <= S <= MAX_S, D <= 128).  Returns
    ``out`` [B, H, S, D] in q's dtype, and with ``with_lse`` also the log-sum-exp of the
    scaled scores, [B, H, S] fp32."""
    return _forward(q, k, v, causal, scale, with_lse, _ForwardGroup)


@nki.jit
def flash_attention_online_fwd_kernel(q, k, v, causal, scale, with_lse):
    """Attention forward, flash-style online softmax (``softmax="online"``): the contract of
    ``flash_attention_fwd_kernel`` (same outputs, same ``lse``)."""
    return _forward(q, k, v, causal, scale, with_lse, _OnlineForwardGroup)


FWD_KERNELS = {"two_pass": flash_attention_fwd_kernel, "online": flash_attention_online_fwd_kernel}


def _constants(mm_dt):
    """The identity, the causal bias of a diagonal tile (0 where key <= query, else NEG_BIG)
    and its transpose (added to diagonal score tiles in PSUM by identity matmuls), and a ones
    tile (the broadcast of u along the keys); built on chip with affine_select (GpSimd)."""
    i_p = nl.arange(TILE)[:, None]
    i_f = nl.arange(TILE)[None, :]
    zeros = nl.zeros((TILE, TILE), dtype=mm_dt, buffer=nl.sbuf)
    ones = nl.ones((TILE, TILE), dtype=mm_dt, buffer=nl.sbuf)
    lower = nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=ones, on_false_value=0.0)
    return {
        "ident": nisa.affine_select(
            pred=(i_f - i_p >= 0), on_true_tile=lower, on_false_value=0.0, dtype=mm_dt
        ),
        "mask": nisa.affine_select(
            pred=(i_p - i_f >= 0), on_true_tile=zeros, on_false_value=NEG_BIG, dtype=mm_dt
        ),
        "mask_t": nisa.affine_select(
            pred=(i_f - i_p >= 0), on_true_tile=zeros, on_false_value=NEG_BIG, dtype=mm_dt
        ),
        "ones": ones,
    }


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
    if not 1 <= s <= MAX_S:
        raise ValueError(f"{fn}: the sequence length must be in [1, {MAX_S}], got {s}")
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


def _fwd_kernel(fn: str, softmax: str):
    """The forward kernel of the ``softmax`` algorithm; ValueError if it is not one."""
    if not isinstance(softmax, str) or softmax not in FWD_KERNELS:
        raise ValueError(
            f"{fn}: softmax must be one of {', '.join(map(repr, SOFTMAX))}, got {softmax!r}"
        )
    return FWD_KERNELS[softmax]


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    scale: float = 0.0,
    softmax: str = "two_pass",
) -> np.ndarray:
    """Scaled dot-product attention ``softmax(scale * q @ k.T [+ causal mask]) @ v``.

    ``q``: [B, H, S, D]; ``k``, ``v``: [B, Hkv, S, D] with ``Hkv`` dividing ``H`` (grouped-query
    attention: query head ``h`` uses KV head ``h // (H // Hkv)``); ``1 <= S <= 4096``,
    ``1 <= D <= 128``.  Numpy arrays or CPU torch tensors, all float32 or all bfloat16.
    ``causal``: query ``i`` attends to keys ``j <= i`` only.  ``scale``: multiplies the scores;
    ``0.0`` (the default) means ``1 / sqrt(D)``.  ``softmax``: the algorithm, ``"two_pass"``
    (the default: a max pass, then an exp pass that never rescales) or ``"online"`` (flash-style:
    one pass with a running max, rescaling the accumulator); the results agree to rounding.
    Returns [B, H, S, D] in the input dtype.  Raises ``ValueError`` for bad shapes, scale or
    ``softmax`` and ``TypeError`` for an unsupported or mixed dtype.
    """
    fwd = _fwd_kernel("attention", softmax)
    *_, scale = _check("attention", q, k, v, scale)
    return fwd(q, k, v, bool(causal), scale, False)


# Backward software pipeline: pool depths, prefetch distance and the SBUF budget
BWD_S_BUFS = 2  # PSUM banks of scores and of dO @ v.T [128 q, 512 k] (each)
BWD_W_BUFS = 4  # SBUF [128, 512] work tiles (p, dp - delta, ds, ds.T)
BWD_DQ_BUFS = 2  # PSUM [128 q, D] partial dq
BWD_SBUF_BUDGET = 200 * 1024  # bytes per partition for everything the backward keeps in SBUF
OUT_BUFS = 3  # SBUF staging tiles of the dQ, dK, dV stores
BWD_UNROLL_STEPS = 1536  # steps (query tile x key block) unrolled across KV heads at most
BWD_PREFETCH = 8  # steps: the loads of a head (or of a KV head) are issued this far ahead
_BWD_STAGES = {
    0: "mm_scores",
    1: "act",
    2: "dscores",
    4: "mm_grads",
    5: "copy_t",
    7: "mm_dq",
    8: "dq_acc",
}
_PREP_AHEAD = 2  # steps: the row statistics of a query tile are computed this far ahead


def _bwd_w_bufs(itemsize: int) -> int:
    """Depth of the SBUF work tiles: fp32 matmuls are 4x slower, so fewer steps need to be in
    flight; at least 3, since p is written at stage 1 and read at stage 4 (a slot may only be
    rewritten after its last reader in program order)."""
    return BWD_W_BUFS if itemsize == 2 else 3


def _bwd_layout(group: int, seq: int, d: int, itemsize: int) -> tuple[int, bool]:
    """(query heads per pass over the keys, whether the loads of the next heads and KV head
    overlap the current ones) so that the resident tiles fit ``BWD_SBUF_BUDGET``.

    Per partition: a KV head keeps K^T, V^T [D, S] and K [128, S/128, D]; a query head Q^T,
    dO^T [D, S], Q, dO [128, S/128, D] (matmul dtype) and its fp32 dQ accumulator; fixed are
    the work and staging tiles, a few blocks of the forward's output (for delta) and, with
    more than one chunk, the fp32 dK/dV sums."""
    rows = seq * d // TILE
    blk = KV_BLOCK * d // TILE  # one 512-row block of a [S, D] tensor, per partition
    per_kv = 2 * seq * itemsize + rows * itemsize
    per_head = 2 * seq * itemsize + 2 * rows * itemsize + rows * 4
    work = (
        4 * _bwd_w_bufs(itemsize) * KV_BLOCK * itemsize  # p, dp - delta, ds, ds.T
        + 2 * blk * 4  # dO * out
        + (3 * OUT_BUFS + 3) * blk * itemsize  # dQ/dK/dV staging, out blocks in flight
        + 6 * TILE * itemsize  # constants
    )
    for overlap in (True, False):
        for multi in (False, True):
            fixed = work + (2 * rows * 4 if multi else 0) + (2 if overlap else 1) * per_kv
            room = BWD_SBUF_BUDGET - fixed - (per_head if overlap else 0)
            chunk = min(group, room // per_head)
            if chunk >= 1 and (multi or chunk == group):
                return chunk, overlap
    return 1, False  # the verifier reports it if even this does not fit


class _Backward:
    """The backward of one batch element (FlashAttention-2 style, probabilities recomputed
    from the forward's log-sum-exp), all KV heads in one software pipeline.

    Per KV head: key blocks (512 keys) outside, (query head, query tile) inside.  dK and dV
    of the block's key tiles accumulate in PSUM over all query tiles of the group's heads;
    dQ of each query tile accumulates in SBUF (fp32) over the key blocks.  The query-side
    tiles of a head (Q, Q^T, dO, dO^T, -lse, -delta with delta = rowsum(dO * out)) are loaded
    once and stay resident while the keys stream past; with many heads per KV head the group
    is split into chunks that fit SBUF (dK/dV are then summed in SBUF over the chunks).  Each
    step (query tile, key block):

        s      = q @ k.T, dp = dO @ v.T [128 q, 512 k]       TensorE (PSUM)
        p      = exp(scale * s - lse), dp - delta            ScalarE -> SBUF (matmul dtype)
        ds     = p * (dp - delta)                            GpSimd
        dV    += p.T @ dO, dK += ds.T @ q (per key tile)     TensorE (PSUM)
        ds.T   = transpose(ds) per key tile                  TensorE (PSUM) -> VectorE copy
        dQ    += ds @ k                                      TensorE (PSUM) -> VectorE add

    The steps are unrolled and software-pipelined like the forward's; the loads of the next
    heads and KV heads are issued ``BWD_PREFETCH`` steps ahead when SBUF has room for both."""

    def __init__(self, q, k, v, o, do, lse, dq, dk, dv, b, groups, consts, causal, scale):
        self.q, self.k, self.v, self.o, self.do, self.lse = q, k, v, o, do, lse
        self.dq, self.dk, self.dv = dq, dk, dv
        self.b = b
        self.groups = groups  # KV heads of this pipeline: ints, or one rolled loop index
        _, n_heads, seq, d = q.shape
        self.group = n_heads // k.shape[1]
        self.seq, self.d = seq, d
        self.n_t = math.ceil(seq / TILE)
        self.n_blocks = math.ceil(seq / KV_BLOCK)
        self.mm_dt = q.dtype
        self.consts, self.causal, self.scale = consts, causal, scale
        mm_dt, f32 = self.mm_dt, nl.float32
        self.w_bufs = _bwd_w_bufs(mm_dt.itemsize)
        self.chunk, self.overlap = _bwd_layout(self.group, seq, d, mm_dt.itemsize)
        self.n_chunks = math.ceil(self.group / self.chunk)
        # rotating buffers (PSUM, bf16: 2 + 2 banks of scores, 3 KiB of ds.T, 1 KiB of dq, 2
        # banks of dK/dV accumulators = the 8 banks)
        self.s_pool = nl.ndarray((BWD_S_BUFS, nl.par_dim(TILE), KV_BLOCK), f32, buffer=nl.psum)
        self.dp_pool = nl.ndarray((BWD_S_BUFS, nl.par_dim(TILE), KV_BLOCK), f32, buffer=nl.psum)
        self.t_bufs = 3 if mm_dt.itemsize == 2 else 1  # fp32 transposes take a bank each
        self.dst_ps = nl.ndarray((self.t_bufs, nl.par_dim(TILE), KV_BLOCK), mm_dt, buffer=nl.psum)
        self.dq_ps = nl.ndarray((BWD_DQ_BUFS, nl.par_dim(TILE), d), f32, buffer=nl.psum)
        per = KV_BLOCK // TILE
        self.dk_ps = nl.ndarray((per, nl.par_dim(TILE), d), f32, buffer=nl.psum)
        self.dv_ps = nl.ndarray((per, nl.par_dim(TILE), d), f32, buffer=nl.psum)
        self.w_pool = {
            name: nl.ndarray((self.w_bufs, nl.par_dim(TILE), KV_BLOCK), mm_dt, buffer=nl.sbuf)
            for name in ("p", "dpm", "ds", "dst")
        }
        # small rotating tiles of their own: a fresh tile could reuse the memory of one that
        # a (slow) store still reads, and wait for it
        self.prod_pool = nl.ndarray((2, nl.par_dim(TILE), per, d), f32, buffer=nl.sbuf)
        self.dq_out = nl.ndarray(
            (OUT_BUFS, nl.par_dim(TILE), STORE_TILES, d), q.dtype, buffer=nl.sbuf
        )
        self.dk_out = nl.ndarray((OUT_BUFS, nl.par_dim(TILE), per, d), dk.dtype, buffer=nl.sbuf)
        self.dv_out = nl.ndarray((OUT_BUFS, nl.par_dim(TILE), per, d), dv.dtype, buffer=nl.sbuf)
        self.n_out = {"dq": 0, "dkv": 0, "prod": 0}
        self.kv: dict = {}  # g -> resident K^T, V^T, K (and the chunk sums of dK, dV)
        self.heads: dict = {}  # (g, hh) -> resident tiles of the query head
        self.steps = self._plan()
        self.loads = self._load_plan()
        self.slots: dict = {}
        self.n_slot = 0
        self.touched: set = set()  # (g, chunk, block, key tile) with a dK/dV contribution
        self.prepped: set = set()

    # -- index helpers -------------------------------------------------------------------------
    @staticmethod
    def _p3():
        return nl.arange(TILE)[:, None, None]

    @staticmethod
    def _t3(n):
        return nl.arange(n)[None, :, None]

    def _d3(self):
        return nl.arange(self.d)[None, None, :]

    # -- the plan ------------------------------------------------------------------------------
    def _plan(self) -> list[tuple]:
        """Steps ``(g, chunk, head, query tile, key block, keys, diagonal key tile or None,
        first contribution to dQ of the tile, last one, last step of the block)``."""
        per = KV_BLOCK // TILE
        steps = []
        for g in range(len(self.groups)):
            for ch, c0 in enumerate(range(0, self.group, self.chunk)):
                heads = range(c0, min(self.group, c0 + self.chunk))
                for jb in range(self.n_blocks):
                    w_blk = min(KV_BLOCK, self.seq - jb * KV_BLOCK)
                    for hh in heads:
                        for i in range(self.n_t):
                            c = i - jb * per
                            if self.causal and c < 0:
                                continue
                            if self.causal and c < math.ceil(w_blk / TILE):
                                w, diag = min((c + 1) * TILE, w_blk), c
                            else:
                                w, diag = w_blk, None
                            last_jb = min(i // per, self.n_blocks - 1) if self.causal else None
                            last = jb == (self.n_blocks - 1 if last_jb is None else last_jb)
                            steps.append([g, ch, hh, i, jb, w, diag, jb == 0, last])
        for n, st in enumerate(steps):
            nxt = steps[n + 1] if n + 1 < len(steps) else None
            st.append(nxt is None or tuple(nxt[:2]) + (nxt[4],) != tuple(st[:2]) + (st[4],))
        return [tuple(st) for st in steps]

    def _load_plan(self) -> dict[int, list[tuple]]:
        """step -> loads to issue with its first stage.  With ``overlap`` each KV head and each
        query head is loaded ``BWD_PREFETCH`` steps before its first use; without, all tiles
        of a chunk are loaded at its first step (after a pipeline flush).  Blocks of the
        forward's output go to ``self.out_loads``, ``BWD_PREFETCH`` steps before their use."""
        first: dict = {}
        chunk_start: dict = {}
        out_first: dict = {}
        per = KV_BLOCK // TILE
        for n, st in enumerate(self.steps):
            c = chunk_start.setdefault(st[:2], n)
            first.setdefault(("kv", st[0]), (n, c))
            first.setdefault(("head", st[0], st[2]), (n, c))
            out_first.setdefault((st[0], st[2], st[3] // per), n)
        plan: dict[int, list[tuple]] = {}
        at_of: dict = {}
        for key, (n, c) in sorted(first.items(), key=lambda kv: (kv[1][0], kv[0][0] != "kv")):
            at = max(0, n - BWD_PREFETCH) if self.overlap else c
            at_of[key] = at
            plan.setdefault(at, []).append(key)
        self.out_loads: dict[int, list[tuple]] = {}
        for (g, hh, jq), n in out_first.items():
            at = max(at_of[("head", g, hh)], n - BWD_PREFETCH)
            self.out_loads.setdefault(at, []).append((g, hh, jq))
        return plan

    # -- resident tiles ------------------------------------------------------------------------
    def _load(self, keys: list[tuple], outs: list[tuple]) -> None:
        """Issue the loads of KV heads, query heads and blocks of the forward's output block by
        block (512 rows), so that the first steps can start after the first blocks arrived."""
        for key in keys:
            if key[0] == "kv":
                self._new_kv(key[1])
            else:
                self._new_head(key[1], key[2])
        for j in range(self.n_blocks):
            for key in keys:
                if key[0] == "kv":
                    self._load_kv_block(key[1], j)
                else:
                    self._load_head_block(key[1], key[2], j)
            for g, hh, jq in outs:
                if jq == j:
                    self._load_out(g, hh, jq)

    def _new_kv(self, g: int) -> None:
        d, seq, mm_dt = self.d, self.seq, self.mm_dt
        kv = {
            "k_t": nl.ndarray((nl.par_dim(d), seq), dtype=mm_dt, buffer=nl.sbuf),
            "v_t": nl.ndarray((nl.par_dim(d), seq), dtype=mm_dt, buffer=nl.sbuf),
            "k": nl.ndarray((nl.par_dim(TILE), self.n_t, d), dtype=mm_dt, buffer=nl.sbuf),
        }
        if self.n_chunks > 1:  # dK, dV summed over the chunks (fp32)
            for name in ("dk_acc", "dv_acc"):
                kv[name] = nl.ndarray((nl.par_dim(TILE), self.n_t, d), nl.float32, buffer=nl.sbuf)
        self.kv[g] = kv

    def _load_kv_block(self, g: int, j: int) -> None:
        b, d, kv = self.b, self.d, self.kv[g]
        w = min(KV_BLOCK, self.seq - j * KV_BLOCK)
        i_dp = nl.arange(d)[:, None]
        i_d = nl.arange(d)[None, :]
        rows = j * KV_BLOCK + nl.arange(w)[:, None]
        cols = j * KV_BLOCK + nl.arange(w)[None, :]
        gh = self.groups[g]
        kv["k_t"][i_dp, cols] = nl.load_transpose2d(self.k[b, gh, rows, i_d])
        kv["v_t"][i_dp, cols] = nl.load_transpose2d(self.v[b, gh, rows, i_d])
        per = KV_BLOCK // TILE
        _move_tiles(
            kv["k"], j * per, lambda r, c: self.k[b, gh, r, c], j * per, -(-w // TILE), self.seq, d
        )

    def _new_head(self, g: int, hh: int) -> None:
        b, h = self.b, self.groups[g] * self.group + hh
        d, seq, n_t, mm_dt = self.d, self.seq, self.n_t, self.mm_dt
        hd = {"lse": nl.ndarray((nl.par_dim(TILE), n_t), dtype=nl.float32, buffer=nl.sbuf), "o": {}}
        _move_cols(hd["lse"], lambda r: self.lse[b, h, r], n_t, seq)
        for name in ("q_t", "do_t"):
            hd[name] = nl.ndarray((nl.par_dim(d), seq), dtype=mm_dt, buffer=nl.sbuf)
        for name in ("do", "q"):
            hd[name] = nl.ndarray((nl.par_dim(TILE), n_t, d), dtype=mm_dt, buffer=nl.sbuf)
        hd["ndelta"] = nl.ndarray((nl.par_dim(TILE), n_t), dtype=nl.float32, buffer=nl.sbuf)
        hd["dq_acc"] = nl.ndarray((nl.par_dim(TILE), n_t, d), dtype=nl.float32, buffer=nl.sbuf)
        self.heads[(g, hh)] = hd

    def _load_head_block(self, g: int, hh: int, j: int) -> None:
        """Rows j * 512 ... of a query head: Q^T, dO^T (transposed loads), dO, Q."""
        b, h, d, hd = self.b, self.groups[g] * self.group + hh, self.d, self.heads[(g, hh)]
        w = min(KV_BLOCK, self.seq - j * KV_BLOCK)
        i_dp = nl.arange(d)[:, None]
        i_d = nl.arange(d)[None, :]
        for name, src in (("q_t", self.q), ("do_t", self.do)):
            hd[name][i_dp, j * KV_BLOCK + nl.arange(w)[None, :]] = nl.load_transpose2d(
                src[b, h, j * KV_BLOCK + nl.arange(w)[:, None], i_d]
            )
        per, nt = KV_BLOCK // TILE, -(-w // TILE)
        for name, src in (("do", self.do), ("q", self.q)):
            _move_tiles(
                hd[name], j * per, lambda r, c, x=src: x[b, h, r, c], j * per, nt, self.seq, d
            )

    def _load_out(self, g: int, hh: int, jq: int) -> None:
        """Rows jq * 512 ... of the forward's output, for delta only: a block-sized tile that
        dies once delta is computed."""
        b, h, hd = self.b, self.groups[g] * self.group + hh, self.heads[(g, hh)]
        nt = math.ceil(min(KV_BLOCK, self.seq - jq * KV_BLOCK) / TILE)
        o_blk = nl.ndarray((nl.par_dim(TILE), nt, self.d), dtype=self.mm_dt, buffer=nl.sbuf)
        per = KV_BLOCK // TILE
        _move_tiles(o_blk, 0, lambda r, c: self.o[b, h, r, c], jq * per, nt, self.seq, self.d)
        hd["o"][jq] = o_blk

    def _prep(self, g: int, hh: int, i: int) -> None:
        """-delta = -rowsum(dO * out) of the 512-row block of query tile i (GpSimd multiply,
        VectorE sum; one instruction each for the block's tiles), once."""
        per = KV_BLOCK // TILE
        jq = i // per
        if (g, hh, jq) in self.prepped:
            return
        self.prepped.add((g, hh, jq))
        hd = self.heads[(g, hh)]
        if "nlse" not in hd:  # here, not at the load: the GpSimd must not wait for the DMA early
            hd["nlse"] = nisa.tensor_scalar(
                hd.pop("lse"), nl.multiply, -1.0, dtype=nl.float32, engine=nisa.engine.gpsimd
            )
        nt = math.ceil(min(KV_BLOCK, self.seq - jq * KV_BLOCK) / TILE)
        prod = self.prod_pool[self.n_out["prod"] % 2]
        self.n_out["prod"] += 1
        o_blk = hd["o"].pop(jq)
        for k0, cnt, r in _runs(jq * per, nt, self.seq):
            p3 = nl.arange(r)[:, None, None]
            t3 = k0 + self._t3(cnt)
            d3 = self._d3()
            prod[p3, t3, d3] = nisa.tensor_tensor(
                hd["do"][p3, jq * per + t3, d3],
                o_blk[p3, t3, d3],
                op=nl.multiply,
                dtype=nl.float32,
                engine=nisa.engine.gpsimd,
            )
            cols = jq * per + k0 + nl.arange(cnt)[None, :]
            hd["ndelta"][nl.arange(r)[:, None], cols] = nisa.tensor_reduce(
                nl.add, prod[p3, t3, d3], axis=(2,), negate=True, dtype=nl.float32
            )

    @staticmethod
    def _key_tiles(w: int) -> list[tuple[int, int]]:
        """(key tile in the block, keys) of a block of ``w`` keys."""
        return [(c, min(TILE, w - c * TILE)) for c in range(math.ceil(w / TILE))]

    def _slot(self, n: int) -> int:
        if n not in self.slots:
            self.slots[n] = self.n_slot
            self.n_slot += 1
        return self.slots[n]

    # -- stages --------------------------------------------------------------------------------
    def mm_scores(self, n: int) -> None:
        """TensorE: s = q @ k.T (+ the causal bias on the diagonal key tile), dp = dO @ v.T."""
        g, _, hh, i, jb, w, diag, *_ = self.steps[n]
        slot = self._slot(n) % BWD_S_BUFS
        hd, kv = self.heads[(g, hh)], self.kv[g]
        rq = _rows(i, self.seq)
        i_p = nl.arange(rq)[:, None]
        i_f = nl.arange(rq)[None, :]
        i_dp = nl.arange(self.d)[:, None]
        i_w = nl.arange(w)[None, :]
        rows = i * TILE + i_f
        keys = jb * KV_BLOCK + i_w
        s = self.s_pool[slot]
        s[i_p, i_w] = nisa.nc_matmul(hd["q_t"][i_dp, rows], kv["k_t"][i_dp, keys])
        if diag is not None:  # the diagonal key tile has the query tile's rows
            c = self.consts
            s[i_p, diag * TILE + i_f] += nisa.nc_matmul(c["ident"][i_p, i_f], c["mask"][i_p, i_f])
        self.dp_pool[slot, i_p, i_w] = nisa.nc_matmul(hd["do_t"][i_dp, rows], kv["v_t"][i_dp, keys])

    def act(self, n: int) -> None:
        """ScalarE: p = exp(scale * s - lse) and dp - delta, PSUM -> SBUF (matmul dtype)."""
        g, _, hh, i, _, w, *_ = self.steps[n]
        slot = self.slots[n]
        hd = self.heads[(g, hh)]
        i_p = nl.arange(_rows(i, self.seq))[:, None]
        i_w = nl.arange(w)[None, :]
        col = nl.arange(1)[None, :] + i
        ws = slot % self.w_bufs
        self.w_pool["p"][ws, i_p, i_w] = nisa.activation(
            nl.exp,
            self.s_pool[slot % BWD_S_BUFS, i_p, i_w],
            bias=hd["nlse"][i_p, col],
            scale=self.scale,
            dtype=self.mm_dt,
        )
        self.w_pool["dpm"][ws, i_p, i_w] = nisa.activation(
            nl.copy,
            self.dp_pool[slot % BWD_S_BUFS, i_p, i_w],
            bias=hd["ndelta"][i_p, col],
            dtype=self.mm_dt,
        )

    def dscores(self, n: int) -> None:
        """GpSimd: ds = p * (dp - delta)."""
        i, w = self.steps[n][3], self.steps[n][5]
        ws = self.slots[n] % self.w_bufs
        i_p = nl.arange(_rows(i, self.seq))[:, None]
        i_w = nl.arange(w)[None, :]
        self.w_pool["ds"][ws, i_p, i_w] = nisa.tensor_tensor(
            self.w_pool["p"][ws, i_p, i_w],
            self.w_pool["dpm"][ws, i_p, i_w],
            op=nl.multiply,
            dtype=self.mm_dt,
            engine=nisa.engine.gpsimd,
        )

    def mm_grads(self, n: int) -> None:
        """TensorE, per key tile: dV += p.T @ dO, dK += ds.T @ q, ds.T = transpose(ds); after
        the block's last step, the drain of dK/dV (before the next block's first dK/dV
        matmul, in program order)."""
        g, ch, hh, i, jb, w, *_ = self.steps[n]
        slot = self.slots[n]
        ws = slot % self.w_bufs
        hd = self.heads[(g, hh)]
        rq = _rows(i, self.seq)
        i_p = nl.arange(rq)[:, None]
        i_q = nl.arange(rq)[None, :]
        i_d = nl.arange(self.d)[None, :]
        p, ds = self.w_pool["p"][ws], self.w_pool["ds"][ws]
        dst = self.dst_ps[slot % self.t_bufs]
        for c, rk in self._key_tiles(w):
            cols = c * TILE + nl.arange(rk)[None, :]
            i_k = nl.arange(rk)[:, None]
            dv_c = nisa.nc_matmul(p[i_p, cols], hd["do"][i_p, i, i_d])
            key = (g, ch, jb, c)
            if key in self.touched:
                self.dv_ps[c, i_k, i_d] += dv_c
                self.dk_ps[c, i_k, i_d] += nisa.nc_matmul(ds[i_p, cols], hd["q"][i_p, i, i_d])
            else:
                self.touched.add(key)
                self.dv_ps[c, i_k, i_d] = dv_c
                self.dk_ps[c, i_k, i_d] = nisa.nc_matmul(ds[i_p, cols], hd["q"][i_p, i, i_d])
            dst[i_k, c * TILE + i_q] = nisa.nc_transpose(ds[i_p, cols])
        if self.steps[n][-1]:
            self._drain(n)

    def copy_t(self, n: int) -> None:
        """VectorE: ds.T PSUM -> SBUF (one instruction; per key tile when ragged)."""
        i, w = self.steps[n][3], self.steps[n][5]
        rq = _rows(i, self.seq)
        slot = self.slots[n]
        if rq == TILE and w % TILE == 0:
            regions = [(TILE, nl.arange(w)[None, :])]
        else:
            regions = [(rk, c * TILE + nl.arange(rq)[None, :]) for c, rk in self._key_tiles(w)]
        for rk, cols in regions:
            i_k = nl.arange(rk)[:, None]
            self.w_pool["dst"][slot % self.w_bufs, i_k, cols] = nisa.tensor_copy(
                self.dst_ps[slot % self.t_bufs, i_k, cols], dtype=self.mm_dt
            )

    def mm_dq(self, n: int) -> None:
        """TensorE: the step's dq = ds @ k (summed over its key tiles in PSUM)."""
        g, _, _, i, jb, w, *_ = self.steps[n]
        slot = self.slots[n]
        rq = _rows(i, self.seq)
        i_p = nl.arange(rq)[:, None]
        i_q = nl.arange(rq)[None, :]
        i_d = nl.arange(self.d)[None, :]
        dst = self.w_pool["dst"][slot % self.w_bufs]
        dq = self.dq_ps[slot % BWD_DQ_BUFS]
        per = KV_BLOCK // TILE
        for c, rk in self._key_tiles(w):
            i_k = nl.arange(rk)[:, None]
            prod = nisa.nc_matmul(dst[i_k, c * TILE + i_q], self.kv[g]["k"][i_k, jb * per + c, i_d])
            if c == 0:
                dq[i_p, i_d] = prod
            else:
                dq[i_p, i_d] += prod

    def dq_acc(self, n: int) -> None:
        """VectorE: dQ of the tile += the step's dq (fp32, SBUF); after the tile's last key
        block, GpSimd scales it into an output tile, stored every ``STORE_TILES`` tiles."""
        g, _, hh, i, _, _, _, first, last, _ = self.steps[n]
        slot = self.slots.pop(n)
        hd = self.heads[(g, hh)]
        i_p = nl.arange(_rows(i, self.seq))[:, None]
        i_d = nl.arange(self.d)[None, :]
        dq = self.dq_ps[slot % BWD_DQ_BUFS, i_p, i_d]
        acc = hd["dq_acc"]
        if first:
            acc[i_p, i, i_d] = nisa.tensor_copy(dq, dtype=nl.float32)
        else:
            acc[i_p, i, i_d] = nisa.tensor_tensor(acc[i_p, i, i_d], dq, op=nl.add, dtype=nl.float32)
        if not last:
            return
        i0 = (i // STORE_TILES) * STORE_TILES
        m = min(STORE_TILES, self.n_t - i0)
        if i == i0:
            hd["dq_out"] = self.dq_out[self.n_out["dq"] % OUT_BUFS]
            self.n_out["dq"] += 1
        hd["dq_out"][i_p, i - i0, i_d] = nisa.tensor_scalar(
            acc[i_p, i, i_d], nl.multiply, self.scale, dtype=self.q.dtype, engine=nisa.engine.gpsimd
        )
        if i == i0 + m - 1:
            b, h = self.b, self.groups[g] * self.group + hh
            _move_tiles(
                hd.pop("dq_out"), 0, lambda r, c: self.dq[b, h, r, c], i0, m, self.seq, self.d, True
            )

    def _drain(self, n: int) -> None:
        """After the block's last step: dK = scale * sum and dV (VectorE, one instruction each
        for the block's full key tiles) to the output dtype, and store (with several head
        chunks they are summed in SBUF, fp32, first)."""
        g, ch, _, _, jb, *_ = self.steps[n]
        per = KV_BLOCK // TILE
        nk = math.ceil(min(KV_BLOCK, self.seq - jb * KV_BLOCK) / TILE)
        last = ch == self.n_chunks - 1
        if last:
            dk_o = self.dk_out[self.n_out["dkv"] % OUT_BUFS]
            dv_o = self.dv_out[self.n_out["dkv"] % OUT_BUFS]
            self.n_out["dkv"] += 1
        kv = self.kv[g]
        d3 = self._d3()
        for k0, cnt, r in _runs(jb * per, nk, self.seq):
            p3 = nl.arange(r)[:, None, None]
            t3 = k0 + self._t3(cnt)
            dk_ps, dv_ps = self.dk_ps[t3, p3, d3], self.dv_ps[t3, p3, d3]
            if self.n_chunks == 1:
                dk_o[p3, t3, d3] = nisa.tensor_scalar(
                    dk_ps, nl.multiply, self.scale, dtype=self.dk.dtype
                )
                dv_o[p3, t3, d3] = nisa.tensor_copy(dv_ps, dtype=self.dv.dtype)
                continue
            kt = jb * per + t3
            for acc, ps in ((kv["dk_acc"], dk_ps), (kv["dv_acc"], dv_ps)):
                if ch == 0:
                    acc[p3, kt, d3] = nisa.tensor_copy(ps, dtype=nl.float32)
                else:
                    acc[p3, kt, d3] = nisa.tensor_tensor(
                        acc[p3, kt, d3], ps, op=nl.add, dtype=nl.float32
                    )
            if last:
                gp = nisa.engine.gpsimd
                dk_o[p3, t3, d3] = nisa.tensor_scalar(
                    kv["dk_acc"][p3, kt, d3],
                    nl.multiply,
                    self.scale,
                    dtype=self.dk.dtype,
                    engine=gp,
                )
                dv_o[p3, t3, d3] = nisa.tensor_copy(
                    kv["dv_acc"][p3, kt, d3], dtype=self.dv.dtype, engine=gp
                )
        if last:
            b, gh = self.b, self.groups[g]
            for out, o in ((self.dk, dk_o), (self.dv, dv_o)):
                _move_tiles(
                    o, 0, lambda r, c, x=out: x[b, gh, r, c], jb * per, nk, self.seq, self.d, True
                )

    def run_all(self) -> None:
        """Emit every stage of every step: step n starts at tick t_n and its stage at offset o
        is emitted at tick t_n + o, the oldest step first within a tick.  Without ``overlap``
        the pipeline is flushed before a step that loads new resident tiles (so their memory
        is reused from the previous ones)."""
        steps, stages = self.steps, _BWD_STAGES
        depth = max(stages)
        start: dict[int, int] = {}
        inflight: list[int] = []
        tick = n_next = 0
        while n_next < len(steps) or inflight:
            for n in inflight:  # oldest first: highest stage first
                off = tick - start[n]
                if off in stages:
                    getattr(self, stages[off])(n)
            inflight = [n for n in inflight if tick - start[n] < depth]
            n = n_next
            if n < len(steps) and (self.overlap or n not in self.loads or not inflight):
                if n in self.loads or n in self.out_loads:
                    self._load(self.loads.get(n, []), self.out_loads.get(n, []))
                for m in range(n, min(len(steps), n + _PREP_AHEAD + 1)):
                    if (steps[m][0], steps[m][2]) in self.heads:
                        self._prep(steps[m][0], steps[m][2], steps[m][3])
                self.mm_scores(n)
                start[n] = tick
                inflight.append(n)
                n_next += 1
            tick += 1


@nki.jit
def flash_attention_bwd_kernel(q, k, v, o, do, lse, causal, scale):
    """``(dq, dk, dv)`` of attention (each in its input's shape and dtype) from the inputs, the
    forward's ``out`` and log-sum-exp ``lse`` [B, H, S] (fp32) and the output gradient ``do``
    [B, H, S, D]."""
    b_size, n_heads, seq, d = q.shape
    n_kv = k.shape[1]
    dq = nl.ndarray((b_size, n_heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((b_size, n_kv, seq, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((b_size, n_kv, seq, d), dtype=v.dtype, buffer=nl.shared_hbm)
    consts = _constants(q.dtype)
    group = n_heads // n_kv
    per_group = group * sum(len(_blocks(i, seq, causal)) for i in range(seq // TILE))
    for b in nl.affine_range(b_size):
        if n_kv * per_group <= BWD_UNROLL_STEPS:  # one pipeline over all KV heads
            _Backward(
                q, k, v, o, do, lse, dq, dk, dv, b, list(range(n_kv)), consts, causal, scale
            ).run_all()
        else:  # a rolled loop over the KV heads keeps tracing time in check
            for g in nl.affine_range(n_kv):
                _Backward(q, k, v, o, do, lse, dq, dk, dv, b, [g], consts, causal, scale).run_all()
    return dq, dk, dv


def attention_backward(
    grad: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    scale: float = 0.0,
    softmax: str = "two_pass",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of ``attention(q, k, v, causal=causal, scale=scale)`` for the
    output gradient ``grad`` [B, H, S, D] (same dtype as the inputs); each gradient has its
    input's shape and dtype.  Reruns the forward kernel of the ``softmax`` algorithm for
    ``out`` and the log-sum-exp, then one backward kernel computes all three (the same for
    both algorithms).  Raises as ``attention``."""
    fwd = _fwd_kernel("attention_backward", softmax)
    *_, scale = _check("attention_backward", q, k, v, scale)
    if tuple(grad.shape) != tuple(q.shape):
        raise ValueError(
            f"attention_backward: grad must have q's shape {tuple(q.shape)}, got {tuple(grad.shape)}"
        )
    _check_same_dtype("attention_backward", q, grad)
    causal = bool(causal)
    out, lse = fwd(q, k, v, causal, scale, True)
    return flash_attention_bwd_kernel(q, k, v, out, grad, lse, causal, scale)


def _check_same_dtype(fn: str, a, b) -> None:
    if dtypes.as_dtype(a.dtype) != dtypes.as_dtype(b.dtype):
        raise TypeError(f"{fn}: grad must have the inputs' dtype {a.dtype}, got {b.dtype}")
