"""NKI 0.x DMA forms the NKI Library relies on: a row gather (``.ap(vector_offset=)``) through a
reshape of a kernel argument (rows are the reshape's rows), a gather-transpose, the 4-D default
permutation of ``dma_transpose`` and SBUF-to-SBUF transposes whose last axis walks the
partitions (a DMA sees SBUF as memory) [nki-0x.md §3.6, §4.3]."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

BLOCKS, BLOCK, D, P = 6, 4, 8, 16


def _cache() -> np.ndarray:
    # (tokens, head dim): a paged KV cache, BLOCK tokens per block
    return np.arange(BLOCKS * BLOCK * D, dtype=np.float32).reshape(BLOCKS * BLOCK, D) / 7


def _blocks() -> np.ndarray:
    return (np.arange(P, dtype=np.int32) * 5 % BLOCKS).reshape(P, 1)


def _load_index(idx):
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    return ix


@nki.jit
def gather_blocks(cache, idx):
    ix = _load_index(idx)
    rows = cache.reshape((cache.shape[0] // BLOCK, BLOCK * D))  # one row per block
    t = nl.ndarray((P, BLOCK * D), dtype=cache.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=rows.ap([[BLOCK * D, P], [1, BLOCK * D]], 0, vector_offset=ix))
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_gather_through_a_reshape_indexes_the_rows_of_the_reshape():
    cache, idx = _cache(), _blocks()
    out = gather_blocks(cache, idx)
    np.testing.assert_array_equal(out, cache.reshape(BLOCKS, -1)[idx[:, 0]])


@nki.jit
def gather_transpose_blocks(cache, idx):
    ix = _load_index(idx)
    four = cache.reshape((cache.shape[0] // BLOCK, 1, BLOCK, D))
    src = four.ap([[BLOCK * D, P], [1, 1], [D, BLOCK], [1, D]], 0, vector_offset=ix)
    t = nl.ndarray((D, 1, BLOCK, P), dtype=cache.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=src, axes=(3, 1, 2, 0))
    out = nl.ndarray((D, BLOCK * P), dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.reshape((D, BLOCK * P)))
    return out


def test_a_gather_transpose_puts_each_gathered_row_in_its_own_column():
    # an indirect transpose takes a uint32 index [ISA dma_transpose]
    cache, idx = _cache().astype(nl.bfloat16), _blocks().astype(np.uint32)
    out = np.asarray(gather_transpose_blocks(cache, idx))
    # dst[d, 0, b, p] = cache[idx[p], b, d]
    want = cache.reshape(BLOCKS, BLOCK, D)[idx[:, 0]].transpose(2, 1, 0).reshape(D, BLOCK * P)
    np.testing.assert_array_equal(out, want)


def test_a_gathered_row_past_the_reshape_is_a_runtime_error():
    idx = _blocks().copy()
    idx[3, 0] = BLOCKS
    with pytest.raises(NkiError, match="err_tensor_access_out_of_bound"):
        gather_blocks(_cache(), idx)


@nki.jit
def transpose_4d_default(x):
    # x: (S, H) in HBM; dst[p, 0, j, s] = x[s, j * 128 + p] with the default axes (3, 1, 2, 0)
    s, h = x.shape
    t = nl.ndarray((128, 1, h // 128, s), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x.ap([[h, s], [1, 1], [128, h // 128], [1, 128]], offset=0))
    out = nl.ndarray((128, h // 128 * s), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.reshape((128, h // 128 * s)))
    return out


def test_the_default_4d_transpose_keeps_the_middle_axes_in_order():
    x = (np.arange(16 * 256, dtype=np.float32).reshape(16, 256) / 3).astype(nl.bfloat16)
    out = np.asarray(transpose_4d_default(x))
    want = x.reshape(16, 2, 128).transpose(2, 1, 0).reshape(128, 32)
    np.testing.assert_array_equal(out, want)


@nki.jit
def sbuf_block_transpose(x):
    # 16 x 16 blocks of an SBUF tensor transposed in place of partitions by the DMA
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    n = x.shape[1]
    for c in range(x.shape[0] // n):
        pat = [[n, n], [1, 1], [1, 1], [1, n]]
        nisa.dma_transpose(dst=r.ap(pat, offset=c * n * n), src=t.ap(pat, offset=c * n * n))
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_an_sbuf_to_sbuf_transpose_may_walk_partitions_along_its_last_axis():
    x = np.arange(64 * 16, dtype=np.uint16).reshape(64, 16)
    out = np.asarray(sbuf_block_transpose(x))
    want = x.reshape(4, 16, 16).transpose(0, 2, 1).reshape(64, 16)
    np.testing.assert_array_equal(out, want)


@nki.jit
def sbuf_strided_partition_copy(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray((8, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=r, src=t[0:16:2, :])  # BAD: every other partition
    return r


def test_a_dma_still_may_not_stride_over_partitions():
    with pytest.raises(NkiError) as e:
        sbuf_strided_partition_copy(np.zeros((16, 16), np.float32))
    assert "test_dma_forms.py" in str(e.value)


def test_hbm_to_hbm_copy_between_shapes_that_share_no_refinement():
    # (3, 4, 4) and (2, 24): no common splitting of dimensions, but both sides are unbroken
    # runs of HBM, so element i of one is element i of the other
    @nki.jit
    def k(a):
        out = nl.ndarray((2, 24), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a[13:16])
        return out

    a = np.arange(20 * 16, dtype=np.float32).reshape(20, 4, 4)
    np.testing.assert_array_equal(k(a), a[13:16].reshape(2, 24))
