"""The tolerance table: its contract, and that it is neither tighter than one rounding to the
dtype nor looser than the dtype's precision warrants."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given

from nkikit import dtypes
from nkikit.testing import (
    DTYPE_TOLERANCES,
    OP_KINDS,
    Tolerance,
    loosest_tolerance,
    round_to,
    tolerance,
)
from nkikit.testing import strategies as nst

FLOATS = [
    "float32",
    "tfloat32",
    "bfloat16",
    "float16",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e5m2",
]


def test_every_nki_float_has_a_tolerance():
    assert set(FLOATS) == set(DTYPE_TOLERANCES)


@pytest.mark.parametrize("name", ["int8", "int16", "int32", "uint8", "uint16", "uint32", "bool"])
@pytest.mark.parametrize("kind", sorted(OP_KINDS))
def test_integers_are_exact(name, kind):
    assert tolerance(name, kind) == Tolerance(0.0, 0.0)


def test_dtype_spellings_agree():
    assert tolerance(np.float32) == tolerance("float32") == tolerance(dtypes.float32)
    assert tolerance(dtypes.bfloat16, "matmul") == tolerance("bfloat16", "matmul")


def test_precision_order():
    order = ["float32", "float16", "bfloat16", "float8_e4m3", "float8_e5m2"]
    rtols = [tolerance(n).rtol for n in order]
    assert rtols == sorted(rtols)
    assert tolerance("tfloat32").rtol > tolerance("float32").rtol


@pytest.mark.parametrize("name", FLOATS)
def test_op_kinds_only_loosen(name):
    base = tolerance(name, "elementwise")
    for kind in OP_KINDS:
        t = tolerance(name, kind)
        assert t.rtol >= base.rtol and t.atol >= base.atol


def test_torch_defaults_where_torch_has_them():
    assert tolerance("float32") == Tolerance(1.3e-6, 1e-5)
    assert tolerance("bfloat16") == Tolerance(1.6e-2, 1e-5)


def test_loosest_wins():
    assert loosest_tolerance(["float32", "bfloat16"]) == tolerance("bfloat16")
    assert loosest_tolerance([], "matmul") == Tolerance(0.0, 0.0)


def test_errors():
    with pytest.raises(ValueError, match="op_kind"):
        tolerance("float32", "convolution")
    with pytest.raises(TypeError, match="float64"):
        tolerance(np.float64)


def _finfo(dt):
    return ml_dtypes.finfo(np.float32 if dtypes.is_tf32(dt) else dt)


@given(dtype=nst.float_dtypes(fp16=True, fp8=True, tf32=True), seed=nst.seeds())
def test_two_roundings_fit_the_elementwise_tolerance(dtype, seed):
    # a kernel that rounds an input and its output to `dtype` must pass
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(4096) * 4.0
    y = rng.standard_normal(4096)
    twice = round_to(round_to(x, dtype).astype(np.float64) * y, dtype).astype(np.float64)
    exact = x * y
    # fp8 saturates: compare inside the representable range only
    keep = (np.abs(x) < float(_finfo(dtype).max)) & (np.abs(exact) < float(_finfo(dtype).max))
    t = tolerance(dtype)
    np.testing.assert_allclose(twice[keep], exact[keep], rtol=t.rtol, atol=t.atol)


MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "tfloat32": 10, "float8_e4m3": 3, "float8_e5m2": 2}


@pytest.mark.parametrize("name", sorted(MANTISSA_BITS))
def test_tolerance_is_about_two_ulps(name):
    # about two ulps (ulp = 2**-mantissa_bits at 1.0), no looser: a kernel off by more must fail
    assert tolerance(name).rtol <= 2.1 * 2.0 ** -MANTISSA_BITS[name]
