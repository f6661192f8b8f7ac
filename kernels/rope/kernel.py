"""Rotary position embedding (RoPE): forward, and backward as the rotation by ``-theta``.

Layout: ``x`` is [..., S, D] (leading dims flattened to ``BH`` "heads"), ``cos`` and ``sin``
are [S, D/2] (``cos[s, i] = cos(s * theta_i)``, one angle per rotated pair; the same table
serves both layouts).  Pair ``i`` of a row is

* ``layout="half"`` (rotate_half, Llama / Hugging Face): elements ``(i, i + D/2)``;
* ``layout="interleaved"`` (GPT-J / Meta original): elements ``(2i, 2i + 1)``;

and is rotated as ``(a, b) -> (a cos - b sin, b cos + a sin)``.  (HF's full-width
``cos = cat(freqs, freqs).cos()`` is this ``cos[:, :D/2]``.)

Mapping: positions go on the partitions (128 per ``affine_range`` tile along S; a ragged last
tile is peeled off the loop with a static partition count), and ``K`` heads side by side on the
free axis, so an x tile is [128 positions, K, D] (``K*D*itemsize`` at most TILE_BYTES per
partition, heads spread evenly over the tiles), moved in DMA_SPLIT strided transfers by heads.
Pair members are views of the same SBUF tile (offset ``D/2`` or stride 2).

Every instruction is elementwise: no engine sums over partitions, so a non-finite input
element reaches only the outputs its own formula does.  Per position tile the tables are
prepared by plain copies: ``cos`` into PSUM (fp32) for the VectorE, ``cos`` in fp32 as the
ScalarE's per-position scale, and the signed sin ``(-+sin, +-sin)`` for the GpSimd.  The work
runs in units of [2 members, heads, pairs] of at most 512 fp32 elements (one PSUM bank):

* ``A = (x1 cos, x2 cos)`` into a PSUM bank, by the VectorE (``cos`` read from PSUM with a
  stride-0 pattern over members and heads: N cycles, not 2N) or, for some units (see
  ``_scalar_units``), by the ScalarE: ``activation(copy, scale=cos[:, i])`` per pair index
  ``i`` over all heads and both members (the scale is a per-partition, i.e. per-position,
  vector);
* ``B = (x2 (-+sin), x1 (+-sin))`` by the GpSimd (SBUF only);
* ``y = A + B`` by the VectorE (one operand in PSUM), written in x's dtype.

The products are exact in fp32 (inputs are at most fp32) and each output is rounded once
(fp32 sum, then x's dtype).  Units are issued as a wavefront (products at program step ``j``,
the sum at ``j + LAG``), their PSUM banks and temporaries rotating through RING slots, so the
in-order engines always find independent work.  The backward (rotation by ``-theta``) only
flips the signs of the sin table.
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
LAYOUTS = ("half", "interleaved")
TILE_BYTES = 16384  # at most this many bytes per partition of one x tile (K heads side by side)
DMA_SPLIT = 4  # transfers per x tile and per output tile: short transfers pack the DMA queues
UNIT = 512  # fp32 elements per partition of one work unit: one PSUM bank
PSUM_TRIG_PAIRS = 256  # cos goes to PSUM up to this many pairs; else the products read SBUF
# The ScalarE makes the cos products of some units (one instruction per pair index, all
# heads and both members) when a unit has at least S_MIN_HEADS heads, i.e. 32 elements per
# instruction; how many is decided by _scalar_units.
S_MIN_HEADS = 16
LAG = 3  # program steps between a unit's products and its sum
RING = 4  # units in flight: PSUM banks and SBUF temporaries rotate through them


def _scalar_units(n_units: int, nq: int, cc: int) -> list[bool]:
    """Which of a tile's ``n_units`` units of ``nq`` heads x ``cc`` pairs get their cos
    products from the ScalarE instead of the VectorE (spread evenly over the tile).

    The share levels the two engines' time per unit on the trn2 model: the VectorE does every
    unit's sum and the other units' products, each one pass of ``2 nq cc`` elements (0.96 GHz,
    60-cycle fixed cost); the ScalarE's ``cc`` per-pair instructions cost
    ``max(64, 2 nq) + 60`` cycles each at 1.2 GHz, x1.5 for their strided reads.  Rounded down:
    a long ScalarE unit holds its sum back, so too many cost more than too few.
    """
    if nq < S_MIN_HEADS:
        return [False] * n_units
    vector = (2 * nq * cc + 60) / 0.96
    scalar = cc * (max(64, 2 * nq) + 60) * 1.5 / 1.2
    n = math.floor(2 * vector / (vector + scalar) * n_units)
    return [(u + 1) * n // n_units > u * n // n_units for u in range(n_units)]


@nki.jit
def rope_kernel(x, cos, sin, interleaved, inverse):
    """Rotate the pairs of ``x`` [BH, S, D] by ``cos``/``sin`` [S, D/2] (by ``-theta`` when
    ``inverse``); pairs are ``(2i, 2i+1)`` when ``interleaved`` else ``(i, i + D/2)``."""
    bh, s, d = x.shape
    h = d // 2
    out = nl.ndarray((bh, s, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    f32 = nl.float32
    gps = nisa.engine.gpsimd
    k = max(1, min(bh, TILE_BYTES // (d * x.itemsize)))  # heads per x tile, at most
    k = math.ceil(bh / math.ceil(bh / k))  # ... spread evenly: the last tile is (nearly) full
    kd = max(1, math.ceil(k / DMA_SPLIT))  # heads per DMA transfer
    in_place = d * x.itemsize > TILE_BYTES
    nq = min(k, UNIT // 2)  # heads per unit
    cc = max(1, min(h, UNIT // (2 * nq)))  # pairs per unit: 2 * nq * cc <= UNIT
    # units (first head, heads, first pair, pairs) of one x tile
    units = [
        (q0, min(nq, k - q0), c0, min(cc, h - c0))
        for q0 in range(0, k, nq)
        for c0 in range(0, h, cc)
    ]
    on_scalar = _scalar_units(len(units), nq, cc)
    # the sin table's sign per pair member: member 0 (y1) takes x2 sin, member 1 (y2) x1 sin
    sign = (1.0, -1.0) if inverse else (-1.0, 1.0)

    def idx(m, col, swap):
        """x index of pair member ``m`` (0: first, 1: second; the other one when ``swap``)."""
        if swap:
            return 2 * col + 1 - m if interleaved else col + h - h * m
        return 2 * col + m if interleaved else col + h * m

    def position_tile(p0, r):
        """One tile of ``r`` positions (static) from ``p0``: all heads, all pairs."""
        i_r = nl.arange(r)[:, None]
        i_h2 = nl.arange(h)[None, :]
        c_tile = nl.load(cos[p0 + i_r, i_h2])
        s_tile = nl.load(sin[p0 + i_r, i_h2])
        # the tables by plain per-element copies (nothing sums over partitions, so a
        # non-finite entry stays in its own position and pair)
        ss = nl.ndarray((r, 2, h), dtype=x.dtype)  # signed sin, for the GpSimd
        for m in range(2):
            ss[i_r, m, i_h2] = nisa.activation(op=nl.copy, data=s_tile, scale=sign[m])
        if h <= PSUM_TRIG_PAIRS:
            c_v = nl.ndarray((r, h), dtype=f32, buffer=nl.psum)  # cos for the VectorE
            c_v[...] = nisa.activation(op=nl.copy, data=c_tile, dtype=f32)
        else:
            c_v = c_tile
        if any(on_scalar):
            c32 = nl.ndarray((r, h), dtype=f32)  # activation scales are fp32
            c32[...] = nisa.activation(op=nl.copy, data=c_tile, dtype=f32)
        i_p = nl.arange(r)[:, None, None, None]
        i_m = nl.arange(2)[None, :, None, None]
        i_p3 = nl.arange(r)[:, None, None]
        i_m3 = nl.arange(2)[None, :, None]
        i_one = nl.arange(1)[None, :, None]  # a (P, 1, 1) scale broadcasts over [P, 2, heads]
        i_d = nl.arange(d)[None, None, :]

        def head_group(g, x_tile, y):
            """All units of x tile ``g`` (heads ``g*K ..``), as a wavefront."""
            acc = [nl.ndarray((r, 2, nq, cc), dtype=f32, buffer=nl.psum) for _ in range(RING)]
            bsb = [nl.ndarray((r, 2, nq, cc), dtype=f32) for _ in range(RING)]

            def stage(st, u):
                q0, uq, c0, uc = units[u]
                a_t = acc[u % RING]
                b_t = bsb[u % RING]
                i_q = nl.arange(uq)[None, None, :, None]
                i_c = nl.arange(uc)[None, None, None, :]
                live = g * k + q0 + i_q < bh
                col = c0 + i_c
                if st == 0:
                    if on_scalar[u]:
                        # ScalarE, one pair index at a time: its cos is the per-position
                        # scale of all heads and both members (an exact fp32 product)
                        i_q3 = nl.arange(uq)[None, None, :]
                        for j in range(uc):
                            a_t[i_p3, i_m3, i_q3, j] = nisa.activation(
                                op=nl.copy,
                                data=x_tile[i_p3, q0 + i_q3, idx(i_m3, c0 + j, False)],
                                scale=c32[i_p3, c0 + j + 0 * i_one],
                                dtype=f32,
                                mask=g * k + q0 + i_q3 < bh,
                            )
                    b_t[i_p, i_m, i_q, i_c] = nisa.tensor_tensor(
                        x_tile[i_p, q0 + i_q, idx(i_m, col, True)],
                        ss[i_p, i_m, 0 * i_q + col],
                        nl.multiply, dtype=f32, engine=gps, mask=live,
                    )  # fmt: skip
                elif st == 1:
                    if not on_scalar[u]:
                        a_t[i_p, i_m, i_q, i_c] = nisa.tensor_tensor(
                            x_tile[i_p, q0 + i_q, idx(i_m, col, False)],
                            c_v[i_p, 0 * i_m + 0 * i_q + col],
                            nl.multiply, dtype=f32, mask=live,
                        )  # fmt: skip
                else:
                    y[i_p, q0 + i_q, idx(i_m, col, False)] = nisa.tensor_tensor(
                        a_t[i_p, i_m, i_q, i_c], b_t[i_p, i_m, i_q, i_c], nl.add,
                        dtype=x.dtype, mask=live,
                    )  # fmt: skip

            # at program step t: the sum of unit t - LAG, then the products of unit t
            offset = {0: 0, 1: 0, 2: LAG}
            for step in range(len(units) + LAG):
                for st in (2, 1, 0):
                    u = step - offset[st]
                    if 0 <= u < len(units):
                        stage(st, u)

        for g in nl.affine_range(math.ceil(bh / k)):
            x_tile = nl.ndarray((r, k, d), dtype=x.dtype)
            for h0 in range(0, k, kd):
                i_kd = h0 + nl.arange(min(kd, k - h0))[None, :, None]
                x_tile[i_p3, i_kd, i_d] = nl.load(
                    x[g * k + i_kd, p0 + i_p3, i_d], mask=g * k + i_kd < bh
                )
            # a head row over TILE_BYTES: the outputs overwrite the x tile in place (each unit
            # writes only the pairs it has read), which halves the SBUF the longest rows need;
            # otherwise a separate tile, so that no unit's sum waits for another unit's reads
            y = x_tile if in_place else nl.ndarray((r, k, d), dtype=x.dtype, buffer=nl.sbuf)
            head_group(g, x_tile, y)
            for h0 in range(0, k, kd):
                i_kd = h0 + nl.arange(min(kd, k - h0))[None, :, None]
                nl.store(
                    out[g * k + i_kd, p0 + i_p3, i_d],
                    value=y[i_p3, i_kd, i_d],
                    mask=g * k + i_kd < bh,
                )

    for st in nl.affine_range(s // pmax):
        position_tile(st * pmax, pmax)
    if s % pmax:
        position_tile(s // pmax * pmax, s % pmax)
    return out


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, layout: str = "half") -> np.ndarray:
    """Apply rotary position embedding to ``x`` [..., S, D] with ``cos``, ``sin`` [S, D/2].

    ``layout``: ``"half"`` rotates pairs ``(i, i + D/2)`` (rotate_half, Llama/HF) and
    ``"interleaved"`` pairs ``(2i, 2i + 1)``.  Pair ``(a, b)`` becomes
    ``(a cos - b sin, b cos + a sin)``.  All three arrays float32 or all bfloat16 (numpy arrays
    or CPU torch tensors); D even.  Returns x's shape and dtype.  Raises ``ValueError`` for bad
    shapes or layout and ``TypeError`` for an unsupported or mixed dtype.
    """
    return _apply("rope", x, cos, sin, layout, inverse=False)


def rope_backward(
    grad: np.ndarray, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, layout: str = "half"
) -> tuple[np.ndarray, ...]:
    """Gradients of ``rope``: ``grad`` rotated by ``-theta`` for ``x``; ``cos`` and ``sin`` are
    treated as constant tables (position encodings are not trained), so their gradients are
    returned as zeros."""
    gx = _apply("rope_backward", grad, cos, sin, layout, inverse=True, other=x)
    zeros = [np.zeros(tuple(t.shape), dtype=_np_dtype(t)) for t in (cos, sin)]
    return (gx, *zeros)


def _np_dtype(t: object) -> np.dtype:
    return dtypes.as_dtype(t.dtype)  # type: ignore[attr-defined]


def _apply(fn, x, cos, sin, layout, *, inverse, other=None):
    if layout not in LAYOUTS:
        raise ValueError(
            f"{fn}: layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}"
        )
    shape = tuple(x.shape)
    if len(shape) < 2:
        raise ValueError(f"{fn}: x must be [..., S, D], got shape {shape}")
    if other is not None and tuple(other.shape) != shape:
        raise ValueError(f"{fn}: grad must have x's shape {tuple(other.shape)}, got {shape}")
    s, d = shape[-2:]
    if d % 2:
        raise ValueError(f"{fn}: the last dimension D must be even, got {d}")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (s, d // 2):
            raise ValueError(f"{fn}: {name} must have shape ({s}, {d // 2}), got {tuple(t.shape)}")
    arrays = (x, cos, sin) if other is None else (x, other, cos, sin)
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in arrays}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    bh = math.prod(shape[:-2])
    if bh == 0 or s == 0 or d == 0:
        return x.copy() if hasattr(x, "copy") else x.clone()
    y = rope_kernel(x.reshape((bh, s, d)), cos, sin, layout == "interleaved", inverse)
    return y.reshape(shape)
