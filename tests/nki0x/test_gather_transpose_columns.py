"""dma_transpose gathering through a (128, N) index: element i of the gathered axis is row
idx[i % 128, i // 128] of the HBM source (the index read column by column, the last column
possibly in part), in 2-D and in the 4-D form whose gathered axis lands last."""

import ml_dtypes
import numpy as np
import pytest
from gather_transpose_kernels import gather_t, gather_t4

from nkikit.errors import NkiError

BF16 = ml_dtypes.bfloat16


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
    np.testing.assert_array_equal(gather_t4(table, idx, 128 * idx.shape[1]), want)


def test_a_wide_index_needs_128_partitions_and_enough_columns():
    table = np.zeros((400, 32), BF16)
    with pytest.raises(NkiError) as e:
        gather_t(table, np.zeros((64, 2), np.uint32), 128)
    assert e.value.name == "err_invalid_argument" and "(128, N)" in str(e.value)
    with pytest.raises(NkiError) as e:
        gather_t(table, np.zeros((128, 2), np.uint32), 304)
    assert e.value.name == "err_invalid_argument" and ">= 304" in str(e.value)
    assert "nisa.dma_transpose(dst=got" in str(e.value)
