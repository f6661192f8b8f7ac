"""Rotary position embedding (RoPE): forward, and backward as the rotation by ``-theta``.

Layout: ``x`` is [..., S, D] (leading dims flattened to ``BH`` "heads"), ``cos`` and ``sin``
are [S, D/2] (``cos[s, i] = cos(s * theta_i)``, one angle per rotated pair; the same table
serves both layouts).  Pair ``i`` of a row is

* ``layout="half"`` (rotate_half, Llama / Hugging Face): elements ``(i, i + D/2)``;
* ``layout="interleaved"`` (GPT-J / Meta original): elements ``(2i, 2i + 1)``;

and is rotated as ``(a, b) -> (a cos - b sin, b cos + a sin)``.  (HF's full-width
``cos = cat(freqs, freqs).cos()`` is this ``cos[:, :D/2]``.)

Mapping: positions go on the partitions (128 per ``affine_range`` tile along S, the last tile
masked), and ``K`` heads side by side on the free axis, so a tile is [128 positions, K, D]: one
strided DMA moves K*D elements (>= 4 KiB) per partition.  ``cos``/``sin`` are loaded once per
position tile (hoisted out of the head loop) and broadcast across the K heads by a stride-0
free access pattern, so no copy is made.  Per tile, six ``tensor_tensor`` instructions on
half-width views (pairs are strided or offset access patterns of the same SBUF tile): one
product and the two sums on VectorE, three products on GpSimd (the split that balances the
two engines in the cost model), written into the two
halves (or even/odd lanes) of the output tile, rounded once to x's dtype.
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
TILE_BYTES = 8192  # target bytes per partition of one x tile (K heads side by side)


@nki.jit
def rope_kernel(x, cos, sin, interleaved, inverse):
    """Rotate the pairs of ``x`` [BH, S, D] by ``cos``/``sin`` [S, D/2] (by ``-theta`` when
    ``inverse``); pairs are ``(2i, 2i+1)`` when ``interleaved`` else ``(i, i + D/2)``."""
    bh, s, d = x.shape
    h = d // 2
    out = nl.ndarray((bh, s, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    k = max(1, min(bh, TILE_BYTES // (d * x.itemsize)))
    i_p = nl.arange(pmax)[:, None, None]
    i_k = nl.arange(k)[None, :, None]
    i_d = nl.arange(d)[None, None, :]
    i_h = nl.arange(h)[None, None, :]
    i_p2 = nl.arange(pmax)[:, None]
    i_h2 = nl.arange(h)[None, :]
    if interleaved:
        first, second = 2 * i_h, 2 * i_h + 1
    else:
        first, second = i_h, h + i_h
    gps = nisa.engine.gpsimd

    for st in nl.affine_range(math.ceil(s / pmax)):
        pos2 = st * pmax + i_p2
        c_tile = nl.load(cos[pos2, i_h2], mask=pos2 < s)
        s_tile = nl.load(sin[pos2, i_h2], mask=pos2 < s)
        for g in nl.affine_range(math.ceil(bh / k)):
            pos = st * pmax + i_p
            heads = g * k + i_k
            valid = (pos < s) & (heads < bh)
            x_tile = nl.load(x[heads, pos, i_d], mask=valid)
            c_b = c_tile[i_p, 0 * i_k + i_h]  # stride-0 broadcast across the K heads
            s_b = s_tile[i_p, 0 * i_k + i_h]
            x1 = x_tile[i_p, i_k, first]
            x2 = x_tile[i_p, i_k, second]
            f32 = nl.float32
            a1 = nisa.tensor_tensor(x1, c_b, nl.multiply, dtype=f32, mask=valid)
            b1 = nisa.tensor_tensor(x2, s_b, nl.multiply, dtype=f32, engine=gps, mask=valid)
            a2 = nisa.tensor_tensor(x2, c_b, nl.multiply, dtype=f32, engine=gps, mask=valid)
            b2 = nisa.tensor_tensor(x1, s_b, nl.multiply, dtype=f32, engine=gps, mask=valid)
            y = nl.ndarray((pmax, k, d), dtype=x.dtype, buffer=nl.sbuf)
            op1, op2 = (nl.add, nl.subtract) if inverse else (nl.subtract, nl.add)
            y[i_p, i_k, first] = nisa.tensor_tensor(a1, b1, op1, dtype=x.dtype, mask=valid)
            y[i_p, i_k, second] = nisa.tensor_tensor(a2, b2, op2, dtype=x.dtype, mask=valid)
            nl.store(out[heads, pos, i_d], value=y, mask=valid)
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
