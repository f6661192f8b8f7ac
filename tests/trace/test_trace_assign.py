"""``dst[...] = op(...)``: the op writes ``dst`` directly when its engine can write there
(VectorE / ScalarE into PSUM included), otherwise a copy follows."""

from __future__ import annotations

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl


def _prims(kernel) -> list[str]:
    return [getattr(s, "prim", "") for s in kernel.body]


@nki.jit
def product_into_psum(a, b, engine):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
    acc[...] = nisa.tensor_tensor(nl.load(a), nl.load(b), nl.multiply, engine=engine)
    nl.store(out, value=acc)
    return out


def test_vector_and_scalar_results_land_in_psum_without_a_copy():
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    b = np.full((128, 64), 0.5, np.float32)
    for engine in (nisa.engine.vector, nisa.engine.scalar):
        kernel = product_into_psum.ir(a, b, engine)
        prims = _prims(kernel)
        # the one copy is the store's (a PSUM value goes through SBUF to HBM)
        assert prims.count("tensor_tensor") == 1 and prims.count("tensor_copy") == 1
        (tt,) = [s for s in kernel.body if getattr(s, "prim", "") == "tensor_tensor"]
        assert tt.outs[0].tensor.buffer == "psum"
        np.testing.assert_array_equal(product_into_psum(a, b, engine), a * b)


def test_gpsimd_cannot_write_psum_so_a_copy_follows():
    a = np.ones((128, 64), np.float32)
    kernel = product_into_psum.ir(a, a, nisa.engine.gpsimd)
    (tt,) = [s for s in kernel.body if getattr(s, "prim", "") == "tensor_tensor"]
    assert tt.outs[0].tensor.buffer == "sbuf"
    assert _prims(kernel).count("tensor_copy") == 2  # into PSUM, then the store's
    np.testing.assert_array_equal(product_into_psum(a, a, nisa.engine.gpsimd), a)
