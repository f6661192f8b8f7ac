"""Semantics of indirect (runtime-index) DMA in the simulators: gathers and scatters against
numpy, masks, duplicates, atomic read-modify-write and run-time bounds errors at the user's
line.  Every test runs on the reference interpreter, the fast path and both together
(``NKIKIT_SIM=check``, which also demands bit-identical results)."""

from __future__ import annotations

import inspect
import os

import ml_dtypes
import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import NkiError

HERE = os.path.abspath(__file__)
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(params=["reference", "fast", "check"], autouse=True)
def simulator(request, monkeypatch):
    monkeypatch.setenv("NKIKIT_SIM", request.param)
    return request.param


def _line(jit, marker: str) -> int:
    lines, start = inspect.getsourcelines(jit.func)
    (hit,) = [start + i for i, text in enumerate(lines) if marker in text]
    return hit


@nki.jit
def gather(data, idx):
    out = nl.ndarray((idx.shape[0], data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    it = nl.load(idx[i_p])
    nl.store(out, value=nl.load(data[it[i_p, 0], nl.arange(data.shape[1])[None, :]]))  # @gather
    return out


@pytest.mark.parametrize("idx_dtype", [np.int32, np.uint32, np.int16])
def test_gather_reads_the_indexed_rows(idx_dtype):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((300, 40)).astype(np.float32)
    idx = rng.integers(0, 300, 128).astype(idx_dtype)
    idx[:3] = [299, 0, 299]  # first, last and repeated rows
    np.testing.assert_array_equal(gather(data, idx), data[idx])


def test_gather_keeps_bits_of_narrow_dtypes():
    data = np.random.default_rng(1).standard_normal((50, 16)).astype(BF16)
    idx = np.arange(49, -1, -1, dtype=np.int32)
    got = gather(data, idx)
    assert got.dtype == BF16 and np.array_equal(got.view(np.uint16), data[idx].view(np.uint16))


def test_out_of_bounds_runtime_index_is_an_error_at_the_users_line():
    data = np.zeros((10, 4), np.float32)
    for bad in (10, -1, 2**31 - 1):
        idx = np.zeros(8, np.int32)
        idx[5] = bad
        with pytest.raises(NkiError) as info:
            gather(data, idx)
        err = info.value
        assert err.name == "err_tensor_access_out_of_bound"
        assert os.path.abspath(err.loc.file) == HERE and err.loc.line == _line(gather, "@gather")
        assert f"holds {bad} for partition 5" in str(err) and "size is 10" in str(err)


@nki.jit
def masked_gather(data, idx, n):
    out = nl.ndarray((128, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    # partitions >= n: their indices are never loaded (poison) and never used
    it = nl.load(idx[i_p], mask=(i_p < n))
    rows = nl.load(data[it, i_f], mask=(i_p < n) & (i_f < 5))
    nl.store(out[i_p, i_f], value=rows, mask=(i_p < n) & (i_f < 5))
    return out


def test_masked_gather_skips_masked_partitions_and_columns():
    rng = np.random.default_rng(2)
    data = rng.standard_normal((20, 8)).astype(np.float32)
    idx = np.full(128, 10**6, np.int32)  # out of bounds beyond n: must not be read
    idx[:70] = rng.integers(0, 20, 70)
    got = masked_gather(data, idx, 70)
    np.testing.assert_array_equal(got[:70, :5], data[idx[:70], :5])
    assert np.isnan(got[70:]).all() and np.isnan(got[:, 5:]).all()  # never written: poison


@nki.jit
def uninitialized_index(data):
    out = nl.ndarray((8, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    it = nl.ndarray((8, 1), dtype=nl.int32, buffer=nl.sbuf)
    nl.store(out, value=nl.load(data[it, nl.arange(data.shape[1])[None, :]]))  # @uninit
    return out


def test_an_unwritten_index_tile_reads_out_of_bounds():
    with pytest.raises(NkiError, match="err_tensor_access_out_of_bound") as info:
        uninitialized_index(np.zeros((10, 4), np.float32))
    assert info.value.loc.line == _line(uninitialized_index, "@uninit")


@nki.jit
def scatter(src, idx, rows):
    out = nl.ndarray((rows, src.shape[1]), dtype=src.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.zeros((rows, src.shape[1]), dtype=src.dtype))
    i_p = nl.arange(src.shape[0])[:, None]
    it = nl.load(idx[i_p])
    nl.store(out[it, nl.arange(src.shape[1])[None, :]], value=nl.load(src))
    return out


def test_scatter_writes_the_indexed_rows_and_the_last_duplicate_wins():
    rng = np.random.default_rng(3)
    src = rng.standard_normal((64, 12)).astype(np.float32)
    idx = rng.permutation(100)[:64].astype(np.int32)
    got = scatter(src, idx, 100)
    expected = np.zeros((100, 12), np.float32)
    expected[idx] = src
    np.testing.assert_array_equal(got, expected)
    idx[[10, 20, 30]] = 7  # partition 30 writes row 7 last
    got = scatter(src, idx, 100)
    np.testing.assert_array_equal(got[7], src[30])


@nki.jit
def scatter_add(table, idx, val):
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(table))
    i_p = nl.arange(idx.shape[0])[:, None]
    it = nl.load(idx[i_p])
    nl.atomic_rmw(out[it, nl.arange(table.shape[1])[None, :]], value=nl.load(val), op=np.add)
    return out


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_atomic_rmw_accumulates_duplicates_rounding_each_update(dtype):
    """The embedding-gradient pattern: several rows add into one row, one after another in
    partition order, each sum rounded to the table's dtype."""
    rng = np.random.default_rng(4)
    table = rng.standard_normal((10, 8)).astype(dtype)
    val = rng.standard_normal((40, 8)).astype(dtype)
    idx = rng.integers(0, 10, 40).astype(np.int32)
    expected = table.copy()
    for r, v in zip(idx, val):
        expected[r] = (expected[r].astype(np.float32) + v.astype(np.float32)).astype(dtype)
    got = scatter_add(table, idx, val)
    assert np.array_equal(got.astype(np.float32), expected.astype(np.float32))


@nki.jit
def block_gather(data, idx):
    """A 3-D tensor: a block chosen by the loop, rows by the index tile."""
    b, r, c = data.shape
    out = nl.ndarray((b, idx.shape[0], c), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(c)[None, :]
    it = nl.load(idx[i_p])
    for k in nl.affine_range(b):
        nl.store(out[k, i_p, i_f], value=nl.load(data[k, it, i_f]))
    return out


def test_gather_within_a_block_of_a_3d_tensor():
    rng = np.random.default_rng(5)
    data = rng.standard_normal((3, 30, 6)).astype(np.float32)
    idx = rng.integers(0, 30, 16).astype(np.int32)
    np.testing.assert_array_equal(block_gather(data, idx), data[:, idx])


@nki.jit
def gather_row_elements(logits, targets):
    """The cross-entropy pattern: element (r, t[r]) of each row through a flat [N*V, 1]
    view, index p*V + t[r] computed on chip."""
    n, v = logits.shape
    out = nl.ndarray((n, 1), dtype=logits.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(n)[:, None]
    i_0 = nl.arange(1)[None, :]
    t = nl.load(targets[i_p])
    offs = nisa.iota(i_p * v + 0 * i_0, dtype=nl.int32)
    idx = nl.add(offs, t, dtype=nl.int32)
    nl.store(out, value=nl.load(logits.reshape((n * v, 1))[idx, i_0]))
    return out


def test_gather_one_element_per_row_through_a_flat_view():
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((100, 37)).astype(np.float32)
    t = rng.integers(0, 37, 100).astype(np.int32)
    got = gather_row_elements(logits, t)
    np.testing.assert_array_equal(got[:, 0], logits[np.arange(100), t])
