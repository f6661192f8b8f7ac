"""NKI 0.x instructions against the current ``nki.isa`` API pages (aws-neuron-sdk@81ce03ae):
documented behaviour a kernel can observe, and documented rules that are named errors at the
kernel's own line.

- The ALU's arithmetic unary operators ``nl.square`` and ``nl.relu`` (beside ``nl.abs``,
  ``nl.rsqrt``, ``nl.reciprocal``) are operators of ``tensor_scalar``.
"""

import numpy as np

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

P, F = 32, 12


def _load(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _out(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


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
