"""NKI 0.x instructions against the current ``nki.isa`` API pages (aws-neuron-sdk@81ce03ae):
documented behaviour a kernel can observe, and documented rules that are named errors at the
kernel's own line.

- The ALU's arithmetic unary operators ``nl.square`` and ``nl.relu`` (beside ``nl.abs``,
  ``nl.rsqrt``, ``nl.reciprocal``) are operators of ``tensor_scalar``.
- A unary ``op0`` of ``tensor_scalar`` / ``tensor_scalar_reduce`` takes ``operand0`` None or 0
  (not reversed: reversed, the operator reads the operand, which stays free).
- ``tensor_tensor`` and ``tensor_reduce`` with a bitvec operator take integer tiles only, and
  ``tensor_reduce`` negates only an arithmetic reduction.
"""

import numpy as np
import pytest
from nki0x_helpers import load as _load
from nki0x_helpers import store as _out

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

P, F = 32, 12


def _rejects(kernel, words: str, *args) -> None:
    with pytest.raises(NkiError) as e:
        kernel(*args)
    assert e.value.name == "err_invalid_argument", e.value
    assert words in str(e.value), e.value
    assert "test_isa_docs_conformance.py" in str(e.value)  # the kernel's own line


def _ramp() -> np.ndarray:
    return (np.arange(P * F, dtype=np.float32).reshape(P, F) - 150.0) / 7.0


# -- arithmetic unary ALU operators ----------------------------------------------------------


@nki.jit
def _square_then_relu(x):
    t = _load(x)
    sq = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=sq, data=t, op0=nl.square, operand0=0.0)
    rl = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    # relu after subtracting 5: the unary operator can be the second stage too
    nisa.tensor_scalar(dst=rl, data=t, op0=nl.subtract, operand0=5.0, op1=nl.relu, operand1=0.0)
    return _out(sq), _out(rl)


def test_square_and_relu_are_alu_operators():
    x = _ramp()
    sq, rl = _square_then_relu(x)
    np.testing.assert_array_equal(sq, x * x)
    np.testing.assert_array_equal(rl, np.maximum(x - 5.0, 0.0))


# -- operand0 of a unary op0 ------------------------------------------------------------------


@nki.jit
def _abs_without_operand(x):
    t = _load(x)
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=t, op0=nl.abs, operand0=None, op1=nl.add, operand1=1.0)
    b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    rowmax = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(
        dst=b, data=t, op0=nl.abs, operand0=None, reduce_op=nl.maximum, reduce_res=rowmax
    )
    return _out(a), _out(rowmax)


def test_unary_op0_takes_no_operand():
    x = _ramp()
    a, rowmax = _abs_without_operand(x)
    np.testing.assert_array_equal(a, np.abs(x) + 1.0)
    np.testing.assert_array_equal(rowmax[:, 0], np.abs(x).max(axis=1))


@nki.jit
def _abs_with_operand(x):
    t = _load(x)
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=t, op0=nl.abs, operand0=2.5)
    return _out(a)


@nki.jit
def _reciprocal_with_vector(x):
    t = _load(x)
    v = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=v, value=0.0)
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(
        dst=a, data=t, op0=nl.reciprocal, operand0=v, reduce_op=nl.add, reduce_res=r
    )
    return _out(a)


def test_unary_op0_rejects_an_operand():
    _rejects(_abs_with_operand, "operand0 must be None or 0, got 2.5", _ramp())
    _rejects(_reciprocal_with_vector, "operand0 must be None or 0", _ramp())


# -- bitvec operators on integer tiles --------------------------------------------------------


@nki.jit
def _xor_of_ints(x, y):
    a, b = _load(x), _load(y)
    c = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.bitwise_xor)
    r = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.bitwise_or, data=a, axis=1)
    return _out(c), _out(r)


def test_bitvec_operators_on_integers():
    x = np.arange(P * F, dtype=np.int32).reshape(P, F) * 37
    y = np.full((P, F), 0x55, np.int32)
    c, r = _xor_of_ints(x, y)
    np.testing.assert_array_equal(c, x ^ y)
    np.testing.assert_array_equal(r[:, 0], np.bitwise_or.reduce(x, axis=1))


@nki.jit
def _and_of_floats(x):
    a = _load(x)
    c = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=a, data2=a, op=nl.bitwise_and)
    return _out(c)


@nki.jit
def _or_reduce_of_floats(x):
    a = _load(x)
    r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.bitwise_or, data=a, axis=1)
    return _out(r)


@nki.jit
def _negated_or_reduce(x):
    a = _load(x)
    r = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.bitwise_or, data=a, axis=1, negate=True)
    return _out(r)


def test_bitvec_operators_refuse_floats_and_negate():
    with pytest.raises(NkiError) as e:
        _and_of_floats(_ramp())
    assert e.value.name == "err_unsupported_dtype" and "data1 of a bitvec" in str(e.value)
    assert "test_isa_docs_conformance.py" in str(e.value)
    with pytest.raises(NkiError) as e:
        _or_reduce_of_floats(_ramp())
    assert e.value.name == "err_unsupported_dtype" and "data of a bitvec" in str(e.value)
    _rejects(
        _negated_or_reduce, "negate=True needs an arithmetic operator", np.ones((P, F), np.int32)
    )


# -- repeated values in max8 / nc_find_index8 / nc_match_replace8 -----------------------------


@nki.jit
def _find_and_replace(x, v):
    data, vals = _load(x), _load(v)
    found = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=found, data=data, vals=vals)
    replaced = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    where = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=replaced, data=data, vals=vals, imm=0.0, dst_idx=where)
    return _out(found), _out(replaced), _out(where)


def test_repeated_values_pair_with_successive_occurrences():
    # 5.0 three times in vals and four times in data; 7.0 once; 2.0 twice but once in data
    row = np.array([5, 1, 7, 5, 2, 5, 9, 5, 3, 4], np.float32)
    vals = np.array([5, 7, 5, 2, 5, 2, 6, 1], np.float32)
    found, replaced, where = _find_and_replace(np.tile(row, (P, 1)), np.tile(vals, (P, 1)))
    none = np.iinfo(np.uint32).max
    # find_index8: a repeated value takes the next occurrence, ascending over the columns
    np.testing.assert_array_equal(found[3], [0, 2, 3, 4, 5, none, none, 1])
    # match_replace8 matches the last column first: the first 5 goes to the highest 5-column
    np.testing.assert_array_equal(where[3][[0, 2, 4]], [5, 3, 0])
    np.testing.assert_array_equal(where[3][[1, 7]], [2, 1])
    np.testing.assert_array_equal(replaced[3], [0, 0, 0, 0, 0, 0, 9, 5, 3, 4])


@nki.jit
def _max8_too_wide(x):
    t = nl.ndarray((P, 16400), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    top = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    return _out(top)


@nki.jit
def _find_index8_too_wide(x):
    t = nl.ndarray((P, 16400), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    v = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=v, value=0.0)
    at = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=at, data=t, vals=v)
    return _out(at)


def test_max8_and_find_index8_read_at_most_16384_elements():
    _rejects(_max8_too_wide, "16400 elements per partition, 8 to 16384 allowed", _ramp())
    _rejects(_find_index8_too_wide, "data 8 to 16384 (got 16400)", _ramp())
