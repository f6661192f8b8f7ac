"""LayerNorm against its numpy reference: hypothesis over row counts (ragged last tiles), free
sizes (ragged last bn_stats chunk) and dtypes, plus fixed examples, the manifest and errors."""

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
    d=nst.free_sizes(1200),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    eps=st.sampled_from([1e-5, 1e-3]),
    offset=st.sampled_from([0.0, 4.0]),
    seed=nst.seeds(),
)
def test_layernorm_matches_reference(rows, d, dtype, eps, offset, seed):
    x, w, b = random_inputs([(rows, d), (d,), (d,)], dtype, seed)
    # a mean far from zero exercises the variance computation (no E[x^2] - E[x]^2 cancellation)
    x = x + np.asarray(offset, dtype=x.dtype)
    check_kernel(
        kernel.layernorm, reference.layernorm, x, w, b, dtype=dtype, op_kind=OP_KIND, eps=eps
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(128, 512), (129, 513), (1, 1), (3, 5, 1024)])
def test_layernorm_fixed_shapes(shape, dtype):
    x, w, b = random_inputs([shape, shape[-1:], shape[-1:]], dtype, seed=3)
    check_kernel(kernel.layernorm, reference.layernorm, x, w, b, dtype=dtype, op_kind=OP_KIND)


def test_layernorm_normalizes():
    # with unit weight and zero bias every row has mean 0 and variance ~1
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(200, 700)).astype(np.float32)
    y = kernel.layernorm(x, np.ones(700, np.float32), np.zeros(700, np.float32), eps=0.0)
    np.testing.assert_allclose(y.mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=1), 1.0, rtol=1e-4)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_layernorm_statistics_on_both_engines(dtype):
    # rows 0-127 take their statistics on ScalarE (two passes), rows 128-255 on VectorE
    # (bn_stats); with the mean 30 standard deviations from zero, E[x^2] - E[x]^2 in fp32
    # would lose about 10 bits of the variance, over the fp32 tolerance
    rng = np.random.default_rng(11)
    x = rng.normal(30.0, 1.0, size=(256, 777)).astype(np.float32).astype(dtypes_of(dtype))
    _, w, b = random_inputs([(1, 777), (777,), (777,)], dtype, seed=12)
    check_kernel(kernel.layernorm, reference.layernorm, x, w, b, dtype=dtype, op_kind=OP_KIND)
    y = kernel.layernorm(x, np.ones(777, x.dtype), np.zeros(777, x.dtype), eps=0.0)
    np.testing.assert_allclose(y.astype(np.float64).var(axis=1), 1.0, rtol=2e-2)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_layernorm_rows_wider_than_the_psum_weight(dtype):
    # columns past kernel.PSUM_COLS take the weight from SBUF (VectorE and GpSimd alternate);
    # 4500 fp32 columns are also over PAIR_ROW_BYTES (one tile per iteration)
    d = kernel.PSUM_COLS + 404
    x, w, b = random_inputs([(257, d), (d,), (d,)], dtype, seed=13)
    x = x + np.asarray(4.0, dtype=x.dtype)
    check_kernel(kernel.layernorm, reference.layernorm, x, w, b, dtype=dtype, op_kind=OP_KIND)


def dtypes_of(name):
    return kernel.dtypes.as_dtype(name)


def test_layernorm_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_layernorm_rejects_bad_inputs():
    x = np.zeros((4, 8), np.float32)
    p = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="bias must have shape"):
        kernel.layernorm(x, p, np.zeros(9, np.float32))
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.layernorm(x, p, p.astype(np.float16))


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_layernorm_largest_row_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    d = kernel.MAX_D
    spec = nt.tensor[[d], dtype]
    kernel.layernorm_kernel.ir(nt.tensor[[256, d], dtype], spec, spec, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_layernorm_large(dtype):
    x, w, b = random_inputs([(1000, 4000), (4000,), (4000,)], dtype, seed=4)
    check_kernel(kernel.layernorm, reference.layernorm, x, w, b, dtype=dtype, op_kind=OP_KIND)


# --- backward ----------------------------------------------------------------------------------


def assert_grads_close(got, want, dtype, term_scale=0.0):
    testing.assert_grads_close(got, want, dtype, op_kind=OP_KIND, term_scale=term_scale)


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(600),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    offset=st.sampled_from([0.0, 4.0]),
    seed=nst.seeds(),
)
def test_layernorm_backward_matches_reference(rows, d, dtype, offset, seed):
    g, x, w, b = random_inputs([(rows, d), (rows, d), (d,), (d,)], dtype, seed)
    x = x + np.asarray(offset, dtype=x.dtype)
    got = kernel.layernorm_backward(g, x, w, b)
    assert [a.dtype for a in got] == [x.dtype] * 3 and got[1].shape == got[2].shape == (d,)
    r = 1.0 / np.sqrt(x.astype(np.float64).var(axis=-1, keepdims=True) + 1e-5)
    term = float(np.max(np.abs(g.astype(np.float64) * w.astype(np.float64) * r)))
    assert_grads_close(got, reference.layernorm_backward(g, x, w, b), dtype, term)


def _backward_term_scale(g, x, w):
    """The size of the terms ``grad * weight * rstd`` that grad_x is a difference of."""
    r = 1.0 / np.sqrt(x.astype(np.float64).var(axis=-1, keepdims=True) + 1e-5)
    return float(np.max(np.abs(g.astype(np.float64) * w.astype(np.float64) * r)))


@pytest.mark.parametrize(
    "dtype, rows, d",
    [
        # fp32: five column chunks (more than the scratch ring holds), weight columns past
        # the PSUM copy (from SBUF) and a chunk straddling both; a pair of row tiles + a
        # ragged one
        ("float32", 300, 4600),
        # 16-bit: three chunks, the last ragged; a pair of row tiles, a leftover full tile and
        # a ragged one
        ("bfloat16", 677, 5000),
        # one chunk: a group of four row tiles, a leftover and a ragged one
        ("bfloat16", 677, 1000),
        ("float32", 677, 1000),
    ],
)
def test_layernorm_backward_wide_rows_and_groups(dtype, rows, d):
    chunks = kernel._chunks(d, dtype)
    assert len(chunks) == {4600: 5, 5000: 3, 1000: 1}[d]
    assert kernel._backward_group(d, dtype) == {4600: 2, 5000: 2, 1000: 4}[d]
    g, x, w, b = random_inputs([(rows, d), (rows, d), (d,), (d,)], dtype, seed=17)
    x = x + np.asarray(4.0, dtype=x.dtype)
    got = kernel.layernorm_backward(g, x, w, b)
    want = reference.layernorm_backward(g, x, w, b)
    assert_grads_close(got, want, dtype, _backward_term_scale(g, x, w))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_layernorm_backward_keeps_rows_apart(dtype):
    # a non-finite grad entry stays in its row of grad_x and its column of grad_weight and
    # grad_bias: no instruction mixes rows with zero weights (0 * inf would be NaN elsewhere)
    rows, d, bad_row, bad_col = 600, 700, 133, 5
    g, x, w, b = random_inputs([(rows, d), (rows, d), (d,), (d,)], dtype, seed=19)
    g[bad_row, bad_col] = np.inf
    gx, gw, gb = kernel.layernorm_backward(g, x, w, b)
    assert not np.isfinite(gw[bad_col]) and not np.isfinite(gb[bad_col])
    with np.errstate(invalid="ignore"):  # the reference's row bad_row is NaN too
        want = reference.layernorm_backward(g, x, w, b)
    keep_r = np.arange(rows) != bad_row
    keep_c = np.arange(d) != bad_col
    assert_grads_close(
        (gx[keep_r], gw[keep_c], gb[keep_c]),
        (want[0][keep_r], want[1][keep_c], want[2][keep_c]),
        dtype,
        _backward_term_scale(g[keep_r], x[keep_r], w),
    )


def test_layernorm_backward_reference_is_torch_autograd():
    torch = pytest.importorskip("torch")
    g, x, w, b = random_inputs([(3, 5, 40), (3, 5, 40), (40,), (40,)], "float32", seed=7)
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b)]
    y = torch.nn.functional.layer_norm(ts[0], (40,), ts[1], ts[2], eps=1e-5)
    y.backward(torch.tensor(g, dtype=torch.float64))
    for got, t in zip(reference.layernorm_backward(g, x, w, b), ts):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-9, atol=1e-11)


@pytest.fixture(scope="module")
def bound():
    """The folder's functions bound as torch ops (with autograd) without publishing."""
    pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    return bind_functions(
        __package__, load_manifest(Path(__file__).parent), "nkikit_local_layernorm"
    )


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_layernorm_gradcheck(bound):
    """gradcheck through the torch binding.  The kernels compute in fp32 (NKI has no float64),
    so it runs in fp32 with finite-difference steps and tolerances loosened for fp32 rounding;
    the tests above check the same gradients tightly against the float64 reference."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(3, 8, requires_grad=True)
    w = (torch.rand(8) + 0.5).requires_grad_()
    b = torch.randn(8, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: bound["layernorm"](*a, eps=1e-3), (x, w, b), eps=1e-2, atol=2e-2, rtol=2e-2
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_layernorm_backward_largest_row_fits_sbuf(dtype):
    d = kernel.MAX_D
    spec = nt.tensor[[256, d], dtype]
    kernel.layernorm_backward_kernel.ir(spec, spec, nt.tensor[[d], dtype], 1e-5)
