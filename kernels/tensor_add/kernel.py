"""Elementwise ``a + b`` as an SPMD kernel: one kernel instance per 128 x 512 tile.

The launch grid is (ceil(rows / 128), ceil(cols / 512)); instance (i, j) loads its tile of
``a`` and ``b`` (two DMAs), adds them on the VectorE (``tensor_tensor``, computed in fp32 and
rounded once to the output dtype) and stores the tile.  Instances on the bottom and right edges
mask the rows and columns past the end of the tensor, so any 2-D shape works without padding.
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
TILE_COLS = 512  # one PSUM bank of fp32; a DMA-friendly free size


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

    ``a``, ``b``: numpy arrays or CPU torch tensors of any shape (N-D inputs are viewed as
    [prod(leading dims), last dim]), dtype float32, bfloat16, float16, float8_e4m3fn or
    float8_e5m2.  Returns ``a + b`` rounded once to that dtype (fp8 saturates).
    Raises ``ValueError`` for different shapes and ``TypeError`` for an unsupported or mixed dtype.
    """
    shape = tuple(a.shape)
    if tuple(b.shape) != shape:
        raise ValueError(f"tensor_add: shapes {shape} and {tuple(b.shape)} differ")
    names = {dtypes.name(dtypes.as_dtype(t.dtype)) for t in (a, b)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"tensor_add: a and b must share one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    if math.prod(shape) == 0:  # an empty kernel launch is not legal
        return a.copy() if hasattr(a, "copy") else a.clone()
    cols = shape[-1] if shape else 1
    rows = math.prod(shape) // cols
    grid = (math.ceil(rows / TILE_ROWS), math.ceil(cols / TILE_COLS))
    out = tensor_add_kernel[grid](a.reshape((rows, cols)), b.reshape((rows, cols)))
    return out.reshape(shape)
