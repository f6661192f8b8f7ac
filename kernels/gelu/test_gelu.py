"""GELU against its numpy reference: hypothesis over row counts (ragged last tiles), free
sizes (ragged last column chunk), dtypes and both approximations, for forward and backward;
the manifest, the error contract, and gradcheck through the torch binding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference

OP_KIND = "transcendental"
# the tanh-form derivative chains ~7 fp32 instructions; a few more fp32 ulps than one activation
BACKWARD_TANH_FP32 = {"rtol": 2e-5, "atol": 2e-5}


def _bwd_tol(dtype, approximate):
    return BACKWARD_TANH_FP32 if approximate == "tanh" and str(dtype) == "float32" else {}


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(2 * kernel.CHUNK + 64),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    approximate=st.sampled_from(kernel.APPROXIMATIONS),
    seed=nst.seeds(),
)
def test_gelu_matches_reference(rows, d, dtype, approximate, seed):
    x = random_inputs((rows, d), dtype, seed, scale=3.0)
    check_kernel(
        kernel.gelu, reference.gelu, x, dtype=dtype, op_kind=OP_KIND, approximate=approximate
    )


@given(
    rows=nst.row_counts(3 * 128),
    d=nst.free_sizes(2 * kernel.CHUNK + 64),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    approximate=st.sampled_from(kernel.APPROXIMATIONS),
    seed=nst.seeds(),
)
def test_gelu_backward_matches_reference(rows, d, dtype, approximate, seed):
    g, x = random_inputs([(rows, d)] * 2, dtype, seed, scale=3.0)
    check_kernel(
        kernel.gelu_backward,
        reference.gelu_backward,
        g,
        x,
        dtype=dtype,
        op_kind=OP_KIND,
        approximate=approximate,
        **_bwd_tol(dtype, approximate),
    )


@pytest.mark.parametrize("approximate", kernel.APPROXIMATIONS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(128, 512), (129, 7), (1, 1), (2, 3, 2049), (7,)])
def test_gelu_fixed_shapes(shape, dtype, approximate):
    g, x = random_inputs([shape] * 2, dtype, seed=1, scale=3.0)
    check_kernel(
        kernel.gelu, reference.gelu, x, dtype=dtype, op_kind=OP_KIND, approximate=approximate
    )
    check_kernel(
        kernel.gelu_backward,
        reference.gelu_backward,
        g,
        x,
        dtype=dtype,
        op_kind=OP_KIND,
        approximate=approximate,
        **_bwd_tol(dtype, approximate),
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_gelu_tanh_backward_where_the_derivative_crosses_zero(dtype):
    # gelu' (tanh form) crosses zero near x = -0.7518: there the kernel's 1 + 2 k0 v cancels
    # to a few thousandths, so every input of it must carry fp32 accuracy (bf16 has 128
    # values in [-1, -0.5); all of them, against grads of both signs and several sizes)
    dt = kernel.dtypes.as_dtype(dtype)
    grid = np.linspace(-1.0, -0.5, 1024, endpoint=False).astype(np.float32).astype(dt)
    x = np.tile(grid, (130, 1))
    g = np.random.default_rng(5).normal(0.0, 2.0, size=x.shape).astype(np.float32).astype(dt)
    check_kernel(
        kernel.gelu_backward,
        reference.gelu_backward,
        g,
        x,
        dtype=dtype,
        op_kind=OP_KIND,
        approximate="tanh",
        **_bwd_tol(dtype, "tanh"),
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_gelu_tanh_backward_long_rows(dtype):
    # rows over the column tile: several column tiles, a ragged last one (and a ragged last
    # unit and PSUM bank piece), two row tiles per wavefront plus a ragged row tile
    itemsize = kernel.dtypes.as_dtype(dtype).itemsize
    d = kernel.TANH_TUNING[itemsize].tile_bytes // itemsize + 700
    g, x = random_inputs([(300, d)] * 2, dtype, seed=6, scale=3.0)
    check_kernel(
        kernel.gelu_backward,
        reference.gelu_backward,
        g,
        x,
        dtype=dtype,
        op_kind=OP_KIND,
        approximate="tanh",
        **_bwd_tol(dtype, "tanh"),
    )


@pytest.mark.parametrize("approximate", kernel.APPROXIMATIONS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["x", "grad", "forward"])
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_gelu_non_finite_input_stays_local(where, bad, dtype, approximate):
    """One non-finite element of x (or of grad) changes only its own output, as torch's
    elementwise formula does (NaN for x = +-inf in the backward, where it multiplies 0 by inf;
    +-inf or NaN for grad = +-inf or NaN).  No engine sums over partitions, so the other 127
    rows of its tile (and every other element) stay finite and match the reference.  Large
    finite x (+-1e10, where x**3 is far beyond any gelu' change) stays exact too."""
    shape = (130, 1100)  # two row tiles (one ragged), several units and PSUM bank pieces
    g, x = random_inputs([shape, shape], dtype, seed=7, scale=3.0)
    row, col = 17, 700
    x[row + 1, col] = 1e10
    x[row + 2, col] = -1e10
    if where == "grad":
        x[row, col] = 0.5  # gelu'(0.5) is nonzero: inf * gelu' is inf, not NaN
        g[row, col] = bad
    else:
        x[row, col] = bad
    tol = _bwd_tol(dtype, approximate)
    if where == "forward":
        fn, ref, args, tol = kernel.gelu, reference.gelu, (x,), {}
    else:
        fn, ref, args = kernel.gelu_backward, reference.gelu_backward, (g, x)
    # check_kernel matches NaN to NaN and infinities exactly, everything else in tolerance
    out = check_kernel(
        fn, ref, *args, dtype=dtype, op_kind=OP_KIND, approximate=approximate, **tol
    )[0]
    non_finite = np.argwhere(~np.isfinite(out.astype(np.float32)))
    assert non_finite.tolist() == [[row, col]]


def test_gelu_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_gelu_rejects_bad_inputs():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="approximate must be one of"):
        kernel.gelu(x, approximate="sigmoid")
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.gelu(x.astype(np.float16))
    with pytest.raises(ValueError, match="grad must have shape"):
        kernel.gelu_backward(np.zeros((4, 7), np.float32), x)


@pytest.mark.parametrize("approximate", kernel.APPROXIMATIONS)
@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_gelu_gradcheck_through_torch_binding(approximate):
    """The kernels compute in fp32 (NKI has no float64), so gradcheck runs in fp32 with a
    finite-difference step and tolerances sized for fp32 rounding (eps=1e-2, atol=rtol=1e-2);
    the gradient is also compared tightly with torch autograd of F.gelu in float64."""
    torch = pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    fns = bind_functions(__package__, load_manifest(Path(__file__).parent), "nkikit_test_gelu")
    op = fns["gelu"].torch.op
    torch.manual_seed(0)
    x = (2 * torch.randn(3, 8)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: op(t, approximate), (x,), eps=1e-2, atol=1e-2, rtol=1e-2
    )
    y = op(x, approximate)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, (x,), g)
    x64 = x.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(
        torch.nn.functional.gelu(x64, approximate=approximate), (x64,), g.double()
    )
    torch.testing.assert_close(gx.double(), rx, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("approximate", kernel.APPROXIMATIONS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_gelu_large(dtype, approximate):
    g, x = random_inputs([(1000, 4200)] * 2, dtype, seed=2, scale=3.0)
    check_kernel(
        kernel.gelu, reference.gelu, x, dtype=dtype, op_kind=OP_KIND, approximate=approximate
    )
    check_kernel(
        kernel.gelu_backward,
        reference.gelu_backward,
        g,
        x,
        dtype=dtype,
        op_kind=OP_KIND,
        approximate=approximate,
        **_bwd_tol(dtype, approximate),
    )
