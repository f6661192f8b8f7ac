"""Semantics of the reference interpreter: rounding, PSUM accumulation, poison, masks, bounds."""

import ml_dtypes
import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl


@nki.jit
def exp_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, value=nl.exp(t))
    return out


def test_bf16_rounds_once_on_write():
    x = np.linspace(-2, 2, 128 * 64, dtype=np.float32).reshape(128, 64).astype(ml_dtypes.bfloat16)
    out = exp_kernel(x)
    assert out.dtype == ml_dtypes.bfloat16
    expected = np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16)
    # one rounding of the fp32 result: identical bits
    assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))


@nki.jit
def fp8_cast_kernel(x):
    out = nl.ndarray(x.shape, dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, value=nl.copy(t, dtype=nl.float8_e4m3))
    return out


def test_fp8_cast_saturates_and_rounds():
    x = np.array([[0.3, 1000.0, -1000.0, 1.0625]], dtype=np.float32)
    out = fp8_cast_kernel(x)
    assert out.dtype == ml_dtypes.float8_e4m3
    f = out.astype(np.float32)[0]
    assert f[0] == np.float32(ml_dtypes.float8_e4m3(0.3))
    assert f[1] == 240.0 and f[2] == -240.0


@nki.jit
def matmul_accumulate(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((M, N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.load(lhsT[k * 128 : (k + 1) * 128, :])
        b = nl.load(rhs[k * 128 : (k + 1) * 128, :])
        acc += nisa.nc_matmul(a, b)
    nl.store(out, value=nl.copy(acc))
    return out


def test_psum_accumulates_in_fp32_and_matmul_is_stationary_transposed():
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((384, 64)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((384, 96)).astype(ml_dtypes.bfloat16)
    out = matmul_accumulate(lhsT, rhs)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    ir = str(matmul_accumulate.ir(lhsT, rhs))
    assert "nc_matmul" in ir and "accumulate" in ir


@nki.jit
def read_uninitialized(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nl.store(out, value=t)
    return out


def test_fresh_memory_is_poisoned():
    out = read_uninitialized(np.zeros((4, 8), np.float32))
    assert np.isnan(out).all()


@nki.jit
def masked_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = x.shape[0]
    ip = nl.arange(128)[:, None]
    jf = nl.arange(x.shape[1])[None, :]
    for i in nl.affine_range((n + 127) // 128):
        t = nl.load(x[i * 128 + ip, jf], mask=(i * 128 + ip < n))
        y = nl.multiply(t, 2.0, mask=(i * 128 + ip < n))
        nl.store(out[i * 128 + ip, jf], value=y, mask=(i * 128 + ip < n))
    return out


def test_masks_handle_ragged_last_tile():
    x = np.arange(200 * 8, dtype=np.float32).reshape(200, 8)
    np.testing.assert_array_equal(masked_rows(x), 2 * x)


@nki.jit
def out_of_bounds(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.sequential_range(3):
        t = nl.load(x[i * 64 : i * 64 + 128, :])
        nl.store(out[0:128, :], value=t)
    return out


def test_out_of_bounds_access_is_an_error_at_the_kernel_line():
    with pytest.raises(nki.NkiError) as e:
        out_of_bounds(np.zeros((128, 4), np.float32))
    assert e.value.name == "err_tensor_access_out_of_bound"
    assert e.value.loc.text == "t = nl.load(x[i * 64 : i * 64 + 128, :])"


@nki.jit
def scan_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    s = nisa.tensor_tensor_scan(x, y, initial=0.0, op0=np.multiply, op1=np.add)
    nl.store(out, value=s)
    return out


def test_tensor_tensor_scan_is_a_linear_recurrence():
    rng = np.random.default_rng(1)
    a = rng.random((4, 16)).astype(np.float32)
    b = rng.random((4, 16)).astype(np.float32)
    r = np.zeros((4,), np.float32)
    ref = np.empty_like(a)
    for i in range(16):
        r = a[:, i] * r + b[:, i]
        ref[:, i] = r
    np.testing.assert_allclose(scan_kernel(a, b), ref, rtol=1e-6)


@nki.jit
def stats_kernel(x):
    out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    s = nisa.bn_stats(t)
    mv = nisa.bn_aggr(s)
    nl.store(out, value=mv)
    return out


def test_bn_stats_and_aggr_give_mean_and_population_variance():
    x = np.random.default_rng(2).standard_normal((16, 100)).astype(np.float32)
    out = stats_kernel(x)
    np.testing.assert_allclose(out[:, 0], x.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 1], x.var(1), rtol=1e-5, atol=1e-6)


@nki.jit
def activation_kernel(x, bias):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    sums = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    t = nl.load(x)
    b = nl.load(bias)
    y = nisa.activation(op=nl.exp, data=t, bias=b, scale=0.5, reduce_op=np.add, reduce_res=sums)
    nl.store(out, value=nl.multiply(y, sums))
    return out


def test_activation_scale_bias_and_reduce():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    bias = rng.standard_normal((8, 1)).astype(np.float32)
    y = np.exp(x * 0.5 + bias)
    np.testing.assert_allclose(activation_kernel(x, bias), y * y.sum(1, keepdims=True), rtol=1e-5)


@nki.jit
def causal_select(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(x.shape[0])[:, None]
    jf = nl.arange(x.shape[1])[None, :]
    t = nl.load(x)
    y = nisa.affine_select(pred=(ip - jf >= 0), on_true_tile=t, on_false_value=-1.0)
    nl.store(out, value=y)
    return out


def test_affine_select_builds_a_causal_mask():
    x = np.ones((16, 16), np.float32)
    np.testing.assert_array_equal(causal_select(x), np.where(np.tril(x) > 0, 1.0, -1.0))


@nki.jit
def iota_kernel(x):
    out = nl.ndarray((128, 64), dtype=nl.int32, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(64)[None, :]
    nl.store(out, value=nisa.iota(ip * 64 + jf, dtype=nl.int32))
    return out


def test_iota_evaluates_the_affine_expression():
    np.testing.assert_array_equal(
        iota_kernel(np.zeros(1, np.float32)), np.arange(128 * 64).reshape(128, 64)
    )


@nki.jit
def reduce_kernel(x):
    out = nl.ndarray((x.shape[0], 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray((x.shape[0], 3), dtype=nl.float32, buffer=nl.sbuf)
    r[:, 0:1] = nl.max(t, axis=1, keepdims=True)
    r[:, 1:2] = nl.mean(t, axis=1)
    r[:, 2:3] = nl.var(t, axis=1)
    nl.store(out, value=r)
    return out


def test_reductions_along_the_free_axis():
    x = np.random.default_rng(4).standard_normal((32, 50)).astype(np.float32)
    out = reduce_kernel(x)
    np.testing.assert_allclose(
        out, np.stack([x.max(1), x.mean(1), x.var(1)], 1), rtol=1e-5, atol=1e-6
    )


@nki.jit
def softmax_rms(x, w):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    wt = nl.load(w)
    s = nl.softmax(t, axis=1)
    nl.store(out, value=nl.rms_norm(s, wt, axis=1, epsilon=1e-6))
    return out


def test_fused_softmax_and_rms_norm():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 40)).astype(np.float32)
    w = rng.standard_normal((1, 40)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    s = e / e.sum(1, keepdims=True)
    ref = s / np.sqrt((s * s).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(softmax_rms(x, w), ref, rtol=2e-5, atol=1e-6)


@nki.jit
def dropout_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.dropout(nl.load(x), prob=0.25))
    return out


def test_dropout_zeroes_about_prob_and_is_reproducible():
    x = np.ones((128, 256), np.float32)
    a, b = dropout_kernel(x), dropout_kernel(x)
    assert np.array_equal(a, b)
    assert set(np.unique(a)) <= {0.0, 1.0}
    assert abs((a == 0).mean() - 0.25) < 0.02


# ---------------------------------------------------------------------------------------------
# the rule context and strict writes


@nki.jit
def shuffle_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    src = nl.load(x)
    dst = nl.full((64, 8), -1.0, dtype=nl.float32)
    # partition i of each quadrant takes partition 31 - i; 255 keeps dst's partition
    nisa.nc_stream_shuffle(src=src, dst=dst, shuffle_mask=[255] + list(range(30, -1, -1)))
    nl.store(out, value=dst)
    return out


def test_stream_shuffle_reads_the_partitions_it_keeps_from_its_destination():
    x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    out = shuffle_kernel(x)
    for q in (0, 32):
        assert (out[q] == -1.0).all()
        np.testing.assert_array_equal(out[q + 1 : q + 32], x[q : q + 31][::-1])


@nki.jit
def copies_in_a_loop(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(x[i * 64 : (i + 1) * 64, :])
        nl.store(out[i * 64 : (i + 1) * 64, :], value=nl.copy(t))
    return out


def test_a_rule_sees_mask_env_seed_and_destination(monkeypatch):
    from nkikit.ir.affine import LoopVar
    from nkikit.sim import rules
    from nkikit.sim.interp import Interpreter

    seen = []
    real = rules.RULES["tensor_copy"]

    def spy(op, ins, ctx):
        loops = {v.name: n for v, n in ctx.env.items() if isinstance(v, LoopVar)}
        seen.append((loops, ctx.seed, ctx.valid, bool(np.isnan(ctx.dst(0)).all())))
        return real(op, ins, ctx)

    monkeypatch.setitem(rules.RULES, "tensor_copy", spy)
    x = np.ones((128, 4), np.float32)
    kernel, _ = copies_in_a_loop.specialize(x)
    (out,) = Interpreter(kernel, seed=7).run([x])
    np.testing.assert_array_equal(out, x)
    # each iteration: its loop value, the call's seed, no mask, a fresh (poisoned) destination
    assert seen == [({"i": 0}, 7, None, True), ({"i": 1}, 7, None, True)]


def test_a_write_of_the_wrong_size_is_an_internal_error_not_a_broadcast():
    from nkikit.ir.prims import PrimError
    from nkikit.sim.interp import Interpreter

    x = np.ones((128, 4), np.float32)
    kernel, _ = copies_in_a_loop.specialize(x)
    it = Interpreter(kernel)
    it.run([x])
    op = next(op for op, _ in kernel.ops() if op.prim == "tensor_copy")
    env = {v: 0 for _, loops in kernel.ops() for v in (lp.var for lp in loops)}
    with pytest.raises(PrimError, match="produced"):
        it.write(op.outs[0], np.zeros((64, 1), np.float32), env, op)
    it.write(op.outs[0], np.zeros((64, 2, 2), np.float32), env, op)  # same elements: reshaped
