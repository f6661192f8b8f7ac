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
        (2, 130, 2 * (kernel.UNIT + 88)),  # pairs in several units, several PSUM banks
        (1, 3, 2 * (kernel.PSUM_TRIG_PAIRS + 76)),  # cos read from SBUF, not PSUM
        (1, 130, 2 * (kernel.TILE_BYTES // 4) + 104),  # rows over TILE_BYTES: output in place
    ],
)
def test_rope_long_head_dims(shape, dtype, layout):
    s, d = shape[-2:]
    x, g, c, sn = random_inputs([shape, shape, (s, d // 2), (s, d // 2)], dtype, seed=2)
    check_kernel(kernel.rope, reference.rope, x, c, sn, dtype=dtype, layout=layout)
    check_kernel(
        kernel.rope_backward, reference.rope_backward, g, x, c, sn, dtype=dtype, layout=layout
    )


@pytest.mark.parametrize("layout", kernel.LAYOUTS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_rope_scalar_engine_units(dtype, layout):
    # 65 heads of D = 128: x tiles of 33 + 32 heads (bf16) or 3 x 22 (fp32), each with a
    # masked-out head in its last tile and enough heads per unit for the ScalarE to make some
    # cos products (checked below: activations with a per-partition scale tile); 130
    # positions leave a ragged position tile
    shape = (5, 13, 130, 128)
    x, g, c, sn = random_inputs([shape, shape, (130, 64), (130, 64)], dtype, seed=3)
    check_kernel(kernel.rope, reference.rope, x, c, sn, dtype=dtype, layout=layout)
    check_kernel(
        kernel.rope_backward, reference.rope_backward, g, x, c, sn, dtype=dtype, layout=layout
    )
    dt = kernel.dtypes.as_dtype(dtype)
    ir = kernel.rope_kernel.ir(
        x.astype(dt).reshape(65, 130, 128), c.astype(dt), sn.astype(dt), layout != "half", False
    )
    scaled = [
        op
        for op in _ops(ir.body)
        if getattr(op, "prim", "") == "activation" and not isinstance(op.ins[2], float)
    ]
    assert scaled, "no ScalarE products with a per-position scale"


def _ops(stmts):
    """Every statement of an IR body, loop bodies included."""
    for stmt in stmts:
        yield stmt
        yield from _ops(getattr(stmt, "body", []))


@pytest.mark.parametrize("layout", kernel.LAYOUTS)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["x", "grad", "cos", "sin"])
def test_rope_non_finite_input_stays_local(where, bad, dtype, layout):
    """One non-finite input element changes only the outputs the formula (and torch's own
    x * cos + rotate_half(x) * sin) makes it touch: an x or grad element only its own pair at
    its position and head; a cos or sin entry only its position and pair, in every head.  In
    particular no other position of its 128-position tile (the partitions) turns NaN."""
    s, d = 130, 64
    shape = (33, s, d)  # 33 heads of D = 64: ScalarE units too (S_MIN_HEADS), a ragged tile
    x, g, c, sn = random_inputs([shape, shape, (s, d // 2), (s, d // 2)], dtype, seed=4)
    head, pos, col = 7, 5, 10  # element 10 is in pair 10 (half) or pair 5 (interleaved)
    if where in ("x", "grad"):
        (x if where == "x" else g)[head, pos, col] = bad
        touched = 2  # the two outputs of its pair
    else:
        (c if where == "cos" else sn)[pos, col] = bad
        touched = 2 * shape[0]  # pair `col` at `pos` in every head
    if where == "grad":
        fn, ref, args = kernel.rope_backward, reference.rope_backward, (g, x, c, sn)
    else:
        fn, ref, args = kernel.rope, reference.rope, (x, c, sn)
    # check_kernel matches NaN to NaN and infinities exactly, everything else in tolerance
    out = check_kernel(fn, ref, *args, dtype=dtype, layout=layout)[0]
    bad_rows = np.argwhere(~np.isfinite(out.astype(np.float32)))
    assert len(bad_rows) == touched
    assert set(bad_rows[:, 1]) == {pos}  # the other 129 positions are all finite


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
