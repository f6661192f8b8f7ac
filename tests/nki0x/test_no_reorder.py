"""nl.no_reorder: program order inside the block (results unchanged), dynamically scoped; a
device loop may not start inside it (the block belongs inside the loop body)."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _double_rows(x, out, i):
    t = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x.ap([[x.shape[1], 1], [1, x.shape[1]]], scalar_offset=i))
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out.ap([[x.shape[1], 1], [1, x.shape[1]]], scalar_offset=i), src=t)


def _kernel(where):
    @nki.jit
    def k(x, n):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        bound = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bound, src=n)
        reg = nisa.register_alloc()
        nisa.register_load(reg, bound)
        if where == "inside the body":
            for i in nl.dynamic_range(reg):
                with nl.no_reorder():
                    _double_rows(x, out, i)
        elif where == "around dynamic_range":
            with nl.no_reorder():
                for i in nl.dynamic_range(reg):
                    _double_rows(x, out, i)
        else:  # around a callee that starts a fori_loop: the scope is dynamic
            with nl.no_reorder():
                nl.fori_loop(0, reg, lambda i: _double_rows(x, out, i))
        return out

    return k


def test_no_reorder_inside_a_device_loop_body_keeps_the_results():
    x = np.random.default_rng(0).random((5, 8), dtype=np.float32)
    got = _kernel("inside the body")(x, np.array([[5]], np.int32))
    np.testing.assert_array_equal(got, 2 * x)


@pytest.mark.parametrize(
    "where, api",
    [("around dynamic_range", "nl.dynamic_range"), ("around fori_loop", "nl.fori_loop")],
)
def test_a_device_loop_inside_no_reorder_is_a_named_error_at_its_line(where, api):
    with pytest.raises(NkiError) as e:
        _kernel(where)(np.zeros((5, 8), np.float32), np.array([[5]], np.int32))
    assert e.value.name == "err_invalid_argument" and str(e.value).split(": ")[2] == api
    assert "no_reorder" in str(e.value) and str(e.value).startswith("test_no_reorder.py:")
