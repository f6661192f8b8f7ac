"""matmul against its numpy reference: hypothesis over (K, M, N) (exact tiles and ragged in
every dimension) and dtypes (fp32, bf16, fp16 and the fp8 formats), plus fixed examples
(multi-block shapes with fully masked tiles), output dtypes, the manifest, the layout and
errors; the backward against the float64 reference and with gradcheck through the torch
binding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import nkikit.typing as nt
from nkikit import dtypes
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
@pytest.mark.parametrize(
    "kmn", [(128, 128, 512), (129, 1, 513), (1, 1, 1), (300, 130, 20), (140, 520, 2100)]
)
def test_matmul_fixed_shapes(kmn, dtype):
    k, m, n = kmn
    lhsT, rhs = random_inputs([(k, m), (k, n)], dtype, seed=10)
    check_kernel(kernel.matmul, reference.matmul, lhsT, rhs, dtype=dtype, op_kind=OP_KIND)


@pytest.mark.parametrize("dtype", kernel.FP8_DTYPES + ("bfloat16",))
@pytest.mark.parametrize("out_dtype", ["", "float32", "bfloat16"])
def test_matmul_output_dtypes(dtype, out_dtype):
    lhsT, rhs = random_inputs([(200, 130), (200, 40)], dtype, seed=12)
    (out,) = check_kernel(
        kernel.matmul,
        reference.matmul,
        lhsT,
        rhs,
        dtype=dtype,
        op_kind=OP_KIND,
        out_dtype=out_dtype,
    )
    default = "bfloat16" if dtype in kernel.FP8_DTYPES else dtype
    assert out.dtype == dtypes.as_dtype(out_dtype or default)


def test_matmul_fp8_products_are_exact_in_fp32():
    # small integers are exact in e4m3 and their products sum exactly in fp32 PSUM
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (256, 64)).astype(np.float32)
    b = rng.integers(-4, 5, (256, 96)).astype(np.float32)
    got = kernel.matmul(
        a.astype(dtypes.float8_e4m3), b.astype(dtypes.float8_e4m3), out_dtype="float32"
    )
    np.testing.assert_array_equal(got, a.T @ b)


def test_block_tiles():
    # 8 or more TensorE passes per output tile (autotuned): one tile per block
    assert kernel.block_tiles(4096, 4096, 4096, 2) == (1, 1)  # 32 K tiles
    assert kernel.block_tiles(1024, 4096, 4096, 1) == (1, 1)  # fp8: 8 K tiles
    assert kernel.block_tiles(256, 4096, 4096, 4) == (1, 1)  # fp32: 2 K tiles x 4 passes
    # fewer: the largest blocks, capped by the tiles M and N have
    assert kernel.block_tiles(512, 4096, 4096, 2) == (4, 4)
    assert kernel.block_tiles(128, 4096, 4096, 4) == (4, 4)
    assert kernel.block_tiles(896, 256, 600, 2) == (2, 2)
    assert kernel.block_tiles(64, 100, 300, 4) == (1, 1)


def test_explicit_blocks_compute_the_same():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((384, 300)).astype(np.float32)
    b = rng.standard_normal((384, 1100)).astype(np.float32)
    want = kernel.matmul_kernel(a, b, None)
    for bm, bn in ((1, 1), (2, 3), (4, 1)):
        got = kernel.matmul_kernel(a, b, None, block_m=bm, block_n=bn)
        np.testing.assert_array_equal(got, want)


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
    with pytest.raises(TypeError, match="out_dtype"):
        kernel.matmul(np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32), out_dtype="int8")
    with pytest.raises(ValueError, match="output shape"):
        kernel.matmul_backward(
            np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32)
        )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3"])
def test_matmul_largest_k_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    k = kernel.MAX_K
    kernel.matmul_kernel.ir(nt.tensor[[k, 300], dtype], nt.tensor[[k, 1100], dtype])


# -- backward -------------------------------------------------------------------------------


@given(
    kmn=nst.matmul_shapes(max_k=2 * 128, max_m=2 * 128, max_n=600, ragged=True),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_matmul_backward_matches_reference(kmn, dtype, seed):
    k, m, n = kmn
    lhsT, rhs = random_inputs([(k, m), (k, n)], dtype, seed)
    (grad,) = random_inputs([(m, n)], "bfloat16" if dtype in kernel.FP8_DTYPES else dtype, seed + 1)
    outs = check_kernel(
        lambda g, a, b: kernel.matmul_backward(g, a, b),
        reference.matmul_backward,
        grad,
        lhsT,
        rhs,
        op_kind=OP_KIND,
        **tolerance_for(dtype),
    )
    assert [o.dtype for o in outs] == [lhsT.dtype, rhs.dtype]
    assert [o.shape for o in outs] == [lhsT.shape, rhs.shape]


def tolerance_for(dtype: str) -> dict:
    """The matmul tolerance of the input dtype (the gradients are rounded to it)."""
    from nkikit.testing import tolerance

    t = tolerance(dtype, OP_KIND)
    return {"rtol": t.rtol, "atol": t.atol}


@pytest.fixture(scope="module")
def bound():
    """The manifest's functions bound as torch ops from this folder (no hub involved)."""
    pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    return bind_functions(__package__, load_manifest(Path(__file__).parent), "nkikit_test_matmul")


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_matmul_gradcheck_through_torch(bound):
    """gradcheck in fp32 (the kernel has no float64): finite-difference step and tolerances
    sized for fp32 rounding (ragged sizes are covered by the reference tests above)."""
    import torch

    torch.manual_seed(0)
    a = torch.randn(20, 3, requires_grad=True)
    b = torch.randn(20, 5, requires_grad=True)
    assert torch.autograd.gradcheck(bound["matmul"], (a, b), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_matmul_torch_gradients_match_autograd(bound):
    import torch

    torch.manual_seed(1)
    a = torch.randn(200, 140, requires_grad=True)
    b = torch.randn(200, 600, requires_grad=True)
    g = torch.randn(140, 600)
    bound["matmul"](a, b).backward(g)
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    (a64.T @ b64).backward(g.double())
    torch.testing.assert_close(a.grad.double(), a64.grad, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(b.grad.double(), b64.grad, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_large(dtype):
    lhsT, rhs = random_inputs([(2048, 512), (2048, 2048)], dtype, seed=11)
    check_kernel(kernel.matmul, reference.matmul, lhsT, rhs, dtype=dtype, op_kind=OP_KIND)
