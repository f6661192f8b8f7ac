"""``.ap(vector_offset=...)`` on a reshape of an HBM tensor: the runtime row index counts rows
of the tensor ``.ap`` was called on (the reshape), not rows of the allocation
(/work/shared/reference/nki-0x.md §3.6: "the leading stride used is the base tensor's row
size")."""

import numpy as np

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl


@nki.jit
def gather_pairs_of_rows(table, idx):
    """Partition p reads rows 2*idx[p] and 2*idx[p]+1 of ``table`` (R, W): one row of its
    (R/2, 2, W) reshape."""
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    r, w = table.shape
    pairs = table.reshape((r // 2, 2, w))
    n = idx.shape[0]
    src = pairs.ap([[2 * w, n], [w, 2], [1, w]], offset=0, vector_offset=ix, indirect_dim=0)
    t = nl.ndarray((n, 2, w), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def gather_even_rows_tail(table, idx):
    """Partition p reads the last ``w // 2`` elements of row 2*idx[p] of ``table`` (R, W),
    through an offset into the (R/2, 2*W) reshape."""
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    r, w = table.shape
    pairs = table.reshape((r // 2, 2 * w))
    n, h = idx.shape[0], w // 2
    src = pairs.ap([[2 * w, n], [1, h]], offset=h, vector_offset=ix, indirect_dim=0)
    t = nl.ndarray((n, h), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _table(rows: int, w: int) -> np.ndarray:
    return np.arange(rows * w, dtype=np.float32).reshape(rows, w)


def test_a_vector_offset_on_a_reshape_indexes_the_reshapes_rows():
    table = _table(32, 4)
    idx = np.array([15, 0, 7, 3, 3, 9, 1, 12], np.int32).reshape(-1, 1)
    out = gather_pairs_of_rows(table, idx)
    want = table.reshape(16, 2, 4)[idx[:, 0]]
    np.testing.assert_array_equal(out, want)


def test_a_vector_offset_on_a_reshape_keeps_the_static_offset_within_the_row():
    table = _table(20, 6)
    idx = np.array([9, 2, 0, 5], np.int32).reshape(-1, 1)
    out = gather_even_rows_tail(table, idx)
    want = table[2 * idx[:, 0], 3:]
    np.testing.assert_array_equal(out, want)


@nki.jit
def scatter_pairs_of_rows(values, idx):
    """Partition p of ``values`` (n, 2*W) writes rows 2*idx[p] and 2*idx[p]+1 of a zeroed
    (R, W) output, through its (R/2, 2*W) reshape."""
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    n, w2 = values.shape
    v = nl.ndarray((n, w2), dtype=values.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=v, src=values)
    rows = 2 * n + 2
    zero = nl.ndarray((rows, w2 // 2), dtype=values.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    out = nl.ndarray((rows, w2 // 2), dtype=values.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=zero)
    pairs = out.reshape((rows // 2, w2))
    dst = pairs.ap([[w2, n], [1, w2]], offset=0, vector_offset=ix, indirect_dim=0)
    nisa.dma_copy(dst=dst, src=v)
    return out


def test_a_vector_offset_scatter_through_a_reshape_writes_the_reshapes_rows():
    values = np.arange(4 * 10, dtype=np.float32).reshape(4, 10) + 1
    idx = np.array([4, 0, 2, 1], np.int32).reshape(-1, 1)
    out = scatter_pairs_of_rows(values, idx)
    want = np.zeros((10, 5), np.float32)
    want.reshape(5, 10)[idx[:, 0]] = values
    np.testing.assert_array_equal(out, want)
