"""matmul against its numpy reference: hypothesis over (K, M, N) (exact tiles and ragged in
every dimension) and dtypes, plus fixed examples, the manifest, the layout and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import nkikit.typing as nt
from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference

OP_KIND = "matmul"


@given(
    kmn=nst.matmul_shapes(max_k=3 * 128, max_m=2 * 128, max_n=2 * 512, ragged=True),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_matmul_matches_reference(kmn, dtype, seed):
    k, m, n = kmn
    lhsT, rhs = random_inputs([(k, m), (k, n)], dtype, seed)
    check_kernel(kernel.matmul, reference.matmul, lhsT, rhs, dtype=dtype, op_kind=OP_KIND)


@given(
    kmn=nst.matmul_shapes(max_k=2 * 128, max_m=2 * 128, max_n=2 * 512, ragged=False),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_matmul_whole_tiles(kmn, dtype, seed):
    k, m, n = kmn
    lhsT, rhs = random_inputs([(k, m), (k, n)], dtype, seed)
    check_kernel(kernel.matmul, reference.matmul, lhsT, rhs, dtype=dtype, op_kind=OP_KIND)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("kmn", [(128, 128, 512), (129, 1, 513), (1, 1, 1), (300, 130, 20)])
def test_matmul_fixed_shapes(kmn, dtype):
    k, m, n = kmn
    lhsT, rhs = random_inputs([(k, m), (k, n)], dtype, seed=10)
    check_kernel(kernel.matmul, reference.matmul, lhsT, rhs, dtype=dtype, op_kind=OP_KIND)


def test_matmul_takes_lhs_transposed():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)  # A [M=2, K=3]
    b = np.ones((3, 4), np.float32)  # B [K=3, N=4]
    np.testing.assert_array_equal(kernel.matmul(np.ascontiguousarray(a.T), b), a @ b)


def test_matmul_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_matmul_rejects_bad_inputs():
    with pytest.raises(ValueError, match="differ in K"):
        kernel.matmul(np.zeros((3, 2), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        kernel.matmul(np.zeros(3, np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="share one of"):
        kernel.matmul(np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float16))


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_matmul_largest_k_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    k = kernel.MAX_K
    kernel.matmul_kernel.ir(nt.tensor[[k, 300], dtype], nt.tensor[[k, 1100], dtype])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_large(dtype):
    lhsT, rhs = random_inputs([(2048, 512), (2048, 2048)], dtype, seed=11)
    check_kernel(kernel.matmul, reference.matmul, lhsT, rhs, dtype=dtype, op_kind=OP_KIND)
