"""RMSNorm: ``y = x / sqrt(mean(x**2, axis=-1) + eps) * weight``, its backward and the fused
residual variant ``add_rmsnorm``.

Rows go on the 128 partitions, 128-row tiles in an ``affine_range`` loop (row tiles are
independent); the ragged last tile is peeled off the loop with a static size, so no
instruction needs a mask.  Each engine runs its instructions in program order, so a tile's
work is written as stages (a generator that yields between them) and, where it pays, two tiles
go per loop iteration with their stages interleaved (one engine starts the second tile while
another finishes the first; see :func:`_for_row_tiles`).

Forward, per tile (rows longer than 16 KiB per partition in column chunks of 4 KiB, so that
the output can overwrite the input and only one row-sized tile per row tile is on chip):

1. ScalarE ``activation_reduce``: square every element and sum along the free axis (fp32).
2. ScalarE ``activation``: ``rsqrt(sum * (1/D) + eps)``; the mean's scale and eps ride on the
   instruction's scale and bias, so no separate VectorE ops.
3. fp32: VectorE ``scalar_tensor_tensor`` ``(x * rstd) * weight``, rounded once.  16-bit:
   VectorE ``tensor_scalar`` ``x * rstd`` then ``tensor_tensor`` ``* weight`` (N + N/2 cycles
   instead of the fused op's 2N).

``add_rmsnorm`` first forms ``h = x + residual`` (fp32: GpSimd, idle otherwise; 16-bit:
VectorE, N/2 cycles in the all-16-bit mode), stores it and normalizes it into residual's tile.

Backward (``r = rstd``, ``gw = grad * weight``, ``coef = -r**3 * sum(gw * x) / D``):
``grad_x = r * gw + coef * x``, ``grad_weight = sum over rows of grad * x * r``.  A row tile
keeps full rows of ``x`` and ``grad`` in SBUF and works on column chunks of 4 KiB whose
intermediates live in a small ring of scratch chunks (see :func:`_backward_rows`):

1. ScalarE: ``r`` from the sum of squares.
2. Per chunk: GpSimd ``gx = grad * x``; TensorE sums ``gx`` over the rows weighted by ``r``
   into a PSUM accumulator (``grad_weight``, over all row tiles); VectorE ``gx * w`` and
   ScalarE its row sum (``dot``); GpSimd ``gw = grad * w`` over grad's chunk.
3. Per chunk, ``grad_x``: TensorE ``diag(r) @ gw`` into PSUM (exact: one nonzero term per
   sum).  fp32: ScalarE ``x * coef`` and an N-cycle VectorE add reading the PSUM operand
   (instead of two 2N-cycle fp32 passes).  16-bit: TensorE also adds ``diag(coef) @ x`` in
   PSUM and VectorE copies the sum out (N/2 cycles).

``add_rmsnorm_backward`` recomputes ``h = x + residual`` per tile (residual a chunk at a time,
rounded as the forward stored it), runs the same backward tile on ``h`` and adds ``grad_h``
chunk by chunk (GpSimd); ``grad_x`` and ``grad_residual`` are equal and stored from one tile.

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
MAX_D = 8192  # a row tile's full rows (x, and grad in the backward) and the weight fit SBUF
CHUNK_BYTES = 4096  # column chunks: 4 KiB per partition (DMAs of chunks stay >= 2 KiB)
FORWARD_WHOLE_ROW = 16384  # forward rows up to this many bytes per partition are one chunk
SCRATCH_CHUNKS = (3, 2)  # backward scratch ring: chunks of grad * x, then of its product by w
PSUM_RING = 2  # PSUM banks per row tile for the diagonal matmuls of the backward's last stage
MM_COLS = 512  # TensorE moving free size: one 2 KiB PSUM bank of fp32


@nki.jit
def rmsnorm_kernel(x, weight, eps):
    """RMSNorm of the rows of ``x`` [N, D] with ``weight`` [D]; returns [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(d)[None, :]
    consts = _constants(weight, eps, d)
    chunk = _forward_chunks(d, x.dtype)[0][1]

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        # y overwrites x; the discarded squares go to a chunk-sized scratch tile
        scratch = nl.ndarray((k, chunk), dtype=x.dtype, buffer=nl.sbuf)

        def finish(cols, y):
            nl.store(out[r0 + i_k, cols], value=y)

        yield from _forward_rows(x_tile, x_tile, scratch, consts, k, d, finish)

    _for_row_tiles(n, row_tile, _forward_group(x.dtype))
    return out


@nki.jit
def add_rmsnorm_kernel(x, residual, weight, eps):
    """``h = x + residual``; returns (rmsnorm(h) * weight, h), both [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    new_res = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(d)[None, :]
    consts = _constants(weight, eps, d)
    # fp32: GpSimd (idle otherwise; the VectorE has the 2N-cycle scaling); 16-bit: the VectorE
    # all-16-bit mode is the fastest
    h_engine = "vector" if _is_16bit(x.dtype) else "gpsimd"

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        r_tile = nl.load(residual[r0 + i_k, i_f])
        # the sum is rounded to x's dtype (it is also an output) and normalized as rounded;
        # it overwrites x, and residual's tile then takes the squares and y
        x_tile[...] = nisa.tensor_tensor(x_tile, r_tile, nl.add, dtype=x.dtype, engine=h_engine)
        nl.store(new_res[r0 + i_k, i_f], value=x_tile)

        def finish(cols, y):
            nl.store(out[r0 + i_k, cols], value=y)

        yield from _forward_rows(x_tile, r_tile, r_tile, consts, k, d, finish)

    _for_row_tiles(n, row_tile, _forward_group(x.dtype))
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
    consts = _constants(weight, eps, d, identity=True)
    # grad_weight partials: acc[p, c] = sum over rows of grad * x * r at column c*128 + p
    acc = nl.zeros((pmax, math.ceil(d / pmax)), dtype=nl.float32, buffer=nl.psum)

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        g_tile = nl.load(grad[r0 + i_k, i_f])

        def finish(cols, dx):
            nl.store(gx_out[r0 + i_k, cols], value=dx)

        yield from _backward_rows(g_tile, x_tile, consts, acc, k, d, finish)

    # one tile per iteration: two interleaved measured slower here (4096 x 4096 bf16:
    # 353.9 us against 324.3 us)
    _for_row_tiles(n, row_tile, 1)
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
    consts = _constants(weight, eps, d, identity=True)
    acc = nl.zeros((pmax, math.ceil(d / pmax)), dtype=nl.float32, buffer=nl.psum)
    chunks = _chunks(d, x.dtype)

    def row_tile(r0, k):
        i_k = nl.arange(k)[:, None]
        h_tile = nl.load(x[r0 + i_k, i_f])
        gy_tile = nl.load(grad_y[r0 + i_k, i_f])
        # h = x + residual in place (rounded as the forward rounds it); residual and grad_h
        # come a chunk at a time, so only two full rows per row tile are on chip
        for j0, c in chunks:
            cols = j0 + nl.arange(c)[None, :]
            r_chunk = nl.load(residual[r0 + i_k, cols])
            h_tile[i_k, cols] = nisa.tensor_tensor(
                h_tile[i_k, cols], r_chunk, nl.add, dtype=x.dtype
            )

        def finish(cols, dx):
            gh = nl.load(grad_h[r0 + i_k, cols])
            # GpSimd: it has the most spare time in the backward's last stage
            dx[...] = nisa.tensor_tensor(dx, gh, nl.add, dtype=x.dtype, engine=nisa.engine.gpsimd)
            nl.store(gx_out[r0 + i_k, cols], value=dx)
            nl.store(gr_out[r0 + i_k, cols], value=dx)

        yield from _backward_rows(gy_tile, h_tile, consts, acc, k, d, finish)

    _for_row_tiles(n, row_tile, _backward_group(d, x.dtype))
    _column_sums_to(gw_out, acc, d)
    return gx_out, gr_out, gw_out


def _for_row_tiles(n, body, group):
    """Run ``body(first_row, rows)`` for every 128-row tile.

    ``body`` is a generator function whose ``yield``s end the stages of its tile.  Full
    tiles go ``group`` per ``affine_range`` iteration with their stages interleaved in
    program order (stage 1 of every tile, then stage 2, ...): each engine runs its
    instructions in program order, and a tile's stages pass data between engines, so one
    engine works on the next tile while another finishes this one.  Leftover tiles, the
    ragged last one included (peeled with a static size: no masks), run after the loop.
    """
    pmax = nl.tile_size.pmax
    full = n // pmax
    for t in nl.affine_range(full // group):
        _interleave([body((t * group + u) * pmax, pmax) for u in range(group)])
    tail = [body(u * pmax, pmax) for u in range(full // group * group, full)]
    if n % pmax:
        tail.append(body(full * pmax, n % pmax))
    _interleave(tail)


def _interleave(stages) -> None:
    """Advance the generators round-robin until all are exhausted."""
    live = list(stages)
    while live:
        live = [g for g in live if next(g, _DONE) is not _DONE]


_DONE = object()


def _is_16bit(dtype) -> bool:
    return dtypes.as_dtype(dtype).itemsize == 2


def _forward_group(dtype):
    """Forward row tiles per loop iteration.  fp32: two, so that ScalarE squares one tile
    while VectorE runs the other's 2N-cycle scaling.  16-bit: one (the scaling is short;
    pairs measured slower)."""
    return 1 if _is_16bit(dtype) else 2


def _backward_group(d, dtype):
    """``add_rmsnorm_backward`` row tiles per loop iteration: two while their full rows (h and
    grad_y) stay within 32 KiB per partition, so that two iterations' tiles fit SBUF."""
    return 2 if 4 * d * dtypes.as_dtype(dtype).itemsize <= 32768 else 1


def _chunks(d, dtype, nbytes=CHUNK_BYTES):
    """Column chunks ``(first column, width)`` of ``nbytes`` per partition (a multiple of 128
    columns, so TensorE column blocks never straddle two chunks); the last may be narrower."""
    c = max(nl.tile_size.pmax, nbytes // dtypes.as_dtype(dtype).itemsize)
    return [(j0, min(c, d - j0)) for j0 in range(0, d, c)]


def _forward_chunks(d, dtype):
    """The forward's chunks: the whole row up to FORWARD_WHOLE_ROW bytes (fewest
    instructions and DMAs), else CHUNK_BYTES (the scratch for the squares stays small)."""
    row = d * dtypes.as_dtype(dtype).itemsize
    return _chunks(d, dtype, row if row <= FORWARD_WHOLE_ROW else CHUNK_BYTES)


def _constants(weight, eps, d, identity=False):
    """Loop invariants: weight broadcast to the partitions, eps as a (P, 1) bias operand and,
    for the backward, the identity (fp32, or x's 16-bit dtype) for the diagonal matmuls."""
    pmax = nl.tile_size.pmax
    consts = {
        "w": _broadcast_row(weight, d, pmax),
        "eps": nl.full((pmax, 1), eps, dtype=nl.float32),
    }
    if identity:
        consts["ident"] = nl.load(nl.shared_identity_matrix(pmax, dtype=weight.dtype))
    return consts


def _forward_rows(x_tile, dst, scratch, consts, k, d, finish):
    """RMSNorm of one row tile, a generator whose ``yield`` ends its first stage.

    Stage 1: ``rstd`` (ScalarE squares and sums each column chunk; the squares go to
    ``scratch``, a chunk-sized tile or ``dst``).  Stage 2, per chunk: ``dst = x * rstd * w``
    (see :func:`_scale_rows`; ``dst`` may be ``x_tile``) and ``finish(cols, dst_chunk)``."""
    dtype = x_tile.dtype
    i_k = nl.arange(k)[:, None]
    chunks = _forward_chunks(d, dtype)
    nch = len(chunks)
    whole = scratch.shape[1] == d

    def view(t, j0, c):
        return t[i_k, j0 + nl.arange(c)[None, :]]

    ss_part = nl.ndarray((k, nch), dtype=nl.float32, buffer=nl.sbuf)
    for j, (j0, c) in enumerate(chunks):
        view(scratch, j0 if whole else 0, c)[...] = nisa.activation_reduce(
            op=nl.square, data=view(x_tile, j0, c), reduce_op=nl.add, reduce_res=ss_part[i_k, j]
        )
    rstd = _rsqrt_mean(_row_sum(ss_part, k, nch), consts["eps"][i_k, 0], d)
    yield
    for j0, c in chunks:
        y = view(dst, j0, c)
        _scale_rows(y, view(x_tile, j0, c), rstd, view(consts["w"], j0, c), dtype)
        finish(j0 + nl.arange(c)[None, :], y)


def _backward_rows(g_tile, x_tile, consts, acc, k, d, finish):
    """RMSNorm backward of one row tile (k rows; full rows of ``g`` and ``x`` in SBUF), a
    generator whose two ``yield``s end its stages (see :func:`_for_row_tiles`).

    Adds the tile's ``g * x * r`` column sums to the PSUM accumulator ``acc`` (grad_weight)
    and calls ``finish(cols, dx)`` for each column chunk of ``grad_x`` (an SBUF view in x's
    dtype, in ``g_tile``'s memory).  Overwrites ``g_tile`` and ``x_tile``.

    Intermediates are column chunks in a ring of scratch chunks (SCRATCH_CHUNKS), so a row
    tile needs little more SBUF than its two inputs and consecutive row tiles overlap even at
    D = 8192 in fp32; the ring lets GpSimd run a few chunks ahead of VectorE and ScalarE.
    Stage 1: ``r`` (ScalarE).  Stage 2, per chunk: ``gx = g * x`` (TensorE sums it over the
    rows weighted by ``r``), ``gx * w`` summed along the rows by ScalarE (``dot``), then
    ``gw = g * w`` over g's chunk.  Stage 3, per chunk: ``grad_x = gw * r + x * coef`` with
    ``coef = -r**3 * dot / D`` (TensorE row scalings into PSUM, see the module docstring).
    """
    dtype = x_tile.dtype
    half = _is_16bit(dtype)
    i_k = nl.arange(k)[:, None]
    w_tile = consts["w"]
    chunks = _chunks(d, dtype)
    cw = chunks[0][1]
    nch = len(chunks)

    def view(t, j0, c):
        return t[i_k, j0 + nl.arange(c)[None, :]]

    # one scratch tile per row tile, cut into the ring's chunks
    na, nb = SCRATCH_CHUNKS
    scratch = nl.ndarray((k, (na + nb) * cw), dtype=dtype, buffer=nl.sbuf)
    ring_a = [view(scratch, u * cw, cw) for u in range(na)]
    ring_b = [view(scratch, (na + u) * cw, cw) for u in range(nb)]

    # stage 1: r = rsqrt(mean(x**2) + eps); ScalarE squares and sums each chunk (the squares
    # are discarded into scratch), then adds the partial sums
    ss_part = nl.ndarray((k, nch), dtype=nl.float32, buffer=nl.sbuf)
    for j, (j0, c) in enumerate(chunks):
        view(ring_b[j % nb], 0, c)[...] = nisa.activation_reduce(
            op=nl.square, data=view(x_tile, j0, c), reduce_op=nl.add, reduce_res=ss_part[i_k, j]
        )
    rstd = _rsqrt_mean(_row_sum(ss_part, k, nch), consts["eps"][i_k, 0], d)
    r_col = nisa.tensor_copy(rstd, dtype=dtype)  # TensorE's moving operand, x's dtype
    yield

    # stage 2: the products
    dot_part = nl.ndarray((k, nch), dtype=nl.float32, buffer=nl.sbuf)
    for j, (j0, c) in enumerate(chunks):
        gx = view(ring_a[j % na], 0, c)
        gx[...] = nisa.tensor_tensor(
            view(g_tile, j0, c),
            view(x_tile, j0, c),
            nl.multiply,
            dtype=dtype,
            engine=nisa.engine.gpsimd,
        )
        _accumulate_column_sums(acc, gx, r_col, k, j0, c)
        gxw = view(ring_b[j % nb], 0, c)
        gxw[...] = nisa.tensor_tensor(gx, view(w_tile, j0, c), nl.multiply, dtype=dtype)
        gxw[...] = nisa.activation_reduce(
            op=nl.copy, data=gxw, reduce_op=nl.add, reduce_res=dot_part[i_k, j]
        )
        g = view(g_tile, j0, c)
        g[...] = nisa.tensor_tensor(
            g, view(w_tile, j0, c), nl.multiply, dtype=dtype, engine=nisa.engine.gpsimd
        )
    dot = _row_sum(dot_part, k, nch)
    yield

    # stage 3: coef = -r**3 * dot / D (16-bit: rounded to x's dtype, like r for the 16-bit
    # matmuls), the diagonal matrices, then grad_x chunk by chunk
    r2 = nisa.tensor_scalar(
        rstd, nl.multiply, rstd, op1=nl.multiply, operand1=-1.0 / d, dtype=nl.float32
    )
    coef = nisa.tensor_scalar(
        r2, nl.multiply, rstd, op1=nl.multiply, operand1=dot, dtype=dtype if half else nl.float32
    )
    ident = consts["ident"][i_k, nl.arange(k)[None, :]]
    diag_r = nisa.tensor_scalar(ident, nl.multiply, rstd, dtype=dtype)
    if half:
        diag_c = nisa.tensor_scalar(ident, nl.multiply, coef, dtype=dtype)
    # a ring of PSUM banks, so TensorE runs ahead of the VectorE reading them
    ring = [nl.ndarray((k, MM_COLS), dtype=nl.float32, buffer=nl.psum) for _ in range(PSUM_RING)]
    nxt = 0
    for j0, c in chunks:
        gw = view(g_tile, j0, c)
        xs = view(x_tile, j0, c)
        if not half:
            xs[...] = nisa.activation(op=nl.copy, data=xs, scale=coef, dtype=dtype)
        for m0 in range(0, c, MM_COLS):
            m = min(MM_COLS, c - m0)
            cols = m0 + nl.arange(m)[None, :]
            ps = ring[nxt % PSUM_RING][i_k, nl.arange(m)[None, :]]
            nxt += 1
            ps[...] = nisa.nc_matmul(diag_r, gw[i_k, cols])
            if half:
                # both products summed in PSUM, one rounding on the way out (N/2 cycles)
                ps[...] += nisa.nc_matmul(diag_c, xs[i_k, cols])
                gw[i_k, cols] = nisa.tensor_copy(ps, dtype=dtype)
            else:
                # gw * r (PSUM) + x * coef (ScalarE): N cycles with a PSUM operand, not 2N
                gw[i_k, cols] = nisa.tensor_tensor(ps, xs[i_k, cols], nl.add, dtype=dtype)
        finish(j0 + nl.arange(c)[None, :], gw)


def _row_sum(part, k, n):
    """(k, 1) fp32 sum of the (k, n) partial sums (the partials themselves when n == 1)."""
    if n == 1:
        return part
    total = nl.ndarray((k, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(op=nl.copy, data=part, reduce_op=nl.add, reduce_res=total)
    return total


def _rsqrt_mean(sum_sq, eps_col, d):
    """ScalarE ``rsqrt(sum_sq / D + eps)``: the 1/D scale and eps ride on the instruction."""
    return nisa.activation(op=nl.rsqrt, data=sum_sq, bias=eps_col, scale=1.0 / d)


def _scale_rows(out, x_tile, rstd, w_tile, dtype):
    """``out = x * rstd * w`` rounded to ``dtype``.  fp32: one VectorE scalar_tensor_tensor.
    16-bit: VectorE tensor_scalar then tensor_tensor (the all-16-bit N/2-cycle mode), one
    intermediate rounding; together cheaper than the 2N-cycle fused op."""
    if not _is_16bit(dtype):
        out[...] = nisa.scalar_tensor_tensor(
            data=x_tile,
            op0=nl.multiply,
            operand0=rstd,
            op1=nl.multiply,
            operand1=w_tile,
            dtype=dtype,
        )
        return
    out[...] = nisa.tensor_scalar(x_tile, nl.multiply, rstd, dtype=dtype)
    out[...] = nisa.tensor_tensor(out, w_tile, nl.multiply, dtype=dtype)


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


def _accumulate_column_sums(acc, data, ones, k, j0, c):
    """acc[p, b] += sum over the k partitions of data[:, i] for column j0 + i = b*128 + p
    (TensorE: the data block of 128 columns is the stationary operand, the (k, 1) column
    ``ones`` the moving one).  ``data``: (k, c) view of columns j0 .. j0 + c, j0 % 128 == 0."""
    pmax = nl.tile_size.pmax
    i_k = nl.arange(k)[:, None]
    for c0 in range(0, c, pmax):
        w = min(pmax, c - c0)
        acc[nl.arange(w)[:, None], (j0 + c0) // pmax] += nisa.nc_matmul(
            data[i_k, c0 + nl.arange(w)[None, :]], ones[i_k, 0]
        )


def _check_dtypes(fn: str, *arrays: np.ndarray) -> None:
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in arrays}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
