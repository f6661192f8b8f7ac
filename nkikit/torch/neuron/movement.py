"""Data-movement kernels of the emulated device: a DMA copy and an embedding gather.

Where an ATen op moves data (``cat``, ``clone``/``contiguous``, ``stack``...), the device runs
these NKI kernels through nkikit's normal launch path, so the system profile shows each copy
with its modeled DMA time.  Both are plain HBM -> SBUF -> HBM tile copies (NKI Beta 1 ``nl.load``
/ ``nl.store``; reference/nki.md: DMA engines move data between HBM and SBUF, tiles have at most
128 partitions); the gather uses one indirect DMA per tile of 128 indices (a row of the table
per partition, addressed by an index tile in SBUF).
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.language as nl

COPY_COLS = 2048  # free size of a copy tile: 128 x 2048 x 4 B = 1 MiB per DMA (fp32)


@nki.jit
def dma_copy_kernel(src):
    """A copy of ``src`` [R, C] (any dtype), moved in [128, COPY_COLS] tiles."""
    rows, cols = src.shape
    out = nl.ndarray((rows, cols), dtype=src.dtype, buffer=nl.shared_hbm)
    tp = min(nl.tile_size.pmax, rows)
    tf = min(COPY_COLS, cols)
    i_p = nl.arange(tp)[:, None]
    i_f = nl.arange(tf)[None, :]
    for r in nl.affine_range(math.ceil(rows / tp)):
        for c in nl.affine_range(math.ceil(cols / tf)):
            rr = r * tp + i_p
            cc = c * tf + i_f
            inside = (rr < rows) & (cc < cols)
            tile = nl.load(src[rr, cc], mask=inside)
            nl.store(out[rr, cc], value=tile, mask=inside)
    return out


@nki.jit
def gather_rows_kernel(table, ids):
    """``table[ids[i, 0]]`` for each row i: table [V, D], ids [N, 1] int32 -> [N, D]."""
    n = ids.shape[0]
    d = table.shape[1]
    out = nl.ndarray((n, d), dtype=table.dtype, buffer=nl.shared_hbm)
    tp = min(nl.tile_size.pmax, n)
    tf = min(COPY_COLS, d)
    i_p = nl.arange(tp)[:, None]
    i_0 = nl.arange(1)[None, :]
    i_f = nl.arange(tf)[None, :]
    for r in nl.affine_range(math.ceil(n / tp)):
        rr = r * tp + i_p
        idx = nl.load(ids[rr, i_0], mask=rr < n)
        for c in nl.affine_range(math.ceil(d / tf)):
            cc = c * tf + i_f
            inside = (rr < n) & (cc < d)
            rows = nl.load(table[idx[i_p, 0], cc], mask=inside)
            nl.store(out[rr, cc], value=rows, mask=inside)
    return out


@nki.jit
def memset_kernel(like, value):
    """A new tensor of ``like``'s shape [R, C] and dtype, every element ``value`` (``like`` is
    not read: it gives the shape and dtype).  One fill tile (VectorE), stored in
    [128, COPY_COLS] tiles."""
    rows, cols = like.shape
    out = nl.ndarray((rows, cols), dtype=like.dtype, buffer=nl.shared_hbm)
    tp = min(nl.tile_size.pmax, rows)
    tf = min(COPY_COLS, cols)
    i_p = nl.arange(tp)[:, None]
    i_f = nl.arange(tf)[None, :]
    tile = nl.full((tp, tf), value, dtype=like.dtype, buffer=nl.sbuf)
    for r in nl.affine_range(math.ceil(rows / tp)):
        for c in nl.affine_range(math.ceil(cols / tf)):
            rr = r * tp + i_p
            cc = c * tf + i_f
            nl.store(out[rr, cc], value=tile, mask=(rr < rows) & (cc < cols))
    return out


def as_2d(a: np.ndarray) -> np.ndarray:
    """``a`` flattened to the [rows, cols] a copy kernel moves: 128 partitions when the size
    allows (full-width DMAs), else one row per leading index."""
    n = a.size
    if n % 128 == 0 and n >= 128:
        return a.reshape(128, n // 128)
    if a.ndim >= 2:
        return a.reshape(-1, a.shape[-1])
    return a.reshape(1, max(n, 1))


def dma_copy(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` made by :func:`dma_copy_kernel` (one launch); the same shape."""
    if a.size == 0:
        return a.copy()
    return np.asarray(dma_copy_kernel(np.ascontiguousarray(as_2d(a)))).reshape(a.shape)


def memset(like: np.ndarray, value: float) -> np.ndarray:
    """An array like ``like`` filled with ``value`` (one launch of :func:`memset_kernel`)."""
    if like.size == 0:
        return like.copy()
    flat = np.ascontiguousarray(as_2d(like))
    return np.asarray(memset_kernel(flat, float(value))).reshape(like.shape)


def gather_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``table[ids]`` for int ids of any shape (one launch of :func:`gather_rows_kernel`)."""
    flat = np.ascontiguousarray(ids.reshape(-1, 1).astype(np.int32))
    if flat.size == 0:
        return np.zeros((*ids.shape, table.shape[1]), dtype=table.dtype)
    out = gather_rows_kernel(np.ascontiguousarray(table), flat)
    return np.asarray(out).reshape(*ids.shape, table.shape[1])
