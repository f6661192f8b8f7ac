"""``dtypes.to_f32``, the widening every engine read goes through: its fast forms give
``astype``'s bits and ``astype``'s memory layout (a reduction's order follows the layout)."""

import numpy as np
import pytest

from nkikit import dtypes

NARROW = [
    dtypes.bfloat16,
    dtypes.float8_e4m3,
    dtypes.float8_e4m3fn,
    dtypes.float8_e5m2,
    dtypes.float8_e8m0fnu,
]


@pytest.mark.parametrize("dt", NARROW, ids=str)
def test_every_bit_pattern_widens_as_astype(dt):
    bits = np.arange(1 << (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    x = bits.view(dt)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float32)
    got = dtypes.to_f32(x)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dt", NARROW, ids=str)
def test_views_keep_astypes_layout(dt):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 1 << (8 * dt.itemsize), (16, 3, 40))
    x = raw.astype(np.uint16 if dt.itemsize == 2 else np.uint8).view(dt)
    for v in (x, x[:, 1, :], x.transpose(2, 0, 1), x[:, :, ::3], x[3, 2, 5:9]):
        with np.errstate(invalid="ignore"):
            want = v.astype(np.float32)
        got = dtypes.to_f32(v)
        assert got.shape == want.shape and got.strides == want.strides
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
