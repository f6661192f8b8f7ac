"""Gathers and scatters the fast path runs as row copies (``executors._rows_form``): one
runtime index per partition, or one for the whole tile, and slices elsewhere.  Each form is
bit-identical to the reference interpreter's element-wise fancy index, including scatters
whose rows meet (the last one wins) and indices out of bounds (the reference's error)."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as beta1
import nkikit.language as nl1
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError
from nkikit.sim import fast, interp, same_bits


def _both(kernel, *args):
    """The kernel's IR, run by the fast path and by the reference; their outputs, which
    must agree bit for bit."""
    ir = kernel._trace(kernel.bind(args, {}), "trn2")
    got = fast.compile_kernel(ir).run(list(args))
    ref = interp.simulate(ir, list(args))
    assert all(same_bits(x, y) for x, y in zip(got, ref))
    return ir, got[0]


def _source(ir) -> str:
    return fast.explain(ir)


@nki.jit
def gather_strided(table, idx):
    """Row idx[p] of ``table``, every second column from column 3."""
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    w = table.shape[1]
    t = nl.ndarray((idx.shape[0], 8), dtype=table.dtype, buffer=nl.sbuf)
    src = table.ap([[w, idx.shape[0]], [2, 8]], offset=3, vector_offset=ix, indirect_dim=0)
    nisa.dma_copy(dst=t, src=src)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_a_per_row_gather_with_a_column_step(dtype):
    table = np.arange(40 * 24).reshape(40, 24).astype(dtype)
    idx = np.array([5, 0, 39, 5, 17, 2, 2, 30], np.int32).reshape(-1, 1)
    ir, out = _both(gather_strided, table, idx)
    np.testing.assert_array_equal(out, table[idx[:, 0]][:, 3:19:2])
    assert "_ind(" not in _source(ir)  # the row form


@nki.jit
def gather_expert(weights, which):
    """The (128, 2, 16) block of expert ``which`` (one runtime index for the whole tile)
    starting at row 128 of its (256, 2, 16) slab."""
    e = nl.ndarray((1, 1), dtype=which.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=e, src=which)
    t = nl.ndarray((128, 2, 16), dtype=weights.dtype, buffer=nl.sbuf)
    src = weights.ap(
        [[32, 128], [16, 2], [1, 16]], offset=128 * 32, scalar_offset=e, indirect_dim=0
    )
    nisa.dma_copy(dst=t, src=src)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_one_runtime_index_for_the_whole_tile():
    weights = np.arange(4 * 256 * 2 * 16, dtype=np.float32).reshape(4, 256, 2, 16)
    for expert in (0, 3):
        ir, out = _both(gather_expert, weights, np.array([[expert]], np.int32))
        np.testing.assert_array_equal(out, weights[expert, 128:256])
    assert "R = int(" in _source(ir)


@nki.jit
def scatter_rows(values, idx):
    """values[p] into columns 5-8 of row idx[p] of a fresh (16, 12) output, whose other
    elements keep their poison (NaN)."""
    ix, v = nl.ndarray(idx.shape, dtype=idx.dtype), nl.ndarray(values.shape, dtype=values.dtype)
    for tile, src in ((ix, idx), (v, values)):
        nisa.dma_copy(dst=tile, src=src)
    out = nl.ndarray((16, 12), dtype=values.dtype, buffer=nl.shared_hbm)
    dst = out.ap([[12, values.shape[0]], [1, 4]], offset=5, vector_offset=ix, indirect_dim=0)
    nisa.dma_copy(dst=dst, src=v)
    return out


@pytest.mark.parametrize(
    "rows",
    [[3, 0, 15, 7], [3, 9, 3, 1], [2, 2, 2, 2]],
    ids=["distinct", "two-meet", "all-meet"],
)
def test_a_per_row_scatter_assigns_and_the_last_of_equal_rows_wins(rows):
    values = np.arange(16, dtype=np.float32).reshape(4, 4) + 1
    ir, out = _both(scatter_rows, values, np.array(rows, np.int32).reshape(-1, 1))
    want = np.full((16, 12), np.nan, np.float32)
    for p, r in enumerate(rows):  # in partition order: the last write to a row stays
        want[r, 5:9] = values[p]
    np.testing.assert_array_equal(out, want)
    assert "K = _last_rows(R)" in _source(ir)


def test_a_row_out_of_bounds_is_the_references_error():
    with pytest.raises(NkiError) as e:
        _both(gather_strided, np.zeros((40, 24), np.float32), np.full((8, 1), 40, np.int32))
    assert e.value.name == "err_tensor_access_out_of_bound"


@beta1.jit
def scatter_into_slab(values, idx):
    """Rows idx[p] (columns 5-8) of slab 1 of a (2, 16, 12) output (NKI Beta 1, whose
    indirect stores take the runtime index on any dimension): it is on dimension 1, after a
    fixed coordinate."""
    out = nl1.ndarray((2, 16, 12), dtype=values.dtype, buffer=nl1.shared_hbm)
    nl1.store(out[0], value=nl1.zeros((16, 12), dtype=values.dtype))
    nl1.store(out[1], value=nl1.zeros((16, 12), dtype=values.dtype))
    i_p = nl1.arange(values.shape[0])[:, None]
    i_f = nl1.arange(4)[None, :]
    it = nl1.load(idx[i_p, 0])
    nl1.store(out[1, it, 5 + i_f], value=nl1.load(values))
    return out


@pytest.mark.parametrize("rows", [[3, 0, 15, 7], [3, 9, 3, 9]], ids=["distinct", "meet"])
def test_a_scatter_along_a_later_dimension(rows):
    values = np.arange(16, dtype=np.float32).reshape(4, 4) + 1
    idx = np.array(rows, np.int32).reshape(-1, 1)
    ir = scatter_into_slab._trace(scatter_into_slab.bind((values, idx), {}), "trn2")
    got = fast.compile_kernel(ir).run([values, idx])
    ref = interp.simulate(ir, [values, idx])
    assert all(same_bits(x, y) for x, y in zip(got, ref))
    want = np.zeros((2, 16, 12), np.float32)
    for p, r in enumerate(rows):
        want[1, r, 5:9] = values[p]
    np.testing.assert_array_equal(got[0], want)
    assert "K = _last_rows(R)" in _source(ir)
