"""Hypothesis strategies for tile-legal kernel shapes, NKI dtypes and seeded inputs.

Sizes are drawn from two sources at once: the tile edges, where kernels break (1, t-1, t, t+1,
2t-1, ... for a tile size t), and anywhere in the allowed range.  Array contents are not drawn
element by element (slow for 100k-element tiles, and hypothesis cannot draw bf16/fp8); a seed is
drawn instead and ``random_inputs`` makes the arrays, so a failing example is reproducible from
its seed and shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from hypothesis import strategies as st

from .. import dtypes
from .inputs import Shape, random_inputs

PMAX = 128  # partitions per tile (nl.tile_size.pmax)
PSUM_FMAX = 512  # fp32 elements per PSUM bank (nl.tile_size.psum_fmax)
GEMM_STATIONARY_FMAX = 128  # matmul stationary free size (M tile)
GEMM_MOVING_FMAX = 512  # matmul moving free size (N tile)
BN_STATS_FMAX = 512  # bn_stats free size

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
FP8_DTYPES = ("float8_e4m3", "float8_e5m2")


def tile_edges(tile: int, lo: int, hi: int, multiple_of: int = 1) -> list[int]:
    """Sizes around multiples of ``tile`` (k*tile - 1, k*tile, k*tile + 1) and 1, within
    [lo, hi] and divisible by ``multiple_of``; sorted, so hypothesis shrinks to the smallest."""
    cands = {1, lo, hi}
    for k in range(1, hi // tile + 2):
        cands.update((k * tile - 1, k * tile, k * tile + 1))
    return sorted(c for c in cands if lo <= c <= hi and c % multiple_of == 0)


def sizes(
    max_size: int, *, min_size: int = 1, tile: int = PMAX, multiple_of: int = 1
) -> st.SearchStrategy[int]:
    """Sizes in [min_size, max_size] that are multiples of ``multiple_of``, with the edges of
    ``tile`` drawn often.  Raises ``ValueError`` when the range holds no such size."""
    lo = -(-max(min_size, 1) // multiple_of)
    hi = max_size // multiple_of
    if lo > hi:
        raise ValueError(f"no multiple of {multiple_of} in [{min_size}, {max_size}]")
    edges = tile_edges(tile, lo * multiple_of, hi * multiple_of, multiple_of)
    anywhere = st.integers(lo, hi).map(lambda k: k * multiple_of)
    return st.one_of(st.sampled_from(edges), anywhere) if edges else anywhere


def row_counts(
    max_rows: int = 3 * PMAX, *, min_rows: int = 1, multiple_of: int = 1
) -> st.SearchStrategy[int]:
    """Row counts for kernels that tile rows onto the 128 partitions: ragged last tiles
    (e.g. 129, 255) as well as exact ones."""
    return sizes(max_rows, min_size=min_rows, tile=PMAX, multiple_of=multiple_of)


def free_sizes(
    max_size: int = 1024, *, min_size: int = 1, tile: int = PSUM_FMAX, multiple_of: int = 1
) -> st.SearchStrategy[int]:
    """Free-axis sizes, with the edges of ``tile`` (default 512: PSUM bank, bn_stats and
    matmul moving limits) drawn often."""
    return sizes(max_size, min_size=min_size, tile=tile, multiple_of=multiple_of)


def shapes_2d(
    max_rows: int = 3 * PMAX, max_free: int = 1024, *, free_tile: int = PSUM_FMAX
) -> st.SearchStrategy[tuple[int, int]]:
    """(rows, free) shapes of a 2-D tensor tiled by 128 rows."""
    return st.tuples(row_counts(max_rows), free_sizes(max_free, tile=free_tile))


def matmul_shapes(
    *,
    max_k: int = 3 * PMAX,
    max_m: int = 2 * GEMM_STATIONARY_FMAX,
    max_n: int = 2 * GEMM_MOVING_FMAX,
    ragged: bool = True,
) -> st.SearchStrategy[tuple[int, int, int]]:
    """(K, M, N) for ``lhsT [K, M] @ rhs [K, N]``.  With ``ragged=False`` K and M are
    multiples of 128 and N of 512 (the matmul tile sizes); otherwise any size, tile edges often."""
    if ragged:
        return st.tuples(
            sizes(max_k, tile=PMAX),
            sizes(max_m, tile=GEMM_STATIONARY_FMAX),
            sizes(max_n, tile=GEMM_MOVING_FMAX),
        )
    return st.tuples(
        sizes(max_k, min_size=PMAX, tile=PMAX, multiple_of=PMAX),
        sizes(
            max_m,
            min_size=GEMM_STATIONARY_FMAX,
            tile=GEMM_STATIONARY_FMAX,
            multiple_of=GEMM_STATIONARY_FMAX,
        ),
        sizes(
            max_n, min_size=GEMM_MOVING_FMAX, tile=GEMM_MOVING_FMAX, multiple_of=GEMM_MOVING_FMAX
        ),
    )


def nki_dtypes(names: Iterable[object] = ("float32", "bfloat16")) -> st.SearchStrategy[np.dtype]:
    """One of the given NKI dtypes (names or dtypes), as numpy/ml_dtypes dtypes."""
    dts = [dtypes.as_dtype(n) for n in names]
    if not dts:
        raise ValueError("nki_dtypes needs at least one dtype")
    return st.sampled_from(dts)


def float_dtypes(
    *, fp16: bool = True, fp8: bool = False, tf32: bool = False
) -> st.SearchStrategy[np.dtype]:
    """float32 and bfloat16, plus float16, the fp8 formats (e4m3, e5m2) and tf32 on request."""
    names: list[str] = ["float32", "bfloat16"]
    if fp16:
        names.append("float16")
    if fp8:
        names.extend(FP8_DTYPES)
    if tf32:
        names.append("tfloat32")
    return nki_dtypes(names)


def seeds() -> st.SearchStrategy[int]:
    """Seeds for ``random_inputs``."""
    return st.integers(0, 2**32 - 1)


def arrays(shape: Shape, dtype: object, *, scale: float = 1.0) -> st.SearchStrategy[np.ndarray]:
    """One array of ``shape`` and NKI ``dtype`` from a drawn seed (see ``random_inputs``)."""
    return seeds().map(lambda s: random_inputs(tuple(shape), dtype, s, scale=scale))


def kernel_inputs(
    shapes: Sequence[Shape] | Mapping[str, Shape], dtype: object, *, scale: float = 1.0
) -> st.SearchStrategy[list[np.ndarray] | dict[str, np.ndarray]]:
    """Several arrays (a list, or a dict for a mapping of shapes) from one drawn seed."""
    return seeds().map(lambda s: random_inputs(shapes, dtype, s, scale=scale))
