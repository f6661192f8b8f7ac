"""RMSNorm: ``y = x / sqrt(mean(x**2, axis=-1) + eps) * weight``, its backward and the fused
residual variant ``add_rmsnorm``.

Rows go on the 128 partitions, one tile of 128 rows per iteration of an ``affine_range`` loop
(row tiles are independent); the ragged last tile is peeled off the loop with a static size,
so no instruction needs a mask.  Forward, per tile:

1. ScalarE ``activation_reduce``: square every element and sum along the free axis (fp32).
2. ScalarE ``activation``: ``rsqrt(sum * (1/D) + eps)``; the mean's scale and eps ride on the
   instruction's scale and bias, so no separate VectorE ops.
3. fp32: VectorE ``scalar_tensor_tensor`` ``(x * rstd) * weight``, rounded once.  16-bit:
   VectorE ``tensor_scalar`` ``x * rstd`` then ``tensor_tensor`` ``* weight``, both in the
   16-bit performance modes (N/4 + N/2 cycles instead of the fused op's 2N).

``add_rmsnorm`` adds a VectorE ``tensor_tensor`` ``h = x + residual`` (stored, then normalized).

Backward (``r = rstd``, ``gw = grad * weight``):
``grad_x = r * gw - x * r**3 * sum(gw * x) / D``, ``grad_weight = sum over rows of grad * x * r``.
GpSimd forms ``gw`` and ``grad * x``, VectorE ``gw * x`` (ScalarE sums it), the per-row
scalars and ``gw * r + x * coef``; TensorE reduces ``grad * x`` weighted by ``r`` across the
partitions (matmuls with the data chunk stationary and the (k, 1) ``r`` column moving),
accumulating ``grad_weight`` in PSUM over all row tiles.

``add_rmsnorm_backward`` recomputes ``h = x + residual`` per tile (VectorE, rounded as the
forward stored it), runs the same backward tile on ``h`` and adds ``grad_h`` (GpSimd, which
has spare time there); ``grad_x`` and ``grad_residual`` are equal and stored from one tile.

``weight`` is loaded once and broadcast across the partitions (on the TensorE) before the loop.
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
MAX_D = 8192  # x, x**2, y and the broadcast weight tiles must fit SBUF (192 KiB per partition)


@nki.jit
def rmsnorm_kernel(x, weight, eps):
    """RMSNorm of the rows of ``x`` [N, D] with ``weight`` [D]; returns [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    i_f = nl.arange(d)[None, :]

    # Loop invariants: weight broadcast to all partitions, and eps as a (P, 1) bias operand.
    w_tile = _broadcast_row(weight, d, pmax)
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        rstd = _rstd(x_tile, eps_tile[i_k, 0], d)
        y = _scale_rows(x_tile, rstd, w_tile[i_k, i_f], x.dtype)
        nl.store(out[r0 + i_k, i_f], value=y)

    for t in nl.affine_range(n // pmax):
        row_tile(t * pmax, pmax)
    if n % pmax:  # the ragged last tile, peeled so the loop body needs no mask
        row_tile(n // pmax * pmax, n % pmax)
    return out


@nki.jit
def add_rmsnorm_kernel(x, residual, weight, eps):
    """``h = x + residual``; returns (rmsnorm(h) * weight, h), both [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    new_res = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    i_f = nl.arange(d)[None, :]
    w_tile = _broadcast_row(weight, d, pmax)
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        r_tile = nl.load(residual[r0 + i_k, i_f])
        # the sum is rounded to x's dtype (it is also an output) and normalized as rounded
        h = nisa.tensor_tensor(x_tile, r_tile, nl.add, dtype=x.dtype)
        nl.store(new_res[r0 + i_k, i_f], value=h)
        rstd = _rstd(h, eps_tile[i_k, 0], d)
        y = _scale_rows(h, rstd, w_tile[i_k, i_f], x.dtype)
        nl.store(out[r0 + i_k, i_f], value=y)

    for t in nl.affine_range(n // pmax):
        row_tile(t * pmax, pmax)
    if n % pmax:
        row_tile(n // pmax * pmax, n % pmax)
    return out, new_res


@nki.jit
def rmsnorm_backward_kernel(grad, x, weight, eps):
    """Gradients of RMSNorm: returns (grad_x [N, D] in x's dtype, grad_weight [D]).

    With ``r = rsqrt(mean(x**2) + eps)`` per row and ``gw = grad * weight``:
    ``grad_x = r * gw - x * r**3 * sum(gw * x) / D`` and
    ``grad_weight = sum over rows of grad * x * r``.
    """
    n, d = x.shape
    gx_out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    gw_out = nl.ndarray((d,), dtype=weight.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    i_f = nl.arange(d)[None, :]
    w_tile = _broadcast_row(weight, d, pmax)
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)
    # grad_weight partials: acc[p, c] = sum over rows of grad * x * r at column c*128 + p
    acc = nl.zeros((pmax, math.ceil(d / pmax)), dtype=nl.float32, buffer=nl.psum)

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        g_tile = nl.load(grad[r0 + i_k, i_f])
        dx = _backward_rows(g_tile, x_tile, w_tile[i_k, i_f], eps_tile[i_k, 0], acc, k, d)
        nl.store(gx_out[r0 + i_k, i_f], value=dx)

    for t in nl.affine_range(n // pmax):
        row_tile(t * pmax, pmax)
    if n % pmax:
        row_tile(n // pmax * pmax, n % pmax)
    _column_sums_to(gw_out, acc, d)
    return gx_out, gw_out


@nki.jit
def add_rmsnorm_backward_kernel(grad_y, grad_h, x, residual, weight, eps):
    """Gradients of ``add_rmsnorm``: returns (grad_x, grad_residual, grad_weight).

    ``h = x + residual`` is recomputed (rounded to x's dtype, as the forward stored it); then
    ``grad_x = grad_residual = rmsnorm_backward(grad_y, h) + grad_h`` and ``grad_weight`` is
    rmsnorm's, on ``h``.  The two equal [N, D] gradients are stored from one tile.
    """
    n, d = x.shape
    gx_out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    gr_out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    gw_out = nl.ndarray((d,), dtype=weight.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    i_f = nl.arange(d)[None, :]
    w_tile = _broadcast_row(weight, d, pmax)
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)
    acc = nl.zeros((pmax, math.ceil(d / pmax)), dtype=nl.float32, buffer=nl.psum)

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        r_tile = nl.load(residual[r0 + i_k, i_f])
        gy_tile = nl.load(grad_y[r0 + i_k, i_f])
        h = nisa.tensor_tensor(x_tile, r_tile, nl.add, dtype=x.dtype)  # as the forward rounds it
        dh = _backward_rows(gy_tile, h, w_tile[i_k, i_f], eps_tile[i_k, 0], acc, k, d)
        # loaded last, so that at D = MAX_D in fp32 it is not live beside the backward's tiles
        gh_tile = nl.load(grad_h[r0 + i_k, i_f])
        # on GpSimd: VectorE carries most of the backward tile, GpSimd only two passes
        dx = nisa.tensor_tensor(dh, gh_tile, nl.add, dtype=x.dtype, engine=nisa.engine.gpsimd)
        nl.store(gx_out[r0 + i_k, i_f], value=dx)
        nl.store(gr_out[r0 + i_k, i_f], value=dx)

    for t in nl.affine_range(n // pmax):
        row_tile(t * pmax, pmax)
    if n % pmax:
        row_tile(n // pmax * pmax, n % pmax)
    _column_sums_to(gw_out, acc, d)
    return gx_out, gr_out, gw_out


def _backward_rows(g_tile, x_tile, w_tile, eps_col, acc, k, d):
    """RMSNorm backward of one row tile: returns ``grad_x`` (k, D) in x's dtype and adds the
    tile's ``grad * x * r`` column sums to the PSUM accumulator ``acc`` (grad_weight).

    GpSimd forms ``gw = g * w`` and ``g * x``, VectorE ``gw * x`` (ScalarE sums it), the per-row
    scalars and ``gw * r + x * coef``; TensorE reduces ``g * x`` weighted by ``r`` across the
    partitions."""
    dtype = x_tile.dtype
    rstd = _rstd(x_tile, eps_col, d)
    gw = nisa.tensor_tensor(g_tile, w_tile, nl.multiply, dtype=dtype, engine=nisa.engine.gpsimd)
    gx = nisa.tensor_tensor(g_tile, x_tile, nl.multiply, dtype=dtype, engine=nisa.engine.gpsimd)
    gwx = nisa.tensor_tensor(gw, x_tile, nl.multiply, dtype=dtype)
    dot = nl.ndarray((k, 1), dtype=nl.float32)
    nisa.activation_reduce(op=nl.copy, data=gwx, reduce_op=nl.add, reduce_res=dot)
    # per-row scalars, in x's dtype so the VectorE tensor_scalar runs in its 16-bit mode:
    # r, and coef = -r**3 * dot / D
    r_col = nisa.tensor_copy(rstd, dtype=dtype)
    r2 = nisa.tensor_scalar(
        rstd, nl.multiply, rstd, op1=nl.multiply, operand1=-1.0 / d, dtype=nl.float32
    )
    coef = nisa.tensor_scalar(r2, nl.multiply, rstd, op1=nl.multiply, operand1=dot, dtype=dtype)
    # grad_x = gw * r + x * coef
    gwr = nisa.tensor_scalar(gw, nl.multiply, r_col, dtype=dtype)
    xc = nisa.tensor_scalar(x_tile, nl.multiply, coef, dtype=dtype)
    dx = nisa.tensor_tensor(gwr, xc, nl.add, dtype=dtype)
    _accumulate_column_sums(acc, gx, r_col, k, d)
    return dx


def _rstd(x_tile, eps_col, d):
    """(k, 1) fp32 ``rsqrt(mean(x**2) + eps)``: ScalarE square + row sum, then ScalarE rsqrt
    with the 1/D scale and eps riding on the instruction's scale and bias."""
    sum_sq = nl.ndarray((x_tile.shape[0], 1), dtype=nl.float32)
    nisa.activation_reduce(op=nl.square, data=x_tile, reduce_op=nl.add, reduce_res=sum_sq)
    return nisa.activation(op=nl.rsqrt, data=sum_sq, bias=eps_col, scale=1.0 / d)


def _scale_rows(x_tile, rstd, w_tile, dtype):
    """``x * rstd * w`` rounded to ``dtype``.  fp32: one VectorE scalar_tensor_tensor.  16-bit:
    VectorE tensor_scalar then tensor_tensor, both in the 16-bit performance modes (one
    intermediate rounding; together about a third of the cost of the 2N-cycle fused op)."""
    if dtypes.as_dtype(dtype).itemsize == 4:
        return nisa.scalar_tensor_tensor(
            data=x_tile,
            op0=nl.multiply,
            operand0=rstd,
            op1=nl.multiply,
            operand1=w_tile,
            dtype=dtype,
        )
    xn = nisa.tensor_scalar(x_tile, nl.multiply, rstd, dtype=dtype)
    return nisa.tensor_tensor(xn, w_tile, nl.multiply, dtype=dtype)


def rmsnorm(x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    ``x``: [..., D] (any number of leading dims, flattened to rows); ``weight``: [D];
    numpy arrays or CPU torch tensors, both float32 or both bfloat16; 1 <= D <= 8192.
    Returns an array (tensor) of x's shape and dtype.  Raises ``ValueError`` for mismatched
    shapes and ``TypeError`` for an unsupported or mixed dtype.
    """
    rows, d = _check("rmsnorm", x, weight)
    if rows == 0:  # nothing to normalize; an empty kernel launch is not legal
        return _copy(x)
    y = rmsnorm_kernel(x.reshape((rows, d)), weight, float(eps))
    return y.reshape(tuple(x.shape))


def add_rmsnorm(
    x: np.ndarray, residual: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Fused residual add + RMSNorm: ``h = x + residual``; returns ``(rmsnorm(h, weight), h)``.

    ``h`` is rounded to x's dtype and normalized as rounded (what an unfused ``x + residual``
    followed by ``rmsnorm`` computes).  ``x``, ``residual``: [..., D] of one shape; ``weight``:
    [D]; all float32 or all bfloat16; 1 <= D <= 8192.  Raises ``ValueError``/``TypeError``.
    """
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(
            f"add_rmsnorm: residual must have x's shape {tuple(x.shape)}, got "
            f"{tuple(residual.shape)}"
        )
    rows, d = _check("add_rmsnorm", x, weight, residual)
    if rows == 0:
        return _copy(x), _copy(x)
    y, h = add_rmsnorm_kernel(x.reshape((rows, d)), residual.reshape((rows, d)), weight, float(eps))
    return y.reshape(tuple(x.shape)), h.reshape(tuple(x.shape))


def rmsnorm_backward(
    grad_out: np.ndarray, x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of :func:`rmsnorm`: ``(grad_x, grad_weight)`` for ``grad_out`` = dL/dy.

    ``grad_out`` and ``x``: [..., D] of one shape; ``weight``: [D]; all float32 or all
    bfloat16; 1 <= D <= 8192.  ``grad_weight`` sums over every row (TensorE column sums
    accumulated in PSUM across row tiles).  Raises ``ValueError``/``TypeError``.
    """
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ValueError(
            f"rmsnorm_backward: grad_out must have x's shape {tuple(x.shape)}, got "
            f"{tuple(grad_out.shape)}"
        )
    rows, d = _check("rmsnorm_backward", x, weight, grad_out)
    if rows == 0:
        zeros = weight * 0
        return _copy(x), zeros
    gx, gw = rmsnorm_backward_kernel(
        grad_out.reshape((rows, d)), x.reshape((rows, d)), weight, float(eps)
    )
    return gx.reshape(tuple(x.shape)), gw


def add_rmsnorm_backward(
    grad_y: np.ndarray,
    grad_h: np.ndarray,
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray,
    *,
    eps: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`add_rmsnorm`: ``(grad_x, grad_residual, grad_weight)`` for
    ``grad_y`` = dL/dy and ``grad_h`` = dL/dh of its two outputs ``(y, h)``.

    With ``h = x + residual`` (recomputed, rounded to x's dtype as the forward does):
    ``grad_x = grad_residual = rmsnorm_backward(grad_y, h)[0] + grad_h`` (equal values, two
    arrays) and ``grad_weight = rmsnorm_backward(grad_y, h)[1]``.  ``grad_y``, ``grad_h``,
    ``x``, ``residual``: [..., D] of one shape; ``weight``: [D]; all float32 or all bfloat16;
    1 <= D <= 8192.  Raises ``ValueError`` for mismatched shapes, ``TypeError`` for dtypes.
    """
    for label, a in (("grad_y", grad_y), ("grad_h", grad_h), ("residual", residual)):
        if tuple(a.shape) != tuple(x.shape):
            raise ValueError(
                f"add_rmsnorm_backward: {label} must have x's shape {tuple(x.shape)}, got "
                f"{tuple(a.shape)}"
            )
    rows, d = _check("add_rmsnorm_backward", x, weight, residual, grad_y, grad_h)
    if rows == 0:
        return _copy(x), _copy(x), weight * 0
    flat = (rows, d)
    gx, gr, gw = add_rmsnorm_backward_kernel(
        grad_y.reshape(flat),
        grad_h.reshape(flat),
        x.reshape(flat),
        residual.reshape(flat),
        weight,
        float(eps),
    )
    return gx.reshape(tuple(x.shape)), gr.reshape(tuple(x.shape)), gw


def _check(fn: str, x: np.ndarray, weight: np.ndarray, *others: np.ndarray) -> tuple[int, int]:
    """Validate shapes/dtypes; returns (rows, D)."""
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError(f"{fn}: x must have at least one dimension")
    d = shape[-1]
    if tuple(weight.shape) != (d,):
        raise ValueError(
            f"{fn}: weight must have shape ({d},) to match x {shape}, got {tuple(weight.shape)}"
        )
    if not 1 <= d <= MAX_D:
        raise ValueError(f"{fn}: the last dimension must be in [1, {MAX_D}], got {d}")
    _check_dtypes(fn, x, weight, *others)
    return math.prod(shape[:-1]), d


def _copy(x: np.ndarray) -> np.ndarray:
    return x.copy() if hasattr(x, "copy") else x.clone()


def _broadcast_row(v, d, pmax):
    """Load a [D] vector once and broadcast it to all partitions (TensorE)."""
    return nl.load(v.reshape((1, d))[nl.arange(1)[:, None], nl.arange(d)[None, :]]).broadcast_to(
        (pmax, d)
    )


def _column_sums_to(out, acc, d):
    """Store a (128, ceil(D/128)) fp32 PSUM accumulator of column sums (column c*128 + p at
    [p, c]) into the [D] HBM tensor ``out``, cast to out's dtype."""
    n_chunks = acc.shape[1]
    res = nl.ndarray((nl.tile_size.pmax, n_chunks), dtype=out.dtype)
    res[...] = nisa.tensor_copy(acc, dtype=out.dtype)
    i_p = nl.arange(nl.tile_size.pmax)[:, None]
    i_c = nl.arange(n_chunks)[None, :]
    nl.store(
        out[i_c * nl.tile_size.pmax + i_p], value=res, mask=(i_c * nl.tile_size.pmax + i_p < d)
    )


def _accumulate_column_sums(acc, data, ones, k, d):
    """acc[p, c] += sum over the k partitions of data[:, c*128 + p] (TensorE, ones-vector
    matmul: the data chunk is the stationary operand, a (k, 1) ones column the moving one)."""
    pmax = nl.tile_size.pmax
    i_k = nl.arange(k)[:, None]
    for c in range(math.ceil(d / pmax)):
        w = min(pmax, d - c * pmax)
        acc[nl.arange(w)[:, None], c] += nisa.nc_matmul(
            data[i_k, c * pmax + nl.arange(w)[None, :]], ones[i_k, 0]
        )


def _check_dtypes(fn: str, *arrays: np.ndarray) -> None:
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in arrays}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
