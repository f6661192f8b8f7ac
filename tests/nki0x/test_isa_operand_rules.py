"""Documented per-instruction operand rules of the NKI 0.x ISA (the instruction pages of
``nki.isa``; nki-0x.md §4): a legal call runs, a violation is a named error at the
kernel's own line.

- tensor_copy_predicated: predicate uint8/uint16/uint32; src and dst share a dtype; src
  and predicate not both in PSUM.
- select_reduce: predicate int8/uint8/int16/uint16; on_true not tfloat32/int32/uint32.
- local_gather: index uint16; src_buffer partitions a multiple of 16; num_elem_per_idx in
  {1, 2, 4, 8, 16, 32}.
- nc_n_gather: uint32 indices.
- tensor_tensor_scan: arithmetic operators; data0 and data1 not both in PSUM.
- scalar_tensor_tensor: arithmetic operators (no bitvec).
- tensor_partition_reduce: op add, max, bitwise_or or bitwise_and.
- activation: reduce_op nl.add.
- dropout: dst has data's dtype.
- dma_compute: at most 16 sources.
"""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

P, F = 16, 8


def _sb(dt=nl.float32, shape=(P, F)):
    return nl.ndarray(shape, dtype=dt, buffer=nl.sbuf)


def _ps(dt=nl.float32, shape=(P, F)):
    return nl.ndarray(shape, dtype=dt, buffer=nl.psum)


def _fill(t, v):
    nisa.memset(dst=t, value=int(v) if "int" in str(t.dtype) else float(v))
    return t


def _out(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _rejects(kernel, name, words):
    with pytest.raises(NkiError) as e:
        kernel(np.zeros((1, 1), np.float32))
    assert e.value.name == name, e.value
    assert words in str(e.value), e.value
    assert "test_isa_operand_rules.py" in str(e.value)  # the kernel's own line


# -- tensor_copy_predicated -------------------------------------------------------------------


@nki.jit
def copy_predicated(x, src_dt=nl.float32, pred_dt=nl.uint8, src_mem="sbuf", pred_mem="sbuf"):
    s = _fill(_ps(src_dt) if src_mem == "psum" else _sb(src_dt), 2.0)
    p = _fill(_ps(pred_dt) if pred_mem == "psum" else _sb(pred_dt), 1)
    d = _fill(_sb(), 0.0)
    nisa.tensor_copy_predicated(dst=d, src=s, predicate=p)
    return _out(d)


@pytest.mark.parametrize("pred", [nl.uint8, nl.uint16, nl.uint32])
def test_a_predicated_copy_takes_an_unsigned_predicate(pred):
    np.testing.assert_array_equal(copy_predicated(np.zeros((1, 1), np.float32), pred_dt=pred), 2.0)


def test_a_predicated_copy_rejects_a_float_predicate():
    kernel = lambda x: copy_predicated(x, pred_dt=nl.float32)  # noqa: E731
    _rejects(kernel, "err_unsupported_dtype", "predicate must be")


def test_a_predicated_copy_keeps_the_dtype():
    kernel = lambda x: copy_predicated(x, src_dt=nl.bfloat16)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "src and dst must share a dtype")


def test_a_predicated_copy_reads_at_most_one_psum_input():
    ok = copy_predicated(np.zeros((1, 1), np.float32), src_mem="psum")
    np.testing.assert_array_equal(ok, 2.0)
    kernel = lambda x: copy_predicated(x, src_mem="psum", pred_mem="psum")  # noqa: E731
    _rejects(kernel, "err_unsupported_memory", "src and predicate")


def test_nl_where_keeps_taking_any_condition():
    @nki.jit
    def k(x):
        c = _fill(_sb(nl.float32), 1.0)
        return _out(nl.where(c, _fill(_sb(nl.bfloat16), 3.0), 0.0, dtype=nl.float32))

    np.testing.assert_array_equal(k(np.zeros((1, 1), np.float32)), 3.0)


# -- select_reduce ---------------------------------------------------------------------------


@nki.jit
def select(x, pred_dt=nl.uint8, true_dt=nl.float32):
    p = _fill(_sb(pred_dt), 1)
    t = _fill(_sb(true_dt), 5)
    d = _sb(true_dt)
    nisa.select_reduce(dst=d, predicate=p, on_true=t, on_false=0.0)
    return _out(d)


def test_select_reduce_predicate_and_on_true_dtypes():
    np.testing.assert_array_equal(select(np.zeros((1, 1), np.float32), pred_dt=nl.int16), 5.0)
    _rejects(lambda x: select(x, pred_dt=nl.float32), "err_unsupported_dtype", "predicate")
    _rejects(lambda x: select(x, pred_dt=nl.uint32), "err_unsupported_dtype", "predicate")
    _rejects(lambda x: select(x, true_dt=nl.int32), "err_unsupported_dtype", "on_true")


# -- local_gather / nc_n_gather ----------------------------------------------------------------


@nki.jit
def local_gather(x, p=16, idx_dt=nl.uint16, per=1):
    src = _fill(_sb(nl.float32, (p, 64)), 7.0)
    ix = _fill(_sb(idx_dt, (p, 2)), 0)
    d = _sb(nl.float32, (p, 32 * per))
    nisa.local_gather(dst=d, src_buffer=src, index=ix, num_elem_per_idx=per)
    return _out(d)


def test_local_gather_rules():
    np.testing.assert_array_equal(local_gather(np.zeros((1, 1), np.float32), per=2), 7.0)
    kernel = lambda x: local_gather(x, idx_dt=nl.uint32)  # noqa: E731
    _rejects(kernel, "err_unsupported_dtype", "index must be uint16")
    _rejects(lambda x: local_gather(x, p=8), "err_invalid_argument", "multiple of 16")
    _rejects(lambda x: local_gather(x, per=3), "err_invalid_argument", "num_elem_per_idx")


@nki.jit
def n_gather(x, idx_dt=nl.uint32):
    data = _fill(_sb(nl.float32, (P, 32)), 4.0)
    ix = _fill(_sb(idx_dt, (P, 4)), 1)
    d = _sb(nl.float32, (P, 4))
    nisa.nc_n_gather(dst=d, data=data, indices=ix)
    return _out(d)


def test_nc_n_gather_takes_uint32_indices():
    np.testing.assert_array_equal(n_gather(np.zeros((1, 1), np.float32)), 4.0)
    _rejects(lambda x: n_gather(x, idx_dt=nl.int32), "err_unsupported_dtype", "uint32")


# -- arithmetic-only operators -----------------------------------------------------------------


@nki.jit
def scan(x, op0=nl.multiply, mem0="sbuf", mem1="sbuf", dt=nl.float32):
    a = _fill(_ps(dt) if mem0 == "psum" else _sb(dt), 1)
    b = _fill(_ps(dt) if mem1 == "psum" else _sb(dt), 1)
    d = _sb(dt)
    nisa.tensor_tensor_scan(dst=d, data0=a, data1=b, initial=0.0, op0=op0, op1=nl.add)
    return _out(d)


def test_tensor_tensor_scan_rules():
    want = np.tile(2 * np.arange(1, F + 1, dtype=np.float32), (P, 1))  # r = (1 + r) + 1
    np.testing.assert_array_equal(scan(np.zeros((1, 1), np.float32), op0=nl.add, mem0="psum"), want)
    kernel = lambda x: scan(x, op0=nl.bitwise_and, dt=nl.int32)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "op0 must be an arithmetic operator")
    _rejects(lambda x: scan(x, mem0="psum", mem1="psum"), "err_unsupported_memory", "data0")


@nki.jit
def stt(x, op0=nl.add):
    a = _fill(_sb(nl.int32), 3)
    b = _fill(_sb(nl.int32), 1)
    d = _sb(nl.int32)
    nisa.scalar_tensor_tensor(dst=d, data=a, op0=op0, operand0=1, op1=nl.add, operand1=b)
    return _out(d)


def test_scalar_tensor_tensor_takes_arithmetic_operators():
    np.testing.assert_array_equal(stt(np.zeros((1, 1), np.float32)), 5)
    kernel = lambda x: stt(x, op0=nl.bitwise_and)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "op0 must be an arithmetic operator")


@nki.jit
def partition_reduce(x, op=nl.add):
    a = _fill(_sb(), 2.0)
    d = _sb(nl.float32, (1, F))
    nisa.tensor_partition_reduce(dst=d, op=op, data=a)
    return _out(d)


def test_tensor_partition_reduce_ops():
    np.testing.assert_array_equal(partition_reduce(np.zeros((1, 1), np.float32)), 2.0 * P)
    np.testing.assert_array_equal(
        partition_reduce(np.zeros((1, 1), np.float32), op=nl.maximum), 2.0
    )
    kernel = lambda x: partition_reduce(x, op=nl.subtract)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "op must be nl.add")


# -- activation, dropout, dma_compute ------------------------------------------------------------


@nki.jit
def act(x, reduce_op=nl.add):
    a = _fill(_sb(), 0.0)
    d, r = _sb(), _sb(nl.float32, (P, 1))
    nisa.activation(
        dst=d,
        op=nl.exp,
        data=a,
        reduce_op=reduce_op,
        reduce_res=r,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    return _out(r)


def test_activation_reduces_by_adding():
    np.testing.assert_array_equal(act(np.zeros((1, 1), np.float32)), float(F))
    _rejects(lambda x: act(x, reduce_op=nl.maximum), "err_invalid_argument", "nl.add")


@nki.jit
def drop(x, dt=nl.float32):
    a = _fill(_sb(), 1.0)
    d = _sb(dt)
    nisa.dropout(dst=d, data=a, prob=0.0)
    return _out(d)


def test_dropout_keeps_the_dtype():
    np.testing.assert_array_equal(drop(np.zeros((1, 1), np.float32)), 1.0)
    _rejects(lambda x: drop(x, dt=nl.bfloat16), "err_invalid_argument", "data's dtype")


@nki.jit
def dma_sum(x, n=16):
    a = _fill(_sb(), 1.0)
    d = _sb()
    nisa.dma_compute(dst=d, srcs=[a] * n, reduce_op=nl.add)
    return _out(d)


def test_dma_compute_takes_at_most_16_sources():
    np.testing.assert_array_equal(dma_sum(np.zeros((1, 1), np.float32)), 16.0)
    _rejects(lambda x: dma_sum(x, n=17), "err_invalid_argument", "1 to 16")


# -- tensor_scalar: operator classes and engines -------------------------------------------------


@nki.jit
def tscalar(x, dt=nl.int32, op0=nl.bitwise_and, op1=None, eng=nisa.engine.unknown):
    a = _fill(_sb(dt), 6)
    d = _sb(dt)
    operand1 = None if op1 is None else 1
    nisa.tensor_scalar(d, a, op0, 3, op1=op1, operand1=operand1, engine=eng)
    return _out(d)


def test_tensor_scalar_bitvec_rules():
    np.testing.assert_array_equal(tscalar(np.zeros((1, 1), np.float32)), 2)
    got = tscalar(np.zeros((1, 1), np.float32), op1=nl.left_shift)
    np.testing.assert_array_equal(got, 4)
    kernel = lambda x: tscalar(x, dt=nl.float32)  # noqa: E731
    _rejects(kernel, "err_unsupported_dtype", "integer dtype")
    _rejects(lambda x: tscalar(x, op1=nl.add), "err_invalid_argument", "must both be bitvec")
    kernel = lambda x: tscalar(x, eng=nisa.engine.gpsimd)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "Vector engine")


def test_tensor_scalar_on_the_trn2_scalar_engine(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    kw = {"dt": nl.float32, "eng": nisa.engine.scalar}
    got = tscalar(np.zeros((1, 1), np.float32), op0=nl.multiply, op1=nl.add, **kw)
    np.testing.assert_array_equal(got, 19.0)
    kernel = lambda x: tscalar(x, op0=nl.subtract, **kw)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "Scalar engine of NeuronCore-v2/v3")


# -- range_select: a floating-point on_true_tile, fp32 bounds -------------------------------------


@nki.jit
def rsel(x, dt=nl.float32, bound_dt=nl.float32):
    t = _fill(_sb(dt), 2)
    lo, hi = _fill(_sb(bound_dt, (P, 1)), 0), _fill(_sb(bound_dt, (P, 1)), 4)
    d = _sb(dt)
    nisa.range_select(
        dst=d,
        on_true_tile=t,
        comp_op0=nl.greater_equal,
        comp_op1=nl.less,
        bound0=lo,
        bound1=hi,
    )
    return _out(d)


def test_range_select_dtypes():
    got = np.asarray(rsel(np.zeros((1, 1), np.float32)))
    np.testing.assert_array_equal(got[:, :4], 2.0)
    _rejects(lambda x: rsel(x, dt=nl.int32), "err_unsupported_dtype", "floating-point")
    _rejects(lambda x: rsel(x, bound_dt=nl.int32), "err_unsupported_dtype", "bound0")


# -- tensor_scalar_reduce, local_gather's index budget, select_reduce's reduce_res, affine_select --


@nki.jit
def tsr(x, op0=nl.add, reverse0=False):
    a = _fill(_sb(nl.int32), 1)
    d, r = _sb(nl.int32), _sb(nl.float32, (P, 1))
    nisa.tensor_scalar_reduce(
        dst=d, data=a, op0=op0, operand0=1, reduce_op=nl.add, reduce_res=r, reverse0=reverse0
    )
    return _out(r)


def test_tensor_scalar_reduce_is_arithmetic_without_reverse0():
    np.testing.assert_array_equal(tsr(np.zeros((1, 1), np.float32)), 2.0 * F)
    kernel = lambda x: tsr(x, op0=nl.bitwise_or)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "op0 must be an arithmetic operator")
    kernel = lambda x: tsr(x, op0=nl.subtract, reverse0=True)  # noqa: E731
    _rejects(kernel, "err_invalid_argument", "reverse0=True is documented as not supported")


def test_a_local_gather_core_takes_at_most_4096_indices():
    @nki.jit
    def k(x):
        src = _fill(_sb(nl.float32, (16, 64)), 7.0)
        ix = _fill(_sb(nl.uint16, (16, 300)), 0)
        d = _sb(nl.float32, (16, 4800))
        nisa.local_gather(dst=d, src_buffer=src, index=ix)
        return _out(d)

    _rejects(k, "err_invalid_argument", "at most 4096 indices")


@nki.jit
def select_res(x, res_dt=nl.float32):
    p = _fill(_sb(nl.uint8), 1)
    t = _fill(_sb(), 5.0)
    d, r = _sb(), _sb(res_dt, (P, 1))
    nisa.select_reduce(
        dst=d,
        predicate=p,
        on_true=t,
        on_false=0.0,
        reduce_res=r,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    return _out(r)


def test_select_reduce_reads_out_into_a_float_tile():
    np.testing.assert_array_equal(select_res(np.zeros((1, 1), np.float32)), 5.0)
    kernel = lambda x: select_res(x, res_dt=nl.int32)  # noqa: E731
    _rejects(kernel, "err_unsupported_dtype", "reduce_res must be of a float dtype")


def test_affine_select_on_false_value_is_a_scalar():
    @nki.jit
    def k(x):
        t = _fill(_sb(), 1.0)
        f = _fill(_sb(nl.float32, (P, 1)), 0.0)
        d = _sb()
        nisa.affine_select(d, [[1, F]], 0, t, f)
        return _out(d)

    _rejects(k, "err_invalid_argument", "on_false_value is a float32 scalar")
