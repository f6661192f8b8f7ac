"""kernel.with_schedule (NKI's scheduling API): edges between instructions named with
``name=`` are checked for form at the caller's line and leave the results unchanged."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


@nki.jit
def two_branches(t):
    x = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=t)
    a = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    b = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
    nisa.activation(dst=a, data=x, op=nl.exp, name="e")
    nisa.tensor_scalar(dst=b, data=x, op0=nl.multiply, operand0=3.0, name="m")
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.subtract, name="sub")
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_with_schedule_keeps_the_edges_and_the_results():
    x = np.random.default_rng(0).random((16, 8), dtype=np.float32)
    ordered = two_branches.with_schedule([("m", "e"), ("sub", ["e", "m"])])
    assert ordered.schedule == (("m", "e"), ("sub", "e"), ("sub", "m"))
    np.testing.assert_allclose(ordered(x), np.exp(x) - 3 * x, rtol=1e-6)
    np.testing.assert_array_equal(ordered[1](x), two_branches(x))


@pytest.mark.parametrize("bad", ["m", [("m",)], [("m", 3)], [("m", [])]])
def test_a_schedule_that_is_not_pairs_of_names_is_a_named_error_at_the_call(bad):
    with pytest.raises(NkiError) as e:
        two_branches.with_schedule(bad)
    assert e.value.name == "err_invalid_argument" and "with_schedule" in str(e.value)
    assert str(e.value).startswith("test_schedule.py:")
