"""check_kernel / assert_close: pass when the kernel matches, fail with a message that says
where and why when it does not."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
from nkikit import dtypes
from nkikit.testing import Tolerance, assert_close, check_kernel, compare, random_inputs


@nki.jit
def scale_rows(x, factor):
    """x * factor, rows tiled by 128 with a masked last tile."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    for t in nl.affine_range(math.ceil(n / 128)):
        valid = t * 128 + i_p < n
        tile = nl.load(x[t * 128 + i_p, i_f], mask=valid)
        nl.store(out[t * 128 + i_p, i_f], value=nl.multiply(tile, factor, mask=valid), mask=valid)
    return out


@nki.jit
def scale_rows_forgets_last_tile(x, factor):
    """Bug: loops over n // 128 tiles, so ragged rows are never written (stay NaN-poisoned)."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    for t in nl.affine_range(n // 128):
        tile = nl.load(x[t * 128 + i_p, i_f])
        nl.store(out[t * 128 + i_p, i_f], value=nl.multiply(tile, factor))
    return out


@nki.jit
def add_and_sub(a, b):
    """Two outputs: a + b and a - b (one 2-D tile)."""
    s = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ta, tb = nl.load(a), nl.load(b)
    nl.store(s, value=nl.add(ta, tb))
    nl.store(d, value=nl.subtract(ta, tb))
    return s, d


@nki.jit
def add_tiles(a, b):
    """One 128 x 64 tile per program of a 2-D grid."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    j = nl.program_id(1) * 64 + nl.arange(64)[None, :]
    nl.store(out[i, j], value=nl.add(nl.load(a[i, j]), nl.load(b[i, j])))
    return out


def ref_scale(x, factor):
    return x * factor


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float8_e4m3"])
def test_passes_for_a_correct_kernel(dtype):
    x = np.random.default_rng(0).standard_normal((300, 40))  # float64: rounded to dtype
    outs = check_kernel(scale_rows, ref_scale, x, 3.0, dtype=dtype)
    assert len(outs) == 1 and outs[0].dtype == dtypes.as_dtype(dtype)


def test_reference_sees_the_rounded_inputs():
    # copying a bf16 input is exact, so it passes with zero tolerance: the reference must get
    # the bf16-rounded values, not the float64 originals
    x = np.random.default_rng(1).standard_normal((130, 9))
    check_kernel(scale_rows, ref_scale, x, 1.0, dtype="bfloat16", rtol=0.0, atol=0.0)


def test_grid_and_keyword_arguments():
    a, b = random_inputs([(256, 128), (256, 128)], "float32", 2)
    check_kernel(add_tiles[2, 2], lambda a, b: a + b, a, b=b)


def test_several_outputs():
    a, b = random_inputs([(64, 32), (64, 32)], "float16", 3)
    outs = check_kernel(add_and_sub, lambda a, b: (a + b, a - b), a, b, dtype="float16")
    assert len(outs) == 2


def test_output_count_mismatch():
    a, b = random_inputs([(8, 8), (8, 8)], "float32", 3)
    with pytest.raises(AssertionError, match="returned 2 outputs, the reference 1"):
        check_kernel(add_and_sub, lambda a, b: a + b, a, b)


def test_uninitialized_output_is_explained():
    x = random_inputs((300, 20), "bfloat16", 4)
    with pytest.raises(AssertionError) as e:
        check_kernel(scale_rows_forgets_last_tile, ref_scale, x, 2.0, dtype="bfloat16")
    msg = str(e.value)
    assert "scale_rows_forgets_last_tile" in msg
    assert "bfloat16[300, 20]" in msg
    assert "mismatched: 880 of 6000" in msg
    assert "first mismatch: [256, 0]" in msg
    assert "span index ranges [256..299, 0..19]" in msg
    assert "NaN: 880 in the kernel output, 0 in the reference" in msg
    assert "NaN-poisoned" in msg


def test_wrong_values_report_worst_elements():
    x = random_inputs((128, 16), "float32", 5)
    with pytest.raises(AssertionError) as e:
        check_kernel(scale_rows, lambda x, f: x * f + 0.5, x, 2.0, op_kind="elementwise")
    msg = str(e.value)
    assert "tolerance: rtol=1.3e-06 atol=1e-05" in msg
    assert "max abs error: 0.5 at [" in msg
    assert "max rel error:" in msg
    assert "NaN" not in msg


def test_explicit_tolerance_overrides_the_table():
    x = random_inputs((128, 16), "float32", 6)
    check_kernel(scale_rows, lambda x, f: x * f + 1e-3, x, 2.0, atol=2e-3)
    with pytest.raises(AssertionError, match="rtol=0 atol=1e-05"):
        check_kernel(scale_rows, lambda x, f: x * f * (1 + 1e-4) + 1e-3, x, 2.0, rtol=0.0)


def test_shape_mismatch():
    x = random_inputs((128, 16), "float32", 7)
    with pytest.raises(
        AssertionError, match=r"shape \(128, 16\) differs from the reference's \(16, 128\)"
    ):
        check_kernel(scale_rows, lambda x, f: (x * f).T, x, 2.0)


def test_compare_nan_and_inf_semantics():
    t = Tolerance(0.0, 0.0)
    compare(np.array([np.nan, np.inf, -np.inf, 1.0]), np.array([np.nan, np.inf, -np.inf, 1.0]), t)
    with pytest.raises(AssertionError, match="mismatched: 1 of 2"):
        compare(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]), t)
    with pytest.raises(AssertionError, match="NaN: 0 in the kernel output, 1 in the reference"):
        compare(np.array([0.0, 1.0]), np.array([np.nan, 1.0]), t)


def test_assert_close_uses_the_dtype_tolerance():
    ref = np.linspace(-3, 3, 101)
    out = ref.astype(np.float16)
    assert_close(out, ref)  # float16 output: the float16 tolerance
    with pytest.raises(AssertionError):
        assert_close(out, ref, rtol=0.0, atol=0.0)
    assert_close(out.astype(np.float32), ref, dtype="float16")
