"""NkiTensor view methods of NKI 0.5: rearrange (einops-style split, reorder, merge),
vector_select (a row gather from HBM) and select with a runtime (1, 1) index, against numpy."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _to_hbm(t, outs, on_chip=True):
    s = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
    (nisa.tensor_copy if on_chip else nisa.dma_copy)(dst=s, src=t)
    h = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=h, src=s)
    outs.append(h)


@nki.jit
def views(x, table, rows, cube, pick):
    outs = []
    xs = nl.load(x)
    _to_hbm(xs.rearrange(("p", ("a", "b")), ("p", "b", "a"), {"a": 3}), outs)
    ix = nl.ndarray(rows.shape, dtype=rows.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=rows)
    _to_hbm(table.vector_select(0, ix), outs, on_chip=False)
    k = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=k, src=pick)
    _to_hbm(cube.select(0, k), outs, on_chip=False)
    on_chip = nl.ndarray((cube.shape[1], cube.shape[0], cube.shape[2]), cube.dtype, nl.sbuf)
    nisa.dma_copy(dst=on_chip, src=cube.rearrange(("c", "p", "f"), ("p", "c", "f")))
    _to_hbm(on_chip.select(1, k), outs)
    return tuple(outs)


def test_rearrange_vector_select_and_runtime_select_match_numpy():
    rng = np.random.default_rng(3)
    x = rng.random((6, 12), dtype=np.float32)
    table = rng.random((9, 2, 5), dtype=np.float32)
    rows = np.array([[8], [0], [4], [4]], np.int32)
    cube = rng.random((3, 10, 7), dtype=np.float32)
    pick = np.array([[1]], np.int32)
    a, b, c, d = views(x, table, rows, cube, pick)
    np.testing.assert_array_equal(a, x.reshape(6, 3, 4).transpose(0, 2, 1))
    np.testing.assert_array_equal(b, table[rows[:, 0]])
    np.testing.assert_array_equal(c, cube[1])
    np.testing.assert_array_equal(d, cube[1])


_REFUSALS = {
    "vector_select along dim 1": (
        lambda t, ix: t.vector_select(1, ix),
        "err_unsupported_api",
        "dim=1",
    ),
    "runtime select on a slice": (
        lambda t, ix: t[0:2].select(0, ix),
        "err_unsupported_api",
        "on a view",
    ),
    "a name not in the source": (
        lambda t, ix: t.rearrange(("a", "b", "c"), ("a", "c", "x")),
        "err_invalid_argument",
        "exactly once",
    ),
    "a split without sizes": (
        lambda t, ix: t.rearrange(("a", ("b", "c"), "d"), ("a", "b", "c", "d")),
        "err_invalid_argument",
        "all but one",
    ),
}


@pytest.mark.parametrize("case", list(_REFUSALS))
def test_view_methods_refuse_what_they_cannot_express_at_the_users_line(case):
    call, name, text = _REFUSALS[case]

    @nki.jit
    def k(x):
        ix = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=ix, value=0)
        call(x, ix)
        return x

    with pytest.raises(NkiError) as e:
        k(np.zeros((4, 6, 5), np.float32))
    assert e.value.name == name and text in str(e.value)
    assert str(e.value).startswith("test_view_methods.py:")


def test_tensor_indirection_is_a_view_of_num_elem_columns():
    # instructions on it: tests/nki0x/test_indirect.py
    @nki.jit
    def k(x):
        t = nl.load(x)
        ix = nl.ndarray((4, 3), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=ix, value=0)
        v, w = t.indirect(ix), t.indirect(ix, num_elem=5)
        assert (v.shape, w.shape) == ((4, 12), (4, 5))
        assert v.is_indirect() and not t.is_indirect()
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    k(np.zeros((4, 6), np.float32))


def _both_simulators(kernel, *args):
    """``kernel``'s outputs on the fast simulator, asserted equal to the reference's."""
    from nkikit.sim import fast
    from nkikit.sim.interp import simulate as reference

    ir, _ = kernel.specialize(*args)
    got, want = fast.simulate(ir, list(args)), reference(ir, list(args))
    for g, w in zip(got, want):
        assert np.array_equal(g, w, equal_nan=True)
    return got


def test_reshape_of_the_leading_columns_of_a_tile():
    # offset 0 and the tile's partition stride, but only part of each row: a view of its own,
    # not the whole tile seen in another shape
    @nki.jit
    def k(a):
        t = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray((8, 2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t[:, 0:4].reshape((8, 2, 2)))
        return out

    a = np.arange(48, dtype=np.float32).reshape(8, 6)
    (got,) = _both_simulators(k, a)
    np.testing.assert_array_equal(got, a[:, 0:4].reshape(8, 2, 2))


def test_a_write_through_a_one_element_view_lands():
    # every dimension indexed by a number: the write goes through a view, not a scalar copy
    @nki.jit
    def k(a):
        r = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        z = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=z, value=-1.0)
        nisa.dma_copy(dst=r, src=z)
        nisa.dma_copy(dst=r.expand_dim(2)[5, 2], src=a)
        return r

    (got,) = _both_simulators(k, np.array([7.0], np.float32))
    want = np.full((8, 6), -1.0, np.float32)
    want[5, 2] = 7.0
    np.testing.assert_array_equal(got, want)


def test_select_keeps_the_rank_indexing_keeps():
    # reference §3.4: an HBM view keeps 1 dimension, an on-chip one 2 (the last with size 1)
    @nki.jit
    def k(a):
        one = nl.ndarray((1,), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=one, src=a.reshape((48,)).select(0, 7))
        t = nl.ndarray((4, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        column = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=column, src=t.select(1, 5))
        return one, column

    a = np.arange(48, dtype=np.float32).reshape(4, 12)
    one, column = _both_simulators(k, a)
    np.testing.assert_array_equal(one, [7.0])
    np.testing.assert_array_equal(column, a[:, 5:6])
