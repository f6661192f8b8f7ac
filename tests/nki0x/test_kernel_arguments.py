"""Calling an NKI 0.x kernel: how its arguments reach the traced function."""

import numpy as np

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl


@nki.jit
def add_all(first, /, *rest, scale=1.0, **named):
    acc = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=acc, src=first)
    for x in (*rest, *named.values()):
        t = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=scale)
    out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_positional_only_star_args_and_keyword_arguments_reach_the_kernel():
    x = np.arange(128, dtype=np.float32).reshape(16, 8)
    np.testing.assert_array_equal(add_all(x), x)
    np.testing.assert_array_equal(add_all(x, x, x, scale=2.0), 6 * x)
    np.testing.assert_array_equal(add_all(x, x, bias=x, scale=0.5), 1.5 * x)
    ir = add_all.ir(x, x, bias=x)
    assert [t.name for t in ir.params] == ["first", "rest[0]", "bias"]
