"""Misused NKI 0.x calls are refused with a catalogued NkiError at the kernel's own line,
never an internal exception (ValueError, IndexError, a PrimError) or a silent wrong answer.
The offending statement of each case is marked ``# <-``."""

import inspect

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _sb(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def _ones(shape, dtype=nl.float32):
    t = _sb(shape, dtype)
    nisa.memset(dst=t, value=1)
    return t


def _marked_line(body) -> int:
    lines, first = inspect.getsourcelines(body)
    (i,) = [k for k, text in enumerate(lines) if text.rstrip().endswith("# <-")]
    return first + i


def _refused(body, name: str, match: str | None = None) -> NkiError:
    @nki.jit
    def k(x):
        body(x)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=_ones((1, 1)))
        return out

    with pytest.raises(NkiError, match=match) as e:
        k(np.ones((128, 64), np.float32))
    assert e.value.name == name
    assert e.value.loc.file == __file__ and e.value.loc.line == _marked_line(body), e.value.loc
    return e.value


# -- views and creation (nkikit/nki/tensor.py, nl.ndarray) -------------------------------------


def _slice_bound_str(x):
    t = _sb((128, 64))
    t[:, "a":]  # <-


def _slice_bound_float(x):
    t = _sb((128, 64))
    t[:, 0:2.5]  # <-


def _reshape_none(x):
    t = _sb((128, 64))
    t.reshape(None)  # <-


def _reshape_str(x):
    t = _sb((128, 64))
    t.reshape("ab")  # <-


def _ap_none(x):
    t = _sb((128, 64))
    t.ap(None)  # <-


def _ap_flat(x):
    t = _sb((128, 64))
    t.ap([64, 128])  # <-


def _ap_three_numbers(x):
    t = _sb((128, 64))
    t.ap([[64, 128], [1, 32, 2]])  # <-


def _ap_negative_count(x):
    t = _sb((128, 64))
    t.ap([[64, 128], [1, -3]])  # <-


def _ap_negative_offset(x):
    x.ap([[64, 128], [1, 64]], offset=-1)  # <-


def _ndarray_list_shape(x):
    nl.ndarray([4, "a"], dtype=nl.float32, buffer=nl.sbuf)  # <-


def _ndarray_huge(x):
    nl.ndarray((128, 2**62), dtype=nl.float32, buffer=nl.sbuf)  # <-


def _zeros_like_numpy(x):
    nl.zeros_like(np.ones((4, 4)))  # <-


@pytest.mark.parametrize(
    "body",
    [
        _slice_bound_str,
        _slice_bound_float,
        _reshape_none,
        _reshape_str,
        _ap_none,
        _ap_flat,
        _ap_three_numbers,
        _ap_negative_count,
        _ap_negative_offset,
        _ndarray_list_shape,
        _ndarray_huge,
        _zeros_like_numpy,
    ],
)
def test_bad_view_and_creation_arguments(body):
    _refused(body, "err_invalid_argument")


def _ndarray_bad_dtype(x):
    nl.ndarray((4, 4), dtype="notadtype", buffer=nl.sbuf)  # <-


def _ap_bad_dtype(x):
    x.ap([[64, 128], [1, 64]], dtype="zz")  # <-


def _tensor_copy_bad_dtype(x):
    nisa.tensor_copy(dst=_sb((128, 64)), src=_ones((128, 64)), dtype="zz")  # <-


@pytest.mark.parametrize("body", [_ndarray_bad_dtype, _ap_bad_dtype, _tensor_copy_bad_dtype])
def test_unknown_dtype(body):
    _refused(body, "err_unsupported_dtype", "zz|notadtype")


# -- instructions (nkikit/nki/isa, trace/instructions.py) ---------------------------------------


def _reduce_axis_out_of_range(x):  # was silently read as the last axis
    nisa.tensor_reduce(dst=_sb((128, 1)), op=nl.add, data=_ones((128, 64)), axis=5)  # <-


def _reduce_axis_none(x):
    nisa.tensor_reduce(dst=_sb((128, 1)), op=nl.add, data=_ones((128, 64)), axis=None)  # <-


def _reduce_axis_str(x):
    nisa.tensor_reduce(dst=_sb((128, 1)), op=nl.add, data=_ones((128, 64)), axis="a")  # <-


def _dma_transpose_axes_str(x):
    nisa.dma_transpose(dst=_sb((64, 128)), src=x, axes="ab")  # <-


def _dma_compute_no_srcs(x):
    nisa.dma_compute(dst=_sb((128, 64)), srcs=[], reduce_op=nl.add)  # <-


def _dma_compute_scale_str(x):
    nisa.dma_compute(dst=_sb((128, 64)), srcs=[x, x], reduce_op=nl.add, scales=["a", 1])  # <-


def _iota_flat_pattern(x):
    nisa.iota(dst=_sb((128, 64), nl.int32), pattern=[1, 64])  # <-


def _iota_none_pattern(x):
    nisa.iota(dst=_sb((128, 64), nl.int32), pattern=None)  # <-


def _affine_select_str_value(x):
    t = _ones((128, 64))
    nisa.affine_select(  # <-
        dst=_sb((128, 64)),
        pattern=[[1, 64]],
        channel_multiplier=0,
        on_true_tile=t,
        on_false_value="a",
    )


def _matmul_tile_size_str(x):
    a = _ones((128, 64))
    nisa.nc_matmul(  # <-
        dst=nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum),
        stationary=a,
        moving=a,
        tile_position="ab",
        tile_size="cd",
    )


def _matmul_scalar_stationary(x):
    p = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=1.0, moving=_ones((128, 64)))  # <-


def _match_replace8_str_imm(x):
    a, v = _ones((128, 64)), _ones((128, 8))
    nisa.nc_match_replace8(dst=_sb((128, 64)), data=a, vals=v, imm="a")  # <-


def _shuffle_mask_str(x):
    nisa.nc_stream_shuffle(dst=_sb((128, 64)), src=_ones((128, 64)), shuffle_mask="a")  # <-


def _shuffle_mask_out_of_quadrant(x):
    a = _ones((128, 64))
    nisa.nc_stream_shuffle(dst=_sb((128, 64)), src=a, shuffle_mask=[200] * 32)  # <-


def _shuffle_mask_past_src(x):
    a = _ones((1, 64))
    nisa.nc_stream_shuffle(dst=_sb((32, 64)), src=a, shuffle_mask=[1] * 32)  # <-


def _max8_of_four(x):
    a = _ones((4, 4))
    nisa.max8(dst=_sb((4, 8)), src=a)  # <-


def _find_index8_one_value(x):
    a, v = _ones((4, 16)), _ones((4, 1))
    nisa.nc_find_index8(dst=_sb((4, 8), nl.uint32), data=a, vals=v)  # <-


def _memset_int8_overflow(x):
    nisa.memset(dst=_sb((4, 8), nl.int8), value=1000)  # <-


def _dropout_prob_two(x):
    nisa.dropout(dst=_sb((4, 8)), data=_ones((4, 8)), prob=2.0)  # <-


def _range_select_add(x):
    a, b = _ones((4, 8)), _ones((4, 1))
    nisa.range_select(  # <-
        dst=_sb((4, 8)),
        on_true_tile=a,
        comp_op0=nl.add,
        comp_op1=nl.less,
        bound0=b,
        bound1=b,
    )


def _range_select_nan_start(x):
    a, b = _ones((4, 8)), _ones((4, 1))
    cmp = {"comp_op0": nl.greater_equal, "comp_op1": nl.less, "bound0": b, "bound1": b}
    nisa.range_select(dst=_sb((4, 8)), on_true_tile=a, **cmp, range_start=float("nan"))  # <-


def _range_select_str_fill(x):
    a, b = _ones((4, 8)), _ones((4, 1))
    cmp = {"comp_op0": nl.greater_equal, "comp_op1": nl.less, "bound0": b, "bound1": b}
    nisa.range_select(dst=_sb((4, 8)), on_true_tile=a, **cmp, on_false_value="min")  # <-


def _tensor_reduce_no_op(x):
    nisa.tensor_reduce(dst=_sb((4, 1)), op=None, data=_ones((4, 8)), axis=1)  # <-


def _activation_number_reduce_res(x):
    a = _ones((4, 8))
    nisa.activation(dst=_sb((4, 8)), op=nl.exp, data=a, reduce_op=nl.add, reduce_res=-1)  # <-


def _local_gather_tuple_count(x):
    src, ix = _ones((16, 8)), _sb((16, 4), nl.uint16)
    nisa.memset(dst=ix, value=0)
    nisa.local_gather(dst=_sb((16, 64)), src_buffer=src, index=ix, num_valid_indices=())  # <-


def _matmul_tiled_scalar_stationary(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    m = _ones((128, 8))
    nisa.nc_matmul(acc, -1, m, tile_position=(0, 0), tile_size=(128, 128))  # <-


def _rand2_str_bound(x):
    nisa.rand2(dst=_sb((4, 8)), min="0", max=1.0)  # <-


def _tensor_scalar_missing_operand(x):
    a = _ones((4, 8))
    nisa.tensor_scalar(dst=_sb((4, 8)), data=a, op0=nl.multiply, operand0=None)  # <-


def _engine_from_another_enum(x):
    a = _ones((4, 8))
    nisa.tensor_copy(dst=_sb((4, 8)), src=a, engine=nisa.reduce_cmd.idle)  # <-


def _partition_reduce_no_op(x):
    nisa.tensor_partition_reduce(dst=_sb((1, 8)), op=None, data=_ones((4, 8)))  # <-


def _matmul_array_accumulate(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, _ones((128, 128)), _ones((128, 8)), accumulate=np.zeros(3))  # <-


def _matmul_array_is_transpose(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, _ones((128, 128)), _ones((128, 8)), is_transpose=np.ones(2))  # <-


def _matmul_array_tile_position(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    s, m = _ones((128, 128)), _ones((128, 8))
    nisa.nc_matmul(acc, s, m, tile_position=np.zeros(2), tile_size=(64, 64))  # <-


def _matmul_int_tile_size(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, _ones((128, 128)), _ones((128, 8)), tile_size=64)  # <-


def _matmul_array_perf_mode(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, _ones((128, 128)), _ones((128, 8)), perf_mode=np.zeros(2))  # <-


def _matmul_one_dim_stationary(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, _ones((128, 128))[:, 0], _ones((128, 8)))  # <-


def _matmul_mx_array_accumulate(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    s, m = _ones((128, 128)), _ones((128, 8))
    nisa.nc_matmul_mx(acc, s, m, s, m, accumulate=np.zeros(2))  # <-


def _matmul_mx_str_tile_size(x):
    acc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
    s, m = _ones((128, 128)), _ones((128, 8))
    nisa.nc_matmul_mx(acc, s, m, s, m, tile_position=(0, 0), tile_size=("a", 128))  # <-


@pytest.mark.parametrize(
    "body",
    [
        _partition_reduce_no_op,
        _tensor_reduce_no_op,
        _activation_number_reduce_res,
        _local_gather_tuple_count,
        _matmul_tiled_scalar_stationary,
        _range_select_nan_start,
        _range_select_str_fill,
        _rand2_str_bound,
        _matmul_array_accumulate,
        _matmul_array_is_transpose,
        _matmul_array_tile_position,
        _matmul_int_tile_size,
        _matmul_array_perf_mode,
        _matmul_one_dim_stationary,
        _matmul_mx_array_accumulate,
        _matmul_mx_str_tile_size,
        _reduce_axis_out_of_range,
        _reduce_axis_none,
        _reduce_axis_str,
        _dma_transpose_axes_str,
        _dma_compute_no_srcs,
        _dma_compute_scale_str,
        _iota_flat_pattern,
        _iota_none_pattern,
        _affine_select_str_value,
        _matmul_tile_size_str,
        _matmul_scalar_stationary,
        _match_replace8_str_imm,
        _shuffle_mask_str,
        _shuffle_mask_out_of_quadrant,
        _shuffle_mask_past_src,
        _max8_of_four,
        _find_index8_one_value,
        _memset_int8_overflow,
        _dropout_prob_two,
        _range_select_add,
        _tensor_scalar_missing_operand,
        _engine_from_another_enum,
    ],
)
def test_bad_instruction_arguments(body):
    _refused(body, "err_invalid_argument")


def test_integer_bounds_of_numpy_type_still_index():
    @nki.jit
    def k(x):
        t = _sb((128, 64))
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t[:, np.int64(2) : np.int32(6)])
        return out

    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_array_equal(k(x), x[:, 2:6])


# -- nl wrappers, loops and creation helpers (nkikit/nki/language) ------------------------------


def _sum_axis_str(x):
    nl.sum(_ones((128, 64)), axis="a")  # <-


def _sum_axis_none(x):
    nl.sum(_ones((128, 64)), axis=None)  # <-


def _mean_axis_float(x):
    nl.mean(_ones((128, 64)), axis=1.0)  # <-


def _var_axis_out_of_range(x):
    nl.var(_ones((128, 64)), axis=5)  # <-


def _softmax_axis_out_of_range(x):
    nl.softmax(_ones((128, 64)), axis=5)  # <-


def _expand_dims_past_the_end(x):  # was silently appended at the end
    nl.expand_dims(_ones((128, 64)), 7)  # <-


def _expand_dims_str(x):
    nl.expand_dims(_ones((128, 64)), "a")  # <-


def _broadcast_to_str(x):
    nl.broadcast_to(_ones((128, 1)), "ab")  # <-


def _rms_norm_n_zero(x):
    a = _ones((128, 64))
    nl.rms_norm(a, _ones((1, 64)), axis=1, n=0)  # <-


def _range_str(x):
    for _ in nl.affine_range("a"):  # <-
        pass


def _range_float(x):  # was silently range(2)
    for _ in nl.affine_range(2.5):  # <-
        pass


def _range_step_zero(x):
    for _ in nl.sequential_range(0, 4, 0):  # <-
        pass


def _ds_negative_start(x):  # was read as Python's -5:-1
    t = _ones((128, 64))
    t[:, nl.ds(-5, 4)]  # <-


def _ds_float_size(x):
    t = _ones((128, 64))
    t[:, nl.ds(1, 2.5)]  # <-


def _program_id_str(x):
    nl.program_id("a")  # <-


def _par_dim_str(x):
    nl.par_dim("a")  # <-


def _identity_negative(x):
    nl.shared_identity_matrix(-1)  # <-


def _shared_constant_missing_file(x):
    nl.shared_constant("/nonexistent/nofile.npy")  # <-


def _local_gather_str_count(x):
    a, i = _ones((128, 64)), _ones((128, 4), nl.uint16)
    nisa.local_gather(dst=_sb((128, 64)), src_buffer=a, index=i, num_elem_per_idx="a")  # <-


@pytest.mark.parametrize(
    "body",
    [
        _sum_axis_str,
        _sum_axis_none,
        _mean_axis_float,
        _var_axis_out_of_range,
        _softmax_axis_out_of_range,
        _expand_dims_past_the_end,
        _expand_dims_str,
        _broadcast_to_str,
        _rms_norm_n_zero,
        _range_str,
        _range_float,
        _range_step_zero,
        _ds_negative_start,
        _ds_float_size,
        _program_id_str,
        _par_dim_str,
        _identity_negative,
        _shared_constant_missing_file,
        _local_gather_str_count,
    ],
)
def test_bad_language_arguments(body):
    _refused(body, "err_invalid_argument")


def _address_past_partition_128(x):
    nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf, address=(126, 0))  # <-


def test_placed_tensor_past_the_last_partition():
    _refused(_address_past_partition_128, "err_allocation_out_of_bounds")


def _address_past_sbuf(x):
    # 2 KiB of each partition from 2 KiB before the end of SBUF, plus 4 bytes
    end = nl.tile_size.total_available_sbuf_size
    nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, address=(0, end - 2044))  # <-


def _address_past_psum(x):
    # the 8 banks x 2 KiB of PSUM end at byte 16384 of a partition: two banks from bank 7
    nl.ndarray((128, 2, 512), nl.float32, buffer=nl.psum, address=(0, 7 * 2048))  # <-


@pytest.mark.parametrize("body", [_address_past_sbuf, _address_past_psum])
def test_placed_tensor_past_the_end_of_its_memory(body):
    e = _refused(body, "err_allocation_out_of_bounds", "of each")
    assert ("SBUF" if body is _address_past_sbuf else "PSUM") in str(e)


@nki.jit
def _placed_at_the_ends(x):
    # the last 2 KiB of each partition of SBUF and the last PSUM bank hold a tile each
    end = nl.tile_size.total_available_sbuf_size
    s = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, address=(0, end - 2048))
    p = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 7 * 2048))
    nisa.dma_copy(dst=s, src=x)
    nisa.tensor_copy(dst=p, src=s)
    nisa.tensor_scalar(dst=s, data=p, op0=nl.multiply, operand0=2.0)
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    return out


def test_placed_tensors_at_the_end_of_their_memory(monkeypatch):
    x = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    np.testing.assert_array_equal(_placed_at_the_ends(x), 2 * x)
    # the memory is the target's: trn1 has 192 KiB of SBUF a partition, trn2 224 KiB
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    np.testing.assert_array_equal(_placed_at_the_ends(x), 2 * x)

    def at_trn2_end(x):
        nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf, address=(0, 222 * 1024))  # <-

    e = _refused(at_trn2_end, "err_allocation_out_of_bounds", "196608 on trn1")
    assert "[227328, 229376)" in str(e)


def test_negative_axes_and_numpy_ints_still_reduce():
    @nki.jit
    def k(x):
        t = _sb((128, 64))
        nisa.dma_copy(dst=t, src=x)
        s = nl.sum(t, axis=-1)
        m = nl.max(t, axis=(np.int64(1),))
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[:, 0:1], src=s)
        nisa.dma_copy(dst=out[:, 1:2], src=m)
        return out

    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    r = k(x)
    np.testing.assert_allclose(r[:, 0], x.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(r[:, 1], x.max(axis=1))


# -- view methods (NkiTensor.slice/select/permute/broadcast/..., nkikit/nki/tensor.py) ------------


def _t3():
    return _ones((128, 4, 16))


def _slice_dim_str(x):
    t = _t3()
    t.slice("a", 0, 2)  # <-


def _slice_dim_out_of_range(x):
    t = _t3()
    t.slice(5, 0, 2)  # <-


def _slice_empty(x):
    t = _t3()
    t.slice(1, 2, 2)  # <-


def _select_index_out_of_range(x):  # was a view past the dimension
    t = _t3()
    t.select(1, 9)  # <-


def _select_dim_out_of_range(x):
    t = _t3()
    t.select(7, 0)  # <-


def _select_partition_on_chip(x):
    t = _t3()
    t.select(0, 1)  # <-


def _permute_str(x):
    t = _t3()
    t.permute("abc")  # <-


def _broadcast_str(x):
    t = _ones((128, 1))
    t.broadcast(1, "a")  # <-


def _broadcast_negative(x):  # was a view of size -3
    t = _ones((128, 1))
    t.broadcast(1, -3)  # <-


def _broadcast_dim_out_of_range(x):
    t = _ones((128, 1))
    t.broadcast(9, 3)  # <-


def _broadcast_partition_on_chip(x):
    t = _ones((1, 4))
    t.broadcast(0, 128)  # <-


def _expand_dim_out_of_range(x):  # was silently appended
    t = _t3()
    t.expand_dim(9)  # <-


def _expand_dim_partition_on_chip(x):
    t = _t3()
    t.expand_dim(0)  # <-


def _squeeze_dim_out_of_range(x):
    t = _t3()
    t.squeeze_dim(9)  # <-


def _reshape_dim_wrong_product(x):  # 4 was silently split into (3, 3)
    t = _t3()
    t.reshape_dim(1, (3, 3))  # <-


def _reshape_dim_str(x):
    t = _t3()
    t.reshape_dim(2, "ab")  # <-


def _reshape_dim_out_of_range(x):
    t = _t3()
    t.reshape_dim(7, (2, 2))  # <-


def _flatten_dims_reversed(x):
    t = _t3()
    t.flatten_dims(2, 1)  # <-


def _flatten_dims_out_of_range(x):
    t = _t3()
    t.flatten_dims(1, 9)  # <-


def _flatten_dims_partition_on_chip(x):
    t = _t3()
    t.flatten_dims(0, 1)  # <-


def _rearrange_none(x):
    t = _ones((128, 24))
    t.rearrange(None, None)  # <-


def _ap_indirect_dim_str(x):
    i = _ones((128, 1), nl.int32)
    x.ap([[64, 128], [1, 64]], vector_offset=i, indirect_dim="a")  # <-


@pytest.mark.parametrize(
    "body",
    [
        _slice_dim_str,
        _slice_dim_out_of_range,
        _slice_empty,
        _select_index_out_of_range,
        _select_dim_out_of_range,
        _select_partition_on_chip,
        _permute_str,
        _broadcast_str,
        _broadcast_negative,
        _broadcast_dim_out_of_range,
        _broadcast_partition_on_chip,
        _expand_dim_out_of_range,
        _expand_dim_partition_on_chip,
        _squeeze_dim_out_of_range,
        _reshape_dim_wrong_product,
        _reshape_dim_str,
        _reshape_dim_out_of_range,
        _flatten_dims_reversed,
        _flatten_dims_out_of_range,
        _flatten_dims_partition_on_chip,
        _rearrange_none,
        _ap_indirect_dim_str,
    ],
)
def test_bad_view_method_arguments(body):
    _refused(body, "err_invalid_argument")


def test_view_methods_with_negative_dims_still_work():
    @nki.jit
    def k(x):
        t = _sb((128, 64))
        nisa.dma_copy(dst=t, src=x)
        v = t.reshape_dim(-1, (4, -1)).select(-2, 1).expand_dim(-1).squeeze_dim(-1)
        out = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=v)
        return out

    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_array_equal(k(x), x.reshape(128, 4, 16)[:, 1, :])


# -- launching (nkikit/nki/jit.py, nkikit/trace/jit.py) ------------------------------------------


@nki.jit
def _copy(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("grid", [0, -1, "a", 1.5, None, (2, 0), 10**9])
def test_bad_launch_grid(grid):
    x = np.ones((4, 4), np.float32)
    with pytest.raises(NkiError, match="kernel\\[grid\\]") as e:
        _copy[grid](x)  # before: IndexError (0, -1), ValueError ("a"), k[1.5] ran as k[1],
    # and k[10**9] started a thread per program until the machine ran out
    assert e.value.name == "err_invalid_argument" and e.value.loc.file == __file__


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.complex64])
def test_argument_of_a_dtype_nki_lacks(dtype):
    with pytest.raises(NkiError, match="argument 'x'") as e:  # was a bare TypeError
        _copy(np.ones((4, 4), dtype))
    assert e.value.name == "err_unsupported_dtype"
    assert e.value.loc.file == __file__ and e.value.loc.function == "_copy"


def test_a_returned_dict_of_tensors():
    @nki.jit
    def k(x):
        return {"copy": _copy(x)}

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    r = k(x)  # was ValueError while building the result
    assert set(r) == {"copy"}
    np.testing.assert_array_equal(r["copy"], x)


def _partition_reduce_subtract(x):  # was accepted (order-dependent across partitions)
    a = _ones((128, 64))
    nisa.tensor_partition_reduce(dst=_sb((1, 64)), op=nl.subtract, data=a)  # <-


def test_partition_reduce_takes_the_gpsimd_ops_only():
    _refused(_partition_reduce_subtract, "err_invalid_argument", "nl.add, nl.maximum")


# -- DMA options: priority, dge_mode, engine (nki-0x.md §4.1, §4.3) -------------------------------


@nki.jit
def _dma_options(x, dge, eng, prio, t_dge, t_prio):
    t = _sb((16, 8), nl.bfloat16)
    nisa.dma_copy(dst=t, src=x, dge_mode=dge, engine=eng, priority=prio)
    u = _sb((8, 16), nl.bfloat16)
    nisa.dma_transpose(dst=u, src=t, dge_mode=t_dge, priority=t_prio)
    out = nl.ndarray((8, 16), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=u)
    return out


@pytest.mark.parametrize(
    "dge, eng, prio, t_dge, t_prio",
    [
        (nisa.dge_mode.unknown, nisa.engine.unknown, None, nisa.dge_mode.unknown, None),
        (nisa.dge_mode.hwdge, nisa.engine.sync, 0, nisa.dge_mode.hwdge, 3),
        (nisa.dge_mode.hwdge, nisa.scalar_engine, 3, nisa.dge_mode.swdge, 0),
        (2, nisa.engine.sync, np.int64(1), 3, 2),  # the NKI Library's raw numbers
        (3, None, 2, nisa.dge_mode.none, None),
        (nisa.dge_mode.swdge, nisa.engine.unknown, None, 0, 1),
    ],
)
def test_legal_dma_options_copy_and_transpose(dge, eng, prio, t_dge, t_prio):
    x = np.arange(16 * 8).reshape(16, 8).astype(ml_dtypes.bfloat16)
    got = _dma_options(x, dge, eng, prio, t_dge, t_prio)
    np.testing.assert_array_equal(got, x.T)


def _dma_engine_vector(x):
    t = _sb((128, 64))
    nisa.dma_copy(dst=t, src=x, engine=nisa.engine.vector, dge_mode=nisa.dge_mode.hwdge)  # <-


def _dma_engine_without_hwdge(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, engine=nisa.engine.sync)  # <-


def _dma_engine_on_the_software_dge(x):
    t = _sb((128, 64))
    nisa.dma_copy(dst=t, src=x, engine=nisa.engine.scalar, dge_mode=nisa.dge_mode.swdge)  # <-


def _dma_engine_int(x):
    t = _sb((128, 64))
    nisa.dma_copy(dst=t, src=x, engine=6, dge_mode=nisa.dge_mode.hwdge)  # <-


def _dma_dge_past_none(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, dge_mode=4)  # <-


def _dma_dge_str(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, dge_mode="hwdge")  # <-


def _dma_dge_of_beta_1(x):
    import nkikit.isa as beta1  # Beta 1 numbers the modes differently (none=0, unknown=3)

    nisa.dma_copy(dst=_sb((128, 64)), src=x, dge_mode=beta1.dge_mode.none)  # <-


def _dma_priority_4(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, priority=4)  # <-


def _dma_priority_negative(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, priority=-1)  # <-


def _dma_priority_float(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, priority=1.0)  # <-


def _transpose_priority_7(x):
    t = _sb((16, 8), nl.bfloat16)
    nisa.dma_transpose(dst=_sb((8, 16), nl.bfloat16), src=t, priority=7)  # <-


def _transpose_dge_str(x):
    t = _sb((16, 8), nl.bfloat16)
    nisa.dma_transpose(dst=_sb((8, 16), nl.bfloat16), src=t, dge_mode="swdge")  # <-


@pytest.mark.parametrize(
    "body",
    [
        _dma_engine_vector,
        _dma_engine_without_hwdge,
        _dma_engine_on_the_software_dge,
        _dma_engine_int,
        _dma_dge_past_none,
        _dma_dge_str,
        _dma_dge_of_beta_1,
        _dma_priority_4,
        _dma_priority_negative,
        _dma_priority_float,
        _transpose_priority_7,
        _transpose_dge_str,
    ],
)
def test_bad_dma_options(body):
    _refused(body, "err_invalid_argument", "engine|dge_mode|priority")


def _hwdge_copy(x):
    nisa.dma_copy(dst=_sb((128, 64)), src=x, dge_mode=nisa.dge_mode.hwdge)  # <-


def _hwdge_transpose(x):
    t = _sb((16, 8), nl.bfloat16)
    u = _sb((8, 16), nl.bfloat16)
    nisa.dma_transpose(dst=u, src=t, dge_mode=nisa.dge_mode.hwdge)  # <-


def _hwdge_cast(x):
    nisa.dma_copy(dst=_sb((128, 64), nl.bfloat16), src=x, dge_mode=nisa.dge_mode.hwdge)  # <-


def test_the_hardware_dge_does_not_convert_dtypes():
    """fp32 -> bf16 converts on the software DGE (the other cases here), not on the hardware
    DGE, which moves bytes [nki-0x.md §4.1]."""
    _refused(_hwdge_cast, "err_invalid_argument", "must have one dtype")


@pytest.mark.parametrize("body", [_hwdge_copy, _hwdge_transpose])
def test_the_hardware_dge_needs_neuroncore_v3(body, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    monkeypatch.delenv("NKI_NC_VERSION", raising=False)
    _refused(body, "err_invalid_argument", "NeuronCore-v3 or later")


# -- activation's reduction (nki-0x.md §4.10: reduce_op must be nl.add) --------------------------


def _activation_reducing_with(op):
    def body(x):
        t, r = _ones((128, 64)), _sb((128, 1))
        nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=op, reduce_res=r)  # <-

    return body


@pytest.mark.parametrize("op", [nl.maximum, nl.minimum, nl.multiply, nl.average, nl.exp, "max"])
def test_activation_reduces_by_adding_only(op):
    _refused(_activation_reducing_with(op), "err_invalid_argument")


@pytest.mark.parametrize("op", [nl.add, np.add, None])
def test_activation_reduce_op_add_or_none(op):
    @nki.jit
    def k(x):
        t, r = _sb((128, 64)), _sb((128, 1))
        nisa.dma_copy(dst=t, src=x)
        cmd = nisa.reduce_cmd.reset_reduce
        nisa.activation(dst=t, op=nl.exp, data=t, reduce_op=op, reduce_res=r, reduce_cmd=cmd)
        out = nl.ndarray((128, 65), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[:, 0:64], src=t)
        nisa.dma_copy(dst=out[:, 64:65], src=r)
        return out

    x = np.linspace(-1, 1, 128 * 64, dtype=np.float32).reshape(128, 64)
    got = k(x)
    np.testing.assert_allclose(got[:, :64], np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(got[:, 64], np.exp(x).sum(axis=1), rtol=1e-5)


# -- activation_reduce on NeuronCore-v2 adds only (nki-0x.md §4.10) -----------------------------


def _activation_reduce_max(x):
    t, r = _ones((128, 64)), _sb((128, 1))
    nisa.activation_reduce(dst=t, op=nl.exp, data=t, reduce_op=nl.maximum, reduce_res=r)  # <-


def test_activation_reduce_other_than_add_is_refused_on_trn1(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    monkeypatch.delenv("NKI_NC_VERSION", raising=False)
    _refused(_activation_reduce_max, "err_invalid_argument", "NeuronCore-v2")


def test_activation_reduce_max_computes_on_trn2(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")

    @nki.jit
    def k(x):
        t, r = _sb((128, 64)), _sb((128, 1))
        nisa.dma_copy(dst=t, src=x)
        nisa.activation_reduce(dst=t, op=nl.exp, data=t, reduce_op=nl.maximum, reduce_res=r)
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out

    x = np.linspace(-1, 1, 128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_allclose(k(x)[:, 0], np.exp(x).max(axis=1), rtol=1e-6)


# -- yes/no options (reverse0, negate, accumulate, ...) are read by truth value ---------------------


def _flag_options() -> list[tuple[str, str]]:
    """(instruction, option) for every option of ``nisa`` whose default is True or False."""
    found = []
    for name in nisa.__all__:
        fn = getattr(nisa, name)
        if not inspect.isfunction(fn) or fn.__module__.split(".")[:3] != ["nkikit", "nki", "isa"]:
            continue
        params = inspect.signature(fn).parameters.values()
        found += [(name, p.name) for p in params if p.default is True or p.default is False]
    return found


def test_every_flag_option_is_found():
    # the discovery reads the instructions' signatures (a helper's keyword is not an option)
    found = _flag_options()
    assert ("tensor_scalar", "reverse0") in found and ("nc_matmul", "is_transpose") in found
    assert not any(name == "check_tensor_engine" for name, _ in found)


@pytest.mark.parametrize(("instruction", "option"), _flag_options())
def test_an_array_for_a_flag_option_is_refused(instruction, option):
    # checked before the operands: any tile does for them
    fn = getattr(nisa, instruction)
    params = inspect.signature(fn).parameters.values()
    required = [p.name for p in params if p.default is inspect.Parameter.empty]

    def body(x):
        operands = {p: _ones((4, 8)) for p in required}
        fn(**operands, **{option: np.zeros(2)})  # <-

    _refused(body, "err_invalid_argument", f"{option} must be True or False")


def _fori_step_zero(x):
    nl.fori_loop(0, 3, lambda i: None, step=0)  # <-


def _reshape_tile_to_nothing(x):
    _ones((1, 1)).reshape(())  # <-


@pytest.mark.parametrize("body", [_fori_step_zero, _reshape_tile_to_nothing])
def test_degenerate_loops_and_reshapes_are_refused(body):
    _refused(body, "err_invalid_argument")


@pytest.mark.parametrize("axes", [1, (0, 1), None, "0"])
def test_num_programs_of_an_axis_the_grid_lacks_is_refused(axes):
    @nki.jit
    def k(x):
        nl.num_programs(axes)  # <-
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=_ones((1, 1)))
        return out

    with pytest.raises(NkiError, match="nl.num_programs") as e:
        k[2](np.ones((1, 1), np.float32))
    assert e.value.name == "err_invalid_argument" and e.value.loc.line == _marked_line(k.func)


def test_a_kernel_that_calls_itself_without_end_is_named():
    @nki.jit
    def forever(x):
        return forever(x)

    with pytest.raises(NkiError, match="call itself without end") as e:
        forever(np.ones((1, 1), np.float32))
    assert e.value.loc.function == "forever"


def test_a_kernel_recursion_that_ends_at_trace_time_runs():
    @nki.jit
    def halves(x, n=2):
        if n == 0:
            t = _sb((4, 8))
            nisa.dma_copy(dst=t, src=x)
            out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=t)
            return out
        return halves(x, n - 1)

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(halves(x), x)


# -- views with no elements as operands ----------------------------------------------------
# A view may select no elements (``t[:, 0:0]``) -- a kernel may build one it never uses -- but an
# instruction reads and writes at least one element per dimension: each of these is refused at
# its line, before the shapes are matched, the verifier's rules run or a simulator computes
# (they leaked ZeroDivisionError, IndexError and numpy's ValueError from inside nkikit).


def _empty_reduce(x):
    nisa.tensor_reduce(dst=_sb((32, 1)), op=nl.add, data=_ones((32, 16))[:, 0:0], axis=1)  # <-


def _empty_mean(x):
    nl.mean(_ones((32, 16))[:, 0:0], axis=1)  # <-


def _empty_dma_shapes_differ(x):
    nisa.dma_copy(dst=_sb((32, 16))[:, 0:0], src=x[0:0, :])  # <-


def _empty_copy_ranks_differ(x):
    nisa.tensor_copy(dst=_sb((32, 16))[:, 0:0], src=_ones((32, 4, 16))[:, :, 0:0])  # <-


def _empty_iota(x):
    nisa.iota(dst=_sb((32, 16), nl.int32)[0:0], pattern=[[1, 16]], offset=0)  # <-


def _empty_rng(x):
    nisa.rng(_sb((32, 16), nl.uint32)[0:0])  # <-


def _empty_max8(x):
    nisa.max8(dst=_sb((32, 8))[0:0], src=_ones((32, 16))[0:0])  # <-


def _empty_gather_source(x):
    idx = _sb((32, 4), nl.uint32)
    nisa.memset(dst=idx, value=1)
    nisa.nc_n_gather(dst=_sb((32, 4)), data=_ones((32, 16))[:, 0:0], indices=idx)  # <-


def _empty_scan_at_the_end(x):
    a = _ones((32, 16))[:, 16:16]
    nisa.tensor_tensor_scan(dst=a, data0=a, data1=a, initial=0.0, op0=nl.multiply, op1=nl.add)  # <-


@pytest.mark.parametrize(
    "body",
    [_empty_reduce, _empty_mean, _empty_dma_shapes_differ, _empty_copy_ranks_differ, _empty_iota,
     _empty_rng, _empty_max8, _empty_gather_source, _empty_scan_at_the_end],
)  # fmt: skip
def test_a_view_with_no_elements_is_refused_as_an_operand(body):
    _refused(body, "err_invalid_argument", "no elements")


def test_a_view_with_no_elements_may_be_made():
    @nki.jit
    def k(x):
        t = _ones((32, 16))
        empty = t[:, 0:0]
        assert empty.shape == (32, 0) and empty.size == 0
        out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(k(np.ones((2, 2), np.float32)), np.ones((32, 16)))
