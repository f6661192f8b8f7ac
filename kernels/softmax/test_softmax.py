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
from nkikit import testing
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
    with pytest.raises(ValueError, match="offset must be >= 0"):
        kernel.softmax(np.zeros((2, 2), np.float32), causal=True, offset=-1)
    with pytest.raises(ValueError, match="grad_out must have"):
        kernel.softmax_backward(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_softmax_largest_row_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    spec = nt.tensor[[1, 600, kernel.MAX_D], dtype]
    bspec = nt.tensor[[1, 600, kernel.MAX_D_BACKWARD], dtype]
    for causal in (False, True):
        kernel.softmax_kernel.ir(spec, causal, 0)
        kernel.softmax_backward_kernel.ir(bspec, bspec, causal, 0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_softmax_large(dtype):
    x = random_inputs((1000, 8192), dtype, seed=6, scale=4.0)
    check_kernel(kernel.softmax, reference.softmax, x, dtype=dtype, op_kind=OP_KIND)


# --- causal mask -------------------------------------------------------------------------------


@given(
    batch=st.sampled_from([1, 2]),
    s=nst.row_counts(2 * 128),
    d=nst.free_sizes(300),
    offset=st.sampled_from([0, 1, 37]),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_softmax_causal_matches_reference(batch, s, d, offset, dtype, seed):
    # square (d == s), wide (d > s) and tall (d < s) score matrices
    x = random_inputs((batch, s, d), dtype, seed, scale=4.0)
    check_kernel(
        kernel.softmax,
        reference.softmax,
        x,
        dtype=dtype,
        op_kind=OP_KIND,
        causal=True,
        offset=offset,
    )


def test_softmax_causal_is_lower_triangular():
    x = random_inputs((2, 3, 130, 130), "float32", seed=8)
    y = kernel.softmax(x, causal=True)
    assert (y[..., np.triu_indices(130, 1)[0], np.triu_indices(130, 1)[1]] == 0).all()
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(y[..., 0, 0], 1.0)  # row 0 keeps only column 0


# --- backward ----------------------------------------------------------------------------------


def assert_grads_close(got, want, dtype, term_scale=0.0):
    testing.assert_grads_close(got, want, dtype, op_kind=OP_KIND, term_scale=term_scale)


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(600),
    causal=st.booleans(),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_softmax_backward_matches_reference(rows, d, causal, dtype, seed):
    g, x = random_inputs([(rows, d), (rows, d)], dtype, seed)
    x = x * np.asarray(3.0, dtype=x.dtype)
    got = kernel.softmax_backward(g, x, causal=causal)
    assert isinstance(got, tuple) and got[0].dtype == x.dtype and got[0].shape == x.shape
    y = reference.softmax(x, causal=causal)
    term = float(np.max(y * np.max(np.abs(g.astype(np.float64)), axis=-1, keepdims=True)))
    assert_grads_close(got, reference.softmax_backward(g, x, causal=causal), dtype, term)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_backward_long_rows(dtype, causal):
    # 1300 columns: three 512-column pieces for the last stage's matmuls (the PSUM ring wraps,
    # the last piece is ragged); 2 x 130 rows: ragged row tiles in each batch
    g, x = random_inputs([(2, 130, 1300), (2, 130, 1300)], dtype, seed=9)
    x = x * np.asarray(3.0, dtype=x.dtype)
    got = kernel.softmax_backward(g, x, causal=causal, offset=5)
    y = reference.softmax(x, causal=causal, offset=5)
    term = float(np.max(y * np.max(np.abs(g.astype(np.float64)), axis=-1, keepdims=True)))
    want = reference.softmax_backward(g, x, causal=causal, offset=5)
    assert_grads_close(got, want, dtype, term)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_backward_reference_is_torch_autograd(causal):
    torch = pytest.importorskip("torch")
    g, x = random_inputs([(2, 7, 9), (2, 7, 9)], "float32", seed=7)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(7, 9, dtype=torch.bool).tril(1) if causal else torch.ones(7, 9).bool()
    torch.softmax(xt.masked_fill(~mask, float("-inf")), -1).backward(torch.tensor(g).double())
    (gx,) = reference.softmax_backward(g, x, causal=causal, offset=1)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def bound():
    """The folder's functions bound as torch ops (with autograd) without publishing."""
    pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    return bind_functions(__package__, load_manifest(Path(__file__).parent), "nkikit_local_softmax")


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_gradcheck(bound, causal):
    """gradcheck through the torch binding.  The kernels compute in fp32 (NKI has no float64),
    so it runs in fp32 with finite-difference steps and tolerances loosened for fp32 rounding;
    the tests above check the same gradients tightly against the float64 reference."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a: bound["softmax"](a, causal=causal, offset=1),
        (x,),
        eps=1e-2,
        atol=2e-2,
        rtol=2e-2,
    )
