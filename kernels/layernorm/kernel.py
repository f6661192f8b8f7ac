"""LayerNorm: ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, and
its backward (grad_x, grad_weight, grad_bias).

Rows go on the 128 partitions: full 128-row tiles several per ``affine_range`` iteration
(forward: two) with their stages interleaved in program order (each engine runs its
instructions in order, so a tile that goes VectorE -> ScalarE -> VectorE would leave VectorE
idle during its ScalarE step); the ragged last tile is peeled off the loop with a static
size, so nothing is masked.

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

Backward (``gw = grad * weight``):
``grad_x = rstd * (gw - sum(gw)/D - xhat * sum(gw * xhat)/D)``; ``grad_weight`` and
``grad_bias`` are the column sums of ``grad * xhat`` and ``grad`` over all rows, accumulated in
PSUM across row tiles by TensorE ones-column matmuls (sums over rows on purpose: no matmul
mixes rows with zero weights, so a non-finite entry stays in its row and column).  A row tile
keeps full rows of x and grad in SBUF and works on column chunks of 4 KiB, in place where it
can, with ``grad * xhat`` in a small ring of scratch chunks, so that two iterations of up to
four row tiles each fit SBUF (see :func:`_backward_rows`):

1. VectorE ``bn_stats``/``bn_aggr``; ScalarE ``rstd`` and ``-mean * rstd``.
2. Per chunk: ScalarE ``xhat`` in place of x (fp32 scale and bias); TensorE sums grad over the
   rows; GpSimd ``g * xhat``, summed over the rows by TensorE, then times w (VectorE) and
   summed along the row (``sum(gw * xhat)``); ``gw = g * w`` in place (GpSimd), then
   ``gw * rstd`` in place, summed along the row.  The row sums ride on an instruction that
   makes a needed output or overwrites a dead one: ScalarE ``activation`` (fp32) or VectorE
   ``tensor_scalar`` in its 16-bit 4x mode (16-bit partial sums, added in fp32).  fp32
   products by w read the weight from PSUM (7 banks, broadcast once by ones-row matmuls), so
   VectorE pays N cycles instead of 2N.
3. Per chunk: ScalarE ``t = xhat * c2 + c1`` in place, GpSimd ``grad_x = gw * rstd + t``, store.

Each engine runs in program order, so the chunk steps are emitted skewed (a step comes a few
chunks after the step it depends on) and a group's tiles interleave: fp32 chunk wave by chunk
wave, 16-bit stage by stage (the statistics of every tile of the group first).
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
BWD_CHUNK_BYTES = 4096  # backward: column chunks of 4 KiB per partition
BWD_RING = 3  # backward: scratch chunks per row tile for g * xhat (GpSimd runs ahead)
BWD_W_BANKS = 7  # fp32 backward: weight columns in 7 PSUM banks (the 8th holds the sums)
BWD_MAX_GROUP = 4  # backward: at most this many row tiles per loop iteration

# Engine of each per-element step of the backward (see _backward_rows), for fp32 (False) and
# 16-bit (True) data: gxh = g * xhat; p = gxh * w and b = its row sum; gw = g * w; a = gw * rstd
# and its row sum; dx = gw * rstd + t (xhat and t = xhat * c2 + c1 are always ScalarE's).
# Products by w run on VectorE wherever the weight has a PSUM copy (fp32); the engine named
# here takes the other columns.
# Per-element costs in the trn2 model (instruction overheads aside): fp32 tensor_tensor
# VectorE 2.1 ns (1.0 ns with a PSUM operand), GpSimd 1.7 ns; a ScalarE pass 0.83 ns;
# 16-bit tensor_tensor VectorE 0.52 ns (all-16-bit mode), GpSimd 0.83 ns; 16-bit VectorE
# tensor_scalar 0.26 ns (4x mode); bn_stats 1.0 ns in either dtype.
_PLAN = {
    False: {
        "gxh": "gpsimd",
        "p": "vector",
        "b": "scalar",
        "gw": "gpsimd",
        "a": "scalar",
        "dx": "gpsimd",
    },
    True: {
        "gxh": "gpsimd",
        "p": "vector",
        "b": "vector",
        "gw": "gpsimd",
        "a": "vector",
        "dx": "gpsimd",
    },
}


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
    """Gradients of LayerNorm: (grad_x [N, D] in x's dtype, grad_weight [D], grad_bias [D]).

    With ``xhat = (x - mean) * rstd`` per row and ``gw = grad * weight``:
    ``grad_x = rstd * (gw - sum(gw)/D - xhat * sum(gw * xhat)/D)``,
    ``grad_weight = sum over rows of grad * xhat``, ``grad_bias = sum over rows of grad``.
    """
    n, d = x.shape
    gx_out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    gw_out = nl.ndarray((d,), dtype=weight.dtype, buffer=nl.shared_hbm)
    gb_out = nl.ndarray((d,), dtype=weight.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    i_f = nl.arange(d)[None, :]
    consts = _backward_constants(weight, eps, d)
    n_blocks = math.ceil(d / pmax)
    # column sums over all rows, column b*128 + p at [p, b]: grad * xhat and grad
    acc_w = nl.zeros((pmax, n_blocks), dtype=nl.float32, buffer=nl.psum)
    acc_b = nl.zeros((pmax, n_blocks), dtype=nl.float32, buffer=nl.psum)
    # fp32: the tiles of a group alternate chunk wave by chunk wave (see _skewed); 16-bit:
    # stage by stage (measured on 4096 x 4096, the other way round: fp32 699 us instead of
    # 625 us, bf16 406 us instead of 356 us)
    waves = not _is_16bit(x.dtype)

    def row_tile(r0, k, slot):
        i_k = nl.arange(k)[:, None]
        x_tile = nl.load(x[r0 + i_k, i_f])
        g_tile = nl.load(grad[r0 + i_k, i_f])

        def finish(cols, dx):
            nl.store(gx_out[r0 + i_k, cols], value=dx)

        yield from _backward_rows(g_tile, x_tile, consts, acc_w, acc_b, k, d, finish, waves)

    _for_row_tiles(n, row_tile, _backward_group(d, x.dtype))
    _column_sums_to(gw_out, acc_w, d)
    _column_sums_to(gb_out, acc_b, d)
    return gx_out, gw_out, gb_out


def _is_16bit(dtype) -> bool:
    return dtypes.as_dtype(dtype).itemsize == 2


def _chunks(d, dtype):
    """Backward column chunks ``(first column, width)`` of BWD_CHUNK_BYTES per partition (a
    multiple of 512 columns: PSUM banks and TensorE blocks never straddle two chunks)."""
    c = BWD_CHUNK_BYTES // dtypes.as_dtype(dtype).itemsize
    return [(j0, min(c, d - j0)) for j0 in range(0, d, c)]


def _backward_group(d, dtype):
    """Backward row tiles per loop iteration: the most (up to BWD_MAX_GROUP, a power of two)
    whose tiles (full rows of x and grad plus the scratch ring) fit NKI's usable SBUF twice,
    so that the next iteration's loads overlap this one's work.  More tiles per iteration give
    each in-order engine more independent work between the statistics and the last stage."""
    item = dtypes.as_dtype(dtype).itemsize
    chunks = _chunks(d, dtype)
    tile = (2 * d + min(len(chunks), BWD_RING) * chunks[0][1]) * item
    group = BWD_MAX_GROUP
    while group > 1 and 2 * group * tile > nl.tile_size.total_available_sbuf_size:
        group //= 2
    return group


def _backward_constants(weight, eps, d):
    """Loop invariants of the backward: eps as a (P, 1) bias operand, a ones column (x's
    dtype) for the TensorE column sums, and the weight broadcast to all partitions.  fp32:
    the first ``BWD_W_BANKS * 512`` weight columns in PSUM (TensorE ones-row matmuls, exact),
    since a VectorE tensor_tensor with one PSUM operand costs N cycles instead of 2N; the rest
    in SBUF.  16-bit: all of it in SBUF (the all-16-bit N/2-cycle mode beats PSUM's N)."""
    pmax = nl.tile_size.pmax
    f32 = nl.float32
    i_1 = nl.arange(1)[:, None]
    consts = {
        "eps": nl.full((pmax, 1), eps, dtype=f32),
        "ones": nl.full((pmax, 1), 1.0, dtype=weight.dtype),
        "w_psum": [],
        "w_sbuf": None,
        "w_first": 0,  # first weight column held in SBUF
    }
    if not _is_16bit(weight.dtype):
        w_row = nl.load(weight.reshape((1, d))[i_1, nl.arange(d)[None, :]])
        ones_row = nl.full((1, pmax), 1.0, dtype=weight.dtype)
        bank = nl.tile_size.psum_fmax
        for c0 in range(0, min(d, BWD_W_BANKS * bank), bank):
            cw = min(bank, d - c0)
            wp = nl.zeros((pmax, cw), dtype=f32, buffer=nl.psum)
            wp += nisa.nc_matmul(ones_row, w_row[i_1, c0 + nl.arange(cw)[None, :]])
            consts["w_psum"].append(wp)
        consts["w_first"] = min(d, BWD_W_BANKS * bank)
    first = consts["w_first"]
    if first < d:
        i_r = first + nl.arange(d - first)[None, :]
        row = nl.load(weight.reshape((1, d))[i_1, i_r])
        consts["w_sbuf"] = row.broadcast_to((pmax, d - first))
    return consts


def _backward_rows(g_tile, x_tile, consts, acc_w, acc_b, k, d, finish, waves):
    """LayerNorm backward of one row tile (k rows, full rows of ``g`` and ``x`` in SBUF), a
    generator whose ``yield``s end its stages (see :func:`_for_row_tiles`; with ``waves``
    every chunk wave of stages 2 and 3 is a stage of its own).

    Adds the tile's column sums of ``g * xhat`` and ``g`` to the PSUM accumulators ``acc_w``
    and ``acc_b`` and calls ``finish(cols, dx)`` for each column chunk of ``grad_x`` (an SBUF
    view in x's dtype, in ``g_tile``'s memory).  Overwrites ``g_tile`` and ``x_tile``.

    Stage 1: statistics (VectorE bn_stats/bn_aggr).  Stage 2: ``rstd``, ``-mean * rstd``
    (ScalarE), then per column chunk: ``xhat`` in place of x; ``g * xhat`` into a ring of
    scratch chunks, summed over the rows by TensorE, then multiplied by w in place and summed
    along the row (``sum(gw * xhat)``); ``gw = g * w`` in place of g (after TensorE has summed
    g over the rows), then ``gw * rstd`` in place, summed along the row (``rstd * sum(gw)``).
    Stage 3, per chunk: ``t = xhat * c2 + c1`` in place of xhat, with
    ``c2 = -rstd * sum(gw * xhat) / D`` and ``c1 = -rstd * sum(gw) / D``, then
    ``grad_x = gw * rstd + t`` in place of g.  Engines: ``_PLAN``.

    The chunk steps are emitted skewed (see :func:`_skewed`): each engine runs its
    instructions in program order, so a step placed right after the one it depends on (on
    another engine) would leave its engine waiting.
    """
    dtype = x_tile.dtype
    half = _is_16bit(dtype)
    plan = _PLAN[half]
    f32 = nl.float32
    i_k = nl.arange(k)[:, None]
    chunks = _chunks(d, dtype)
    nch = len(chunks)
    n_ring = min(nch, BWD_RING)
    ones = consts["ones"][i_k, 0]

    def view(t, j):
        j0, c = chunks[j]
        return t[i_k, j0 + nl.arange(c)[None, :]]

    ring = nl.ndarray((k, n_ring * chunks[0][1]), dtype=dtype, buffer=nl.sbuf)

    def scratch(j):
        return ring[i_k, (j % n_ring) * chunks[0][1] + nl.arange(chunks[j][1])[None, :]]

    # stage 1 (VectorE) and the start of stage 2 (ScalarE): _stats yields between them
    rstd, nmr = yield from _stats(x_tile, consts["eps"][i_k, 0])
    nrd = nisa.activation(op=nl.copy, data=rstd, scale=-1.0 / d)  # -rstd / D, for c2
    # 16-bit VectorE instructions run in their fast modes only with 16-bit operands: rstd and
    # the partial sums they write are then in x's dtype (the partials are added in fp32)
    rstd_n = nisa.activation(op=nl.copy, data=rstd, dtype=dtype) if half else rstd

    def part_dtype(step):
        return dtype if half and plan[step] != "scalar" else f32

    a_part = nl.ndarray((k, nch), dtype=part_dtype("a"), buffer=nl.sbuf)  # rstd * sum(gw)
    b_part = nl.ndarray((k, nch), dtype=part_dtype("b"), buffer=nl.sbuf)  # sum(gw * xhat)

    def xhat(j):
        # ScalarE with fp32 scale and bias: rounding them to 16 bits would cost accuracy
        # where x's mean is large next to its spread (x * rstd and -mean * rstd cancel)
        xs = view(x_tile, j)
        xs[...] = nisa.activation(op=nl.copy, data=xs, scale=rstd, bias=nmr, dtype=dtype)

    def grad_sum(j):
        _accumulate_column_sums(acc_b, view(g_tile, j), ones, k, *chunks[j])

    def gxh(j):
        r = scratch(j)
        r[...] = nisa.tensor_tensor(
            view(g_tile, j), view(x_tile, j), nl.multiply, dtype=dtype, engine=plan["gxh"]
        )
        _accumulate_column_sums(acc_w, r, ones, k, *chunks[j])

    # the weight columns past its PSUM copy: p on VectorE, except a remainder of at most one
    # bank, which goes to GpSimd (measured, fp32: D = 4096: 625 us against 643 us; D = 8192:
    # 1330 us on VectorE against 1558 us on GpSimd)
    rest = d - consts["w_first"]
    narrow = consts["w_psum"] and 0 < rest <= nl.tile_size.psum_fmax
    p_engine = "gpsimd" if narrow else plan["p"]

    def p(j):
        _times_weight(scratch(j), consts, k, *chunks[j], p_engine)

    def b_sum(j):
        _scaled_row_sum(scratch(j), 1.0, b_part[i_k, j], plan["b"])

    def gw(j):
        _times_weight(view(g_tile, j), consts, k, *chunks[j], plan["gw"])

    def a_sum(j):
        s = rstd if plan["a"] == "scalar" else rstd_n
        _scaled_row_sum(view(g_tile, j), s, a_part[i_k, j], plan["a"])

    # (lag, step): chunk j's step is emitted in wave j + lag
    stage2 = [(0, xhat), (0, grad_sum), (1, gxh), (2, p), (2, gw), (3, b_sum), (3, a_sum)]
    yield from _skewed(nch, stage2, waves)
    yield

    # stage 3; the scalars on ScalarE, which made the sums (VectorE may be on to the next
    # tile's statistics)
    a_r = _row_sum(a_part, k, nch)
    b = _row_sum(b_part, k, nch)
    c1 = nisa.activation(op=nl.copy, data=a_r, scale=-1.0 / d, dtype=f32)
    c2 = nisa.activation(op=nl.copy, data=b, scale=nrd, dtype=f32)

    def t(j):
        xs = view(x_tile, j)
        xs[...] = nisa.activation(op=nl.copy, data=xs, scale=c2, bias=c1, dtype=dtype)

    def dx(j):
        gs = view(g_tile, j)
        gs[...] = nisa.tensor_tensor(gs, view(x_tile, j), nl.add, dtype=dtype, engine=plan["dx"])
        finish(chunks[j][0] + nl.arange(chunks[j][1])[None, :], gs)

    yield from _skewed(nch, [(0, t), (1, dx)], waves)


def _skewed(n, steps, waves):
    """Emit ``step(j)`` for chunks j < n in waves: wave w runs each ``(lag, step)`` of
    ``steps`` (in list order) for chunk ``w - lag``, so a step comes ``lag`` waves after the
    chunk's first step and its inputs from other engines are usually ready by then.  A
    generator; with ``waves`` it yields between waves."""
    last = max(lag for lag, _ in steps)
    for w in range(n + last):
        for lag, step in steps:
            if 0 <= w - lag < n:
                step(w - lag)
        if waves and w < n + last - 1:
            yield


def _times_weight(t, consts, k, j0, c, engine):
    """``t *= w`` in place for the (k, c) view ``t`` of columns j0 .. j0 + c: VectorE with the
    weight's PSUM copy where there is one (N cycles), else ``engine`` with the SBUF copy."""
    i_k = nl.arange(k)[:, None]
    bank = nl.tile_size.psum_fmax
    first = consts["w_first"]
    m0 = 0
    while m0 < c:
        col = j0 + m0
        if col < first:  # one PSUM bank of the weight
            m = min(bank - col % bank, c - m0)
            w = consts["w_psum"][col // bank][i_k, col % bank + nl.arange(m)[None, :]]
            eng = "vector"
        else:
            m = c - m0
            w = consts["w_sbuf"][i_k, col - first + nl.arange(m)[None, :]]
            eng = engine
        cols = m0 + nl.arange(m)[None, :]
        t[i_k, cols] = nisa.tensor_tensor(t[i_k, cols], w, nl.multiply, dtype=t.dtype, engine=eng)
        m0 += m


def _scaled_row_sum(t, scale, res, engine):
    """``t *= scale`` in place (``scale``: a number or (k, 1) tile) and the row sums of the
    result into the (k, 1) view ``res``: ScalarE activation or VectorE tensor_scalar, either
    with its free-axis reduction (accumulated in fp32, rounded once to res's dtype)."""
    if engine == "scalar":
        t[...] = nisa.activation(
            op=nl.copy, data=t, scale=scale, reduce_op=nl.add, reduce_res=res, dtype=t.dtype
        )
    else:
        t[...] = nisa.tensor_scalar_reduce(
            data=t, op0=nl.multiply, operand0=scale, reduce_op=nl.add, reduce_res=res, dtype=t.dtype
        )


def _row_sum(part, k, n):
    """(k, 1) sum of the (k, n) partial sums, in fp32 (ScalarE); the partials themselves when
    n == 1."""
    if n == 1:
        return part
    total = nl.ndarray((k, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(op=nl.copy, data=part, reduce_op=nl.add, reduce_res=total)
    return total


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


def _accumulate_column_sums(acc, data, col, k, j0, c):
    """``acc[p, b] += sum_i data[i, m] * col[i]`` for column j0 + m = b*128 + p, over the k
    partitions (TensorE: a block of 128 data columns is the stationary operand, the (k, 1)
    column the moving one).  ``data``: (k, c) view of columns j0 .. j0 + c, j0 % 128 == 0."""
    pmax = nl.tile_size.pmax
    i_k = nl.arange(k)[:, None]
    for c0 in range(0, c, pmax):
        w = min(pmax, c - c0)
        acc[nl.arange(w)[:, None], (j0 + c0) // pmax] += nisa.nc_matmul(
            data[i_k, c0 + nl.arange(w)[None, :]], col
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
