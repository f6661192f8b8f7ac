"""The experimental nl wrappers of the NKI 0.6 stub set that build several instructions:
nl.broadcast_to (a (1, F) row onto every partition, as SSM kernels broadcast their B and C
rows), nl.expand_dims, nl.where, nl.softmax, nl.rms_norm, nl.var, nl.all, nl.load_transpose2d and
nl.dropout, each against numpy."""

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _out(t, outs):
    """Store ``t`` (any on-chip dtype) to a new fp32 HBM output."""
    s = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s, src=t)
    h = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=h, src=s)
    outs.append(h)


def test_broadcast_to_a_row_onto_partitions_and_a_column_along_the_free_axis():
    @nki.jit
    def k(row, x):
        outs = []
        r = nl.ndarray(row.shape, dtype=row.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=r, src=row)
        xs = nl.load(x)
        _out(nl.broadcast_to(r, (x.shape[0], row.shape[1])), outs)
        _out(nl.broadcast_to(nl.max(xs, axis=1), xs.shape), outs)
        # a PSUM row goes through SBUF first
        p = nl.ndarray(row.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=r)
        _out(nl.broadcast_to(p, (x.shape[0], row.shape[1])), outs)
        assert nl.broadcast_to(xs, xs.shape) is xs
        return tuple(outs)

    row = np.random.rand(1, 24).astype(np.float32)
    x = np.random.randn(40, 24).astype(np.float32)
    a, b, c = k(row, x)
    np.testing.assert_array_equal(a, np.broadcast_to(row, x.shape))
    np.testing.assert_array_equal(b, np.broadcast_to(x.max(1, keepdims=True), x.shape))
    np.testing.assert_array_equal(c, np.broadcast_to(row, x.shape))


def test_broadcast_to_a_shape_it_cannot_reach_is_a_named_error_at_the_call():
    @nki.jit
    def k(x):
        xs = nl.load(x)
        y = nl.broadcast_to(xs, (8, 6))
        out = nl.ndarray(y.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=y)
        return out

    with pytest.raises(NkiError) as e:
        k(np.zeros((4, 3), np.float32))
    assert e.value.name == "err_invalid_argument" and "cannot broadcast (4, 3)" in str(e.value)
    assert "nl.broadcast_to(xs, (8, 6))" in str(e.value)


def test_where_softmax_rms_norm_var_all_and_expand_dims_match_numpy():
    @nki.jit
    def k(x, w, c):
        outs = []
        xs, ws, cs = nl.load(x), nl.load(w), nl.load(c)
        _out(nl.where(cs, xs, ws), outs)
        _out(nl.where(cs, xs, 0.0), outs)
        _out(nl.softmax(xs, axis=1), outs)
        x3 = xs.reshape((x.shape[0], 4, x.shape[1] // 4))
        _out(nl.softmax(x3, axis=2), outs)
        _out(nl.rms_norm(xs, ws, axis=1, n=x.shape[1]), outs)
        _out(nl.var(xs, axis=1), outs)
        _out(nl.all(cs, axis=1), outs)
        _out(nl.expand_dims(xs, 1), outs)
        return tuple(outs)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 16), dtype=np.float32)
    w = rng.random((32, 16), dtype=np.float32)
    c = (rng.random((32, 16)) > 0.2).astype(np.float32)
    c[:4] = 1.0

    def softmax(a, axis):
        e = np.exp(a - a.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    got = k(x, w, c)
    want = [
        np.where(c != 0, x, w),
        np.where(c != 0, x, 0.0),
        softmax(x, 1),
        softmax(x.reshape(32, 4, 4), 2),
        x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * w,
        x.var(1, keepdims=True),
        c.all(1, keepdims=True),
        x[:, None, :],
    ]
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_load_transpose2d_and_dropout_at_the_extreme_rates():
    @nki.jit
    def k(x):
        outs = []
        t = nl.load_transpose2d(x)
        f = nl.load_transpose2d(x, dtype=nl.float32)
        for v in (t, f, nl.dropout(f, 0.0), nl.dropout(f, 1.0)):
            _out(v, outs)
        return tuple(outs)

    x = np.random.default_rng(2).random((24, 10), dtype=np.float32).astype(ml_dtypes.bfloat16)
    t, f, kept, dropped = k(x)
    want = x.T.astype(np.float32)
    for g in (t, f, kept):
        np.testing.assert_array_equal(g, want)
    np.testing.assert_array_equal(dropped, np.zeros_like(want))


def test_gather_flattened_gathers_each_partitions_flattened_elements():
    @nki.jit
    def k(data, idx):
        d = nl.load(data)
        i = nl.load(idx)
        outs = []
        _out(nl.gather_flattened(d, i), outs)
        _out(nl.gather_flattened(d, i, dtype=nl.bfloat16), outs)
        return tuple(outs)

    rng = np.random.default_rng(3)
    data = rng.standard_normal((32, 4, 16), dtype=np.float32)
    idx = rng.integers(0, 64, size=(32, 24), dtype=np.uint32)
    same, cast = nki.simulate(k)(data, idx)
    expect = np.take_along_axis(data.reshape(32, 64), idx.astype(np.int64), axis=1)
    np.testing.assert_array_equal(same, expect)
    np.testing.assert_array_equal(cast, expect.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_gather_flattened_along_another_axis_is_a_named_error_at_the_call():
    @nki.jit
    def k(data, idx):
        d = nl.load(data)
        i = nl.load(idx)
        return nl.gather_flattened(d, i, axis=1)  # the line the error names

    with pytest.raises(NkiError, match="err_unsupported_api") as e:
        nki.simulate(k)(np.zeros((8, 16), np.float32), np.zeros((8, 4), np.uint32))
    assert "nl.gather_flattened(axis=1)" in str(e.value)
    assert "the line the error names" in str(e.value)


def test_memory_region_and_dtype_type_names():
    assert nl.MemoryRegion.sbuf is nl.sbuf and nl.MemoryRegion.shared_hbm is nl.shared_hbm
    assert isinstance(nl.psum, nl.MemoryRegion) and nl.psum.value == "psum"
    assert isinstance(nl.bfloat16, nl.DType) and isinstance(nl.float32, nl.DType)
