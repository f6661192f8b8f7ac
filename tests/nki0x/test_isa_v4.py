"""The NKI 0.x instructions activate2, exponential, tensor_scalar_cumulative, sequence_bounds
and topk [reference/nki-0x.md §4.6 - §4.10]: numerics against numpy models written here,
every constraint rejected with its named error at the kernel's line, and a cost model entry
(an engine and a duration).  The directory's conftest runs every kernel on both simulators,
which must agree bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nki0x_helpers import load as _load
from nki0x_helpers import rejects
from nki0x_helpers import store as _store

import nkikit
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

rng = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _trn3(monkeypatch):
    # activate2 and exponential are NC-v4 instructions [nki-0x.md §4.2]
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _opcode(kernel, args, opcode: str, target: str = "trn3"):
    """The profiled instructions of ``opcode``: the cost model gave each an engine and a
    duration."""
    prof = nkikit.profile_kernel(kernel, *args, target=target)
    got = [i for i in prof.instructions if i.opcode == opcode]
    assert got, sorted({i.opcode for i in prof.instructions})
    return got


# -- activate2 ------------------------------------------------------------------------------


def _prelu(v, alpha):
    return np.where(v >= 0, v, alpha * v)


@nki.jit
def act2(x, imm0, imm1, alpha):
    a, i0, i1, al = _load(x), _load(imm0), _load(imm1), _load(alpha)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(
        dst=y,
        op=nl.prelu,
        data=a,
        imm0=i0,
        imm1=i1,
        op0=nl.multiply,
        op1=nl.subtract,
        relu_param=al,
        reduce_op=nl.abs_max,
        reduce_res=m,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    return _store(y), _store(m)


@settings(max_examples=8, deadline=None)
@given(p=st.sampled_from([1, 16, 128]), f=st.integers(1, 96), seed=st.integers(0, 2**16))
def test_activate2_is_the_two_stage_prelu_with_an_abs_max_reduction(p, f, seed):
    r = np.random.default_rng(seed)
    x = r.standard_normal((p, f)).astype(np.float32)
    i0, i1, al = (r.standard_normal((p, 1)).astype(np.float32) for _ in range(3))
    y, m = act2(x, i0, i1, al)
    v = (x * i0).astype(np.float32) - i1
    want = _prelu(v, al).astype(np.float32)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
    # abs_max: the signed value of the largest magnitude
    pick = np.abs(want).argmax(axis=1)
    np.testing.assert_allclose(m[:, 0], want[np.arange(p), pick], rtol=1e-6)


@pytest.mark.parametrize(
    ("op0", "op1", "model"),
    [
        (nl.multiply, nl.add, lambda x: x * 2.0 + 0.5),
        (nl.add, nl.bypass, lambda x: x + 2.0),
        (nl.subtract, None, lambda x: 2.0 - x),  # reverse0: imm0 - data
        (nl.bypass, nl.bypass, lambda x: x),
    ],
)
def test_activate2_stages_and_reverse(op0, op1, model):
    reverse0 = op0 is nl.subtract

    @nki.jit
    def k(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(
            dst=y, op=nl.exp, data=a, imm0=2.0, imm1=0.5, op0=op0, op1=op1, reverse0=reverse0
        )
        return _store(y)

    x = f32(32, 40)
    np.testing.assert_allclose(k(x), np.exp(model(x)), rtol=1e-5)


@nki.jit
def act2_bad_pair(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=y, op=nl.exp, data=a, imm0=1.0, imm1=1.0, op0=nl.add, op1=nl.add)  # BAD
    return _store(y)


@nki.jit
def act2_reverse_without_stage(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(  # BAD
        dst=y, op=nl.exp, data=a, imm0=1.0, imm1=1.0, op0=None, op1=None, reverse1=True
    )
    return _store(y)


@nki.jit
def act2_bad_reduce(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(  # BAD
        dst=y,
        op=nl.exp,
        data=a,
        imm0=1.0,
        imm1=1.0,
        op0=None,
        op1=None,
        reduce_op=nl.multiply,
        reduce_res=r,
    )
    return _store(y)


@nki.jit
def act2_mixed_imm_dtypes(x, c):
    a, c32 = _load(x), _load(c)
    c16 = nl.ndarray(c.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c16, src=c32)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=y, op=nl.exp, data=a, imm0=c32, imm1=c16, op0=nl.multiply, op1=nl.add)  # BAD
    return _store(y)


@nki.jit
def act2_wide_imm(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=y, op=nl.exp, data=a, imm0=a, imm1=1.0, op0=nl.multiply, op1=nl.add)  # BAD
    return _store(y)


@nki.jit
def act2_hbm_dst(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.activate2(dst=y, op=nl.exp, data=a, imm0=1.0, imm1=1.0, op0=None, op1=None)  # BAD
    return y


def test_activate2_constraints_are_named_errors_at_the_line():
    x, c = f32(16, 8), f32(16, 1)
    assert "(add, add)" in str(rejects(act2_bad_pair, "err_invalid_argument", x))
    assert "reverse1" in str(rejects(act2_reverse_without_stage, "err_invalid_argument", x))
    assert "abs_max" in str(rejects(act2_bad_reduce, "err_invalid_argument", x))
    assert "one dtype" in str(rejects(act2_mixed_imm_dtypes, "err_invalid_argument", x, c))
    assert "(P, 1)" in str(rejects(act2_wide_imm, "err_invalid_argument", x))
    rejects(act2_hbm_dst, "err_unsupported_memory", x)


@nki.jit
def act2_plain(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=y, op=nl.exp, data=a, imm0=1.0, imm1=1.0, op0=None, op1=None)  # BAD
    return _store(y)


@nki.jit
def exp_plain(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=y, src=a)  # BAD
    return _store(y)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("kernel", [act2_plain, exp_plain])
def test_nc_v4_instructions_are_rejected_on_older_targets(monkeypatch, target, kernel):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    err = rejects(kernel, "err_unsupported_instruction_on_target", f32(16, 8))
    assert "trn3" in str(err)


# -- exponential ------------------------------------------------------------------------------


@nki.jit
def expo(x, mx, dtype):
    a, m = _load(x), _load(mx)
    y = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
    s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.exponential(
        dst=y, src=a, max_value=m, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reset_reduce
    )
    return _store(y), _store(s)


@settings(max_examples=8, deadline=None)
@given(
    p=st.sampled_from([1, 8, 128]),
    f=st.integers(1, 300),
    dtype=st.sampled_from([nl.float32, nl.bfloat16, nl.float16]),
    seed=st.integers(0, 2**16),
)
def test_exponential_subtracts_the_max_and_sums_in_fp32(p, f, dtype, seed):
    r = np.random.default_rng(seed)
    x = r.standard_normal((p, f)).astype(np.float32) * 3
    mx = x.max(axis=1, keepdims=True)
    y, s = expo(x, mx, dtype)
    e = np.exp(x - mx)
    np.testing.assert_array_equal(y, e.astype(np.dtype(dtype)))  # one rounding, on write
    np.testing.assert_allclose(s[:, 0], e.sum(axis=1), rtol=1e-5)


def test_exponential_rounds_to_an_integer_destination():
    @nki.jit
    def k(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.exponential(dst=y, src=a, max_value=-1.0)
        return _store(y)

    x = np.linspace(-2, 3, 64, dtype=np.float32).reshape(4, 16)
    np.testing.assert_array_equal(k(x), np.rint(np.exp(x + 1.0)).astype(np.int32))


@nki.jit
def exp_tf32_src(x):
    a = _load(x)
    t = nl.ndarray(x.shape, dtype=nl.tfloat32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=a)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=y, src=t)  # BAD
    return _store(y)


@nki.jit
def exp_uint32_dst(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.uint32, buffer=nl.sbuf)
    nisa.exponential(dst=y, src=a)  # BAD
    return _store(y)


@nki.jit
def exp_wide_max(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=y, src=a, max_value=a)  # BAD
    return _store(y)


@nki.jit
def exp_unread_init(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.exponential(dst=y, src=a, reduce_init=2.0)  # BAD
    return _store(y)


def test_exponential_constraints_are_named_errors_at_the_line():
    x = f32(16, 8)
    assert "load_reduce" in str(rejects(exp_unread_init, "err_invalid_argument", x))
    rejects(exp_tf32_src, "err_unsupported_dtype", x)
    rejects(exp_uint32_dst, "err_unsupported_dtype", x)
    rejects(exp_wide_max, "err_invalid_argument", x)


# -- tensor_scalar_cumulative -------------------------------------------------------------------


def _scan(x, imm0, op0, op1, init):
    v = op0(x, imm0).astype(np.float32)
    reg = np.broadcast_to(np.float32(init), (x.shape[0],)).astype(np.float32)
    out = np.empty_like(v)
    for i in range(v.shape[1]):
        reg = op1(v[:, i], reg).astype(np.float32)
        out[:, i] = reg
    return out


_NP = {
    nl.add: np.add,
    nl.subtract: np.subtract,
    nl.multiply: np.multiply,
    nl.maximum: np.maximum,
    nl.minimum: np.minimum,
}
_IDENTITY = {
    nl.add: 0.0,
    nl.subtract: 0.0,
    nl.multiply: 1.0,
    nl.maximum: -np.inf,
    nl.minimum: np.inf,
}


@settings(max_examples=10, deadline=None)
@given(
    op1=st.sampled_from(list(_NP)),
    f=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_tensor_scalar_cumulative_is_a_running_scan(op1, f, seed):
    r = np.random.default_rng(seed)
    x = (r.standard_normal((16, f)) * 0.5 + 1).astype(np.float32)
    c = r.standard_normal((16, 1)).astype(np.float32)

    @nki.jit
    def k(x, c):
        a, cc = _load(x), _load(c)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=y, src=a, op0=nl.multiply, op1=op1, imm0=cc)
        return _store(y)

    want = _scan(x, c, np.multiply, _NP[op1], _IDENTITY[op1])
    np.testing.assert_allclose(k(x, c), want, rtol=1e-5, atol=1e-6)


def test_tensor_scalar_cumulative_continues_and_loads_the_register():
    @nki.jit
    def k(x):
        a = _load(x[:, :8])
        b = _load(x[:, 8:])
        y1 = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        y2 = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        y3 = nl.ndarray((16, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        cmd = nisa.reduce_cmd
        nisa.tensor_scalar_cumulative(dst=y1, src=a, op0=nl.add, op1=nl.add, imm0=1.0)
        nisa.tensor_scalar_cumulative(
            dst=y2, src=b, op0=nl.add, op1=nl.add, imm0=1.0, reduce_cmd=cmd.reduce
        )
        nisa.tensor_scalar_cumulative(
            dst=y3,
            src=b,
            op0=nl.multiply,
            op1=nl.maximum,
            imm0=2.0,
            imm1=0.5,
            reduce_cmd=cmd.load_reduce,
        )
        return _store(y1), _store(y2), _store(y3)

    x = f32(16, 16)
    y1, y2, y3 = k(x)
    whole = _scan(x, 1.0, np.add, np.add, 0.0)
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), whole, rtol=1e-5, atol=1e-5)
    want3 = _scan(x[:, 8:], 2.0, np.multiply, np.maximum, 0.5).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(y3, want3)


@nki.jit
def cumulative_int32(x):
    a = _load(x, nl.int32)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=y, src=a, op0=nl.add, op1=nl.add, imm0=1.0)  # BAD
    return _store(y)


@nki.jit
def cumulative_bad_op1(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=y, src=a, op0=nl.add, op1=nl.power, imm0=1.0)  # BAD
    return _store(y)


@nki.jit
def cumulative_bitvec_op0(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=y, src=a, op0=nl.bitwise_and, op1=nl.add, imm0=1.0)  # BAD
    return _store(y)


@nki.jit
def cumulative_imm1_unread(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=y, src=a, op0=nl.add, op1=nl.add, imm0=1.0, imm1=2.0)  # BAD
    return _store(y)


@nki.jit
def cumulative_idle(x):
    a = _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(  # BAD
        dst=y, src=a, op0=nl.add, op1=nl.add, imm0=1.0, reduce_cmd=nisa.reduce_cmd.idle
    )
    return _store(y)


def test_tensor_scalar_cumulative_constraints_are_named_errors_at_the_line():
    x = f32(16, 8)
    rejects(cumulative_int32, "err_unsupported_dtype", x)
    rejects(cumulative_bad_op1, "err_invalid_argument", x)
    rejects(cumulative_bitvec_op0, "err_invalid_argument", x)
    assert "load_reduce" in str(rejects(cumulative_imm1_unread, "err_invalid_argument", x))
    rejects(cumulative_idle, "err_invalid_argument", x)


# -- sequence_bounds ----------------------------------------------------------------------------


def _bounds(ids):
    n = ids.size
    start, end = np.full(n, n), np.full(n, -1)
    for sid in set(ids.tolist()) - {0}:
        at = np.flatnonzero(ids == sid)
        start[at], end[at] = at[0], at[-1] + 1
    return np.stack([start, end])[None]


@nki.jit
def seq_bounds(ids):
    a = _load(ids)
    d = nl.ndarray((1, 2, ids.shape[1]), dtype=ids.dtype, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=d, segment_ids=a)
    return _store(d)


def test_sequence_bounds_reproduces_the_documented_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], dtype=np.int32)
    got = seq_bounds(ids)
    np.testing.assert_array_equal(got[0, 0], [9, 1, 1, 3, 3, 3, 9, 7, 7])
    np.testing.assert_array_equal(got[0, 1], [-1, 3, 3, 6, 6, 6, -1, 9, 9])


@settings(max_examples=10, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6)), min_size=1, max_size=12),
    dtype=st.sampled_from([np.int32, np.float32]),
)
def test_sequence_bounds_of_packed_segments(runs, dtype):
    ids = np.concatenate([np.full(n, sid) for sid, n in runs]).astype(dtype)[None]
    np.testing.assert_array_equal(seq_bounds(ids), _bounds(ids[0]).astype(dtype))


def test_a_nan_segment_id_is_a_segment_of_its_own():
    # a NaN id equals no id, itself included (it crashed the simulators' rule before)
    ids = np.array([[1, 1, np.nan, np.nan, 2, 0]], dtype=np.float32)
    got = seq_bounds(ids)
    np.testing.assert_array_equal(got[0, 0], [0, 0, 2, 3, 4, 6])
    np.testing.assert_array_equal(got[0, 1], [2, 2, 3, 4, 5, -1])


@nki.jit
def seq_two_partitions(ids):
    a = _load(ids)
    d = nl.ndarray((2, 2, ids.shape[1]), dtype=ids.dtype, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=d, segment_ids=a)  # BAD
    return _store(d)


@nki.jit
def seq_uint8(ids):
    a = _load(ids, nl.uint8)
    d = nl.ndarray((1, 2, ids.shape[1]), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=d, segment_ids=a)  # BAD
    return _store(d)


@nki.jit
def seq_short_dst(ids):
    a = _load(ids)
    d = nl.ndarray((1, ids.shape[1]), dtype=ids.dtype, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=d, segment_ids=a)  # BAD
    return _store(d)


def test_sequence_bounds_constraints_are_named_errors_at_the_line():
    rejects(seq_two_partitions, "err_invalid_argument", np.ones((2, 8), np.int32))
    rejects(seq_uint8, "err_unsupported_dtype", np.ones((1, 8), np.int32))
    rejects(
        seq_short_dst, "err_store_dst_shape_smaller_than_other_shape", np.ones((1, 8), np.int32)
    )


# -- topk ---------------------------------------------------------------------------------------


def _topk(src, n, k):
    """Every partition of each 16-partition group: the K largest of the group's n snake-wise
    elements, ascending, and their element numbers (ties: the lower number ranks higher)."""
    p = src.shape[0]
    vals = np.empty((p, k), np.float32)
    idx = np.empty((p, k), np.uint32)
    e = np.arange(n)
    for g in range(0, p, 16):
        x = src[g : g + 16][e % 16, e // 16].astype(np.float32)
        order = sorted(range(n), key=lambda j: (-x[j], j))[:k][::-1]
        vals[g : g + 16], idx[g : g + 16] = x[order], order
    return vals, idx


@nki.jit
def topk_kernel(x, n, k):
    a = _load(x)
    v = nl.ndarray((x.shape[0], k), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((x.shape[0], k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=n)
    return _store(v), _store(i)


@settings(max_examples=10, deadline=None)
@given(
    groups=st.integers(1, 3),
    n=st.integers(8, 120),
    data=st.data(),
    ties=st.booleans(),
)
def test_topk_takes_the_largest_of_each_snake_group(groups, n, data, ties):
    k = data.draw(st.integers(1, n))
    cols = -(-n // 16) + data.draw(st.integers(0, 2))
    r = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = r.standard_normal((16 * groups, cols))
    if ties:
        x = np.round(x * 2) / 2  # many equal values
    x = x.astype(ml_dtypes.bfloat16)
    v, i = topk_kernel(x, n, k)
    want_v, want_i = _topk(x, n, k)
    np.testing.assert_array_equal(v.astype(np.float32), want_v)
    np.testing.assert_array_equal(i, want_i)


BF = (rng.standard_normal((16, 8))).astype(ml_dtypes.bfloat16)


@nki.jit
def topk_small_n(x):
    a = _load(x)
    v = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((16, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=7)  # BAD
    return _store(v)


@nki.jit
def topk_k_over_n(x):
    a = _load(x)
    v = nl.ndarray((16, 12), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((16, 12), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=10)  # BAD
    return _store(v)


@nki.jit
def topk_src_too_short(x):
    a = _load(x)
    v = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((16, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=200)  # BAD
    return _store(v)


@nki.jit
def topk_12_partitions(x):
    a = _load(x[0:12])
    v = nl.ndarray((12, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((12, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=16)  # BAD
    return _store(v)


@nki.jit
def topk_fp32_src(x):
    a = _load(x, nl.float32)
    v = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((16, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=16)  # BAD
    return _store(v)


@nki.jit
def topk_int32_idx(x):
    a = _load(x)
    v = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((16, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=16)  # BAD
    return _store(v)


@nki.jit
def topk_idx_width(x):
    a = _load(x)
    v = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((16, 5), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=16)  # BAD
    return _store(v)


@nki.jit
def topk_psum_dst(x):
    a = _load(x)
    v = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.psum)
    i = nl.ndarray((16, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=v, idx_dst=i, src=a, n=16)  # BAD
    return _store(i)


def test_topk_constraints_are_named_errors_at_the_line():
    assert "at least 8" in str(rejects(topk_small_n, "err_invalid_argument", BF))
    assert "must not exceed" in str(rejects(topk_k_over_n, "err_invalid_argument", BF))
    assert "ceil(n / 16)" in str(rejects(topk_src_too_short, "err_invalid_argument", BF))
    assert "multiple of 16" in str(rejects(topk_12_partitions, "err_invalid_argument", BF))
    rejects(topk_fp32_src, "err_unsupported_dtype", BF)
    rejects(topk_int32_idx, "err_unsupported_dtype", BF)
    rejects(topk_idx_width, "err_invalid_argument", BF)
    rejects(topk_psum_dst, "err_unsupported_memory", BF)


# -- the cost model -------------------------------------------------------------------------------


def test_each_instruction_has_an_engine_and_a_duration():
    x, c = f32(128, 64), f32(128, 1)
    cases = [
        (act2, (x, c, c, c), "ACTIVATE2", "scalar"),
        (expo, (x, c, nl.float32), "EXPONENTIAL", "vector"),
        (topk_kernel, (f32(32, 8).astype(ml_dtypes.bfloat16), 100, 8), "TOPK", "gpsimd"),
        (seq_bounds, (np.ones((1, 64), np.int32),), "SEQUENCE_BOUNDS", "gpsimd"),
    ]
    for kernel, args, opcode, engine in cases:
        for instr in _opcode(kernel, args, opcode):
            assert instr.engine.lower().startswith(engine), (opcode, instr.engine)
            assert instr.duration_ns > 0, opcode

    @nki.jit
    def cum(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=y, src=a, op0=nl.add, op1=nl.add, imm0=1.0)
        return _store(y)

    (instr,) = _opcode(cum, (x,), "TENSOR_SCALAR_CUMULATIVE", target="trn2")
    assert instr.engine.lower().startswith("vector") and instr.duration_ns > 0


def test_topk_cost_grows_with_n():
    # 4n + K GpSimd cycles [nki-0x.md §4.8]
    x = f32(16, 64).astype(ml_dtypes.bfloat16)
    short = _opcode(topk_kernel, (x, 64, 8), "TOPK")[0].duration_ns
    long = _opcode(topk_kernel, (x, 1024, 8), "TOPK")[0].duration_ns
    assert long > short
