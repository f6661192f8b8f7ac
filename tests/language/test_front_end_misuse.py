"""The Beta-1 front end never answers wrongly in silence and never leaks an internal exception
(issue #12, item 5): out-of-range slices, empty indices, bad axes, missing grid axes and
arguments of the wrong type are NKI errors at the kernel's line, which is marked ``# BAD``.
Each kernel here used to run (giving a wrong answer) or to die in numpy or ``int()``."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import ErrNkiApiOutsideOfNkiKernel

rng = np.random.default_rng(12)
A = rng.standard_normal((128, 512)).astype(np.float32)


def out_like(shape=(128, 512)):
    return nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)


# -- slices: every bound, every start ---------------------------------------------------------


@nki.jit
def slice_stop_past_end(a):
    out = out_like((128, 600))
    t = nl.load(a[0:128, 0:600])  # BAD
    nl.store(out, t)
    return out


@nki.jit
def slice_start_past_end(a):
    out = out_like((128, 100))
    t = nl.load(a[0:128, 600:700])  # BAD
    nl.store(out, t)
    return out


@nki.jit
def slice_start_below_minus_extent(a):
    out = out_like((128, 512))
    t = nl.load(a[:, -600:])  # BAD
    nl.store(out, t)
    return out


@nki.jit
def integer_index_past_end(a):
    out = out_like((1, 512))
    t = nl.load(a[128, :])  # BAD
    nl.store(out, t)
    return out


@pytest.mark.parametrize(
    "kernel",
    [
        slice_stop_past_end,
        slice_start_past_end,
        slice_start_below_minus_extent,
        integer_index_past_end,
    ],
)
def test_out_of_range_slices_are_out_of_bounds(kernel, rejects):
    err = rejects(kernel, "err_tensor_access_out_of_bound", A)
    assert err.fields["tensor"] == "a"


@nki.jit
def empty_slice(a):
    out = out_like((128, 1))
    t = nl.load(a[:, 5:5])  # BAD
    nl.store(out, t)
    return out


@nki.jit
def slice_bound_of_wrong_type(a):
    out = out_like((128, 3))
    t = nl.load(a[:, 0.5:3])  # BAD
    nl.store(out, t)
    return out


@nki.jit
def empty_dynamic_slice(a):
    out = out_like((128, 1))
    t = nl.load(a[:, nl.ds(0, 0)])  # BAD
    nl.store(out, t)
    return out


@pytest.mark.parametrize("kernel", [empty_slice, slice_bound_of_wrong_type, empty_dynamic_slice])
def test_empty_or_ill_typed_slices_are_invalid(kernel, rejects):
    rejects(kernel, "err_invalid_argument", A)


@nki.jit
def negative_slices(a):
    out = out_like((64, 500))
    nl.store(out, nl.load(a[-64:, 2:-10]))
    return out


def test_negative_slice_bounds_count_from_the_end():
    np.testing.assert_array_equal(negative_slices(A), A[-64:, 2:-10])


# -- aranges ------------------------------------------------------------------------------------


@nki.jit
def index_with_empty_arange(a):
    out = out_like((128, 1))
    i_p, i_f = nl.arange(128)[:, None], nl.arange(0)[None, :]
    t = nl.load(a[i_p, i_f])  # BAD
    nl.store(out, t)
    return out


@nki.jit
def arange_of_a_float(a):
    out = out_like()
    i_f = nl.arange(1.5)[None, :]  # BAD
    nl.store(out, nl.load(a[nl.arange(128)[:, None], i_f]))
    return out


@nki.jit
def arange_placed_twice(a):
    out = out_like()
    i_f = nl.arange(512)[:, :]  # BAD
    nl.store(out, nl.load(a[nl.arange(128)[:, None], i_f]))
    return out


@pytest.mark.parametrize(
    "kernel", [index_with_empty_arange, arange_of_a_float, arange_placed_twice]
)
def test_bad_aranges_are_invalid(kernel, rejects):
    rejects(kernel, "err_invalid_argument", A)


@nki.jit
def unused_empty_arange(a):
    out = out_like()
    rest = nl.arange(0)[:, None]  # a library kernel builds one for a remainder tile it skips
    assert rest.shape == (0, 1)
    nl.store(out, nl.load(a))
    return out


def test_an_empty_arange_that_indexes_nothing_is_fine():
    np.testing.assert_array_equal(unused_empty_arange(A), A)


# -- reductions: axes are never wrapped ----------------------------------------------------------


@nki.jit
def sum_axis_5(a):
    out = out_like((128, 1))
    s = nl.sum(nl.load(a), axis=5, keepdims=True)  # BAD
    nl.store(out, s)
    return out


@nki.jit
def sum_axis_str(a):
    out = out_like((128, 1))
    s = nl.sum(nl.load(a), axis="1", keepdims=True)  # BAD
    nl.store(out, s)
    return out


@nki.jit
def sum_axis_twice(a):
    out = out_like((128, 1))
    s = nl.sum(nl.load(a), axis=(1, -1), keepdims=True)  # BAD
    nl.store(out, s)
    return out


@pytest.mark.parametrize("kernel", [sum_axis_5, sum_axis_str, sum_axis_twice])
def test_bad_reduction_axes_are_invalid(kernel, rejects):
    rejects(kernel, "err_invalid_argument", A)


# -- launch grid ---------------------------------------------------------------------------------


@nki.jit
def program_id_3(a):
    out = out_like()
    nl.store(out[0, :], nl.load(a[nl.program_id(3), :]))  # BAD
    nl.store(out, nl.load(a))
    return out


def test_program_id_of_a_missing_grid_axis_is_invalid(rejects):
    rejects(program_id_3, "err_invalid_argument", A)
    rejects(program_id_3[2, 2], "err_invalid_argument", A)


# -- the trace cache keys floats by their bits ------------------------------------------------------


@nki.jit
def scaled(a, c):
    out = out_like()
    nl.store(out, nl.multiply(nl.load(a), c))
    return out


def test_minus_zero_is_not_served_the_trace_of_zero():
    pos = scaled(A, 0.0)
    neg = scaled(A, -0.0)  # was served the 0.0 trace: the signs of pos
    np.testing.assert_array_equal(np.signbit(pos), np.signbit(A * np.float32(0.0)))
    np.testing.assert_array_equal(np.signbit(neg), np.signbit(A * np.float32(-0.0)))
    assert scaled.ir(A, float("nan")) is scaled.ir(A, float("nan"))  # nan reuses its trace


# -- misuse that used to die inside numpy ---------------------------------------------------------


def test_load_outside_a_kernel_says_so():
    with pytest.raises(ErrNkiApiOutsideOfNkiKernel):
        nl.load(A)


@nki.jit
def add_different_free_sizes(a):
    out = out_like()
    t, u = nl.load(a), nl.load(a[:, 0:256])
    s = nl.add(t, u)  # BAD
    nl.store(out, s)
    return out


@nki.jit
def bn_aggr_of_a_plain_tile(a):
    out = out_like((128, 2))
    m = nisa.bn_aggr(nl.load(a))  # BAD
    nl.store(out, m)
    return out


@nki.jit
def loop_of_a_string(a):
    out = out_like()
    for _ in nl.affine_range("4"):  # BAD
        pass
    nl.store(out, nl.load(a))
    return out


@nki.jit
def zero_sized_buffer(a):
    out = out_like()
    t = nl.ndarray((128, 0), dtype=nl.float32, buffer=nl.sbuf)  # BAD
    nl.store(out, t)
    return out


@nki.jit
def broadcast_to_a_string_shape(a):
    out = out_like()
    t = nl.broadcast_to(nl.load(a[:, 0:1]), ("128", 512))  # BAD
    nl.store(out, t)
    return out


@nki.jit
def full_of_a_string(a):
    out = out_like()
    t = nl.full((128, 512), "1", dtype=nl.float32)  # BAD
    nl.store(out, t)
    return out


@nki.jit
def expand_dims_past_the_end(a):
    out = out_like()
    t = nl.expand_dims(nl.load(a), 9)  # BAD
    nl.store(out, t)
    return out


@nki.jit
def iota_of_an_empty_arange(a):
    out = out_like()
    t = nisa.iota(nl.arange(0)[None, :], dtype=nl.int32)  # BAD
    nl.store(out, t)
    return out


@pytest.mark.parametrize(
    "kernel",
    [
        add_different_free_sizes,
        bn_aggr_of_a_plain_tile,
        loop_of_a_string,
        zero_sized_buffer,
        broadcast_to_a_string_shape,
        full_of_a_string,
        expand_dims_past_the_end,
        iota_of_an_empty_arange,
    ],
)
def test_misuse_is_invalid_at_its_line(kernel, rejects):
    rejects(kernel, "err_invalid_argument", A)


@nki.jit
def dtype_not_a_dtype(a):
    out = out_like()
    t = nl.exp(nl.load(a), dtype="float99")  # BAD
    nl.store(out, t)
    return out


def test_a_dtype_argument_that_is_no_dtype_is_unsupported(rejects):
    err = rejects(dtype_not_a_dtype, "err_unsupported_dtype", A)
    assert "dtype" in str(err)


# -- every argument is checked where it enters: one bad argument per kernel line ---------------
# Each of these died in int() / float() / numpy / an enum lookup (or ran) before issue #12.

ARGUMENT_MISUSE = [
    ("nisa.tensor_copy(t, engine=99)", "err_invalid_argument"),
    ("nisa.tensor_tensor(t, t, op=np.add, engine=7)", "err_invalid_argument"),
    ("nisa.local_gather(t, t, num_elem_per_idx='x')", "err_invalid_argument"),
    ("nisa.nc_stream_shuffle(src=t, dst=t, shuffle_mask='abc')", "err_invalid_argument"),
    ("nisa.nc_stream_shuffle(src=t, dst=t, shuffle_mask=5)", "err_invalid_argument"),
    ("nisa.affine_select(nl.arange(128)[:, None] > 3, t, 'x')", "err_invalid_argument"),
    (
        "nisa.range_select(on_true_tile=t, comp_op0=np.greater, comp_op1=np.less, bound0=1.0, "
        "bound1=5.0, on_false_value='x')",
        "err_invalid_argument",
    ),
    ("nisa.nc_match_replace8(data=t, vals=t, imm='x')", "err_invalid_argument"),
    ("nisa.select_reduce(predicate=t, on_true=t, on_false='x')", "err_invalid_argument"),
    ("nisa.nc_matmul(t, t, tile_position=5)", "err_invalid_argument"),
    ("nisa.memset((128, 'x'), 0.0, nl.float32)", "err_invalid_argument"),
    ("nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf, name=5)", "err_invalid_argument"),
    ("nl.shared_constant('abc')", "err_unsupported_dtype"),
    ("nl.zeros_like('x')", "err_invalid_argument"),
    ("nl.rms_norm(t, t, epsilon='x')", "err_invalid_argument"),
    ("nl.rms_norm(t, t, n='x')", "err_invalid_argument"),
    ("nl.matmul(t, t, transpose_x='yes')", "err_invalid_argument"),
    ("nl.arange(4) // 0", "err_invalid_argument"),
    ("nl.arange(128)[:, None] < 'x'", "err_invalid_argument"),
    ("nl.par_dim('x')", "err_invalid_argument"),
    ("nl.affine_range(4, directives='x')", "err_invalid_argument"),
    ("nl.sequential_range(0, 4, 0)", "err_invalid_argument"),
    ("nl.exp('x')", "err_invalid_argument"),
    ("nl.exp(None)", "err_invalid_argument"),
    ("nl.add('x', 1.0)", "err_invalid_argument"),
    ("t.assert_shape('x')", "err_invalid_argument"),
    ("t.reshape((2, 'x'))", "err_invalid_argument"),
    ("nl.num_programs(5)", "err_invalid_argument"),
    ("nl.mgrid[0:]", "err_invalid_argument"),
    ("nl.ds(0, '4')", "err_invalid_argument"),
    ("nl.where(t, 'x', 1.0)", "err_invalid_argument"),
    ("nisa.memset((128, 4), 'z', dtype=nl.float32)", "err_invalid_argument"),
    ("nl.exp(t, dtype=5)", "err_unsupported_dtype"),
    ("nl.program_id('0')", "err_invalid_argument"),
]


@pytest.mark.parametrize("call,name", ARGUMENT_MISUSE, ids=[c for c, _ in ARGUMENT_MISUSE])
def test_an_argument_of_the_wrong_kind_is_named_at_its_line(call, name):
    from nkikit.testing.random_kernels import RandomKernel, check_random_kernel

    lines = [
        "def kernel(a):",
        "    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)",
        "    t = nl.load(a)",
        f"    r = {call}",
        "    nl.store(out, t)",
        "    return out",
    ]
    a = rng.standard_normal((128, 64)).astype(np.float32)
    case = RandomKernel(lines, [a], bad_line=4, errors=(name,), what=call)
    assert check_random_kernel(case) == name
