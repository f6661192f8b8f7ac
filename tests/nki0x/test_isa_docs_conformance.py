"""NKI 0.x instructions against the current ``nki.isa`` API pages (aws-neuron-sdk@81ce03ae):
documented behaviour a kernel can observe, and documented rules that are named errors at the
kernel's own line.

- The ALU's arithmetic unary operators ``nl.square`` and ``nl.relu`` (beside ``nl.abs``,
  ``nl.rsqrt``, ``nl.reciprocal``) are operators of ``tensor_scalar``.
- A unary ``op0`` of ``tensor_scalar`` / ``tensor_scalar_reduce`` takes ``operand0`` None or 0
  (not reversed: reversed, the operator reads the operand, which stays free).
"""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

P, F = 32, 12


def _load(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _out(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


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
