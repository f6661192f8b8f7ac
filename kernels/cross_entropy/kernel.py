"""Cross-entropy of logits [N, V] against class indices [N], forward and backward.

Forward returns the **per-row** losses ``loss[r] = logsumexp(logits[r]) - logits[r, t[r]]``
(``reduction="none"``; take ``.mean()`` for the usual mean loss, whose gradient ``1/N`` then
flows into the backward) and, from ``cross_entropy_forward``, the fp32 logsumexp per row.
Rows whose target is outside ``[0, V)`` (e.g. torch's ``ignore_index=-100``) get loss 0 and a
zero gradient.

Mapping: rows on the 128 partitions, in blocks of up to ``TILES_PER_BLOCK`` row tiles
(``affine_range`` over blocks and over their tiles, the last masked); row tile ``j`` of a block
is column ``j`` of the block's [P, tiles] tiles.  The vocabulary in ``ceil(V / CHUNK)`` chunks
of equal width (the last masked).  The chunks of a row tile are independent
(``affine_range``): chunk ``c`` writes its own element ``[p, j, c]`` of two [P, tiles,
n_chunks] fp32 tiles, so there is no loop-carried dependency and the logits are read once:

1. VectorE ``tensor_reduce(max)``: the chunk max ``m_c``;
2. ScalarE ``activation_reduce(exp, bias=-m_c, reduce=add)``: ``s_c = sum exp(x - m_c)``.

The target logit ``x[r, t[r]]`` is one **indirect DMA** (gather) per row tile from the flat
[N*V, 1] view of the logits: partition ``p`` reads element ``p*V + t`` of the view that starts
at the tile's first row (``t`` clamped to [0, V), so an ignored row reads a real logit; the
valid mask zeroes its loss).  At the end of a block, for all its row tiles at once:
``M = max_c m_c``, ``lse = M + log(sum_c s_c exp(m_c - M))``, ``loss = (lse - x_t) * valid``
-- once per block so that no engine waits on another between row tiles.

Backward ``grad_logits = (softmax - onehot) * grad[r]``: ``cross_entropy_backward`` first runs
the forward for the logsumexp, then per chunk ScalarE ``p = exp(x - lse)`` and GpSimd
``p * grad`` rounded once to the logits' dtype, stored; at the end of a block the target
columns are overwritten with ``(p_t - 1) * grad`` (``p_t`` from the gathered target logits) by
one **indirect DMA** (scatter) per row tile, so no per-element one-hot compare is left.
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
# Most vocabulary columns per tile: 32 KiB (fp32) / 16 KiB (bf16) per partition per DMA.  V is
# cut into ceil(V / CHUNK) chunks of equal width (the last one up to n_chunks - 1 narrower).
CHUNK = 8192
# Engines compute in fp32, so the per-partition offset p*V + t of the gather is exact only
# below 2**24: one indirect DMA covers the largest power-of-two group of partitions with
# group * V <= 2**24 (all 128 up to V = 131072).
_EXACT = 1 << 24
# Row tiles per block: the per-row-tile results of a block live in SBUF until the block ends
# ([P, tiles, chunks] fp32 tiles), so blocks bound that memory for any N.
TILES_PER_BLOCK = 64


def _group(v: int, pmax: int) -> int:
    """Partitions per indirect DMA for vocabulary size ``v`` (see ``_EXACT``)."""
    g = 1
    while g * 2 <= min(pmax, _EXACT // v):
        g *= 2
    return g


def _row_offsets(v: int, pmax: int):
    """int32 [pmax, 1]: ``(p - p0) * V`` for partition ``p`` of the gather group starting at
    ``p0`` (see ``_group``): where its row starts in the group's flat view."""
    g = _group(v, pmax)
    i_g = nl.arange(g)[:, None]
    i_0 = nl.arange(1)[None, :]
    base = nl.ndarray((pmax, 1), dtype=nl.int32, buffer=nl.sbuf)
    for k in nl.static_range(pmax // g):
        base[k * g + i_g, i_0] = nisa.iota(i_g * v + 0 * i_0, dtype=nl.int32)
    return base


def _target_index(base, tgt_i, v: int, mask):
    """int32 [P, n_tiles] (``tgt_i``'s shape): ``base + clamp(t, 0, V-1)``, the flat offset
    of each row's target logit in its gather group.  Clamped, an ignored row (t = -1 or V
    after ``_check``, anything in the kernel) reads a real logit of its own row; the valid
    mask zeroes its loss and gradient."""
    tc = nisa.tensor_scalar(
        tgt_i, nl.maximum, 0.0, op1=nl.minimum, operand1=float(v - 1), dtype=nl.int32, mask=mask
    )
    return nl.add(tc, base, dtype=nl.int32, mask=mask)


def _row_elements(flat, idx, t, col, n: int, v: int, pmax: int):
    """For row tile ``t``: the accesses of element ``(row, t[row])`` of the flat [N*V, 1] view
    for each partition's row, one indirect DMA per gather group (``_group``): a list of
    ``(partition index, indirect access, mask)``.  Column ``col`` of ``idx`` holds the tile's
    offsets from ``_target_index``; group ``k`` indexes the flat view of its own rows, which
    starts at row ``t*P + k*g``."""
    g = _group(v, pmax)
    i_0 = nl.arange(1)[None, :]
    out = []
    for k in nl.static_range(pmax // g):
        i_g = nl.arange(g)[:, None]
        p0 = k * g
        rows = flat[nl.ds((t * pmax + p0) * v, g * v), :]  # this group's rows, flat
        out.append((p0 + i_g, rows[idx[p0 + i_g, col + i_0], i_0], t * pmax + p0 + i_g < n))
    return out


def _blocks(n: int, pmax: int) -> tuple[int, int]:
    """(row tiles per block, blocks): blocks of at most ``TILES_PER_BLOCK`` row tiles, as even
    as possible (the last block's extra tiles, if any, are fully masked)."""
    nt = math.ceil(n / pmax)
    nb = math.ceil(nt / TILES_PER_BLOCK)
    return math.ceil(nt / nb), nb


@nki.jit
def cross_entropy_kernel(logits, targets):
    """Per-row cross-entropy of ``logits`` [N, V] with int32 ``targets`` [N]; returns
    ``(loss [N] in logits' dtype, logsumexp [N] fp32)``."""
    n, v = logits.shape
    loss = nl.ndarray((n,), dtype=logits.dtype, buffer=nl.shared_hbm)
    lse_out = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    tb, nb = _blocks(n, pmax)
    nch = math.ceil(v / CHUNK)
    ch = math.ceil(v / nch)
    f32 = nl.float32
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(ch)[None, :]
    i_0 = nl.arange(1)[None, :]
    flat = logits.reshape((n * v, 1))
    offsets = _row_offsets(v, pmax)

    for b in nl.affine_range(nb):
        # the block's row tiles at once: row (b*tb + j)*P + p is element [p, j]
        rows_all = i_p + pmax * (b * tb + nl.arange(tb)[None, :])
        valid_all = rows_all < n
        tgt_all = nl.load(targets[rows_all], mask=valid_all)
        idx = _target_index(offsets, tgt_all, v, valid_all)
        x_t = nl.ndarray((pmax, tb), dtype=logits.dtype, buffer=nl.sbuf)
        cmax = nl.ndarray((pmax, tb, nch), dtype=f32, buffer=nl.sbuf)
        csum = nl.ndarray((pmax, tb, nch), dtype=f32, buffer=nl.sbuf)
        for j in nl.affine_range(tb):
            t = b * tb + j
            rows = t * pmax + i_p
            rvalid = rows < n
            # the target logit of every row: one indirect DMA (gather) per group of partitions
            for part, src, m in _row_elements(flat, idx, t, j, n, v, pmax):
                x_t[part, j + i_0] = nl.load(src, mask=m)
            for c in nl.affine_range(nch):
                cols = c * ch + i_f
                valid = rvalid & (cols < v)
                x = nl.load(logits[rows, cols], mask=valid)
                # the max of bf16 values is a bf16 value: reducing in the I/O dtype is exact
                # and takes the VectorE's bf16 fast path (N/2 cycles)
                neg_m = nisa.tensor_reduce(
                    nl.max, x, axis=1, negate=True, keepdims=True, dtype=logits.dtype, mask=valid
                )
                cmax[i_p, j, c + i_0] = nisa.tensor_scalar(neg_m, nl.multiply, -1.0, mask=rvalid)
                nisa.activation_reduce(
                    op=nl.exp,
                    data=x,
                    bias=neg_m,
                    reduce_op=nl.add,
                    reduce_res=csum[i_p, j, c + i_0],
                    dtype=logits.dtype,
                    mask=valid,
                )
        # combine the chunks of the block's row tiles at once (not per tile, so that VectorE
        # and ScalarE do not wait on each other between row tiles):
        # lse = M + log(sum_c s_c * exp(m_c - M))
        i_3 = nl.arange(pmax)[:, None, None] + pmax * (b * tb + nl.arange(tb)[None, :, None])
        valid3 = i_3 + 0 * nl.arange(nch)[None, None, :] < n
        neg_big = nisa.tensor_reduce(
            nl.max, cmax, axis=2, negate=True, keepdims=True, dtype=f32, mask=valid3
        )
        scale = nl.exp(nl.add(cmax, neg_big, dtype=f32, mask=valid3), dtype=f32, mask=valid3)
        prod = nl.multiply(scale, csum, dtype=f32, mask=valid3)
        total = nisa.tensor_reduce(nl.add, prod, axis=2, keepdims=True, dtype=f32, mask=valid3)
        lse3 = nl.subtract(nl.log(total, dtype=f32), neg_big, dtype=f32)
        lse = lse3[i_p, nl.arange(tb)[None, :], 0]  # [P, tb]
        ok = _valid_rows(tgt_all, v, valid_all)
        diff = nl.subtract(lse, x_t, dtype=f32, mask=valid_all)
        row_loss = nl.multiply(diff, ok, dtype=logits.dtype, mask=valid_all)
        nl.store(loss[rows_all], value=row_loss, mask=valid_all)
        nl.store(lse_out[rows_all], value=lse, mask=valid_all)
    return loss, lse_out


def _valid_rows(tgt, v: int, mask):
    """fp32, ``tgt``'s shape: 1 where ``0 <= t < V``, else 0."""
    below = nisa.tensor_scalar(tgt, nl.less, float(v), dtype=nl.float32, mask=mask)
    return nl.multiply(
        nisa.tensor_scalar(tgt, nl.greater_equal, 0.0, dtype=nl.float32, mask=mask),
        below,
        dtype=nl.float32,
        mask=mask,
    )


@nki.jit
def cross_entropy_backward_kernel(grad, logits, targets, lse):
    """``(softmax(logits) - onehot(targets)) * grad[:, None]`` with the forward's fp32
    ``lse`` [N] and fp32 ``grad`` [N] (the caller zeroes it for rows with an out-of-range
    target)."""
    n, v = logits.shape
    out = nl.ndarray((n, v), dtype=logits.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    tb, nb = _blocks(n, pmax)
    nch = math.ceil(v / CHUNK)
    ch = math.ceil(v / nch)
    f32 = nl.float32
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(ch)[None, :]
    i_0 = nl.arange(1)[None, :]
    flat = logits.reshape((n * v, 1))
    out_flat = out.reshape((n * v, 1))
    offsets = _row_offsets(v, pmax)

    for b in nl.affine_range(nb):
        rows_all = i_p + pmax * (b * tb + nl.arange(tb)[None, :])
        valid_all = rows_all < n
        tgt_all = nl.load(targets[rows_all], mask=valid_all)
        idx = _target_index(offsets, tgt_all, v, valid_all)
        neg_lse = nisa.tensor_scalar(
            nl.load(lse[rows_all], mask=valid_all), nl.multiply, -1.0, mask=valid_all
        )
        g = nl.load(grad[rows_all], mask=valid_all)
        x_t = nl.ndarray((pmax, tb), dtype=logits.dtype, buffer=nl.sbuf)
        for j in nl.affine_range(tb):
            t = b * tb + j
            rows = t * pmax + i_p
            rvalid = rows < n
            for part, src, m in _row_elements(flat, idx, t, j, n, v, pmax):
                x_t[part, j + i_0] = nl.load(src, mask=m)
            for c in nl.affine_range(nch):
                cols = c * ch + i_f
                valid = rvalid & (cols < v)
                x = nl.load(logits[rows, cols], mask=valid)
                p = nisa.activation(
                    op=nl.exp, data=x, bias=neg_lse[i_p, j + i_0], dtype=f32, mask=valid
                )
                y = nisa.tensor_scalar(
                    p, nl.multiply, g[i_p, j + i_0], dtype=logits.dtype,
                    engine=nisa.engine.gpsimd, mask=valid,
                )  # fmt: skip
                nl.store(out[rows, cols], value=y, mask=valid)
        # the target columns: (p_t - 1) * grad (p_t as the chunks computed it: exp(x_t - lse)),
        # written over p_t * grad by one indirect DMA (scatter) per row tile.  They come after
        # the block's tiles: a scatter's rows are only known at run time, so every store to
        # `out` before it must finish first, and the stores after it wait for it.
        p_t = nl.exp(nl.add(x_t, neg_lse, dtype=f32, mask=valid_all), dtype=f32, mask=valid_all)
        fix = nl.multiply(
            nl.subtract(p_t, 1.0, dtype=f32, mask=valid_all), g, dtype=logits.dtype,
            mask=valid_all,
        )  # fmt: skip
        for j in nl.affine_range(tb):
            for part, dst, m in _row_elements(out_flat, idx, b * tb + j, j, n, v, pmax):
                nl.store(dst, value=fix[part, j + i_0], mask=m)
    return out


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(per-row loss [N] in logits' dtype, logsumexp [N] float32)``; see ``cross_entropy``."""
    logits, t = _check("cross_entropy", logits, targets)
    return cross_entropy_kernel(logits, t)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-row cross-entropy ``logsumexp(logits[r]) - logits[r, targets[r]]`` (torch's
    ``F.cross_entropy(..., reduction="none")``; ``.mean()`` of it is the usual loss).

    ``logits``: [N, V], float32 or bfloat16 (numpy array or CPU torch tensor); the logsumexp is
    max-subtracted and accumulated in fp32, so any V up to 2**24 works (tiled in chunks of at
    most ``CHUNK`` columns; class indices are handled exactly in fp32 only up to 2**24).
    ``targets``: [N] class indices, an integer array (int32/int64, cast to int32) or a float
    array holding integers (rounded to the nearest integer).
    Rows whose target is outside ``[0, V)`` (e.g. ``-100``) are ignored: loss 0, gradient 0.
    Returns [N] in logits' dtype.  Raises ``ValueError`` for bad shapes and ``TypeError`` for an
    unsupported logits dtype.
    """
    return cross_entropy_forward(logits, targets)[0]


def cross_entropy_backward(
    grad: np.ndarray, logits: np.ndarray, targets: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Gradients of ``cross_entropy``: ``((softmax(logits) - onehot(targets)) * grad[:, None],
    zeros like targets)``; ``grad`` is [N] (the per-row loss gradient; ``1/N`` for a mean)."""
    logits_k, t = _check("cross_entropy_backward", logits, targets)
    if tuple(grad.shape) != (logits_k.shape[0],):
        raise ValueError(
            f"cross_entropy_backward: grad must have shape ({logits_k.shape[0]},), got {tuple(grad.shape)}"
        )
    _, lse = cross_entropy_kernel(logits_k, t)
    ignored = (t < 0) | (t >= logits_k.shape[1])
    g = np.where(ignored, 0.0, _to_numpy(grad).astype(np.float32)).astype(np.float32)
    g_logits = cross_entropy_backward_kernel(g, logits_k, t, lse)
    zeros = np.zeros(tuple(targets.shape), dtype=_to_numpy(targets).dtype)
    return g_logits, zeros


def _to_numpy(a: object) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        t = a.detach().cpu()
        return t.float().numpy() if t.is_floating_point() else t.numpy()
    return np.asarray(a)


def _check(fn: str, logits: np.ndarray, targets: np.ndarray):
    shape = tuple(logits.shape)
    if len(shape) != 2 or 0 in shape:
        raise ValueError(f"{fn}: logits must be a non-empty [N, V] array, got shape {shape}")
    if tuple(targets.shape) != (shape[0],):
        raise ValueError(f"{fn}: targets must have shape ({shape[0]},), got {tuple(targets.shape)}")
    if shape[1] > 1 << 24:
        raise ValueError(f"{fn}: at most 2**24 classes (fp32-exact indices), got V = {shape[1]}")
    name = dtypes.name(dtypes.as_dtype(logits.dtype))
    if name not in DTYPES:
        raise TypeError(f"{fn}: logits must be one of {', '.join(DTYPES)}; got {name}")
    t = _to_numpy(targets)
    if t.dtype.kind == "f" or dtypes.is_float(t.dtype):
        t = np.rint(t.astype(np.float64))
    t = np.clip(t.astype(np.int64), -1, shape[1]).astype(np.int32)  # out of range -> ignored
    return logits, t
