"""Cross-entropy against its numpy reference: hypothesis over row counts (ragged last tiles),
vocabulary sizes (one chunk, several chunks, ragged last chunk), dtypes and targets (including
ignored, out-of-range ones), for forward (loss and logsumexp) and backward; large logits
(stability), the manifest, the error contract, and gradcheck through the torch binding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference

OP_KIND = "normalization"


def _targets(n, v, seed, ignore=True):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, v, n).astype(np.int32)
    if ignore and n > 2:
        t[rng.integers(0, n)] = -100  # torch's ignore_index: loss 0, no gradient
        t[rng.integers(0, n)] = v - 1
    return t


@given(
    rows=nst.row_counts(2 * 128),
    v=st.one_of(st.integers(1, 300), st.sampled_from([kernel.CHUNK, kernel.CHUNK + 1, 9000])),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_cross_entropy_matches_reference(rows, v, dtype, seed):
    x = random_inputs((rows, v), dtype, seed, scale=3.0)
    t = _targets(rows, v, seed)
    g = np.random.default_rng(seed).standard_normal(rows).astype(np.float32)
    check_kernel(
        kernel.cross_entropy_forward, reference.cross_entropy_forward, x, t, dtype=dtype,
        op_kind=OP_KIND,
    )  # fmt: skip
    check_kernel(
        kernel.cross_entropy_backward, reference.cross_entropy_backward, g, x, t, dtype=dtype,
        op_kind=OP_KIND,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (129, 7), (128, 2 * kernel.CHUNK + 5)])
def test_cross_entropy_fixed_shapes(shape, dtype):
    x = random_inputs(shape, dtype, seed=1)
    t = _targets(shape[0], shape[1], 1)
    check_kernel(kernel.cross_entropy, reference.cross_entropy, x, t, dtype=dtype, op_kind=OP_KIND)


def test_cross_entropy_is_stable_for_large_logits():
    # exp(1000) overflows fp32; the max-subtracted logsumexp does not
    x = random_inputs((130, 5000), "float32", seed=2) + np.float32(1000.0)
    x[:, 4321] += 50.0
    t = _targets(130, 5000, 2, ignore=False)
    loss = kernel.cross_entropy(x, t)
    assert np.isfinite(loss).all()
    np.testing.assert_allclose(loss, reference.cross_entropy(x, t), rtol=1e-4, atol=1e-3)


def test_cross_entropy_accepts_torch_style_targets():
    x = random_inputs((5, 10), "float32", seed=3)
    t64 = np.array([0, 9, -100, 3, 3], dtype=np.int64)
    np.testing.assert_allclose(
        kernel.cross_entropy(x, t64), reference.cross_entropy(x, t64), rtol=2e-5, atol=2e-5
    )
    assert kernel.cross_entropy(x, t64)[2] == 0.0


def test_cross_entropy_manifest():
    check_manifest(Path(__file__).parent, __package__, op_kind=OP_KIND)


def test_cross_entropy_rejects_bad_inputs():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="targets must have shape"):
        kernel.cross_entropy(x, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        kernel.cross_entropy(np.zeros(8, np.float32), np.zeros(8, np.int32))
    with pytest.raises(TypeError, match="float32, bfloat16"):
        kernel.cross_entropy(x.astype(np.float16), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="grad must have shape"):
        kernel.cross_entropy_backward(np.zeros(3, np.float32), x, np.zeros(4, np.int32))


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_cross_entropy_gradcheck_through_torch_binding():
    """gradcheck in fp32 (NKI has no float64) with eps=1e-2 and atol=rtol=1e-2 for fp32
    rounding, on the logits (targets are indices; through the registry they travel as float32,
    see kernel.toml); the mean loss's gradient is also compared with torch's F.cross_entropy."""
    torch = pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    fns = bind_functions(
        __package__, load_manifest(Path(__file__).parent), "nkikit_test_cross_entropy"
    )
    op = fns["cross_entropy"].torch.op
    torch.manual_seed(0)
    x = torch.randn(6, 11, requires_grad=True)
    t = torch.tensor([0.0, 10.0, 3.0, -100.0, 5.0, 5.0])
    assert torch.autograd.gradcheck(lambda a: op(a, t), (x,), eps=1e-2, atol=1e-2, rtol=1e-2)
    loss = op(x, t).sum() / 5  # mean over the non-ignored rows, as torch's default reduction
    (gx,) = torch.autograd.grad(loss, (x,))
    x64 = x.detach().double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(x64, t.long(), ignore_index=-100)
    (rx,) = torch.autograd.grad(ref, (x64,))
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx.double(), rx, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_cross_entropy_large(dtype):
    x = random_inputs((300, 32000), dtype, seed=4, scale=3.0)
    t = _targets(300, 32000, 4)
    g = np.full(300, 1.0 / 300, np.float32)
    check_kernel(
        kernel.cross_entropy_forward, reference.cross_entropy_forward, x, t, dtype=dtype,
        op_kind=OP_KIND,
    )  # fmt: skip
    check_kernel(
        kernel.cross_entropy_backward, reference.cross_entropy_backward, g, x, t, dtype=dtype,
        op_kind=OP_KIND,
    )  # fmt: skip
