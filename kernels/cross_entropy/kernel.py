"""Cross-entropy of logits [N, V] against class indices [N], forward and backward.

Forward returns the **per-row** losses ``loss[r] = logsumexp(logits[r]) - logits[r, t[r]]``
(``reduction="none"``; take ``.mean()`` for the usual mean loss, whose gradient ``1/N`` then
flows into the backward) and, from ``cross_entropy_forward``, the fp32 logsumexp per row.
Rows whose target is outside ``[0, V)`` (e.g. torch's ``ignore_index=-100``) get loss 0 and a
zero gradient.

Mapping: rows on the 128 partitions (``affine_range`` over row tiles, the last masked); the
vocabulary in chunks of ``CHUNK`` columns (the last masked).  The chunks of a row tile are
independent (``affine_range``): chunk ``c`` writes its own column ``c`` of three small
[128, n_chunks] fp32 tiles, so there is no loop-carried dependency and the logits are read once:

1. VectorE ``tensor_reduce(max)``: the chunk max ``m_c``;
2. ScalarE ``activation_reduce(exp, bias=-m_c, reduce=add)``: ``s_c = sum exp(x - m_c)``;
3. VectorE ``range_select`` (keep the column ``t <= i < t + 1``, else -FLT_MAX, max-reduce):
   the target logit when it falls in this chunk.

Then per row tile, on [128, n_chunks]: ``M = max_c m_c``, ``lse = M + log(sum_c s_c
exp(m_c - M))``, target logit = max over the chunks, ``loss = (lse - x_t) * valid``.

Backward ``grad_logits = (softmax - onehot) * grad[r]``: ``cross_entropy_backward`` first runs
the forward for the logsumexp, then per chunk: ScalarE ``exp(x - lse)``; VectorE
``scalar_tensor_tensor((iota == t - c*CHUNK) - p)`` against a hoisted column-index iota;
GpSimd ``tensor_scalar(* -grad)`` rounded once to the logits' dtype.
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
CHUNK = 4096  # vocabulary columns per tile: 16 KiB (fp32) / 8 KiB (bf16) per partition
_FMAX = 3.4028234663852886e38


@nki.jit
def cross_entropy_kernel(logits, targets):
    """Per-row cross-entropy of ``logits`` [N, V] with int32 ``targets`` [N]; returns
    ``(loss [N] in logits' dtype, logsumexp [N] fp32)``."""
    n, v = logits.shape
    loss = nl.ndarray((n,), dtype=logits.dtype, buffer=nl.shared_hbm)
    lse_out = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    ch = min(v, CHUNK)
    nch = math.ceil(v / ch)
    f32 = nl.float32
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(ch)[None, :]
    i_0 = nl.arange(1)[None, :]
    i_c = nl.arange(nch)[None, :]
    chunk_base = nisa.iota(i_c * ch + 0 * i_p, dtype=f32)  # c * CHUNK in column c
    t2 = targets.reshape((n, 1))
    loss2 = loss.reshape((n, 1))
    lse2 = lse_out.reshape((n, 1))

    for t in nl.affine_range(math.ceil(n / pmax)):
        rows = t * pmax + i_p
        rvalid = rows < n
        tgt_i = nl.load(t2[rows, i_0], mask=rvalid)
        tgt = nisa.tensor_copy(tgt_i, dtype=f32, mask=rvalid)
        # per-chunk bounds t - c*CHUNK and t - c*CHUNK + 1, one column per chunk
        lo = nisa.tensor_scalar(chunk_base, nl.subtract, tgt, reverse0=True, mask=rvalid)
        hi = nisa.tensor_scalar(lo, nl.add, 1.0, mask=rvalid)
        cmax = nl.ndarray((pmax, nch), dtype=f32, buffer=nl.sbuf)
        csum = nl.ndarray((pmax, nch), dtype=f32, buffer=nl.sbuf)
        ctgt = nl.ndarray((pmax, nch), dtype=f32, buffer=nl.sbuf)
        for c in nl.affine_range(nch):
            cols = c * ch + i_f
            valid = rvalid & (cols < v)
            x = nl.load(logits[rows, cols], mask=valid)
            # the max of bf16 values is a bf16 value: reducing in the I/O dtype is exact and
            # takes the VectorE's bf16 fast path (N/2 cycles)
            neg_m = nisa.tensor_reduce(
                nl.max, x, axis=1, negate=True, keepdims=True, dtype=logits.dtype, mask=valid
            )
            cmax[i_p, c + i_0] = nisa.tensor_scalar(neg_m, nl.multiply, -1.0, mask=rvalid)
            nisa.activation_reduce(
                op=nl.exp,
                data=x,
                bias=neg_m,
                reduce_op=nl.add,
                reduce_res=csum[i_p, c + i_0],
                dtype=logits.dtype,
                mask=valid,
            )
            nisa.range_select(
                on_true_tile=x,
                comp_op0=nl.greater_equal,
                comp_op1=nl.less,
                bound0=lo[i_p, c + i_0],
                bound1=hi[i_p, c + i_0],
                reduce_op=nl.max,
                reduce_res=ctgt[i_p, c + i_0],
                dtype=logits.dtype,
                mask=valid,
            )
        # combine the chunks: lse = M + log(sum_c s_c * exp(m_c - M))
        neg_big = nisa.tensor_reduce(
            nl.max, cmax[i_p, i_c], axis=1, negate=True, keepdims=True, dtype=f32, mask=rvalid
        )
        scale = nisa.activation(op=nl.exp, data=cmax[i_p, i_c], bias=neg_big, mask=rvalid)
        prod = nisa.tensor_tensor(scale, csum[i_p, i_c], nl.multiply, dtype=f32, mask=rvalid)
        total = nisa.tensor_reduce(nl.add, prod, axis=1, keepdims=True, dtype=f32, mask=rvalid)
        log_total = nisa.activation(op=nl.log, data=total, dtype=f32, mask=rvalid)
        lse = nisa.tensor_tensor(log_total, neg_big, nl.subtract, dtype=f32, mask=rvalid)
        x_t = nisa.tensor_reduce(
            nl.max, ctgt[i_p, i_c], axis=1, keepdims=True, dtype=f32, mask=rvalid
        )
        # valid = (t >= 0) * (t < V)
        below = nisa.tensor_scalar(tgt, nl.less, float(v), mask=rvalid)
        ok = nisa.scalar_tensor_tensor(
            data=tgt, op0=nl.greater_equal, operand0=0.0, op1=nl.multiply, operand1=below,
            mask=rvalid,
        )  # fmt: skip
        row_loss = nisa.scalar_tensor_tensor(
            data=lse, op0=nl.subtract, operand0=x_t, op1=nl.multiply, operand1=ok,
            dtype=logits.dtype, mask=rvalid,
        )  # fmt: skip
        nl.store(loss2[rows, i_0], value=row_loss, mask=rvalid)
        nl.store(lse2[rows, i_0], value=lse, mask=rvalid)
    return loss, lse_out


@nki.jit
def cross_entropy_backward_kernel(grad, logits, targets, lse):
    """``(softmax(logits) - onehot(targets)) * grad[:, None]`` with the forward's fp32
    ``lse`` [N] and fp32 ``grad`` [N] (the caller zeroes it for rows with an out-of-range
    target)."""
    n, v = logits.shape
    out = nl.ndarray((n, v), dtype=logits.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    ch = min(v, CHUNK)
    nch = math.ceil(v / ch)
    f32 = nl.float32
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(ch)[None, :]
    i_0 = nl.arange(1)[None, :]
    iota = nisa.iota(i_f + 0 * i_p, dtype=f32)  # column index within a chunk, every row
    i_c = nl.arange(nch)[None, :]
    chunk_base = nisa.iota(i_c * ch + 0 * i_p, dtype=f32)  # c * CHUNK in column c

    for t in nl.affine_range(math.ceil(n / pmax)):
        rows = t * pmax + i_p
        rvalid = rows < n
        tgt_i = nl.load(targets.reshape((n, 1))[rows, i_0], mask=rvalid)
        tgt = nisa.tensor_copy(tgt_i, dtype=f32, mask=rvalid)
        t_loc = nisa.tensor_scalar(chunk_base, nl.subtract, tgt, reverse0=True, mask=rvalid)
        neg_lse = nisa.tensor_scalar(
            nl.load(lse.reshape((n, 1))[rows, i_0], mask=rvalid), nl.multiply, -1.0, mask=rvalid
        )
        neg_g = nisa.tensor_scalar(
            nl.load(grad.reshape((n, 1))[rows, i_0], mask=rvalid), nl.multiply, -1.0, mask=rvalid
        )
        for c in nl.affine_range(nch):
            cols = c * ch + i_f
            valid = rvalid & (cols < v)
            x = nl.load(logits[rows, cols], mask=valid)
            p = nisa.activation(op=nl.exp, data=x, bias=neg_lse, dtype=f32, mask=valid)
            d = nisa.scalar_tensor_tensor(
                data=iota, op0=nl.equal, operand0=t_loc[i_p, c + i_0], op1=nl.subtract, operand1=p,
                dtype=f32, mask=valid,
            )  # fmt: skip
            y = nisa.tensor_scalar(
                d, nl.multiply, neg_g, dtype=logits.dtype, engine=nisa.engine.gpsimd, mask=valid
            )
            nl.store(out[rows, cols], value=y, mask=valid)
    return out


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(per-row loss [N] in logits' dtype, logsumexp [N] float32)``; see ``cross_entropy``."""
    logits, t = _check("cross_entropy", logits, targets)
    return cross_entropy_kernel(logits, t)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-row cross-entropy ``logsumexp(logits[r]) - logits[r, targets[r]]`` (torch's
    ``F.cross_entropy(..., reduction="none")``; ``.mean()`` of it is the usual loss).

    ``logits``: [N, V], float32 or bfloat16 (numpy array or CPU torch tensor); the logsumexp is
    max-subtracted and accumulated in fp32, so any V works (tiled by ``CHUNK`` columns).
    ``targets``: [N] class indices, an integer array (cast to int32) or a float array holding
    integers (rounded to the nearest integer: the registry's example inputs are float).
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
    name = dtypes.name(dtypes.as_dtype(logits.dtype))
    if name not in DTYPES:
        raise TypeError(f"{fn}: logits must be one of {', '.join(DTYPES)}; got {name}")
    t = _to_numpy(targets)
    if t.dtype.kind == "f" or dtypes.is_float(t.dtype):
        t = np.rint(t.astype(np.float64))
    t = np.clip(t.astype(np.int64), -1, shape[1]).astype(np.int32)  # out of range -> ignored
    return logits, t
