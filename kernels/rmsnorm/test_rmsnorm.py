"""RMSNorm against its numpy reference: hypothesis over row counts (ragged last tiles), free
sizes and dtypes, plus fixed examples, the manifest and the error contract."""

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
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    seed=nst.seeds(),
)
def test_rmsnorm_matches_reference(rows, d, dtype, eps, seed):
    x, w = random_inputs([(rows, d), (d,)], dtype, seed)
    check_kernel(kernel.rmsnorm, reference.rmsnorm, x, w, dtype=dtype, op_kind=OP_KIND, eps=eps)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(128, 512), (129, 7), (1, 1), (2, 3, 64)])
def test_rmsnorm_fixed_shapes(shape, dtype):
    x, w = random_inputs([shape, shape[-1:]], dtype, seed=1)
    check_kernel(kernel.rmsnorm, reference.rmsnorm, x, w, dtype=dtype, op_kind=OP_KIND)


def test_rmsnorm_constant_rows_are_weight():
    # x / rms(x) is exactly +-1 when a row is constant, so the result is +-weight
    x = np.full((130, 16), -3.0, dtype=np.float32)
    w = np.arange(16, dtype=np.float32)
    y = kernel.rmsnorm(x, w, eps=0.0)
    np.testing.assert_allclose(y, np.broadcast_to(-w, x.shape), rtol=1e-6)


def test_rmsnorm_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_rmsnorm_rejects_bad_inputs():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="weight must have shape"):
        kernel.rmsnorm(x, np.zeros(7, np.float32))
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.rmsnorm(x.astype(np.float16), np.zeros(8, np.float16))
    with pytest.raises(ValueError, match="last dimension"):
        kernel.rmsnorm(
            np.zeros((1, kernel.MAX_D + 1), np.float32), np.zeros(kernel.MAX_D + 1, np.float32)
        )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rmsnorm_largest_row_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    d = kernel.MAX_D
    kernel.rmsnorm_kernel.ir(nt.tensor[[256, d], dtype], nt.tensor[[d], dtype], 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rmsnorm_large(dtype):
    x, w = random_inputs([(1000, 4096), (4096,)], dtype, seed=2)
    check_kernel(kernel.rmsnorm, reference.rmsnorm, x, w, dtype=dtype, op_kind=OP_KIND)
