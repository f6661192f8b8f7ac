"""SwiGLU against its numpy reference: hypothesis over row counts (ragged last tiles), free
sizes (ragged last column chunk) and dtypes for forward and backward, the manifest, the error
contract, and gradcheck through the torch binding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference

OP_KIND = "transcendental"


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(kernel.CHUNK_BYTES + 64),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_swiglu_matches_reference(rows, d, dtype, seed):
    a, b = random_inputs([(rows, d), (rows, d)], dtype, seed, scale=3.0)
    check_kernel(kernel.swiglu, reference.swiglu, a, b, dtype=dtype, op_kind=OP_KIND)


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(kernel.CHUNK_BYTES + 64),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_swiglu_backward_matches_reference(rows, d, dtype, seed):
    g, a, b = random_inputs([(rows, d)] * 3, dtype, seed, scale=3.0)
    check_kernel(
        kernel.swiglu_backward, reference.swiglu_backward, g, a, b, dtype=dtype, op_kind=OP_KIND
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(128, 512), (129, 7), (1, 1), (2, 3, 2049)])
def test_swiglu_fixed_shapes(shape, dtype):
    g, a, b = random_inputs([shape] * 3, dtype, seed=1)
    check_kernel(kernel.swiglu, reference.swiglu, a, b, dtype=dtype, op_kind=OP_KIND)
    check_kernel(
        kernel.swiglu_backward, reference.swiglu_backward, g, a, b, dtype=dtype, op_kind=OP_KIND
    )


def test_swiglu_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_swiglu_rejects_bad_inputs():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="must have shape"):
        kernel.swiglu(x, np.zeros((4, 7), np.float32))
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.swiglu(x.astype(np.float16), x.astype(np.float16))
    with pytest.raises(TypeError):
        kernel.swiglu(x, x.astype(np.float64))


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_swiglu_gradcheck_through_torch_binding():
    """The kernels compute in fp32 (NKI has no float64), so gradcheck runs in fp32 with a
    finite-difference step and tolerances sized for fp32 rounding (eps=1e-2, atol=rtol=1e-2);
    the backward is checked tightly against the float64 reference above."""
    torch = pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    fns = bind_functions(__package__, load_manifest(Path(__file__).parent), "nkikit_test_swiglu")
    op = fns["swiglu"].torch.op
    torch.manual_seed(0)
    a = torch.randn(3, 8, requires_grad=True)
    b = torch.randn(3, 8, requires_grad=True)
    assert torch.autograd.gradcheck(op, (a, b), eps=1e-2, atol=1e-2, rtol=1e-2)
    # and the gradients equal torch autograd of the float64 formula
    y = op(a, b)
    g = torch.randn_like(y)
    ga, gb = torch.autograd.grad(y, (a, b), g)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ra, rb = torch.autograd.grad(torch.nn.functional.silu(a64) * b64, (a64, b64), g.double())
    torch.testing.assert_close(ga.double(), ra, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb.double(), rb, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_swiglu_large(dtype):
    g, a, b = random_inputs([(1000, 4200)] * 3, dtype, seed=2)
    check_kernel(kernel.swiglu, reference.swiglu, a, b, dtype=dtype, op_kind=OP_KIND)
    check_kernel(
        kernel.swiglu_backward, reference.swiglu_backward, g, a, b, dtype=dtype, op_kind=OP_KIND
    )
