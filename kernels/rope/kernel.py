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
free axis, so a tile is [128 positions, K, D]: one strided DMA moves K*D elements (4 KiB) per
partition.  Pairs are half-width views of the same SBUF tile (offset ``D/2`` or stride 2).

Per position tile ``cos`` and ``sin`` are loaded once (hoisted out of the head loop) and
copied into PSUM by the TensorE (identity matmul, exact): a VectorE ``tensor_tensor`` with one
PSUM operand takes N cycles instead of 2N, and a stride-0 free access pattern broadcasts them
over the heads without a copy.  The four products are exact in fp32 (the inputs are at most
fp32), and each output is rounded once:

* VectorE: ``a1 = x1 cos``, ``b1 = x2 sin``, ``a2 = x2 cos`` (cos/sin from PSUM);
* GpSimd: ``b2 = x1 sin`` and ``y2 = a2 + b2``;
* TensorE: ``y1 = a1 - b1`` accumulated in PSUM as ``I @ a1 + (-I) @ b1`` (fp32 matmuls);
* ScalarE: ``y1`` from PSUM into the output tile (the rounding to x's dtype).

The work runs in groups of up to 512 fp32 columns (one PSUM bank), so the engines pipeline
within a tile.  For the backward (rotation by ``-theta``) the signs of ``b1`` and ``b2`` flip.
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
TILE_BYTES = 4096  # target bytes per partition of one x tile (K heads side by side)
GROUP_COLS = 512  # fp32 columns per work group: one PSUM bank
PSUM_TRIG_PAIRS = 1024  # cos/sin go to PSUM up to this many pairs (4 banks); else from SBUF


@nki.jit
def rope_kernel(x, cos, sin, interleaved, inverse):
    """Rotate the pairs of ``x`` [BH, S, D] by ``cos``/``sin`` [S, D/2] (by ``-theta`` when
    ``inverse``); pairs are ``(2i, 2i+1)`` when ``interleaved`` else ``(i, i + D/2)``."""
    bh, s, d = x.shape
    h = d // 2
    out = nl.ndarray((bh, s, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    f32 = nl.float32
    k = max(1, min(bh, TILE_BYTES // (d * x.itemsize)))
    hc = min(h, GROUP_COLS)  # pairs per group
    hg = max(1, min(k, GROUP_COLS // hc))  # heads per group
    ident = nl.load(nl.shared_identity_matrix(pmax, dtype=f32))
    # y1 = a1 - b1 (forward) or a1 + b1 (backward): the b1 term enters PSUM through -I or I
    sign_b1 = nisa.tensor_scalar(ident, nl.multiply, 1.0 if inverse else -1.0, dtype=f32)
    ident_x = nl.load(nl.shared_identity_matrix(pmax, dtype=x.dtype))
    op2 = nl.subtract if inverse else nl.add  # y2 = a2 + b2, or a2 - b2 backward

    def position_tile(p0, r):
        """One tile of ``r`` positions (static) from ``p0``: all heads, all pairs."""
        i_r = nl.arange(r)[:, None]
        i_h2 = nl.arange(h)[None, :]
        c_tile = nl.load(cos[p0 + i_r, i_h2])
        s_tile = nl.load(sin[p0 + i_r, i_h2])
        trig = []  # per pair chunk: cos, sin (PSUM when small enough) for the VectorE products
        for c0 in range(0, h, hc):
            i_c = c0 + nl.arange(min(hc, h - c0))[None, :]
            if h <= PSUM_TRIG_PAIRS:
                c_ps = nl.ndarray((r, i_c.shape[1]), dtype=f32, buffer=nl.psum)
                c_ps[...] = nisa.nc_matmul(ident_x[i_r, nl.arange(r)[None, :]], c_tile[i_r, i_c])
                s_ps = nl.ndarray((r, i_c.shape[1]), dtype=f32, buffer=nl.psum)
                s_ps[...] = nisa.nc_matmul(ident_x[i_r, nl.arange(r)[None, :]], s_tile[i_r, i_c])
                trig.append((c_ps, s_ps, 0))
            else:
                trig.append((c_tile, s_tile, c0))
        i_p = nl.arange(r)[:, None, None]
        i_k = nl.arange(k)[None, :, None]
        i_d = nl.arange(d)[None, None, :]
        for g in nl.affine_range(math.ceil(bh / k)):
            heads = g * k + i_k
            x_tile = nl.load(x[heads, p0 + i_p, i_d], mask=heads < bh)
            y = nl.ndarray((r, k, d), dtype=x.dtype, buffer=nl.sbuf)
            for q in range(0, k, hg):
                nq = min(hg, k - q)
                i_q = nl.arange(nq)[None, :, None]
                live = g * k + q + i_q < bh
                for j, c0 in enumerate(range(0, h, hc)):
                    nc = min(hc, h - c0)
                    i_c = nl.arange(nc)[None, None, :]
                    pair = c0 + i_c
                    first, second = (2 * pair, 2 * pair + 1) if interleaved else (pair, h + pair)
                    x1 = x_tile[i_p, q + i_q, first]
                    x2 = x_tile[i_p, q + i_q, second]
                    c_v, s_v, off = trig[j]
                    c_b = c_v[i_p, 0 * i_q + off + i_c]  # stride 0 over the heads
                    s_b = s_v[i_p, 0 * i_q + off + i_c]
                    # a1, b1 as 2-D [r, nq * nc] tiles: the TensorE reads them as moving operands
                    flat = i_q * nc + i_c
                    a1 = nl.ndarray((r, nq * nc), dtype=f32)
                    a1[i_p, flat] = nisa.tensor_tensor(x1, c_b, nl.multiply, dtype=f32, mask=live)
                    b1 = nl.ndarray((r, nq * nc), dtype=f32)
                    b1[i_p, flat] = nisa.tensor_tensor(x2, s_b, nl.multiply, dtype=f32, mask=live)
                    a2 = nisa.tensor_tensor(x2, c_b, nl.multiply, dtype=f32, mask=live)
                    b2 = nisa.tensor_tensor(
                        x1, s_tile[i_p, 0 * i_q + pair], nl.multiply, dtype=f32,
                        engine=nisa.engine.gpsimd, mask=live,
                    )  # fmt: skip
                    y[i_p, q + i_q, second] = nisa.tensor_tensor(
                        a2, b2, op2, dtype=x.dtype, engine=nisa.engine.gpsimd, mask=live
                    )
                    acc = nl.ndarray((r, nq * nc), dtype=f32, buffer=nl.psum)
                    acc[...] = nisa.nc_matmul(ident[i_r, nl.arange(r)[None, :]], a1)
                    acc += nisa.nc_matmul(sign_b1[i_r, nl.arange(r)[None, :]], b1)
                    y[i_p, q + i_q, first] = nisa.activation(
                        op=nl.copy, data=acc[i_p, flat], dtype=x.dtype, mask=live
                    )
            nl.store(out[heads, p0 + i_p, i_d], value=y, mask=heads < bh)

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
