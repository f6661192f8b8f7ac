"""Row softmax: ``y = exp(x - max(x)) / sum(exp(x - max(x)))`` over the last dimension, with an
optional causal mask, and its backward ``grad_x = y * (grad - sum(grad * y))``.

Rows go on the 128 partitions (``affine_range`` over row tiles; the ragged last tile is peeled
off the loop, so no instruction needs a mask).  Per tile of the forward:

0. (causal only) GpSimd ``affine_select``: columns ``j > i + offset`` become ``-inf``.
1. VectorE ``tensor_reduce``: ``-max(x)`` per row, in x's dtype (the max of 16-bit values is
   exact in 16 bits, and the 16-bit reduce runs at twice the fp32 rate); ``negate=True`` puts
   the sign flip in the reduction, so it feeds the next instruction's bias directly.
2. ScalarE ``activation_reduce``: ``exp(x + (-max))`` with the row sum (fp32) accumulated by the
   same instruction.
3. VectorE ``reciprocal`` of the (P, 1) sums: one division per row instead of per element.
4. VectorE ``tensor_scalar``: ``exp * (1/sum)``, rounded once to x's dtype.

The backward recomputes ``y`` the same way over x's tile (its inputs are ``grad`` and ``x``),
then ``s = sum(grad * y)`` (GpSimd product over grad's tile, ScalarE row sum) and
``grad_x = grad * y - s * y`` with ``-s * y`` a TensorE ``diag(-s) @ y`` in PSUM, which the
VectorE adds to ``grad * y`` (fp32) or TensorE accumulates ``grad * y`` into too (16-bit) (see
:func:`_backward_rows`).
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit import dtypes

# Entry points take numpy arrays or CPU torch tensors (annotated as numpy) and return the same kind.

DTYPES = ("float32", "bfloat16", "float16")
MAX_D = 16384  # x, exp(x) in fp32 and y must fit SBUF (192 KiB per partition)
MAX_D_BACKWARD = 8192  # the backward also holds grad and grad * y
MM_COLS = 512  # TensorE moving free size: one 2 KiB PSUM bank of fp32


@nki.jit
def softmax_kernel(x, causal, offset):
    """Softmax of each row of ``x`` [B, S, D]; returns [B, S, D] in x's dtype.  With ``causal``,
    row i of each [S, D] slice keeps columns ``j <= i + offset`` (the rest become 0)."""
    b, n, d = x.shape
    out = nl.ndarray((b, n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(d)[None, :]

    def row_tile(bi, r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[bi, r0 + i_k, i_f])
        y = yield from _softmax_rows(x_tile, r0, causal, offset)
        nl.store(out[bi, r0 + i_k, i_f], value=y)

    _for_row_tiles(b, n, row_tile, _group(d, x.dtype, 4))
    return out


@nki.jit
def softmax_backward_kernel(grad, x, causal, offset):
    """``grad_x = y * (grad - sum(grad * y))`` with ``y = softmax(x)`` recomputed; [B, S, D]."""
    b, n, d = x.shape
    out = nl.ndarray((b, n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(d)[None, :]
    # for the diagonal matmuls of the last stage, in x's dtype (exact)
    ident = nl.load(nl.shared_identity_matrix(nl.tile_size.pmax, dtype=x.dtype))

    def row_tile(bi, r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[bi, r0 + i_k, i_f])
        g_tile = nl.load(grad[bi, r0 + i_k, i_f])
        yield from _backward_rows(x_tile, g_tile, r0, causal, offset, ident)
        nl.store(out[bi, r0 + i_k, i_f], value=g_tile)

    _for_row_tiles(b, n, row_tile, _group(d, x.dtype, 2, budget=65536))
    return out


def _for_row_tiles(b, n, body, group):
    """Run ``body(batch, first_row, rows)`` for every 128-row tile of every batch.

    ``body`` is a generator function; each ``yield`` ends one stage of its tile.  Full tiles
    go ``group`` per ``affine_range`` iteration with their stages interleaved in program
    order (stage 1 of every tile, then stage 2 of every tile, ...): each engine runs its
    instructions in program order, so an engine that works twice on one tile (VectorE before
    and after the ScalarE exp) would otherwise idle while the other engine works.  Tiles left
    over, including the ragged last one (peeled with a static size, so no instruction needs a
    mask), run after the loop.
    """
    pmax = nl.tile_size.pmax
    full = n // pmax
    for bi in nl.affine_range(b):
        for t in nl.affine_range(full // group):
            _interleave([body(bi, (t * group + u) * pmax, pmax) for u in range(group)])
        tail = [body(bi, u * pmax, pmax) for u in range(full // group * group, full)]
        if n % pmax:
            tail.append(body(bi, full * pmax, n % pmax))
        _interleave(tail)


def _interleave(stages) -> None:
    """Advance the generators round-robin until all are exhausted (traces their stages in
    interleaved program order)."""
    live = list(stages)
    while live:
        live = [g for g in live if next(g, _DONE) is not _DONE]


_DONE = object()


def _softmax_rows(x_tile, r0, causal, offset):
    """Softmax of the rows of an SBUF tile (row i of the tile is row ``r0 + i``); x's dtype."""
    k, d = x_tile.shape
    dtype = x_tile.dtype
    if causal:
        i_k = nl.arange(k)[:, None]
        i_f = nl.arange(d)[None, :]
        x_tile = nisa.affine_select(r0 + i_k + offset - i_f >= 0, x_tile, -np.inf)
    # 16-bit: the max is exact in the input dtype and the 16-bit reduce is twice as fast
    red_dtype = dtype if _is_16bit(dtype) else nl.float32
    neg_max = nisa.tensor_reduce(
        nl.max, x_tile, axis=1, negate=True, keepdims=True, dtype=red_dtype
    )
    yield
    row_sum = nl.ndarray((k, 1), dtype=nl.float32)
    exp_tile = nisa.activation_reduce(
        op=nl.exp,
        data=x_tile,
        bias=neg_max,
        reduce_op=nl.add,
        reduce_res=row_sum,
        dtype=red_dtype,
    )
    # 16-bit: 1/sum rounded to x's dtype so the multiply runs in the 16-bit tensor_scalar mode
    # (4x); exp, 1/sum and the product are each rounded once (<= 1.5 ulp together)
    inv_sum = nisa.reciprocal(row_sum, dtype=red_dtype)
    return nisa.tensor_scalar(exp_tile, nl.multiply, inv_sum, dtype=dtype)


def _backward_rows(x_tile, g_tile, r0, causal, offset, ident):
    """Softmax backward of one row tile (row i of the tiles is row ``r0 + i``), a generator
    whose ``yield``s end its stages.  Writes ``y`` over ``x_tile``, then ``grad * y`` and
    finally ``grad_x`` over ``g_tile``, so a row tile holds two row-sized tiles.

    ``grad_x = y * (grad - s) = grad * y - s * y`` with ``s = sum(grad * y)``: GpSimd forms
    ``grad * y`` and ScalarE sums it; TensorE forms ``-s * y`` as ``diag(-s) @ y`` in PSUM
    (exact: one nonzero term per sum).  fp32: VectorE adds ``grad * y`` to the PSUM operand
    (N cycles, not the 2N of an fp32 ``scalar_tensor_tensor``).  16-bit: TensorE also adds
    ``I @ (grad * y)`` in PSUM and VectorE copies the sum out (N/2 cycles).
    """
    k, d = x_tile.shape
    dtype = x_tile.dtype
    half = _is_16bit(dtype)
    i_k = nl.arange(k)[:, None]
    i_f = nl.arange(d)[None, :]
    if causal:
        x_tile[...] = nisa.affine_select(r0 + i_k + offset - i_f >= 0, x_tile, -np.inf)
    red_dtype = dtype if half else nl.float32  # as in _softmax_rows
    neg_max = nisa.tensor_reduce(
        nl.max, x_tile, axis=1, negate=True, keepdims=True, dtype=red_dtype
    )
    yield
    row_sum = nl.ndarray((k, 1), dtype=nl.float32, buffer=nl.sbuf)
    x_tile[...] = nisa.activation_reduce(
        op=nl.exp, data=x_tile, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum
    )
    inv_sum = nisa.reciprocal(row_sum, dtype=red_dtype)
    if half:  # VectorE's 16-bit tensor_scalar mode (N/4 cycles)
        x_tile[...] = nisa.tensor_scalar(x_tile, nl.multiply, inv_sum, dtype=dtype)
    else:  # ScalarE (N cycles at 1.2 GHz) keeps the fp32 pass off the busier VectorE
        x_tile[...] = nisa.activation(op=nl.copy, data=x_tile, scale=inv_sum, dtype=dtype)
    yield
    # grad * y over grad (not needed again); ScalarE's copy of it is discarded in place
    gy = g_tile
    gy[...] = nisa.tensor_tensor(
        g_tile, x_tile, nl.multiply, dtype=dtype, engine=nisa.engine.gpsimd
    )
    s = nl.ndarray((k, 1), dtype=nl.float32, buffer=nl.sbuf)
    gy[...] = nisa.activation_reduce(op=nl.copy, data=gy, reduce_op=nl.add, reduce_res=s)
    yield
    ident_k = ident[i_k, nl.arange(k)[None, :]]
    # diag(-s), rounded to x's dtype for the 16-bit matmul (s is rounded there either way)
    diag = nisa.tensor_scalar(ident_k, nl.multiply, s, op1=nl.multiply, operand1=-1.0, dtype=dtype)
    # two PSUM banks per tile, so TensorE runs ahead of the VectorE reading them
    ring = [nl.ndarray((k, MM_COLS), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
    for j, m0 in enumerate(range(0, d, MM_COLS)):
        m = min(MM_COLS, d - m0)
        cols = m0 + nl.arange(m)[None, :]
        ps = ring[j % 2][i_k, nl.arange(m)[None, :]]
        ps[...] = nisa.nc_matmul(diag, x_tile[i_k, cols])
        if half:
            ps[...] += nisa.nc_matmul(ident_k, gy[i_k, cols])
            g_tile[i_k, cols] = nisa.tensor_copy(ps, dtype=dtype)
        else:
            g_tile[i_k, cols] = nisa.tensor_tensor(ps, gy[i_k, cols], nl.add, dtype=dtype)


def _group(d, dtype, most, budget=32768):
    """Row tiles per loop iteration: up to ``most``, while the group's x tiles stay within
    ``budget`` bytes per partition (more would not fit SBUF with their intermediates and
    buffers; the backward, whose tiles hold only x and grad, takes twice the budget)."""
    return max(1, min(most, budget // (d * dtypes.as_dtype(dtype).itemsize)))


def _is_16bit(dtype) -> bool:
    return dtypes.as_dtype(dtype).itemsize == 2


def softmax(x: np.ndarray, *, causal: bool = False, offset: int = 0) -> np.ndarray:
    """Softmax over the last dimension, max-subtracted (no overflow for large inputs).

    ``x``: [..., D] (leading dims flattened to rows), numpy array or CPU torch tensor of
    float32, bfloat16 or float16; 1 <= D <= 16384.  With ``causal=True``, x is [..., S, D]
    (e.g. attention scores [B, H, S_q, S_k]) and row i of each [S, D] slice keeps the columns
    ``j <= i + offset`` (``offset >= 0``; ``offset = S_k - S_q`` aligns the mask bottom-right);
    masked entries are 0.  Returns x's shape and dtype.  Raises ``ValueError`` for a bad shape
    or offset and ``TypeError`` for an unsupported dtype.
    """
    shape = _check("softmax", x, causal, offset)
    if math.prod(shape) == 0:  # nothing to do; an empty kernel launch is not legal
        return x.copy() if hasattr(x, "copy") else x.clone()
    y = softmax_kernel(x.reshape(_as_3d(shape, causal)), bool(causal), int(offset))
    return y.reshape(shape)


def softmax_backward(
    grad_out: np.ndarray, x: np.ndarray, *, causal: bool = False, offset: int = 0
) -> tuple[np.ndarray]:
    """Gradient of :func:`softmax` w.r.t. ``x``: ``(y * (grad_out - sum(grad_out * y)),)`` with
    ``y = softmax(x, causal=causal, offset=offset)`` recomputed.  ``grad_out``: x's shape and
    dtype.  Returns a 1-tuple (one gradient per input)."""
    shape = _check("softmax_backward", x, causal, offset)
    if tuple(grad_out.shape) != shape:
        raise ValueError(
            f"softmax_backward: grad_out must have x's shape {shape}, got {tuple(grad_out.shape)}"
        )
    gname = dtypes.name(dtypes.as_dtype(grad_out.dtype))
    if gname != dtypes.name(dtypes.as_dtype(x.dtype)):
        raise TypeError(f"softmax_backward: grad_out must have x's dtype; got {gname}")
    if shape[-1] > MAX_D_BACKWARD:
        raise ValueError(
            f"softmax_backward: the last dimension must be <= {MAX_D_BACKWARD}, got {shape[-1]}"
        )
    if math.prod(shape) == 0:
        return (x.copy() if hasattr(x, "copy") else x.clone(),)
    s3 = _as_3d(shape, causal)
    gx = softmax_backward_kernel(grad_out.reshape(s3), x.reshape(s3), bool(causal), int(offset))
    return (gx.reshape(shape),)


def _check(fn: str, x: np.ndarray, causal: bool, offset: int) -> tuple[int, ...]:
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError(f"{fn}: x must have at least one dimension")
    d = shape[-1]
    if not 1 <= d <= MAX_D:
        raise ValueError(f"{fn}: the last dimension must be in [1, {MAX_D}], got {d}")
    if causal and offset < 0:
        raise ValueError(f"{fn}: offset must be >= 0 (every row keeps column 0), got {offset}")
    name = dtypes.name(dtypes.as_dtype(x.dtype))
    if name not in DTYPES:
        raise TypeError(f"{fn}: x must be one of {', '.join(DTYPES)}; got {name}")
    return shape


def _as_3d(shape: tuple[int, ...], causal: bool) -> tuple[int, int, int]:
    """[B, S, D] for the kernel: the causal mask needs each row's index within its slice."""
    if causal:
        s = shape[-2] if len(shape) >= 2 else 1
        return (math.prod(shape[:-2]), s, shape[-1])
    return (1, math.prod(shape[:-1]), shape[-1])
