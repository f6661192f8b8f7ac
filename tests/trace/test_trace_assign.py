"""``dst[...] = op(...)``: the op writes ``dst`` directly when its engine can write there
(VectorE / ScalarE into PSUM included), otherwise a copy follows."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import NkiError


def _prims(kernel) -> list[str]:
    return [getattr(s, "prim", "") for s in kernel.body]


@nki.jit
def product_into_psum(a, b, engine):
    """a * b (tensor_tensor) on the VectorE or GpSimd, a * b[:, :1] (tensor_scalar) on the ScalarE."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
    x, y = nl.load(a), nl.load(b)
    if engine == nisa.engine.scalar:
        acc[...] = nisa.tensor_scalar(x, nl.multiply, y[:, 0:1], engine=engine)
    else:
        acc[...] = nisa.tensor_tensor(x, y, nl.multiply, engine=engine)
    nl.store(out, value=acc)
    return out


def _compute(kernel):
    (op,) = [s for s in kernel.body if getattr(s, "prim", "") in ("tensor_tensor", "tensor_scalar")]
    return op


def test_vector_and_scalar_results_land_in_psum_without_a_copy():
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    b = np.full((128, 64), 0.5, np.float32)
    for engine in (nisa.engine.vector, nisa.engine.scalar):
        kernel = product_into_psum.ir(a, b, engine)
        # the one copy is the store's (a PSUM value goes through SBUF to HBM)
        assert _prims(kernel).count("tensor_copy") == 1
        assert _compute(kernel).outs[0].tensor.buffer == "psum"
        np.testing.assert_array_equal(product_into_psum(a, b, engine), a * b)


def test_gpsimd_cannot_write_psum_so_a_copy_follows():
    a = np.ones((128, 64), np.float32)
    kernel = product_into_psum.ir(a, a, nisa.engine.gpsimd)
    assert _compute(kernel).outs[0].tensor.buffer == "sbuf"
    assert _prims(kernel).count("tensor_copy") == 2  # into PSUM, then the store's
    np.testing.assert_array_equal(product_into_psum(a, a, nisa.engine.gpsimd), a)


@nki.jit
def tensor_tensor_on(a, engine):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    nl.store(out, value=nisa.tensor_tensor(x, x, nl.add, engine=engine))
    return out


def test_an_instruction_on_an_engine_it_does_not_run_on_is_named_at_the_users_line():
    a = np.ones((128, 8), np.float32)
    with pytest.raises(NkiError) as info:
        tensor_tensor_on(a, nisa.engine.scalar)
    err = info.value
    assert err.name == "err_invalid_argument"
    assert "engine=scalar" in str(err) and "vector, gpsimd" in str(err)
    assert err.loc.file.endswith("test_trace_assign.py")
    np.testing.assert_array_equal(tensor_tensor_on(a, nisa.engine.gpsimd), 2 * a)
