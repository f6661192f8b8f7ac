"""The three steps of the NKI fused-Mamba tutorial [T-MAMBA], written for nkikit.

Inputs: ``delta``, ``u`` [batch, channels, seq]; ``A`` [channels, states]; ``B``, ``C``
[batch, states, seq]; output [batch, channels, seq] =
``sum_s C[s] * scan_t(exp(delta * A[:, s]), delta * u * B[s])`` (the selective-scan core
of a Mamba-v1 layer).  Channels go on the partitions (tiles of 128), the sequence on the free
axis, so ``exp(delta * A)`` is one ScalarE activation with a per-partition scale, ``B`` and
``C`` rows are broadcast across partitions, and the recurrence is one VectorE
``tensor_tensor_scan`` per tile.  The steps differ only in loop order and tiling, as in the
tutorial:

1. ``mamba_v1``: states outside channel tiles; ``delta`` and ``u`` are loaded for every
   (state, channel tile), partial sums live in one [tiles, 128, seq] accumulator stored at
   the end.
2. ``mamba_v2``: channel tiles outside states; ``delta`` / ``u`` loaded once per channel tile
   and one [128, seq] accumulator per tile (loop reordering + fusion).
3. ``mamba_v3``: v2 with the sequence tiled (512 columns) inside the state loop; the scan of
   each sequence tile starts from the last column of the previous one, and ``C * scan`` is
   written to PSUM so that the accumulation into SBUF reads one PSUM input.
"""

from __future__ import annotations

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

P = nl.tile_size.pmax  # 128 channels per tile
SEQ_TILE = 512  # v3's sequence tile (the tutorial's starting choice)


def _dims(delta, A):
    batch, channels, seq = delta.shape
    assert channels % P == 0, "channels must be a multiple of 128"
    return batch, channels // P, seq, A.shape[1]


def _scan(d_t, u_t, a_col, b_row, seq, initial=0.0):
    """Steps 1-4 of one (state, channel tile): scan_t(exp(delta * A), delta * u * B)."""
    d_a = nisa.activation(op=nl.exp, data=d_t, scale=a_col)  # exp(delta * A): ScalarE
    d_u = nisa.tensor_tensor(d_t, u_t, op=nl.multiply)
    d_bu = nisa.tensor_tensor(d_u, b_row.broadcast_to((P, seq)), op=nl.multiply)
    return nisa.tensor_tensor_scan(d_a, d_bu, initial=initial, op0=nl.multiply, op1=nl.add)


def _state_step(d_t, u_t, a_col, b_row, c_row, seq):
    """Steps 1-5: C * scan (step 6, the sum over states, is the caller's)."""
    scan = _scan(d_t, u_t, a_col, b_row, seq)
    return nisa.tensor_tensor(scan, c_row.broadcast_to((P, seq)), op=nl.multiply)


@nki.jit
def mamba_v1(delta, u, A, B, C):
    """States outside channel tiles: delta / u reloaded for every state."""
    batch, tiles, seq, states = _dims(delta, A)
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        acc = nl.zeros((tiles, nl.par_dim(P), seq), dtype=delta.dtype, buffer=nl.sbuf)
        for s in nl.affine_range(states):
            b_row = nl.load(B[b, s : s + 1, 0:seq])
            c_row = nl.load(C[b, s : s + 1, 0:seq])
            for c in nl.affine_range(tiles):
                ch = slice(c * P, (c + 1) * P)
                d_t = nl.load(delta[b, ch, 0:seq])
                u_t = nl.load(u[b, ch, 0:seq])
                a_col = nl.load(A[ch, s : s + 1])
                part = _state_step(d_t, u_t, a_col, b_row, c_row, seq)
                acc[c, :, :] += part
        for c in nl.affine_range(tiles):
            nl.store(out[b, c * P : (c + 1) * P, 0:seq], value=acc[c, :, :])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    """Channel tiles outside states: delta / u loaded once per tile, one accumulator per tile."""
    batch, tiles, seq, states = _dims(delta, A)
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(tiles):
            ch = slice(c * P, (c + 1) * P)
            acc = nl.zeros((nl.par_dim(P), seq), dtype=delta.dtype, buffer=nl.sbuf)
            d_t = nl.load(delta[b, ch, 0:seq])
            u_t = nl.load(u[b, ch, 0:seq])
            for s in nl.affine_range(states):
                a_col = nl.load(A[ch, s : s + 1])
                b_row = nl.load(B[b, s : s + 1, 0:seq])
                c_row = nl.load(C[b, s : s + 1, 0:seq])
                part = _state_step(d_t, u_t, a_col, b_row, c_row, seq)
                acc[...] += part
            nl.store(out[b, ch, 0:seq], value=acc)
    return out


@nki.jit
def mamba_v3(delta, u, A, B, C):
    """v2 with the sequence tiled inside the state loop; the scan carries across tiles."""
    batch, tiles, seq, states = _dims(delta, A)
    ft = min(SEQ_TILE, seq)
    assert seq % ft == 0, "seq must be a multiple of 512"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(tiles):
            ch = slice(c * P, (c + 1) * P)
            acc = nl.zeros((nl.par_dim(P), seq), dtype=delta.dtype, buffer=nl.sbuf)
            d_t = nl.load(delta[b, ch, 0:seq])
            u_t = nl.load(u[b, ch, 0:seq])
            for s in nl.affine_range(states):
                a_col = nl.load(A[ch, s : s + 1])
                carry = nl.zeros((nl.par_dim(P), 1), dtype=delta.dtype, buffer=nl.sbuf)
                for j in nl.sequential_range(seq // ft):
                    b_row = nl.load(B[b, s : s + 1, j * ft : (j + 1) * ft])
                    c_row = nl.load(C[b, s : s + 1, j * ft : (j + 1) * ft])
                    d_j = d_t[:, j * ft : (j + 1) * ft]
                    u_j = u_t[:, j * ft : (j + 1) * ft]
                    scan = _scan(d_j, u_j, a_col, b_row, ft, carry)
                    carry[...] = nl.copy(scan[:, ft - 1 : ft])
                    # C * scan goes to PSUM, so the accumulation reads one PSUM input
                    part = nl.ndarray((nl.par_dim(P), ft), dtype=delta.dtype, buffer=nl.psum)
                    part[...] = nisa.tensor_tensor(
                        scan, c_row.broadcast_to((P, ft)), op=nl.multiply
                    )
                    acc[:, j * ft : (j + 1) * ft] += part
            nl.store(out[b, ch, 0:seq], value=acc)
    return out


KERNELS = {"v1": mamba_v1, "v2": mamba_v2, "v3": mamba_v3}
