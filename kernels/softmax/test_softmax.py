"""Softmax against its numpy reference: hypothesis over row counts (ragged last tiles), free
sizes, dtypes and input scales (large logits need the max subtraction), plus fixed examples,
the manifest and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nkikit.typing as nt
from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference

OP_KIND = "normalization"


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(1024),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    scale=st.sampled_from([1.0, 30.0]),
    seed=nst.seeds(),
)
def test_softmax_matches_reference(rows, d, dtype, scale, seed):
    x = random_inputs((rows, d), dtype, seed, scale=scale)
    check_kernel(kernel.softmax, reference.softmax, x, dtype=dtype, op_kind=OP_KIND)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(128, 512), (129, 3), (1, 1), (2, 65, 40)])
def test_softmax_fixed_shapes(shape, dtype):
    x = random_inputs(shape, dtype, seed=5)
    check_kernel(kernel.softmax, reference.softmax, x, dtype=dtype, op_kind=OP_KIND)


def test_softmax_large_logits_do_not_overflow():
    # exp(1000) overflows fp32; the max subtraction keeps every value finite
    x = np.array([[1000.0, 999.0, -1000.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    y = kernel.softmax(x)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[1], 1.0 / 3.0, rtol=1e-6)


def test_softmax_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_softmax_rejects_bad_inputs():
    with pytest.raises(TypeError, match="float32, bfloat16, float16"):
        kernel.softmax(np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="last dimension"):
        kernel.softmax(np.zeros((2, 0), np.float32))


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_softmax_largest_row_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    kernel.softmax_kernel.ir(nt.tensor[[256, kernel.MAX_D], dtype])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_softmax_large(dtype):
    x = random_inputs((1000, 8192), dtype, seed=6, scale=4.0)
    check_kernel(kernel.softmax, reference.softmax, x, dtype=dtype, op_kind=OP_KIND)
