"""RoPE against its numpy reference: hypothesis over head counts, sequence lengths (ragged
last position tile), head dims, dtypes and both layouts, for forward and backward; the manifest,
the error contract, and gradcheck through the torch binding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference


def _inputs(bh, s, d, dtype, seed):
    return random_inputs([(bh, s, d), (bh, s, d), (s, d // 2), (s, d // 2)], dtype, seed)


@given(
    bh=st.integers(1, 70),
    s=nst.row_counts(2 * 128),
    half_d=st.integers(1, 80),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    layout=st.sampled_from(kernel.LAYOUTS),
    seed=nst.seeds(),
)
def test_rope_matches_reference(bh, s, half_d, dtype, layout, seed):
    x, g, c, sn = _inputs(bh, s, 2 * half_d, dtype, seed)
    check_kernel(kernel.rope, reference.rope, x, c, sn, dtype=dtype, layout=layout)
    check_kernel(
        kernel.rope_backward, reference.rope_backward, g, x, c, sn, dtype=dtype, layout=layout
    )


@pytest.mark.parametrize("layout", kernel.LAYOUTS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 3, 129, 64), (130, 8), (40, 128, 128)])
def test_rope_fixed_shapes(shape, dtype, layout):
    s, d = shape[-2:]
    x, g, c, sn = random_inputs([shape, shape, (s, d // 2), (s, d // 2)], dtype, seed=1)
    check_kernel(kernel.rope, reference.rope, x, c, sn, dtype=dtype, layout=layout)
    check_kernel(
        kernel.rope_backward, reference.rope_backward, g, x, c, sn, dtype=dtype, layout=layout
    )


@pytest.mark.parametrize("layout", kernel.LAYOUTS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (2, 130, 2 * (kernel.GROUP_COLS + 88)),  # pairs in two PSUM-bank chunks
        (1, 3, 2 * (kernel.PSUM_TRIG_PAIRS + 76)),  # cos/sin read from SBUF, not PSUM
    ],
)
def test_rope_long_head_dims(shape, dtype, layout):
    s, d = shape[-2:]
    x, g, c, sn = random_inputs([shape, shape, (s, d // 2), (s, d // 2)], dtype, seed=2)
    check_kernel(kernel.rope, reference.rope, x, c, sn, dtype=dtype, layout=layout)
    check_kernel(
        kernel.rope_backward, reference.rope_backward, g, x, c, sn, dtype=dtype, layout=layout
    )


def test_rope_is_a_rotation():
    # with real angles, rope preserves each pair's norm, and backward undoes forward
    s, d = 130, 16
    theta = np.arange(s)[:, None] * 10000.0 ** (-np.arange(d // 2) / (d // 2))
    c, sn = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    x = np.random.default_rng(0).standard_normal((3, s, d)).astype(np.float32)
    y = kernel.rope(x, c, sn)
    np.testing.assert_allclose(
        y[..., :8] ** 2 + y[..., 8:] ** 2, x[..., :8] ** 2 + x[..., 8:] ** 2, rtol=1e-5, atol=1e-5
    )
    (back, _, _) = kernel.rope_backward(y, x, c, sn)
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)


def test_rope_manifest():
    check_manifest(Path(__file__).parent, __package__)


def test_rope_rejects_bad_inputs():
    x = np.zeros((2, 4, 8), np.float32)
    c = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="cos must have shape"):
        kernel.rope(x, np.zeros((4, 8), np.float32), c)
    with pytest.raises(ValueError, match="must be even"):
        kernel.rope(np.zeros((4, 7), np.float32), c, c)
    with pytest.raises(ValueError, match="layout must be one of"):
        kernel.rope(x, c, c, layout="neox")
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.rope(x, c.astype(np.float16), c)


@pytest.mark.parametrize("layout", kernel.LAYOUTS)
@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_rope_gradcheck_through_torch_binding(layout):
    """gradcheck in fp32 (NKI has no float64) with eps=1e-2 and atol=rtol=1e-2 for fp32
    rounding, on x only: cos/sin are constant tables (their gradient is returned as zeros)."""
    torch = pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    fns = bind_functions(__package__, load_manifest(Path(__file__).parent), "nkikit_test_rope")
    op = fns["rope"].torch.op
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, requires_grad=True)
    c, sn = torch.randn(5, 4), torch.randn(5, 4)
    assert torch.autograd.gradcheck(
        lambda t: op(t, c, sn, layout), (x,), eps=1e-2, atol=1e-2, rtol=1e-2
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", kernel.LAYOUTS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rope_large(dtype, layout):
    x, g, c, sn = _inputs(8, 1000, 128, dtype, seed=2)
    check_kernel(kernel.rope, reference.rope, x, c, sn, dtype=dtype, layout=layout)
    check_kernel(
        kernel.rope_backward, reference.rope_backward, g, x, c, sn, dtype=dtype, layout=layout
    )
