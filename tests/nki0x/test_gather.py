"""NKI 0.x gathers and scatters: ``dma_copy`` through a runtime row index
(``.ap(vector_offset=...)``), with ``oob_mode.skip`` leaving out the rows whose index is outside
the indexed tensor, and the GpSimd gathers ``local_gather`` / ``nc_n_gather``."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

ROWS, W, P = 10, 8, 16


def _index(values) -> np.ndarray:
    return np.asarray(values, np.int32).reshape(-1, 1)


@nki.jit
def gather_rows(table, idx, skip):
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    t = nl.ndarray((idx.shape[0], table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=-1.0)
    w = table.shape[1]
    src = table.ap([[w, idx.shape[0]], [1, w]], offset=0, vector_offset=ix, indirect_dim=0)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(dst=t, src=src, oob_mode=mode)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_gather_with_oob_skip_leaves_the_rows_of_bad_indices_as_they_were():
    table = np.arange(ROWS * W, dtype=np.float32).reshape(ROWS, W)
    idx = [3, 0, 12, 9, -1, 5, 10, 1, 2, 2, 4, 100, 6, 7, 8, 9]
    out = gather_rows(table, _index(idx), True)
    for p, i in enumerate(idx):
        want = table[i] if 0 <= i < ROWS else np.full(W, -1.0, np.float32)
        np.testing.assert_array_equal(out[p], want, err_msg=f"partition {p}, index {i}")


def test_a_skipping_gather_into_fresh_memory_leaves_its_poison():
    # the first write of a fresh tile: the rows it skips keep the NaN poison on both
    # simulators (the fast path may not treat a skipping DMA as writing its whole destination)
    @nki.jit
    def gather_fresh(table, idx):
        ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ix, src=idx)
        t = nl.ndarray((idx.shape[0], table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
        w = table.shape[1]
        src = table.ap([[w, idx.shape[0]], [1, w]], offset=0, vector_offset=ix, indirect_dim=0)
        nisa.dma_copy(dst=t, src=src, oob_mode=nisa.oob_mode.skip)
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    table = np.arange(ROWS * W, dtype=np.float32).reshape(ROWS, W)
    idx = [p % ROWS for p in range(P)]
    idx[3] = ROWS + 2
    out = gather_fresh(table, _index(idx))
    assert np.isnan(out[3]).all()
    for p, i in enumerate(idx):
        if p != 3:
            np.testing.assert_array_equal(out[p], table[i])


def test_without_skip_an_out_of_bounds_row_is_a_runtime_error():
    table = np.zeros((ROWS, W), np.float32)
    gather_rows(table, _index([p % ROWS for p in range(P)]), False)  # in bounds: fine
    with pytest.raises(NkiError, match="err_tensor_access_out_of_bound"):
        gather_rows(table, _index([ROWS] + [0] * (P - 1)), False)


def test_a_scatter_with_oob_skip_writes_only_the_rows_in_bounds():
    @nki.jit
    def scatter_rows(values, idx):
        ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ix, src=idx)
        v = nl.ndarray(values.shape, dtype=values.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=values)
        zero = nl.ndarray((ROWS, W), dtype=values.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        out = nl.ndarray((ROWS, W), dtype=values.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=zero)
        dst = out.ap([[W, values.shape[0]], [1, W]], offset=0, vector_offset=ix, indirect_dim=0)
        nisa.dma_copy(dst=dst, src=v, oob_mode=nisa.oob_mode.skip)
        return out

    values = np.arange(4 * W, dtype=np.float32).reshape(4, W) + 1
    out = scatter_rows(values, _index([7, 40, 2, -3]))
    want = np.zeros((ROWS, W), np.float32)
    want[7], want[2] = values[0], values[2]
    np.testing.assert_array_equal(out, want)


def test_oob_mode_must_be_one_of_the_enum():
    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, oob_mode=7)
        return x

    with pytest.raises(NkiError, match="err_invalid_argument.*oob_mode") as e:
        k(np.zeros((4, 4), np.float32))
    assert "test_gather.py" in str(e.value)


@nki.jit
def n_gather(data, indices):
    d = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=data)
    ix = nl.ndarray(indices.shape, dtype=indices.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=indices)
    g = nl.ndarray(indices.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=g, data=d, indices=ix)
    out = nl.ndarray(g.shape, dtype=g.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=g)
    return out


def test_nc_n_gather_takes_elements_of_each_partition_by_its_own_indices():
    rng = np.random.default_rng(4)
    data = rng.integers(0, 1 << 20, size=(32, 4, 6)).astype(np.uint32)  # free dims flattened
    indices = rng.integers(0, 24, size=(32, 9)).astype(np.uint32)
    out = n_gather(data, indices)
    np.testing.assert_array_equal(out, np.take_along_axis(data.reshape(32, 24), indices, axis=1))


@pytest.mark.parametrize(
    "indices, name",
    [
        (np.full((4, 2), 24, np.uint32), "err_tensor_access_out_of_bound"),
        # nc_n_gather's indices are uint32 [ISA nc_n_gather]
        (np.zeros((4, 2), np.float32), "err_unsupported_dtype.*indices must be uint32"),
        (np.zeros((4, 2), np.int32), "err_unsupported_dtype.*indices must be uint32"),
    ],
)
def test_bad_nc_n_gather_indices_are_named_errors_at_the_user_line(indices, name):
    with pytest.raises(NkiError, match=name) as e:
        n_gather(np.zeros((4, 24), np.float32), indices)
    assert "test_gather.py" in str(e.value)


def _local_gather_model(src, index, per, used):
    """The ISA's model, written out per partition: partition p of core c takes ``per``
    elements of its own row at each of core c's offsets, read column by column."""
    rows = src.reshape(src.shape[0], -1)
    out = []
    for p in range(src.shape[0]):
        core = index[(p // 16) * 16 : (p // 16) * 16 + 16]
        offsets = [int(core[r, c]) for c in range(core.shape[1]) for r in range(core.shape[0])]
        out.append(np.concatenate([rows[p, o : o + per] for o in offsets[:used]]))
    return np.stack(out)


@pytest.mark.parametrize("per, used", [(2, None), (1, 20)])
def test_local_gather_gives_every_partition_its_cores_offsets(per, used):
    rng = np.random.default_rng(5)
    src = rng.standard_normal((32, 5, 8)).astype(np.float32)
    index = rng.integers(0, 40 - per, size=(32, 3)).astype(np.uint16)
    n = (used or 48) * per

    @nki.jit
    def k(src, index):
        s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        ix = nl.ndarray(index.shape, dtype=index.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ix, src=index)
        g = nl.ndarray((32, n + 4), dtype=src.dtype, buffer=nl.sbuf)
        nisa.memset(dst=g, value=0.0)
        # the destination may be a view of a larger tensor
        nisa.local_gather(
            dst=g[:, 0:n], src_buffer=s, index=ix, num_elem_per_idx=per, num_valid_indices=used
        )
        out = nl.ndarray(g.shape, dtype=g.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=g)
        return out

    out = k(src, index)
    np.testing.assert_array_equal(out[:, :n], _local_gather_model(src, index, per, used or 48))
    assert (out[:, n:] == 0).all()


@pytest.mark.parametrize(
    "width, used, name",
    [(4, 49, "err_invalid_argument.*num_valid_indices"), (47, None, "produces 48")],
)
def test_bad_local_gathers_are_named_errors_at_the_user_line(width, used, name):
    @nki.jit
    def k(src):
        s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        ix = nl.ndarray((32, 3), dtype=nl.uint16, buffer=nl.sbuf)
        nisa.memset(dst=ix, value=0)
        g = nl.ndarray((32, width), dtype=src.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=g, src_buffer=s, index=ix, num_valid_indices=used)
        return src

    with pytest.raises(NkiError, match=name) as e:
        k(np.zeros((32, 8), np.float32))
    assert "test_gather.py" in str(e.value)


def test_a_scalar_offset_scatter_with_oob_skip_drops_what_falls_past_the_end():
    @nki.jit
    def place(values, at):
        a = nl.ndarray((1, 1), dtype=at.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=at)
        v = nl.ndarray(values.shape, dtype=values.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=values)
        out = nl.ndarray((20,), dtype=values.dtype, buffer=nl.shared_hbm)
        z = nl.ndarray((1, 20), dtype=values.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z, value=0.0)
        nisa.dma_copy(dst=out, src=z)
        # rows of 4 elements at element `at` of a flat (20,) output
        dst = out.ap([[4, values.shape[0]], [1, 4]], offset=0, scalar_offset=a, indirect_dim=0)
        nisa.dma_copy(dst=dst, src=v, oob_mode=nisa.oob_mode.skip)
        return out

    values = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    for at in (0, 6, 14, 40):
        want = np.zeros(20, np.float32)
        n = max(0, min(12, 20 - at))
        want[at : at + n] = values.reshape(-1)[:n]
        out = place(values, np.array([[at]], np.int32))
        np.testing.assert_array_equal(out, want, err_msg=f"at {at}")
