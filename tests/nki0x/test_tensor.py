"""NKI 0.x tensor model: views (slices with steps, integer indexing, reshape, view methods,
.ap) read and write exactly the storage elements NKI's strided-view rule names."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _roundtrip(view_fn, shape, out_shape, dtype=np.float32):
    """DMA a view of an SBUF copy of x back to HBM: out = view_fn(x) in numpy terms."""

    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(out_shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=view_fn(t))
        return out

    x = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    return x, k(x)


@pytest.mark.parametrize(
    "view, ref, out_shape",
    [
        (lambda t: t[0:64, 8:24], lambda x: x[0:64, 8:24], (64, 16)),
        (lambda t: t[:, ::2], lambda x: x[:, ::2], (128, 16)),
        (lambda t: t[:, 1::3], lambda x: x[:, 1::3], (128, 11)),
        (lambda t: t[3], lambda x: x[3:4], (1, 32)),  # on-chip: dim 0 stays, size 1
        (lambda t: t[:, 5], lambda x: x[:, 5:6], (128, 1)),  # keeps a unit free dim
        (lambda t: t[:, nl.ds(4, 8)], lambda x: x[:, 4:12], (128, 8)),
        (lambda t: t[..., -4:], lambda x: x[:, -4:], (128, 4)),
        (lambda t: t.slice(1, 2, 10, 4), lambda x: x[:, 2:10:4], (128, 2)),
        (lambda t: t.ap([[32, 16], [1, 8]], offset=8), lambda x: x[0:16, 8:16], (16, 8)),
        (lambda t: t.ap([[32, 128], [2, 16]]), lambda x: x[:, ::2], (128, 16)),
    ],
)
def test_sbuf_views(view, ref, out_shape):
    x, out = _roundtrip(view, (128, 32), out_shape)
    np.testing.assert_array_equal(out, ref(x).reshape(out_shape))


def test_three_d_views_and_reshape():
    x, out = _roundtrip(lambda t: t.reshape((128, 4, 8))[:, 1, :], (128, 32), (128, 8))
    np.testing.assert_array_equal(out, x.reshape(128, 4, 8)[:, 1, :])
    x, out = _roundtrip(lambda t: t.reshape((128, 4, 8)).permute((0, 2, 1)), (128, 32), (128, 8, 4))
    np.testing.assert_array_equal(out, x.reshape(128, 4, 8).transpose(0, 2, 1))
    x, out = _roundtrip(lambda t: t[:, 0:1].broadcast(1, 6), (128, 32), (128, 6))
    np.testing.assert_array_equal(out, np.repeat(x[:, 0:1], 6, axis=1))


def test_hbm_views_reshape_and_integer_index():
    @nki.jit
    def k(x):
        x2 = x.reshape((6, 64))  # (2, 3, 64) -> (6, 64)
        t = nl.ndarray((6, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x2[:, 10:26])
        out = nl.ndarray((3, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x[1])  # an integer drops the HBM dimension
        out2 = nl.ndarray((6, 16), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out2, src=t)
        return out, out2

    x = np.random.rand(2, 3, 64).astype(np.float32)
    a, b = k(x)
    np.testing.assert_array_equal(a, x[1])
    np.testing.assert_array_equal(b, x.reshape(6, 64)[:, 10:26])


def test_view_attributes():
    seen = {}

    @nki.jit
    def k(x):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        v = t[:, 8:24]
        seen.update(
            shape=v.shape,
            strides=v.strides,
            offset=v.offset,
            contiguous=v.is_contiguous(),
            pattern=t[:, ::2].get_pattern(),
            buffer=v.buffer,
        )
        nisa.memset(dst=t, value=0.0)
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    k(np.zeros((1, 1), np.float32))
    assert seen["shape"] == (128, 16)
    assert seen["strides"] == (64, 1)
    assert seen["offset"] == 8
    assert seen["contiguous"] is True
    assert seen["pattern"] == [[64, 128], [2, 32]]
    assert seen["buffer"] is nl.sbuf


def _fails(body, match):
    @nki.jit
    def k(x):
        body(x)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        return out

    with pytest.raises(NkiError, match=match) as e:
        k(np.zeros((4, 4), np.float32))
    return e.value


def test_out_of_bounds_slice_is_an_error_at_the_user_line():
    def body(x):
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        t[0:128, 0:600]  # noqa: B018 - the view itself is the error

    err = _fails(body, "err_tensor_access_out_of_bound")
    assert "test_tensor.py" in str(err)


def test_negative_step_in_bounds_is_named_as_such():
    def body(x):
        t = nl.ndarray((16, 96), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((16, 96), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(
            dst=r.ap(pattern=[[96, 16], [1, 2]], offset=0),
            src=t.ap(pattern=[[96, 16], [-1, 2]], offset=1),
        )

    err = _fails(body, "err_invalid_argument")
    assert "negative step" in str(err) and "test_tensor.py" in str(err)


def test_partition_step_and_bad_ap_are_rejected():
    def step(x):
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        t[::2, :]  # noqa: B018

    _fails(step, "partition dimension cannot be stepped")

    def ap(x):
        t = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        t.ap([[64, 8], [1, 32]])

    _fails(ap, "partition step")


def test_reshape_of_non_contiguous_view_is_rejected():
    def body(x):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        t[:, ::2].reshape((128, 2, 16))

    _fails(body, "not contiguous")


def test_dma_between_a_column_and_one_partition_row():
    @nki.jit
    def k(x):
        t = nl.ndarray((4, 32), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        nisa.dma_copy(dst=t[0:1, 0:20], src=x)  # (20, 1) HBM into 20 elements of partition 0
        out = nl.ndarray((4, 32), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(20, dtype=np.float32).reshape(20, 1)
    out = k(x)
    np.testing.assert_array_equal(out[0, :20], x[:, 0])
    assert (out[0, 20:] == 0).all() and (out[1:] == 0).all()


def test_scalar_offset_shifts_an_hbm_access_at_run_time():
    @nki.jit
    def k(table, which):
        w = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=w, src=which)
        t = nl.ndarray((4, 8), dtype=table.dtype, buffer=nl.sbuf)
        # rows which*4 .. which*4 + 3 of a (3, 4, 8) table: the offset counts whole (4, 8) blocks
        nisa.dma_copy(
            dst=t, src=table.ap([[8, 4], [1, 8]], offset=0, scalar_offset=w, indirect_dim=0)
        )
        out = nl.ndarray((4, 8), dtype=table.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    table = np.arange(3 * 4 * 8, dtype=np.float32).reshape(3, 4, 8)
    for which in (0, 2):
        out = k(table, np.array([[which]], np.int32))
        np.testing.assert_array_equal(out, table[which])
    with pytest.raises(NkiError, match="err_tensor_access_out_of_bound"):
        k(table, np.array([[3]], np.int32))


def test_flatten_dims_ignores_unit_dimensions():
    x, out = _roundtrip(
        lambda t: t.reshape((128, 4, 8)).expand_dim(2).flatten_dims(1, 3), (128, 32), (128, 32)
    )
    np.testing.assert_array_equal(out, x)


def test_a_tensor_is_truthy_as_an_object():
    seen = []

    @nki.jit
    def k(x):
        seen.append(bool(x) and x is not None)  # `if params.index:` in the NKI Library
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    k(np.zeros((1, 1), np.float32))
    assert seen == [True]


def _center_by_psum_mean(step: int, rows: int = 320):
    """x - mean with the mean a [128, 320] fp32 PSUM tile read as [128, rows, 24] through
    ``.ap`` (``step`` 0: a broadcast along the last axis, as the NKI Library's layernorm_tkg
    reads its mean; 1: overlapping windows, every read a new address)."""

    @nki.jit
    def center(x):
        out = nl.ndarray((128, rows * 24), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, rows, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x.reshape((128, rows, 24)))
        mean = nl.ndarray((128, 320), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(dst=mean, value=0.5)
        res = nl.ndarray((128, rows, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(
            dst=res,
            data1=xs,
            data2=mean.ap([[320, 128], [1, rows], [step, 24]], offset=0),
            op=nl.subtract,
        )
        nisa.dma_copy(dst=out.reshape((128, rows, 24)), src=res)
        return out

    return center


def test_free_size_limit_counts_a_broadcast_axis_once():
    # 7,680 reads of PSUM per partition, but of 320 elements: within the 4K-element limit
    x = np.random.default_rng(0).standard_normal((128, 320 * 24)).astype(np.float32)
    np.testing.assert_array_equal(_center_by_psum_mean(0)(x), x - np.float32(0.5))


def test_free_size_limit_rejects_4800_psum_elements():
    x = np.zeros((128, 200 * 24), np.float32)
    with pytest.raises(NkiError) as e:
        _center_by_psum_mean(1, rows=200)(x)
    assert e.value.name == "err_size_of_dimension_exceed_arch_limit"
    assert "4800" in str(e.value) and "4096" in str(e.value)
    assert "nisa.tensor_tensor(" in str(e.value)  # the kernel's own line


def test_ndarray_of_one_kind_again_keeps_its_checks_and_dtype():
    """nl.ndarray remembers the on-chip tile kinds it checked (an unrolled kernel allocates
    one per step): a tfloat32 tile after a float32 one of the same shape (the two dtypes
    compare equal) stays tfloat32, and a bad shape after a good one is still refused."""
    seen = {}

    @nki.jit
    def k(x):
        for _ in range(2):
            a = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
            b = nl.ndarray((4, 8), dtype=nl.tfloat32, buffer=nl.sbuf)
            c = nl.ndarray([4, 8], dtype=nl.float32, buffer=nl.sbuf)
        seen.update(a=a.dtype, b=b.dtype, c=c.shape)
        nisa.dma_copy(dst=a, src=x)
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(k(x), x)
    assert seen["a"].metadata is None
    assert seen["b"].metadata == nl.tfloat32.metadata
    assert seen["c"] == (4, 8)

    @nki.jit
    def bad(x):
        nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nl.ndarray((4, 0), dtype=nl.float32, buffer=nl.sbuf)
        return x

    with pytest.raises(NkiError, match="err_invalid_argument"):
        bad(x)
