"""``nisa.nonzero_with_count``: the first partition of each GpSimd core (0, 16, ..., 112) gets
the positions of its non-zero elements (plus ``index_offset``), then ``padding_val``, then the
count; every other partition keeps its value [nki-0x.md §4.8]."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _model(x: np.ndarray, old: int, offset: int, pad: int) -> np.ndarray:
    p, n = x.shape[0], int(np.prod(x.shape[1:]))
    out = np.full((p, n + 1), old, np.int32)
    for q in range(0, p, 16):
        (hits,) = np.nonzero(x[q].reshape(-1))
        out[q] = pad
        out[q, : hits.size] = hits + offset
        out[q, n] = hits.size
    return out


def _store(d):
    out = nl.ndarray(d.shape, dtype=d.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=d)
    return out


def make_kernel(offset: int, pad: int):
    @nki.jit
    def nonzero(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        n = x.shape[1] * x.shape[2]
        d = nl.ndarray((x.shape[0], 1, n + 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=d, value=7)
        nisa.nonzero_with_count(dst=d, src=t, index_offset=offset, padding_val=pad)
        out = nl.ndarray(d.shape, dtype=d.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    return nonzero


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("offset, pad", [(0, -1), (256, 0)])
def test_each_core_lists_its_first_partitions_nonzeros_then_padding_then_the_count(
    dtype, offset, pad
):
    rng = np.random.default_rng(3)
    x = (rng.random((128, 2, 64)) < 0.1).astype(dtype) * rng.integers(1, 9, (128, 2, 64))
    x[32] = 0  # a core with nothing to report
    x[48] = 1  # one with everything
    out = np.asarray(make_kernel(offset, pad)(x.astype(dtype)))
    np.testing.assert_array_equal(out.reshape(128, -1), _model(x, 7, offset, pad))


def test_a_smaller_tile_has_one_core_per_16_partitions():
    x = np.zeros((40, 1, 8), np.float32)
    x[:, 0, 3] = 2.5
    x[16, 0, 0] = -1.0
    out = np.asarray(make_kernel(0, -1)(x)).reshape(40, -1)
    np.testing.assert_array_equal(out, _model(x, 7, 0, -1))


def test_dst_must_have_one_more_element_per_partition_than_src():
    @nki.jit
    def short_dst(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        d = nl.ndarray((x.shape[0], x.shape[1]), dtype=nl.int32, buffer=nl.sbuf)
        nisa.nonzero_with_count(dst=d, src=t)  # BAD: no room for the count
        return _store(d)

    with pytest.raises(NkiError, match="nonzero_with_count") as e:
        short_dst(np.zeros((16, 8), np.float32))
    assert "test_nonzero.py" in str(e.value)


def test_src_must_be_fp32_or_int32():
    @nki.jit
    def bf16_src(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        d = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.nonzero_with_count(dst=d, src=t)  # BAD: bf16
        return _store(d)

    with pytest.raises(NkiError, match="err_unsupported_dtype|bfloat16"):
        bf16_src(np.zeros((16, 8), nl.bfloat16))
