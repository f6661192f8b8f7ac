"""LayerNorm: ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, and
its backward (grad_x, grad_weight, grad_bias).

Rows go on the 128 partitions: full 128-row tiles two per ``affine_range`` iteration with
their stages interleaved in program order (each engine runs its instructions in order, so a
tile that goes VectorE -> ScalarE -> VectorE would leave VectorE idle during its ScalarE
step); the ragged last tile is peeled off the loop with a static size, so nothing is masked.

Forward, per pair of row tiles (one tile per iteration when a row is over 16 KiB):

1. Statistics, numerically stable (no ``E[x^2] - E[x]^2`` cancellation), split between the
   engines so that neither VectorE nor ScalarE carries all of them: the first tile of the
   pair on ScalarE in two passes (``activation_reduce``: the row sum, then the sum of
   ``(x - mean)^2``), the second on VectorE (``bn_stats`` on each chunk of up to 512 elements
   into one stats tile, ``bn_aggr``: Chan's parallel variance).
2. ScalarE ``activation``: ``rstd = rsqrt(var + eps)`` (eps on the bias port), then
   ``xhat = x * rstd + (-mean * rstd)`` in one pass, in fp32.
3. ``xhat * weight`` on VectorE, in place, with ``weight`` read from PSUM: a tensor_tensor
   with one PSUM operand costs N cycles instead of 2N.  The weight is broadcast into PSUM once
   before the loop (TensorE ones-row matmuls, one 2 KiB bank per 512 columns, so up to
   ``PSUM_COLS`` columns); further columns alternate between VectorE (weight from SBUF) and
   GpSimd.
4. ``+ bias`` on GpSimd, rounded once to x's dtype, so entries where ``xhat * weight`` and
   ``bias`` nearly cancel keep their relative accuracy.

Backward, per tile (``gw = grad * weight``):
``grad_x = rstd * (gw - sum(gw)/D - xhat * sum(gw * xhat)/D)``; ``grad_weight`` and
``grad_bias`` are the column sums of ``grad * xhat`` and ``grad`` over all rows, accumulated in
PSUM across row tiles by TensorE ones-vector matmuls.
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
GROUP = 2  # row tiles per loop iteration, stages interleaved (see _for_row_tiles)
PAIR_ROW_BYTES = 16384  # forward: rows up to this size go two tiles per iteration
CHUNK = 512  # forward: columns per xhat * weight instruction (one fp32 PSUM bank)
PSUM_COLS = 8 * CHUNK  # forward: weight columns kept in PSUM (all 8 banks of 2 KiB)
MAX_D = 8192  # x, the fp32 intermediate, y and two broadcast parameter tiles must fit SBUF


@nki.jit
def layernorm_kernel(x, weight, bias, eps):
    """LayerNorm of the rows of ``x`` [N, D] with ``weight``/``bias`` [D]; returns [N, D]."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    f32 = nl.float32
    i_f = nl.arange(d)[None, :]
    i_1 = nl.arange(1)[:, None]

    # Loop invariants: the weight in PSUM (TensorE broadcast of the row, fp32, exact), the rest
    # of it and the bias broadcast to all partitions in SBUF, eps as a (P, 1) bias operand.
    w_row = nl.load(weight.reshape((1, d))[i_1, i_f])
    ones = nl.full((1, pmax), 1.0, dtype=x.dtype)
    w_psum = []
    for c0 in range(0, min(d, PSUM_COLS), CHUNK):
        cw = min(CHUNK, d - c0)
        wp = nl.zeros((pmax, cw), dtype=f32, buffer=nl.psum)
        wp += nisa.nc_matmul(ones, w_row[i_1, c0 + nl.arange(cw)[None, :]])
        w_psum.append(wp)
    w_rest = None
    if d > PSUM_COLS:
        i_r = PSUM_COLS + nl.arange(d - PSUM_COLS)[None, :]
        w_rest = nl.load(weight.reshape((1, d))[i_1, i_r]).broadcast_to((pmax, d - PSUM_COLS))
    b_tile = _broadcast_row(bias, d, pmax)
    eps_tile = nl.full((pmax, 1), eps, dtype=f32)

    def row_tile(r0, k, slot):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        y = nl.ndarray((k, d), dtype=x.dtype)
        # the first tile of a pair takes its statistics on ScalarE, the others on VectorE
        if slot == 0:
            stats = _stats_scalar(x_tile, eps_tile[i_k, 0], y)
        else:
            stats = _stats(x_tile, eps_tile[i_k, 0])
        rstd, nmr = yield from stats
        xhat = _normalize(x_tile, rstd, nmr, f32)
        yield
        for j, c0 in enumerate(range(0, d, CHUNK)):
            cw = min(CHUNK, d - c0)
            i_c = c0 + nl.arange(cw)[None, :]
            i_w = nl.arange(cw)[None, :]
            if j < len(w_psum):
                w, eng = w_psum[j][i_k, i_w], nisa.engine.vector
            else:  # past the PSUM columns: alternate VectorE and GpSimd, weight from SBUF
                w = w_rest[i_k, i_c - PSUM_COLS]
                eng = nisa.engine.vector if j % 2 == 0 else nisa.engine.gpsimd
            xhat[i_k, i_c] = nisa.tensor_tensor(
                xhat[i_k, i_c], w, nl.multiply, dtype=f32, engine=eng
            )
            y[i_k, i_c] = nisa.tensor_tensor(
                xhat[i_k, i_c], b_tile[i_k, i_c], nl.add, dtype=x.dtype, engine=nisa.engine.gpsimd
            )
        nl.store(out[r0 + i_k, i_f], value=y)

    _for_row_tiles(n, row_tile, GROUP if d * x.itemsize <= PAIR_ROW_BYTES else 1)
    return out


@nki.jit
def layernorm_backward_kernel(grad, x, weight, eps):
    """Gradients of LayerNorm: (grad_x [N, D], grad_weight [D], grad_bias [D])."""
    n, d = x.shape
    gx_out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    gw_out = nl.ndarray((d,), dtype=weight.dtype, buffer=nl.shared_hbm)
    gb_out = nl.ndarray((d,), dtype=weight.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    i_f = nl.arange(d)[None, :]
    w_tile = _broadcast_row(weight, d, pmax)
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)
    ones = nl.full((pmax, 1), 1.0, dtype=x.dtype)
    n_chunks = math.ceil(d / pmax)
    # column sums over all rows, column c*128 + p at [p, c]: grad * xhat and grad
    acc_w = nl.zeros((pmax, n_chunks), dtype=nl.float32, buffer=nl.psum)
    acc_b = nl.zeros((pmax, n_chunks), dtype=nl.float32, buffer=nl.psum)

    def row_tile(r0, k, slot):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        g_tile = nl.load(grad[r0 + i_k, i_f])
        rstd, nmr = yield from _stats(x_tile, eps_tile[i_k, 0])
        gw = nisa.tensor_tensor(
            g_tile, w_tile[i_k, i_f], nl.multiply, dtype=x.dtype, engine=nisa.engine.gpsimd
        )
        _accumulate_column_sums(acc_b, g_tile, ones, k, d)
        yield
        xhat = _normalize(x_tile, rstd, nmr, x.dtype)
        s1 = nl.ndarray((k, 1), dtype=nl.float32)  # sum(gw), ScalarE
        nisa.activation_reduce(op=nl.copy, data=gw, reduce_op=nl.add, reduce_res=s1)
        yield
        gxh = nisa.tensor_tensor(
            g_tile, xhat, nl.multiply, dtype=x.dtype, engine=nisa.engine.gpsimd
        )
        _accumulate_column_sums(acc_w, gxh, ones, k, d)
        p = nisa.tensor_tensor(gw, xhat, nl.multiply, dtype=x.dtype)
        s2 = nisa.tensor_reduce(nl.add, p, axis=1, keepdims=True, dtype=x.dtype)
        # t = xhat * (-s2/D) + (-s1/D), scalars in x's dtype (16-bit tensor_scalar mode)
        c2 = nisa.tensor_scalar(s2, nl.multiply, -1.0 / d, dtype=x.dtype)
        c1 = nisa.tensor_scalar(s1, nl.multiply, -1.0 / d, dtype=x.dtype)
        t = nisa.tensor_scalar(xhat, nl.multiply, c2, op1=nl.add, operand1=c1, dtype=x.dtype)
        u = nisa.tensor_tensor(gw, t, nl.add, dtype=x.dtype, engine=nisa.engine.gpsimd)
        yield
        dx = nisa.activation(op=nl.copy, data=u, scale=rstd, dtype=x.dtype)  # ScalarE
        nl.store(gx_out[r0 + i_k, i_f], value=dx)

    # one tile per iteration for the longest fp32 rows (two would not fit SBUF)
    _for_row_tiles(n, row_tile, GROUP if d * dtypes.as_dtype(x.dtype).itemsize <= 16384 else 1)
    _column_sums_to(gw_out, acc_w, d)
    _column_sums_to(gb_out, acc_b, d)
    return gx_out, gw_out, gb_out


def _stats(x_tile, eps_col):
    """(rstd, -mean * rstd), both (k, 1) fp32: VectorE bn_stats/bn_aggr, ScalarE rsqrt."""
    k, d = x_tile.shape
    chunk = min(d, nl.tile_size.bn_stats_fmax)
    n_chunks = math.ceil(d / chunk)
    i_k = nl.arange(k)[:, None]
    i_stat = nl.arange(6)[None, :]
    stats = nl.ndarray((k, 6 * n_chunks), dtype=nl.float32)
    for c in range(n_chunks):  # unrolled: the last chunk may be shorter
        w = min(chunk, d - c * chunk)
        stats[i_k, c * 6 + i_stat] = nisa.bn_stats(
            x_tile[i_k, c * chunk + nl.arange(w)[None, :]], dtype=nl.float32
        )
    mean_var = nisa.bn_aggr(stats)
    neg_mean = nisa.tensor_scalar(mean_var[i_k, 0], nl.multiply, -1.0, dtype=nl.float32)
    yield  # the rest is ScalarE work: a new stage, so ScalarE does not wait for the next tile
    rstd = nisa.activation(op=nl.rsqrt, data=mean_var[i_k, 1], bias=eps_col)
    nmr = nisa.activation(op=nl.copy, data=neg_mean, scale=rstd)
    return rstd, nmr


def _stats_scalar(x_tile, eps_col, scratch):
    """(rstd, -mean * rstd), both (k, 1) fp32, from two ScalarE passes: the row sum, then the
    sum of ``(x - mean)^2`` (the textbook two-pass variance).  The elementwise outputs of the
    passes are not needed; they go to ``scratch`` (the tile's output, written later)."""
    k, d = x_tile.shape
    f32 = nl.float32
    row_sum = nl.ndarray((k, 1), dtype=f32)
    scratch[...] = nisa.activation_reduce(
        op=nl.copy, data=x_tile, reduce_op=nl.add, reduce_res=row_sum, dtype=scratch.dtype
    )
    neg_mean = nisa.activation(op=nl.copy, data=row_sum, scale=-1.0 / d, dtype=f32)
    sq_sum = nl.ndarray((k, 1), dtype=f32)
    scratch[...] = nisa.activation_reduce(
        op=nl.square,
        data=x_tile,
        bias=neg_mean,
        reduce_op=nl.add,
        reduce_res=sq_sum,
        dtype=scratch.dtype,
    )
    yield
    rstd = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / d, bias=eps_col)
    nmr = nisa.activation(op=nl.copy, data=neg_mean, scale=rstd)
    return rstd, nmr


def _normalize(x_tile, rstd, nmr, dtype):
    """ScalarE ``x * rstd + (-mean * rstd)`` in one pass."""
    return nisa.activation(op=nl.copy, data=x_tile, scale=rstd, bias=nmr, dtype=dtype)


def _for_row_tiles(n, body, group=2):
    """Run ``body(first_row, rows, slot)`` (a generator; each ``yield`` ends a stage) for every
    128-row tile: full tiles ``group`` per ``affine_range`` iteration with their stages
    interleaved in program order (``slot`` = the tile's place in the group; None when the group
    is one tile), then the leftover full tiles and the ragged last one after the loop (slot
    None)."""
    pmax = nl.tile_size.pmax
    full = n // pmax
    for t in nl.affine_range(full // group):
        _interleave(
            [body((t * group + u) * pmax, pmax, u if group > 1 else None) for u in range(group)]
        )
    tail = [body(u * pmax, pmax, None) for u in range(full // group * group, full)]
    if n % pmax:
        tail.append(body(full * pmax, n % pmax, None))
    _interleave(tail)


def _interleave(stages) -> None:
    """Advance the generators round-robin until all are exhausted."""
    live = list(stages)
    while live:
        live = [g for g in live if next(g, _DONE) is not _DONE]


_DONE = object()


def _broadcast_row(v, d, pmax):
    """Load a [D] vector once and broadcast it to all partitions (TensorE)."""
    row = nl.load(v.reshape((1, d))[nl.arange(1)[:, None], nl.arange(d)[None, :]])
    return row.broadcast_to((pmax, d))


def _accumulate_column_sums(acc, data, col, k, d):
    """``acc[p, c] += sum_i data[i, c*128 + p] * col[i]`` over the k partitions (TensorE: the
    data chunk is the stationary operand, the (k, 1) column the moving one)."""
    pmax = nl.tile_size.pmax
    i_k = nl.arange(k)[:, None]
    for c in range(math.ceil(d / pmax)):
        w = min(pmax, d - c * pmax)
        acc[nl.arange(w)[:, None], c] += nisa.nc_matmul(
            data[i_k, c * pmax + nl.arange(w)[None, :]], col[i_k, 0]
        )


def _column_sums_to(out, acc, d):
    """Store the (128, ceil(D/128)) PSUM column sums into the [D] tensor ``out``."""
    pmax = nl.tile_size.pmax
    res = nl.ndarray(acc.shape, dtype=out.dtype)
    res[...] = nisa.tensor_copy(acc, dtype=out.dtype)
    i_p = nl.arange(pmax)[:, None]
    i_c = nl.arange(acc.shape[1])[None, :]
    nl.store(out[i_c * pmax + i_p], value=res, mask=(i_c * pmax + i_p < d))


def layernorm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, eps: float = 1e-5
) -> np.ndarray:
    """LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``
    (population variance, as ``torch.nn.functional.layer_norm``).

    ``x``: [..., D] (leading dims flattened to rows); ``weight``, ``bias``: [D]; numpy arrays or
    CPU torch tensors, all float32 or all bfloat16; 1 <= D <= 8192.  Returns x's shape and dtype.
    Raises ``ValueError`` for mismatched shapes and ``TypeError`` for an unsupported or mixed dtype.
    """
    rows, d = _check("layernorm", x, weight, bias)
    if rows == 0:  # nothing to normalize; an empty kernel launch is not legal
        return _copy(x)
    y = layernorm_kernel(x.reshape((rows, d)), weight, bias, float(eps))
    return y.reshape(tuple(x.shape))


def _check(fn: str, x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> tuple[int, int]:
    """Validate shapes/dtypes; returns (rows, D)."""
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError(f"{fn}: x must have at least one dimension")
    d = shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if tuple(p.shape) != (d,):
            raise ValueError(
                f"{fn}: {name} must have shape ({d},) to match x {shape}, got {tuple(p.shape)}"
            )
    if not 1 <= d <= MAX_D:
        raise ValueError(f"{fn}: the last dimension must be in [1, {MAX_D}], got {d}")
    _check_dtypes(fn, x, weight, bias)
    return math.prod(shape[:-1]), d


def _copy(x: np.ndarray) -> np.ndarray:
    return x.copy() if hasattr(x, "copy") else x.clone()


def _check_dtypes(fn: str, *arrays: np.ndarray) -> None:
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in arrays}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )


def layernorm_backward(
    grad_out: np.ndarray, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`layernorm`: ``(grad_x, grad_weight, grad_bias)`` for ``grad_out``.

    Shapes and dtypes as for :func:`layernorm`, ``grad_out`` like ``x``.  ``grad_weight`` and
    ``grad_bias`` sum over every row.  Raises ``ValueError``/``TypeError``.
    """
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ValueError(
            f"layernorm_backward: grad_out must have x's shape {tuple(x.shape)}, got "
            f"{tuple(grad_out.shape)}"
        )
    rows, d = _check("layernorm_backward", x, weight, bias)
    _check_dtypes("layernorm_backward", x, grad_out)
    shape = tuple(x.shape)
    if rows == 0:
        return _copy(x), weight * 0, bias * 0
    gx, gw, gb = layernorm_backward_kernel(
        grad_out.reshape((rows, d)), x.reshape((rows, d)), weight, float(eps)
    )
    return gx.reshape(shape), gw, gb
