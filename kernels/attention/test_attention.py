"""Attention forward and backward against the float64 numpy reference: hypothesis over batch,
query/KV head counts (grouped-query), sequence lengths (ragged ones too: not multiples of 128
or of the 512-key block), head dims (not multiples of 32), causal or not, scale and dtypes;
the backward's other schedules (head chunks that fit SBUF, a rolled loop over KV heads); the
manifest; the error contract; and the torch binding (gradients against torch autograd of a
float64 torch reference, and gradcheck).

Tolerances: the ``matmul`` kind of ``nkikit.testing`` for float32.  In bfloat16 the probabilities
are rounded to bf16 before the P @ V matmul (and ds before the gradient matmuls), which adds an
absolute error of a few bf16 ulps of |v| (|dO|) per output element on top of the output rounding
that the bf16 rtol covers, so bf16 uses an absolute tolerance of ``BF16_ATOL``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nkikit.typing as nt
from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference

OP_KIND = "matmul"
BF16_ATOL = 2e-2  # forward: |out| <= max|v| ~ 4; error a few 2**-9 ulps of the p @ v terms
BF16_GRAD_ATOL = 6e-2  # backward: ds and p in bf16, contracted over up to 3 * 256 rows


def _atol(dtype, atol=BF16_ATOL):
    return atol if np.dtype(dtype) != np.float32 else None


def _shapes(b, h, hkv, s, d):
    return [(b, h, s, d), (b, hkv, s, d), (b, hkv, s, d)]


heads = st.sampled_from([(1, 1), (2, 1), (2, 2), (3, 1), (4, 2)])  # (H, Hkv)


@settings(max_examples=8)
@given(
    b=st.integers(1, 2),
    hh=heads,
    s=st.sampled_from([100, 128, 256, 300, 640]),
    d=nst.sizes(128, tile=32),
    causal=st.booleans(),
    scale=st.sampled_from([0.0, 0.05, 1.0]),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_attention_matches_reference(b, hh, s, d, causal, scale, dtype, seed):
    q, k, v = random_inputs(_shapes(b, *hh, s, d), dtype, seed)
    check_kernel(
        kernel.attention,
        reference.attention,
        q,
        k,
        v,
        dtype=dtype,
        op_kind=OP_KIND,
        atol=_atol(dtype),
        causal=causal,
        scale=scale,
    )


@settings(max_examples=8)
@given(
    hh=heads,
    s=st.sampled_from([100, 128, 256, 200]),
    d=nst.sizes(128, tile=32),
    causal=st.booleans(),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_attention_backward_matches_reference(hh, s, d, causal, dtype, seed):
    g, q, k, v = random_inputs([(1, hh[0], s, d), *_shapes(1, *hh, s, d)], dtype, seed)
    check_kernel(
        kernel.attention_backward,
        reference.attention_backward,
        g,
        q,
        k,
        v,
        dtype=dtype,
        op_kind=OP_KIND,
        atol=_atol(dtype, BF16_GRAD_ATOL),
        causal=causal,
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_fixed_shape(dtype, causal):
    q, k, v = random_inputs(_shapes(1, 4, 2, 256, 128), dtype, seed=1)
    check_kernel(
        kernel.attention,
        reference.attention,
        q,
        k,
        v,
        dtype=dtype,
        op_kind=OP_KIND,
        atol=_atol(dtype),
        causal=causal,
    )


@pytest.mark.parametrize("s", [1, 5, 130, 513])
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_sequence_forward_and_backward(s, causal):
    # partial last query and key tiles (and a 512-key block that ends one key in)
    g, q, k, v = random_inputs([(1, 2, s, 24), *_shapes(1, 2, 1, s, 24)], "float32", seed=s)
    check_kernel(kernel.attention, reference.attention, q, k, v, op_kind=OP_KIND, causal=causal)
    check_kernel(
        kernel.attention_backward,
        reference.attention_backward,
        g,
        q,
        k,
        v,
        op_kind=OP_KIND,
        causal=causal,
    )


@pytest.mark.parametrize(
    ("budget", "unroll", "chunk"),
    [(60_000, None, (2, True)), (40_000, None, (1, False)), (None, 1, None)],
    ids=["chunks-overlapped", "chunks-flushed", "rolled-kv-loop"],
)
def test_backward_schedules(monkeypatch, budget, unroll, chunk):
    # the head chunking (dK/dV summed in SBUF over chunks, with and without prefetch) and the
    # rolled loop over KV heads that large shapes use, forced on small shapes (unique shapes,
    # so that no cached trace of another schedule is reused)
    d = {60_000: 56, 40_000: 40}.get(budget, 72)
    if budget is not None:
        monkeypatch.setattr(kernel, "BWD_SBUF_BUDGET", budget)
        assert kernel._bwd_layout(3, 300, d, 4) == chunk
    if unroll is not None:
        monkeypatch.setattr(kernel, "BWD_UNROLL_STEPS", unroll)
    g, q, k, v = random_inputs([(2, 6, 300, d), *_shapes(2, 6, 2, 300, d)], "float32", seed=7)
    check_kernel(
        kernel.attention_backward,
        reference.attention_backward,
        g,
        q,
        k,
        v,
        op_kind=OP_KIND,
        causal=True,
    )


def test_attention_large_scores_are_stable():
    # scores up to ~1e4: the online max keeps exp() finite and the result matches
    q, k, v = random_inputs(_shapes(1, 1, 1, 256, 32), "float32", seed=2)
    check_kernel(
        kernel.attention, reference.attention, q * 30, k * 30, v, op_kind=OP_KIND, atol=1e-4
    )


def test_causal_first_row_is_first_value():
    # query 0 sees only key 0, so its output is v[..., 0, :] exactly up to rounding
    q, k, v = random_inputs(_shapes(1, 2, 1, 128, 16), "float32", seed=3)
    out = kernel.attention(q, k, v, causal=True)
    np.testing.assert_allclose(out[0, :, 0], np.repeat(v[0, :, 0], 2, axis=0), rtol=1e-6)


def test_attention_manifest():
    # the examples run below with the bf16 tolerance of this kernel
    manifest = check_manifest(
        Path(__file__).parent, __package__, op_kind=OP_KIND, run_examples=False
    )
    fn = manifest.functions["attention"]
    shapes = [tuple(fn.example[n]) for n in fn.inputs]
    for dt in fn.dtypes:
        q, k, v = random_inputs(shapes, dt, 0)
        check_kernel(
            kernel.attention,
            reference.attention,
            q,
            k,
            v,
            dtype=dt,
            op_kind=OP_KIND,
            atol=_atol(dt),
            **fn.attrs,
        )


def test_attention_rejects_bad_inputs():
    z = np.zeros
    f32 = np.float32
    with pytest.raises(ValueError, match="must be 4-D"):
        kernel.attention(z((128, 16), f32), z((128, 16), f32), z((128, 16), f32))
    with pytest.raises(ValueError, match="sequence length"):
        kernel.attention(z((1, 1, 0, 16), f32), z((1, 1, 0, 16), f32), z((1, 1, 0, 16), f32))
    with pytest.raises(ValueError, match="sequence length"):
        big = z((1, 1, kernel.MAX_S + 1, 16), f32)
        kernel.attention(big, big, big)
    with pytest.raises(ValueError, match="must divide"):
        kernel.attention(z((1, 3, 128, 16), f32), z((1, 2, 128, 16), f32), z((1, 2, 128, 16), f32))
    with pytest.raises(ValueError, match="head dim"):
        kernel.attention(
            z((1, 1, 128, 129), f32), z((1, 1, 128, 129), f32), z((1, 1, 128, 129), f32)
        )
    with pytest.raises(ValueError, match="k and v must both be"):
        kernel.attention(z((1, 1, 128, 16), f32), z((1, 1, 256, 16), f32), z((1, 1, 128, 16), f32))
    with pytest.raises(TypeError, match="float32, bfloat16"):
        a = z((1, 1, 128, 16), np.float16)
        kernel.attention(a, a, a)
    with pytest.raises(ValueError, match="scale must be positive"):
        a = z((1, 1, 128, 16), f32)
        kernel.attention(a, a, a, scale=-1.0)
    with pytest.raises(ValueError, match="grad must have"):
        a = z((1, 1, 128, 16), f32)
        kernel.attention_backward(z((1, 1, 128, 8), f32), a, a, a)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_attention_longest_sequence_fits_sbuf(dtype):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    s = kernel.MAX_S
    spec_q = nt.tensor[[1, 1, s, 128], dtype]
    kernel.flash_attention_fwd_kernel.ir(spec_q, spec_q, spec_q, False, 0.1, True)


# -- torch binding -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bound():
    """The manifest's function bound as a torch op without publishing (a unique namespace)."""
    pytest.importorskip("torch")
    from nkikit.registry.manifest import load_manifest
    from nkikit.registry.runtime import bind_functions

    manifest = load_manifest(Path(__file__).parent)
    return bind_functions(__package__, manifest, "nkikit_test_attention")["attention"]


def _torch_ref(q, k, v, causal=True):
    import torch

    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize("causal", [True, False])
def test_torch_gradients_match_autograd_of_the_reference(bound, causal):
    import torch

    torch.manual_seed(0)
    q = torch.randn(1, 4, 256, 32, requires_grad=True)
    k = torch.randn(1, 2, 256, 32, requires_grad=True)
    v = torch.randn(1, 2, 256, 32, requires_grad=True)
    g = torch.randn(1, 4, 256, 32)
    out = bound(q, k, v, causal=causal)
    out.backward(g)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out_ref = _torch_ref(*ref, causal=causal)
    out_ref.backward(g.double())
    torch.testing.assert_close(out.double(), out_ref, atol=1e-5, rtol=1e-4)
    for t, r in zip((q, k, v), ref):
        torch.testing.assert_close(t.grad.double(), r.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_torch_gradcheck_fp32(bound):
    """The kernels compute in fp32 (NKI has no float64), so gradcheck runs in fp32 with a large
    finite-difference step and tolerances sized for fp32 rounding, and in fast mode (random
    projections of the Jacobian: a few dozen kernel calls instead of one per input element);
    the test above checks the gradients tightly against torch autograd of a float64 reference."""
    import torch

    torch.manual_seed(1)
    q = torch.randn(1, 2, 128, 8, requires_grad=True)
    k = torch.randn(1, 1, 128, 8, requires_grad=True)
    v = torch.randn(1, 1, 128, 8, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: bound(a, b, c, causal=True),
        (q, k, v),
        eps=1e-2,
        atol=2e-2,
        rtol=2e-2,
        fast_mode=True,
    )


def test_torch_opcheck(bound):
    import torch

    q = torch.randn(1, 2, 128, 16, requires_grad=True)
    kv = torch.randn(1, 1, 128, 16, requires_grad=True)
    result = torch.library.opcheck(bound.op, (q, kv, kv.detach().clone().requires_grad_()))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.slow
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_attention_large(dtype):
    g, q, k, v = random_inputs([(2, 4, 1024, 128), *_shapes(2, 4, 2, 1024, 128)], dtype, seed=4)
    check_kernel(
        kernel.attention,
        reference.attention,
        q,
        k,
        v,
        dtype=dtype,
        op_kind=OP_KIND,
        atol=_atol(dtype),
    )
    check_kernel(
        kernel.attention_backward,
        reference.attention_backward,
        g,
        q,
        k,
        v,
        dtype=dtype,
        op_kind=OP_KIND,
        atol=_atol(dtype, BF16_GRAD_ATOL),
    )
