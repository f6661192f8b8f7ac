"""Cross-entropy against its numpy reference: hypothesis over row counts (ragged last tiles),
vocabulary sizes (one chunk, several chunks, ragged last chunk), dtypes and targets (including
ignored, out-of-range ones), for forward (loss and logsumexp) and backward; the indirect-DMA
design (target logits gathered, target gradients scattered, in partition groups for large
vocabularies); large logits (stability), the manifest, the error contract, and gradcheck
through the torch binding."""

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
@pytest.mark.parametrize("shape", [(1, 1), (129, 7), (128, 2 * kernel.CHUNK + 7)])
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


def test_cross_entropy_rounds_float_targets():
    x = random_inputs((6, 10), "float32", seed=5)
    t_float = np.array([0.0, 2.9999998, -100.0, 9.0, 4.2, 10.0], np.float32)
    t_int = np.array([0, 3, -100, 9, 4, 10], np.int32)
    np.testing.assert_array_equal(kernel.cross_entropy(x, t_float), kernel.cross_entropy(x, t_int))
    assert kernel.cross_entropy(x, t_float)[[2, 5]].tolist() == [0.0, 0.0]


def test_kernels_zero_rows_whose_target_is_out_of_range():
    """The jit kernels themselves (no host-side clipping of the targets): an out-of-range
    target is clamped for the gather and the scatter, and its row's loss is zeroed."""
    rng = np.random.default_rng(7)
    x = random_inputs((130, 50), "float32", seed=7)
    t = rng.integers(0, 50, 130).astype(np.int32)
    bad = [0, 5, 77, 129]
    t[bad] = [-100, 50, 2**31 - 1, -(2**31)]
    loss, lse = kernel.cross_entropy_kernel(x, t)
    assert loss[bad].tolist() == [0.0] * 4
    np.testing.assert_allclose(loss, reference.cross_entropy(x, t), rtol=2e-5, atol=2e-5)
    g = rng.standard_normal(130).astype(np.float32)
    g[bad] = 0.0  # the wrapper's contract: ignored rows carry no gradient
    grad = kernel.cross_entropy_backward_kernel(g, x, t, lse)
    assert not grad[bad].any()
    np.testing.assert_allclose(
        grad, reference.cross_entropy_backward(g, x, t)[0], rtol=2e-5, atol=2e-6
    )


def test_target_logits_move_by_indirect_dma():
    """The forward gathers x[r, t[r]] and the backward scatters the target column by index
    tile: no per-element selection is left on the engines."""
    import nkikit.language as nl
    import nkikit.typing as nt
    from nkikit.compiler import compile

    n, v = 300, 1000
    fwd = compile(
        kernel.cross_entropy_kernel, nt.tensor[[n, v], nl.bfloat16], nt.tensor[[n], nl.int32]
    )
    bwd = compile(
        kernel.cross_entropy_backward_kernel,
        nt.tensor[[n], nl.float32],
        nt.tensor[[n, v], nl.bfloat16],
        nt.tensor[[n], nl.int32],
        nt.tensor[[n], nl.float32],
    )
    f_ops = [i.opcode for i in fwd.infos]
    b_ops = [i.opcode for i in bwd.infos]
    assert f_ops.count("DMA_HBM_TO_SBUF_INDIRECT") == 1  # one per row tile, in the loop
    assert b_ops.count("DMA_SBUF_TO_HBM_INDIRECT") == 1
    assert "RANGE_SELECT" not in f_ops and "SCALAR_TENSOR_TENSOR" not in b_ops


def test_large_vocabularies_gather_in_partition_groups(monkeypatch):
    """Offsets p*V + t stay below 2**24 (exact in the engines' fp32) by gathering in groups of
    partitions; shrink the limit to exercise groups of 32 and 4 on small shapes."""
    for exact in (1 << 12, 1 << 9):
        monkeypatch.setattr(kernel, "_EXACT", exact)
        kernel.cross_entropy_kernel._cache.clear()
        kernel.cross_entropy_backward_kernel._cache.clear()
        assert kernel._group(100, 128) == (32 if exact == 1 << 12 else 4)
        x = random_inputs((130, 100), "bfloat16", seed=8, scale=3.0)
        t = _targets(130, 100, 8)
        g = np.random.default_rng(8).standard_normal(130).astype(np.float32)
        check_kernel(
            kernel.cross_entropy_forward, reference.cross_entropy_forward, x, t,
            dtype="bfloat16", op_kind=OP_KIND,
        )  # fmt: skip
        check_kernel(
            kernel.cross_entropy_backward, reference.cross_entropy_backward, g, x, t,
            dtype="bfloat16", op_kind=OP_KIND,
        )  # fmt: skip
    kernel.cross_entropy_kernel._cache.clear()
    kernel.cross_entropy_backward_kernel._cache.clear()


def test_row_tiles_in_blocks(monkeypatch):
    """Row tiles go in blocks of TILES_PER_BLOCK (their per-tile results live in SBUF until the
    block ends); with 2 per block, 522 rows are 5 tiles in 3 blocks, the last tile fully
    masked."""
    monkeypatch.setattr(kernel, "TILES_PER_BLOCK", 2)
    kernel.cross_entropy_kernel._cache.clear()
    kernel.cross_entropy_backward_kernel._cache.clear()
    assert kernel._blocks(522, 128) == (2, 3)
    x = random_inputs((522, 70), "float32", seed=9)
    t = _targets(522, 70, 9)
    g = np.random.default_rng(9).standard_normal(522).astype(np.float32)
    check_kernel(
        kernel.cross_entropy_forward, reference.cross_entropy_forward, x, t, dtype="float32",
        op_kind=OP_KIND,
    )  # fmt: skip
    check_kernel(
        kernel.cross_entropy_backward, reference.cross_entropy_backward, g, x, t,
        dtype="float32", op_kind=OP_KIND,
    )  # fmt: skip
    kernel.cross_entropy_kernel._cache.clear()
    kernel.cross_entropy_backward_kernel._cache.clear()


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
    rounding, on the logits (targets are int64 class indices, as torch users have them: not
    differentiable, see input_dtypes in kernel.toml); the mean loss's gradient is also compared
    with torch's F.cross_entropy."""
    torch = pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    fns = bind_functions(
        __package__, load_manifest(Path(__file__).parent), "nkikit_test_cross_entropy"
    )
    op = fns["cross_entropy"].torch.op
    torch.manual_seed(0)
    x = torch.randn(6, 11, requires_grad=True)
    t = torch.tensor([0, 10, 3, -100, 5, 5])
    assert torch.autograd.gradcheck(lambda a: op(a, t), (x,), eps=1e-2, atol=1e-2, rtol=1e-2)
    loss = op(x, t).sum() / 5  # mean over the non-ignored rows, as torch's default reduction
    (gx,) = torch.autograd.grad(loss, (x,))
    x64 = x.detach().double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(x64, t, ignore_index=-100)
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
