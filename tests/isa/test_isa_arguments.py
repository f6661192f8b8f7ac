"""nkikit.isa takes every documented Beta-1 argument and swallows none: each argument that
used to vanish into ``**kwargs`` either works (and simulates what it says) or, at a value
nkikit does not model, is rejected with an NKI error name at the kernel's own line.  An
unknown keyword is Python's TypeError, raised at the kernel's line.

Bad kernels mark the offending line ``# BAD`` (see conftest.py).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.targets import ENV_VAR

rng = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_no_instruction_swallows_keywords():
    for name in nisa.__all__ if hasattr(nisa, "__all__") else dir(nisa):
        fn = getattr(nisa, name)
        if not inspect.isfunction(fn):
            continue
        kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, f"nisa.{name} takes **kwargs"


# -- nc_matmul ------------------------------------------------------------------------------


@nki.jit
def matmul_hinted(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b), is_stationary_onezero=True, is_moving_onezero=True)
    nl.store(out, value=acc)
    return out


def test_onezero_hints_change_nothing_for_16_bit_operands():
    a = (rng.random((128, 64)) < 0.5).astype(np.float32).astype(nl.bfloat16)
    b = f32(128, 256).astype(nl.bfloat16)
    want = a.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(matmul_hinted(a, b), want, rtol=1e-5, atol=1e-4)


@nki.jit
def matmul_hinted_fp32(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b), is_moving_onezero=True)
    nl.store(out, value=acc)
    return out


def test_onezero_hint_on_fp32_is_accepted_and_changes_nothing():
    a, b = f32(128, 64), (rng.random((128, 256)) < 0.5).astype(np.float32)
    np.testing.assert_allclose(matmul_hinted_fp32(a, b), a.T @ b, rtol=1e-5, atol=1e-4)
    assert nki.profile_kernel(matmul_hinted_fp32, a, b, target="trn2").total_us > 0


@nki.jit
def matmul_transpose_mode(a, ident):
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(ident), is_transpose=True)
    nl.store(out, value=acc)
    return out


@nki.jit
def matmul_pe_tiles(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b), tile_position=(0, 0), tile_size=(64, 64))  # BAD
    nl.store(out, value=acc)
    return out


def test_transpose_mode_transposes_the_stationary_operand():
    a = f32(64, 48)
    np.testing.assert_array_equal(matmul_transpose_mode(a, np.eye(64, dtype=np.float32)), a.T)
    assert nki.profile_kernel(matmul_transpose_mode, a, np.eye(64, dtype=np.float32)).total_us > 0


def test_pe_tiling_is_unsupported(rejects):
    a = f32(64, 64)
    err = rejects(matmul_pe_tiles, "err_unsupported_api", a, f32(64, 128))
    assert "tile_position" in str(err)


@nki.jit
def matmul_double_row(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    mode = nisa.matmul_perf_mode.double_row
    nl.store(out, value=nisa.nc_matmul(nl.load(a), nl.load(b), perf_mode=mode))  # BAD
    return out


def test_double_row_perf_mode_needs_nc_v3(rejects, monkeypatch):
    a = f32(128, 64).astype(nl.float8_e4m3)
    b = f32(128, 128).astype(nl.float8_e4m3)
    want = a.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(matmul_double_row(a, b), want, rtol=1e-5, atol=1e-4)  # trn2
    monkeypatch.setenv(ENV_VAR, "trn1")
    err = rejects(matmul_double_row, "err_invalid_argument", a, b)
    assert "NeuronCore-v3 or newer" in str(err)


@nki.jit
def matmul_3d(a, b):
    out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b))  # BAD
    nl.store(out, value=acc)
    return out


def test_matmul_operands_are_2d(rejects):
    err = rejects(matmul_3d, "err_exceed_max_supported_dimension", f32(64, 8, 8), f32(64, 128))
    assert "[64, 8, 8]" in str(err) and "at most 2" in str(err)


# -- nc_transpose(mask=) ------------------------------------------------------------------


@nki.jit
def masked_transpose(x, engine):
    p, f = x.shape
    out = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.arange(p)[:, None], nl.arange(f)[None, :]
    t = nl.load(x)
    if engine == "vector":  # VectorE transposes 32x32 blocks, in SBUF or PSUM
        t = nl.copy(t)
    keep = nisa.nc_transpose(
        t[ip, jf], mask=(ip < p - 3) & (jf >= 2), engine=getattr(nisa.engine, engine)
    )
    full = nl.zeros((f, p), dtype=x.dtype)  # masked-off elements keep this
    full[...] = nl.copy(keep)
    nl.store(out, value=full)
    return out


@pytest.mark.parametrize("engine,shape", [("tensor", (96, 40)), ("vector", (32, 32))])
def test_nc_transpose_mask_is_over_the_input_axes(engine, shape):
    """mask=(i_p < p-3) & (i_f >= 2) keeps input rows < p-3 and columns >= 2: the transposed
    output is written in columns < p-3 and rows >= 2, and nowhere else."""
    x = f32(*shape)
    p, f = shape
    got = masked_transpose(x, engine)
    written = np.zeros((f, p), bool)
    written[2:, : p - 3] = True
    np.testing.assert_array_equal(got[written], x.T[written])
    assert np.isnan(got[~written]).all()  # not written: fresh (NaN-poisoned) memory


# -- activation(reduce_cmd=) and its reduce arguments ---------------------------------------


@nki.jit
def activation_sums(x, cmd):
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    nisa.activation(op=nl.exp, data=nl.load(x), reduce_op=np.add, reduce_res=s, reduce_cmd=cmd)
    nl.store(out, value=s)
    return out


@pytest.mark.parametrize("cmd", [nisa.reduce_cmd.idle, nisa.reduce_cmd.reset_reduce])
def test_activation_reduces_its_own_result(cmd):
    x = f32(128, 64)
    np.testing.assert_allclose(activation_sums(x, cmd)[:, 0], np.exp(x).sum(1), rtol=1e-5)


@nki.jit
def activation_accumulates(x, y):
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    cmd = nisa.reduce_cmd
    nisa.activation(op=nl.exp, data=nl.load(x), reduce_op=np.add, reduce_cmd=cmd.reset_reduce)
    nisa.activation(
        op=nl.exp, data=nl.load(y), reduce_op=np.add, reduce_res=s, reduce_cmd=cmd.reduce
    )
    nl.store(out, value=s)
    return out


@nki.jit
def activation_res_without_op(x):
    s = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    nisa.activation(op=nl.exp, data=nl.load(x), reduce_res=s)  # BAD
    return None


def test_activation_accumulates_across_instructions(rejects):
    # the ScalarE accumulators carry the first sum into the second instruction
    x, y = f32(128, 64), f32(128, 32)
    want = np.exp(x).sum(1) + np.exp(y).sum(1)
    np.testing.assert_allclose(activation_accumulates(x, y)[:, 0], want, rtol=1e-5)
    err = rejects(activation_res_without_op, "err_invalid_argument", f32(128, 64))
    assert "reduce_res needs reduce_op" in str(err)


# -- tensor_tensor_scan(reverse0=, reverse1=) ----------------------------------------------


@nki.jit
def scan(a, b, op0, op1, reverse0, reverse1):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    r = nisa.tensor_tensor_scan(nl.load(a), nl.load(b), 0.5, op0, op1, reverse0, reverse1)
    nl.store(out, value=r)
    return out


def test_scan_reverse_of_commutative_operators_is_exact():
    a, b = f32(16, 32), f32(16, 32)
    plain = scan(a, b, np.multiply, np.add, False, False)
    np.testing.assert_array_equal(scan(a, b, np.multiply, np.add, True, True), plain)
    r, want = np.full((16,), 0.5, np.float32), np.empty_like(a)
    for i in range(32):
        r = (a[:, i] * r + b[:, i]).astype(np.float32)
        want[:, i] = r
    np.testing.assert_allclose(plain, want, rtol=1e-5)


@nki.jit
def scan_reversed_subtract(a, b):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    a_, b_ = nl.load(a), nl.load(b)
    r = nisa.tensor_tensor_scan(a_, b_, 0.0, np.subtract, np.add, reverse0=True)  # BAD
    nl.store(out, value=r)
    return out


def test_scan_reverse_of_other_operators_is_unsupported(rejects):
    err = rejects(scan_reversed_subtract, "err_unsupported_api", f32(16, 32), f32(16, 32))
    assert "reverse0=True" in str(err) and "subtract" in str(err)


# -- tensor_partition_reduce: the primitive record's operators -------------------------------


@nki.jit
def partition_reduce(a, op):
    out = nl.ndarray((1, a.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.tensor_partition_reduce(op, nl.load(a)))  # BAD
    return out


def test_partition_reduce_takes_the_records_operators(rejects):
    # add, max, bitwise_or, bitwise_and, average [nki.md: "add, max, or, and"; nki-0x.md §4.9];
    # subtract and the like were accepted (subtract summed)
    a = f32(16, 8)
    np.testing.assert_allclose(partition_reduce(a, "average"), a.mean(0, keepdims=True), 1e-6)
    np.testing.assert_array_equal(partition_reduce(a, np.maximum), a.max(0, keepdims=True))
    for op in (np.subtract, np.minimum, np.multiply):
        err = rejects(partition_reduce, "err_invalid_argument", a, op)
        assert "not a supported reduce operator" in str(err)


# -- tensor_scalar: operand1 and reverse1 need op1 -------------------------------------------


@nki.jit
def scalar_operand1_without_op1(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    r = nisa.tensor_scalar(nl.load(a), np.multiply, 2.0, operand1=3.0)  # BAD
    nl.store(out, value=r)
    return out


def test_tensor_scalar_operand1_needs_op1(rejects):
    err = rejects(scalar_operand1_without_op1, "err_invalid_argument", f32(8, 8))
    assert "operand1 and reverse1 need op1" in str(err)


# -- range_select / select_reduce ---------------------------------------------------------


@nki.jit
def range_select_reduce_cmd(x, y):
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    rs = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    kw = dict(comp_op0=np.greater_equal, comp_op1=np.less, bound0=1.0, bound1=5.0)
    cmd = nisa.reduce_cmd
    nisa.range_select(on_true_tile=nl.load(x), **kw, reduce_cmd=cmd.reset_reduce)
    nisa.range_select(on_true_tile=nl.load(y), **kw, reduce_res=rs, reduce_cmd=cmd.reduce)
    nl.store(out, value=rs)
    return out


@nki.jit
def range_select_on_false(x):
    kw = dict(comp_op0=np.greater_equal, comp_op1=np.less, bound0=1.0, bound1=5.0)
    nisa.range_select(on_true_tile=nl.load(x), **kw, on_false_value=0.0)  # BAD
    return None


@nki.jit
def range_select_sum(x):
    rs = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    kw = dict(comp_op0=np.greater_equal, comp_op1=np.less, bound0=1.0, bound1=5.0)
    nisa.range_select(on_true_tile=nl.load(x), **kw, reduce_res=rs, reduce_op=np.add)  # BAD
    return None


def test_range_select_rejects_what_the_hardware_cannot_do(rejects):
    x = f32(8, 16)
    err = rejects(range_select_on_false, "err_invalid_argument", x)
    assert "nl.fp32.min" in str(err)
    err = rejects(range_select_sum, "err_invalid_argument", x)
    assert "np.max" in str(err)


@nki.jit
def select_into_dst(pred, x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    peak = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=nl.float32)
    mx = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    r = nisa.select_reduce(
        dst=dst,
        predicate=nl.load(pred),
        on_true=nl.load(x),
        on_false=-1.0,
        reduce_res=mx,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
        reverse_pred=True,
    )
    assert r is dst
    nl.store(out, value=dst)
    nl.store(peak, value=mx)
    return out, peak


def test_select_reduce_writes_dst():
    pred = (rng.random((16, 24)) < 0.5).astype(np.uint8)
    x = f32(16, 24)
    out, peak = select_into_dst(pred, x)
    want = np.where(pred == 0, x, np.float32(-1.0))
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(peak[:, 0], want.max(1))


@nki.jit
def select_reduce_accumulating(pred, x):
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    mx = nl.ndarray((x.shape[0], 1), dtype=nl.float32)
    p, t, cmd = nl.load(pred), nl.load(x), nisa.reduce_cmd
    nisa.select_reduce(predicate=p, on_true=t, on_false=0.0, reduce_cmd=cmd.reset_reduce)
    nisa.select_reduce(
        predicate=p,
        on_true=t,
        on_false=-1.0,
        reverse_pred=True,
        reduce_res=mx,
        reduce_cmd=cmd.reduce,
    )
    nl.store(out, value=mx)
    return out


def test_select_reduce_accumulates_across_instructions():
    pred, x = (rng.random((8, 8)) < 0.5).astype(np.uint8), f32(8, 8)
    first = np.where(pred != 0, x, np.float32(0.0)).max(1)
    second = np.where(pred == 0, x, np.float32(-1.0)).max(1)
    got = select_reduce_accumulating(pred, x)[:, 0]
    np.testing.assert_array_equal(got, np.maximum(first, second))


def test_range_select_accumulates_across_instructions():
    x, y = f32(8, 16), f32(8, 16)
    idx = np.arange(16)
    keep = (idx >= 1) & (idx < 5)
    want = np.maximum(x[:, keep].max(1), y[:, keep].max(1))
    np.testing.assert_array_equal(range_select_reduce_cmd(x, y)[:, 0], want)


# -- dma_copy(oob_mode=, dge_mode=) ---------------------------------------------------------


@nki.jit
def dma_direct(x, mode):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype)
    nisa.dma_copy(dst=t, src=x, oob_mode=mode)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_oob_mode_on_a_direct_dma_changes_nothing():
    x = f32(32, 16)
    for mode in (nisa.oob_mode.error, nisa.oob_mode.skip):
        np.testing.assert_array_equal(dma_direct(x, mode), x)


@nki.jit
def gather_skipping(data, idx):
    out = nl.ndarray((idx.shape[0], data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    it = nl.load(idx)
    rows = nl.ndarray((idx.shape[0], data.shape[1]), dtype=data.dtype)
    src = data[it, nl.arange(data.shape[1])[None, :]]
    nisa.dma_copy(dst=rows, src=src, oob_mode=nisa.oob_mode.skip)  # BAD
    nl.store(out, value=rows)
    return out


@nki.jit
def add_skipping(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=nl.load(x), dst_rmw_op=np.add, oob_mode=nisa.oob_mode.skip)  # BAD
    return out


def test_oob_skip_on_an_indirect_dma_is_unsupported(rejects):
    idx = np.array([[3], [0], [1], [2]], np.int32)
    err = rejects(gather_skipping, "err_unsupported_api", f32(8, 16), idx)
    assert "oob_mode=oob_mode.skip" in str(err)
    err = rejects(add_skipping, "err_invalid_argument", f32(8, 16))
    assert "dst_rmw_op allows only oob_mode=oob_mode.error" in str(err)


@nki.jit
def dma_hwdge(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype)
    nisa.dma_copy(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)  # BAD
    nl.store(out, value=t)
    return out


def test_dge_mode_is_checked_then_unsupported(rejects, monkeypatch):
    x = f32(32, 16)
    err = rejects(dma_hwdge, "err_unsupported_api", x)  # trn2: legal, but not modeled
    assert "dge_mode=dge_mode.hwdge" in str(err)
    monkeypatch.setenv(ENV_VAR, "trn1")
    err = rejects(dma_hwdge, "err_invalid_argument", x)
    assert "NeuronCore-v3 or newer" in str(err) and "trn1" in str(err)


# -- nc_find_index8(dtype=), nc_stream_shuffle(dtype=) ---------------------------------------


@nki.jit
def find_index(x, dtype):
    out = nl.ndarray((x.shape[0], 8), dtype=dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, value=nisa.nc_find_index8(data=t, vals=nisa.max8(src=t), dtype=dtype))
    return out


@nki.jit
def find_index_float(x):
    t = nl.load(x)
    nisa.nc_find_index8(data=t, vals=nisa.max8(src=t), dtype=nl.float32)  # BAD
    return None


def test_find_index8_dtype(rejects):
    x = rng.permutation(16 * 32).reshape(16, 32).astype(np.float32)
    want = np.argsort(-x, axis=1)[:, :8]
    for dtype in (np.uint16, np.uint32):
        got = find_index(x, dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
    rejects(find_index_float, "err_unsupported_dtype", x)


@nki.jit
def shuffle_cast(x):
    dst = nl.zeros(x.shape, dtype=nl.float32)
    nisa.nc_stream_shuffle(nl.load(x), dst, list(range(32)), dtype=nl.bfloat16)  # BAD
    return None


def test_stream_shuffle_dtype_must_be_dsts(rejects):
    err = rejects(shuffle_cast, "err_invalid_argument", f32(32, 8))
    assert "dst's float32" in str(err)


# -- unknown keywords ------------------------------------------------------------------------


@nki.jit
def matmul_misspelled(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b), is_tranpose=False)  # BAD
    nl.store(out, value=acc)
    return out


@nki.jit
def activation_misspelled(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.activation(op=nl.exp, data=nl.load(x), sacle=2.0))  # BAD
    return out


def test_unknown_keywords_are_type_errors_at_the_kernel_line(type_error_at_bad_line):
    e = type_error_at_bad_line(matmul_misspelled, f32(64, 64), f32(64, 64))
    assert "unexpected keyword argument 'is_tranpose'" in str(e)
    e = type_error_at_bad_line(activation_misspelled, f32(8, 8))
    assert "unexpected keyword argument 'sacle'" in str(e)
