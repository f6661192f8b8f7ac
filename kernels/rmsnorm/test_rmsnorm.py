"""RMSNorm against its numpy reference: hypothesis over row counts (ragged last tiles), free
sizes and dtypes, plus fixed examples, the manifest and the error contract."""

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


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rmsnorm_long_rows_in_chunks(dtype):
    # fp32 rows over 16 KiB per partition go in 4 KiB column chunks (the last one ragged),
    # y overwriting x; 16-bit rows of this length are one chunk
    d = 4500
    x, r, w = random_inputs([(130, d), (130, d), (d,)], dtype, seed=11)
    check_kernel(kernel.rmsnorm, reference.rmsnorm, x, w, dtype=dtype, op_kind=OP_KIND)
    check_kernel(kernel.add_rmsnorm, reference.add_rmsnorm, x, r, w, dtype=dtype, op_kind=OP_KIND)
    y, h = kernel.add_rmsnorm(x, r, w)
    np.testing.assert_array_equal(y, kernel.rmsnorm(h, w))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rmsnorm_large(dtype):
    x, w = random_inputs([(1000, 4096), (4096,)], dtype, seed=2)
    check_kernel(kernel.rmsnorm, reference.rmsnorm, x, w, dtype=dtype, op_kind=OP_KIND)


# --- add_rmsnorm -------------------------------------------------------------------------------


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(1024),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_add_rmsnorm_matches_reference(rows, d, dtype, seed):
    x, r, w = random_inputs([(rows, d), (rows, d), (d,)], dtype, seed)
    check_kernel(kernel.add_rmsnorm, reference.add_rmsnorm, x, r, w, dtype=dtype, op_kind=OP_KIND)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_add_rmsnorm_is_add_then_rmsnorm(dtype):
    x, r, w = random_inputs([(2, 65, 96), (2, 65, 96), (96,)], dtype, seed=4)
    y, h = kernel.add_rmsnorm(x, r, w, eps=1e-5)
    want_h = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(h, want_h)  # one rounding of the exact sum
    np.testing.assert_array_equal(y, kernel.rmsnorm(want_h, w, eps=1e-5))
    with pytest.raises(ValueError, match="residual must have"):
        kernel.add_rmsnorm(x, r[:1], w)


# --- backward ----------------------------------------------------------------------------------


def assert_grads_close(got, want, dtype, term_scale=0.0):
    testing.assert_grads_close(got, want, dtype, op_kind=OP_KIND, term_scale=term_scale)


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(600),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    eps=st.sampled_from([1e-6, 0.1]),
    seed=nst.seeds(),
)
def test_rmsnorm_backward_matches_reference(rows, d, dtype, eps, seed):
    g, x, w = random_inputs([(rows, d), (rows, d), (d,)], dtype, seed)
    got = kernel.rmsnorm_backward(g, x, w, eps=eps)
    assert got[0].dtype == x.dtype and got[1].dtype == w.dtype and got[1].shape == (d,)
    x64 = x.astype(np.float64)
    r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    term = float(np.max(np.abs(g.astype(np.float64) * w.astype(np.float64) * r)))
    assert_grads_close(got, reference.rmsnorm_backward(g, x, w, eps=eps), dtype, term)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rmsnorm_backward_long_rows_in_chunks(dtype):
    # several 4 KiB column chunks (1024 fp32 / 2048 bf16 columns, the last one ragged): the
    # scratch ring wraps, the partial sums of squares and of grad * w * x are added, and the
    # last stage's matmuls cover 512-column pieces; 130 rows: a ragged last row tile
    d = 2500
    g, x, w = random_inputs([(130, d), (130, d), (d,)], dtype, seed=12)
    got = kernel.rmsnorm_backward(g, x, w, eps=1e-5)
    x64 = x.astype(np.float64)
    r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-5)
    term = float(np.max(np.abs(g.astype(np.float64) * w.astype(np.float64) * r)))
    assert_grads_close(got, reference.rmsnorm_backward(g, x, w, eps=1e-5), dtype, term)


def test_rmsnorm_backward_reference_is_torch_autograd():
    torch = pytest.importorskip("torch")
    g, x, w = random_inputs([(3, 5, 40), (3, 5, 40), (40,)], "float32", seed=7)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    y = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-6) * wt
    y.backward(torch.tensor(g, dtype=torch.float64))
    gx, gw = reference.rmsnorm_backward(g, x, w)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw, wt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def bound():
    """The folder's functions bound as torch ops (with autograd) without publishing."""
    pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    return bind_functions(__package__, load_manifest(Path(__file__).parent), "nkikit_local_rmsnorm")


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_rmsnorm_gradcheck(bound):
    """gradcheck through the torch binding.  The kernels compute in fp32 (NKI has no float64),
    so it runs in fp32 with finite-difference steps and tolerances loosened for fp32 rounding;
    the tests above check the same gradients tightly against the float64 reference."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(3, 8, requires_grad=True)
    w = (torch.rand(8) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: bound["rmsnorm"](a, b, eps=1e-3), (x, w), eps=1e-2, atol=2e-2, rtol=2e-2
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rmsnorm_backward_largest_row_fits_sbuf(dtype):
    d = kernel.MAX_D
    spec = nt.tensor[[256, d], dtype]
    kernel.rmsnorm_backward_kernel.ir(spec, spec, nt.tensor[[d], dtype], 1e-6)
    kernel.add_rmsnorm_kernel.ir(spec, spec, nt.tensor[[d], dtype], 1e-6)
    kernel.add_rmsnorm_backward_kernel.ir(spec, spec, spec, spec, nt.tensor[[d], dtype], 1e-6)


# --- add_rmsnorm backward ----------------------------------------------------------------------


def _rms_term(gy, h, w, eps):
    """The size of the largest term of rmsnorm's input gradient at ``h`` (see assert_grads_close)."""
    h64 = h.astype(np.float64)
    r = 1.0 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + eps)
    return float(np.max(np.abs(gy.astype(np.float64) * w.astype(np.float64) * r)))


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(600),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    eps=st.sampled_from([1e-6, 0.1]),
    seed=nst.seeds(),
)
def test_add_rmsnorm_backward_matches_reference(rows, d, dtype, eps, seed):
    gy, gh, x, r, w = random_inputs([(rows, d), (rows, d), (rows, d), (rows, d), (d,)], dtype, seed)
    got = kernel.add_rmsnorm_backward(gy, gh, x, r, w, eps=eps)
    assert [g.dtype for g in got] == [x.dtype, x.dtype, w.dtype]
    assert [g.shape for g in got] == [x.shape, x.shape, (d,)]
    assert got[0] is not got[1]  # equal values, distinct arrays
    np.testing.assert_array_equal(got[0], got[1])
    h = (x.astype(np.float32) + r.astype(np.float32)).astype(x.dtype)
    term = _rms_term(gy, h, w, eps) + float(np.max(np.abs(gh.astype(np.float64))))
    want = reference.add_rmsnorm_backward(gy, gh, x, r, w, eps=eps)
    assert_grads_close(got, want, dtype, term)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("d", [96, 2500])
def test_add_rmsnorm_backward_is_rmsnorm_backward_at_h_plus_grad_h(dtype, d):
    # the same backward tile on the rounded h, then one rounded add: bit-exact composition
    # (d = 2500: several column chunks, residual and grad_h loaded a chunk at a time)
    gy, gh, x, r, w = random_inputs([(3, 70, d)] * 4 + [(d,)], dtype, seed=6)
    gx, gr, gw = kernel.add_rmsnorm_backward(gy, gh, x, r, w, eps=1e-5)
    _, h = kernel.add_rmsnorm(x, r, w, eps=1e-5)
    dh, gw_h = kernel.rmsnorm_backward(gy, h, w, eps=1e-5)
    want = (dh.astype(np.float32) + gh.astype(np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(gx, want)
    np.testing.assert_array_equal(gr, want)
    np.testing.assert_array_equal(gw, gw_h)


def test_add_rmsnorm_backward_reference_is_torch_autograd():
    torch = pytest.importorskip("torch")
    gy, gh, x, r, w = random_inputs([(3, 5, 40)] * 4 + [(40,)], "float32", seed=8)
    xt, rt, wt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, r, w))
    h = xt + rt
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * wt
    torch.autograd.backward(
        (y, h), (torch.tensor(gy, dtype=torch.float64), torch.tensor(gh, dtype=torch.float64))
    )
    for got, t in zip(reference.add_rmsnorm_backward(gy, gh, x, r, w), (xt, rt, wt)):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_add_rmsnorm_backward_rejects_bad_inputs():
    x = np.zeros((4, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="grad_h must have x's shape"):
        kernel.add_rmsnorm_backward(x, x[:2], x, x, w)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        kernel.add_rmsnorm_backward(x, x, x, x[:, :4], w)
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.add_rmsnorm_backward(x, x, x, x.astype(np.float16), w)
    empty = np.zeros((0, 8), np.float32)
    gx, gr, gw = kernel.add_rmsnorm_backward(empty, empty, empty, empty, w)
    assert gx.shape == gr.shape == (0, 8) and (gw == 0).all()


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_add_rmsnorm_gradcheck(bound):
    """gradcheck of both outputs (y, h) with respect to x, residual and weight, through the
    torch binding's multi-output backward; fp32 steps and tolerances as test_rmsnorm_gradcheck."""
    import torch

    torch.manual_seed(2)
    x = torch.randn(3, 8, requires_grad=True)
    r = torch.randn(3, 8, requires_grad=True)
    w = (torch.rand(8) + 0.5).requires_grad_()
    fn = bound["add_rmsnorm"]
    assert torch.autograd.gradcheck(
        lambda a, b, c: fn(a, b, c, eps=1e-3), (x, r, w), eps=1e-2, atol=2e-2, rtol=2e-2
    )


def _torch_add_rmsnorm(x, r, w, eps=1e-6):
    h = x.double() + r.double()
    return h * (h.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w.double(), h


@pytest.mark.parametrize("used", ["both", "y", "h"])
def test_add_rmsnorm_autograd_with_unused_outputs(bound, used):
    """Gradients when the loss uses both outputs or only one (the other's gradient is zeros),
    against torch autograd of a float64 reference."""
    import torch

    torch.manual_seed(3)
    x = torch.randn(130, 64, requires_grad=True)
    r = torch.randn(130, 64, requires_grad=True)
    w = (torch.rand(64) + 0.5).requires_grad_()
    cy, ch = torch.randn(130, 64), torch.randn(130, 64)

    def loss(y, h):
        return {"both": (y * cy).sum() + (h * ch).sum(), "y": (y * cy).sum(), "h": (h * ch).sum()}[
            used
        ]

    got = torch.autograd.grad(loss(*bound["add_rmsnorm"](x, r, w)), (x, r, w), allow_unused=True)
    leaves = [t.detach().double().requires_grad_() for t in (x, r, w)]
    want = torch.autograd.grad(loss(*_torch_add_rmsnorm(*leaves)), leaves, allow_unused=True)
    for g, wnt in zip(got, want):
        wnt = torch.zeros_like(g, dtype=torch.float64) if wnt is None else wnt
        torch.testing.assert_close(g.double(), wnt, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[0], got[1], rtol=0, atol=0)


def test_add_rmsnorm_opcheck(bound):
    import torch

    op = bound["add_rmsnorm"].torch.op
    cases = [
        (torch.randn(20, 64, requires_grad=True), torch.randn(20, 64, requires_grad=True),
         torch.rand(64, requires_grad=True), 1e-6),
        (torch.randn(2, 3, 64).bfloat16(), torch.randn(2, 3, 64).bfloat16(), torch.rand(64).bfloat16()),
    ]  # fmt: skip
    for args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result
    bwd = bound["add_rmsnorm"].torch.backward_op
    assert str(bwd._schema).startswith(
        "nkikit_local_rmsnorm::add_rmsnorm_backward(Tensor grad_0, Tensor grad_1, Tensor x, "
        "Tensor residual, Tensor weight"
    )
    g = torch.randn(20, 64)
    result = torch.library.opcheck(bwd, (g, g, g, g, torch.rand(64)))
    assert set(result.values()) == {"SUCCESS"}, result


def test_add_rmsnorm_compile_fullgraph_with_backward(bound):
    import torch

    torch._dynamo.reset()
    fn = bound["add_rmsnorm"]
    x = torch.randn(10, 64, requires_grad=True)
    r = torch.randn(10, 64, requires_grad=True)
    w = torch.rand(64, requires_grad=True)

    def loss(a, b, c):
        y, h = fn(a, b, c)
        return (y**2).sum() + (h * 0.5).sum()

    loss(x, r, w).backward()
    eager = [t.grad.clone() for t in (x, r, w)]
    for t in (x, r, w):
        t.grad = None
    compiled = torch.compile(loss, fullgraph=True)  # raises on any graph break
    compiled(x, r, w).backward()
    torch.testing.assert_close([t.grad for t in (x, r, w)], eager)
