"""The hypothesis strategies: sizes stay in range, tile edges come up, dtypes and inputs are
what they claim."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nkikit import dtypes
from nkikit.testing import strategies as nst


def test_tile_edges():
    assert nst.tile_edges(128, 1, 300) == [1, 127, 128, 129, 255, 256, 257, 300]
    assert nst.tile_edges(512, 1, 600, multiple_of=2) == [512, 600]
    assert nst.tile_edges(128, 130, 200) == [130, 200]


@given(n=nst.row_counts(3 * 128))
def test_row_counts_in_range(n):
    assert 1 <= n <= 384


@given(n=nst.free_sizes(1000, min_size=4, multiple_of=4))
def test_free_sizes_multiples(n):
    assert 4 <= n <= 1000 and n % 4 == 0


def test_sizes_empty_range():
    with pytest.raises(ValueError, match="no multiple of 128"):
        nst.sizes(100, multiple_of=128)


def test_edges_are_drawn_often():
    seen: set[int] = set()

    @settings(max_examples=200, derandomize=True, database=None)
    @given(n=nst.row_counts(3 * 128))
    def collect(n):
        seen.add(n)

    collect()
    # a ragged last tile right after a full one, and an exact multiple
    assert {129, 256} & seen and {1, 128} & seen


@given(shape=nst.shapes_2d(max_rows=200, max_free=700))
def test_shapes_2d(shape):
    rows, free = shape
    assert 1 <= rows <= 200 and 1 <= free <= 700


@given(kmn=nst.matmul_shapes(max_k=384, max_m=256, max_n=1024, ragged=False))
def test_matmul_shapes_whole_tiles(kmn):
    k, m, n = kmn
    assert k % 128 == 0 and m % 128 == 0 and n % 512 == 0
    assert 128 <= k <= 384 and 128 <= m <= 256 and 512 <= n <= 1024


@given(kmn=nst.matmul_shapes(max_k=300, max_m=200, max_n=600))
def test_matmul_shapes_ragged(kmn):
    k, m, n = kmn
    assert 1 <= k <= 300 and 1 <= m <= 200 and 1 <= n <= 600


@given(dt=nst.float_dtypes(fp16=False, fp8=True, tf32=True))
def test_float_dtypes(dt):
    assert dtypes.name(dt) in {"float32", "bfloat16", "float8_e4m3", "float8_e5m2", "tfloat32"}


@given(dt=nst.nki_dtypes(["int8", np.float16]))
def test_nki_dtypes(dt):
    assert dt in (np.dtype(np.int8), np.dtype(np.float16))


def test_nki_dtypes_needs_one():
    with pytest.raises(ValueError):
        nst.nki_dtypes([])


@given(x=nst.arrays((3, 5), "bfloat16"), xs=nst.kernel_inputs({"a": (2,), "b": (4, 1)}, "float16"))
def test_array_strategies(x, xs):
    assert x.shape == (3, 5) and x.dtype == dtypes.bfloat16
    assert xs["a"].shape == (2,) and xs["b"].dtype == np.float16


@given(data=st.data())
def test_drawn_inputs_are_reproducible(data):
    seed = data.draw(nst.seeds())
    from nkikit.testing import random_inputs

    np.testing.assert_array_equal(
        random_inputs((4,), "float32", seed), random_inputs((4,), "float32", seed)
    )
