"""Elementwise ``a + b``: a pipelined single-instance kernel (the library path) and the NKI
tutorial's SPMD form (one kernel instance per 128 x 512 tile), kept as the grid example.

``tensor_add`` views the inputs as a [128, size / 128] matrix when the size divides by 128
(every partition then reads one contiguous run of the flat arrays), else as
[prod(leading dims), last dim], and launches ``tensor_add_tiled_kernel`` once.  That kernel
walks the matrix in [128, F] tiles of ``TILE_BYTES`` per partition, ``GROUP`` tiles per
``affine_range`` iteration with all loads issued before the adds and the stores (so the DMA
queues always have a transfer ready while an earlier one waits out its fixed start latency),
and adds on the VectorE (``tensor_tensor``, computed in fp32 and rounded once to the output
dtype).  Only bf16 has the all-16-bit fast path of ``tensor_tensor``; for the other dtypes
each add is split by columns between the VectorE and the GpSimd so that neither engine is
slower than the DMA.  Tiles past the bottom or right edge are masked, so any shape works
without padding.

``tensor_add_kernel`` is the SPMD example: launch it on the grid
``[ceil(rows / 128), ceil(cols / 512)]``; instance (i, j) loads its tile of ``a`` and ``b``,
adds and stores, masking rows and columns past the end.
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit import dtypes

# Entry points take numpy arrays or CPU torch tensors (annotated as numpy) and return the same kind.

DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
TILE_ROWS = 128  # nl.tile_size.pmax
TILE_COLS = 512  # SPMD example: one PSUM bank of fp32; a DMA-friendly free size
TILE_BYTES = 8192  # tiled kernel: bytes per partition of one tile (8 KiB per DMA)
GROUP = 4  # tiled kernel: tiles per loop iteration, loads first (see the module docstring)
# share of each tile's columns added on the GpSimd when the VectorE has no fast path for the
# dtype: both then run tensor_tensor at 2 cycles per element, the GpSimd at 1.2 GHz and the
# VectorE at 0.96 GHz, so 1.2 / (1.2 + 0.96) of the columns balance them
GPSIMD_SHARE = 0.55


@nki.jit
def tensor_add_tiled_kernel(a, b):
    """``a + b`` for a, b: [rows, cols] of one dtype, in one kernel instance (no grid)."""
    n, m = a.shape
    out = nl.ndarray((n, m), dtype=a.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    fc = min(m, max(1, TILE_BYTES // a.itemsize))
    n_chunks = math.ceil(m / fc)
    group = min(GROUP, n_chunks * math.ceil(n / pmax))
    # groups run along the columns when a row has enough chunks, else along the rows
    along_cols = n_chunks >= group
    i_p = nl.arange(pmax)[:, None]
    # bf16 adds at N/2 VectorE cycles; other dtypes split the columns with the GpSimd
    split = fc if a.dtype == nl.bfloat16 else fc - int(fc * GPSIMD_SHARE) // 32 * 32
    parts = [(0, split, nisa.engine.vector), (split, fc, nisa.engine.gpsimd)]
    parts = [(lo, hi, eng) for lo, hi, eng in parts if hi > lo]

    def tiles(t, c):
        """The group's (rows, first column) pairs for iteration (t, c)."""
        if along_cols:
            return [(t * pmax + i_p, (c * group + u) * fc) for u in range(group)]
        return [((t * group + u) * pmax + i_p, c * fc) for u in range(group)]

    outer = math.ceil(n / pmax) if along_cols else math.ceil(math.ceil(n / pmax) / group)
    inner = math.ceil(n_chunks / group) if along_cols else n_chunks
    for t in nl.affine_range(outer):
        for c in nl.affine_range(inner):
            loaded = []
            for rows, c0 in tiles(t, c):
                cols = c0 + nl.arange(fc)[None, :]
                inside = (rows < n) & (cols < m)
                loaded.append(
                    (
                        rows,
                        c0,
                        nl.load(a[rows, cols], mask=inside),
                        nl.load(b[rows, cols], mask=inside),
                    )
                )
            sums = []
            for rows, c0, a_tile, b_tile in loaded:
                s_tile = nl.ndarray((pmax, fc), dtype=a.dtype)
                for lo, hi, eng in parts:
                    i_c = lo + nl.arange(hi - lo)[None, :]
                    inside = (rows < n) & (c0 + i_c < m)
                    s_tile[i_p, i_c] = nisa.tensor_tensor(
                        a_tile[i_p, i_c],
                        b_tile[i_p, i_c],
                        nl.add,
                        dtype=a.dtype,
                        engine=eng,
                        mask=inside,
                    )
                sums.append(s_tile)
            for (rows, c0, _, _), s_tile in zip(loaded, sums, strict=True):
                cols = c0 + nl.arange(fc)[None, :]
                nl.store(out[rows, cols], value=s_tile, mask=(rows < n) & (cols < m))
    return out


@nki.jit
def tensor_add_kernel(a, b):
    """``a + b`` for one 128 x 512 tile per program; launch with grid
    ``[ceil(rows / 128), ceil(cols / 512)]``.  a, b: [rows, cols], same dtype."""
    n, m = a.shape
    out = nl.ndarray((n, m), dtype=a.dtype, buffer=nl.shared_hbm)

    rows = nl.program_id(0) * TILE_ROWS + nl.arange(TILE_ROWS)[:, None]
    cols = nl.program_id(1) * TILE_COLS + nl.arange(TILE_COLS)[None, :]
    inside = (rows < n) & (cols < m)

    a_tile = nl.load(a[rows, cols], mask=inside)
    b_tile = nl.load(b[rows, cols], mask=inside)
    c_tile = nisa.tensor_tensor(a_tile, b_tile, nl.add, dtype=a.dtype, mask=inside)
    nl.store(out[rows, cols], value=c_tile, mask=inside)
    return out


def tensor_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise sum of two arrays of the same shape and dtype.

    ``a``, ``b``: numpy arrays or CPU torch tensors of any shape, dtype float32, bfloat16,
    float16, float8_e4m3fn or float8_e5m2.  Returns ``a + b`` rounded once to that dtype (fp8
    saturates), in a's shape.  Raises ``ValueError`` for different shapes and ``TypeError`` for
    an unsupported or mixed dtype.
    """
    shape = tuple(a.shape)
    if tuple(b.shape) != shape:
        raise ValueError(f"tensor_add: shapes {shape} and {tuple(b.shape)} differ")
    names = {dtypes.name(dtypes.as_dtype(t.dtype)) for t in (a, b)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"tensor_add: a and b must share one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    size = math.prod(shape)
    if size == 0:  # an empty kernel launch is not legal
        return a.copy() if hasattr(a, "copy") else a.clone()
    if size % TILE_ROWS == 0:
        # elementwise, so any 2-D view works: 128 rows of contiguous data fill every partition
        # and make each partition's DMA run one contiguous stretch
        view = (TILE_ROWS, size // TILE_ROWS)
    else:
        cols = shape[-1] if shape else 1
        view = (size // cols, cols)
    out = tensor_add_tiled_kernel(a.reshape(view), b.reshape(view))
    return out.reshape(shape)
