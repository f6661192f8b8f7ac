"""dma_transpose gathering through a (128, N) index: element i of the gathered axis is row
idx[i % 128, i // 128] of the HBM source (the index read column by column, the last column
possibly in part), in 2-D and in the 4-D form whose gathered axis lands last."""

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

BF16 = ml_dtypes.bfloat16


@nki.jit
def gather_t(table, idx, n):
    w = table.shape[1]
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    got = nl.ndarray((w, n), dtype=table.dtype, buffer=nl.sbuf)
    rows = table.ap(pattern=[[w, n], [1, w]], vector_offset=ix, indirect_dim=0)
    nisa.dma_transpose(dst=got, src=rows, axes=(1, 0))
    out = nl.ndarray((w, n), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


@nki.jit
def gather_t4(table, idx):
    t, d1, d2, d3 = table.shape
    n = 128 * idx.shape[1]
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    got = nl.ndarray((d3, d1, d2, n), dtype=table.dtype, buffer=nl.sbuf)
    rows = table.ap(
        pattern=[[d1 * d2 * d3, n], [d2 * d3, d1], [d3, d2], [1, d3]],
        vector_offset=ix,
        indirect_dim=0,
    )
    nisa.dma_transpose(dst=got, src=rows, axes=(3, 1, 2, 0))
    out = nl.ndarray(got.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


@pytest.mark.parametrize("cols, n", [(1, 128), (2, 256), (3, 304)])
def test_a_wide_index_is_read_column_by_column(cols, n):
    rng = np.random.default_rng(cols)
    table = rng.random((400, 32)).astype(BF16)
    idx = rng.integers(0, 400, (128, cols)).astype(np.uint32)
    flat = idx.T.flatten()[:n]
    np.testing.assert_array_equal(gather_t(table, idx, n), table[flat].T)


def test_the_four_dimensional_form_lands_the_gathered_rows_last():
    rng = np.random.default_rng(7)
    table = rng.random((300, 1, 3, 8)).astype(BF16)
    idx = rng.integers(0, 300, (128, 2)).astype(np.uint32)
    want = np.transpose(table[idx.T.flatten()], (3, 1, 2, 0))
    np.testing.assert_array_equal(gather_t4(table, idx), want)


def test_a_wide_index_needs_128_partitions_and_enough_columns():
    table = np.zeros((400, 32), BF16)
    with pytest.raises(NkiError) as e:
        gather_t(table, np.zeros((64, 2), np.uint32), 128)
    assert e.value.name == "err_invalid_argument" and "(128, N)" in str(e.value)
    with pytest.raises(NkiError) as e:
        gather_t(table, np.zeros((128, 2), np.uint32), 304)
    assert e.value.name == "err_invalid_argument" and ">= 304" in str(e.value)
    assert "nisa.dma_transpose(dst=got" in str(e.value)
