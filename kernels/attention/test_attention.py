"""Attention forward and backward against the float64 numpy reference, for both softmax
algorithms of the forward (``two_pass`` and ``online``; the backward with the ``lse`` of
each): hypothesis over batch, query/KV head counts (grouped-query), sequence lengths (ragged
ones too: not multiples of 128 or of the 512-key block; several key blocks, so the online
forward rescales), head dims (not multiples of 32), causal or not, scale and dtypes; a running
max that grows block after block; the two algorithms against each other (out and lse) and
their lse against the reference; the backward's other schedules (head chunks that fit SBUF,
a rolled loop over KV heads); the manifest; the error contract; and the torch binding
(gradients against torch autograd of a float64 torch reference, and gradcheck).

Tolerances: the ``matmul`` kind of ``nkikit.testing`` for float32.  In bfloat16 the probabilities
are rounded to bf16 before the P @ V matmul (and ds before the gradient matmuls), which adds an
absolute error of a few bf16 ulps of |v| (|dO|) per output element on top of the output rounding
that the bf16 rtol covers, so bf16 uses an absolute tolerance of ``BF16_ATOL``.  The saved
log-sum-exp ``log(l) - scale * u`` sums probabilities rounded to bf16 (relative error up to
2**-8 each) into ``l``, so in bf16 it is within about 2**-8 of the reference (``LSE_ATOL``)."""

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
LSE_ATOL = {"float32": 2e-5, "bfloat16": 8e-3}  # |lse| <= ~30 here; bf16: 2 * 2**-8 with margin
SOFTMAX = kernel.SOFTMAX


def _atol(dtype, atol=BF16_ATOL):
    return atol if np.dtype(dtype) != np.float32 else None


def _shapes(b, h, hkv, s, d):
    return [(b, h, s, d), (b, hkv, s, d), (b, hkv, s, d)]


heads = st.sampled_from([(1, 1), (2, 1), (2, 2), (3, 1), (4, 2)])  # (H, Hkv)


@pytest.mark.parametrize("softmax", SOFTMAX)
@settings(max_examples=8)
@given(
    b=st.integers(1, 2),
    hh=heads,
    s=st.sampled_from([100, 128, 256, 300, 640, 1030]),
    d=nst.sizes(128, tile=32),
    causal=st.booleans(),
    scale=st.sampled_from([0.0, 0.05, 1.0]),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_attention_matches_reference(softmax, b, hh, s, d, causal, scale, dtype, seed):
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
        softmax=softmax,
    )


@pytest.mark.parametrize("softmax", SOFTMAX)
@settings(max_examples=8)
@given(
    hh=heads,
    s=st.sampled_from([100, 128, 256, 200, 600]),
    d=nst.sizes(128, tile=32),
    causal=st.booleans(),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_attention_backward_matches_reference(softmax, hh, s, d, causal, dtype, seed):
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
        softmax=softmax,
    )


@pytest.mark.parametrize("softmax", SOFTMAX)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_fixed_shape(dtype, causal, softmax):
    # two key blocks (512 + 256 keys)
    q, k, v = random_inputs(_shapes(1, 4, 2, 768, 128), dtype, seed=1)
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
        softmax=softmax,
    )


def _growing_max(dtype, seed: int, s: int = 1100):
    """GQA inputs whose scores grow along the keys (|q| . |k| times a ramp): the row max of
    every key block exceeds the previous one, so the online forward rescales its accumulator
    by factors far below 1 (the scores span ~0.2 to ~25 after the scale of 1/8)."""
    q, k, v = random_inputs(_shapes(1, 2, 1, s, 64), dtype, seed)
    ramp = np.linspace(0.2, 3.0, s)[None, None, :, None]
    k = (np.abs(k.astype(np.float32)) * ramp).astype(k.dtype)
    return np.abs(q), k, v


@pytest.mark.parametrize("softmax", SOFTMAX)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_growing_max_matches_reference(dtype, causal, softmax):
    q, k, v = _growing_max(dtype, seed=11)
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
        scale=0.125,
        softmax=softmax,
    )


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_algorithms_agree(dtype, causal):
    # the forward kernels themselves: out and the lse the backward consumes, each algorithm
    # against the other and the lse against the float64 log-sum-exp
    q, k, v = _growing_max(dtype, seed=12)
    res = {
        sm: [
            np.asarray(x, np.float64) for x in kernel.FWD_KERNELS[sm](q, k, v, causal, 0.125, True)
        ]
        for sm in SOFTMAX
    }
    (out_2p, lse_2p), (out_on, lse_on) = res["two_pass"], res["online"]
    atol = BF16_ATOL if dtype == "bfloat16" else 2e-6
    np.testing.assert_allclose(out_on, out_2p, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(lse_on, lse_2p, rtol=0, atol=LSE_ATOL[dtype])
    lse_ref = reference.logsumexp(q, k, causal=causal, scale=0.125)
    for lse in (lse_2p, lse_on):
        np.testing.assert_allclose(lse, lse_ref, rtol=0, atol=LSE_ATOL[dtype])
    assert not np.array_equal(out_on, out_2p)  # two computations, not one kernel twice


@pytest.mark.parametrize("softmax", SOFTMAX)
@pytest.mark.parametrize("s", [1, 5, 130, 513])
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_sequence_forward_and_backward(s, causal, softmax):
    # partial last query and key tiles (and a 512-key block that ends one key in)
    g, q, k, v = random_inputs([(1, 2, s, 24), *_shapes(1, 2, 1, s, 24)], "float32", seed=s)
    check_kernel(
        kernel.attention,
        reference.attention,
        q,
        k,
        v,
        op_kind=OP_KIND,
        causal=causal,
        softmax=softmax,
    )
    check_kernel(
        kernel.attention_backward,
        reference.attention_backward,
        g,
        q,
        k,
        v,
        op_kind=OP_KIND,
        causal=causal,
        softmax=softmax,
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


@pytest.mark.parametrize("softmax", SOFTMAX)
@pytest.mark.parametrize(("s", "atol"), [(256, 1e-4), (700, 1e-3)])
def test_attention_large_scores_are_stable(s, atol, softmax):
    # scaled scores up to ~5e3: subtracting the (running) max keeps exp() finite; with two key
    # blocks the online rescale factors underflow to 0.  The fp32 rounding of such scores
    # (~1e-3 absolute at S = 700, where near-ties are likelier) bounds the agreement
    q, k, v = random_inputs(_shapes(1, 1, 1, s, 32), "float32", seed=2)
    check_kernel(
        kernel.attention,
        reference.attention,
        q * 30,
        k * 30,
        v,
        op_kind=OP_KIND,
        atol=atol,
        softmax=softmax,
    )


@pytest.mark.parametrize("softmax", SOFTMAX)
def test_causal_first_row_is_first_value(softmax):
    # query 0 sees only key 0, so its output is v[..., 0, :] exactly up to rounding
    q, k, v = random_inputs(_shapes(1, 2, 1, 128, 16), "float32", seed=3)
    out = kernel.attention(q, k, v, causal=True, softmax=softmax)
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
    a = z((1, 1, 128, 16), f32)
    for bad in ("flash", "Online", None):
        with pytest.raises(ValueError, match="softmax must be one of 'two_pass', 'online'"):
            kernel.attention(a, a, a, softmax=bad)
        with pytest.raises(ValueError, match="softmax must be one of 'two_pass', 'online'"):
            kernel.attention_backward(a, a, a, a, softmax=bad)


@pytest.mark.slow
@pytest.mark.parametrize("softmax", SOFTMAX)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_attention_longest_sequence_fits_sbuf(dtype, softmax):
    # trace + verify only (SBUF capacity is a verifier rule); no simulation
    s = kernel.MAX_S
    spec_q = nt.tensor[[1, 1, s, 128], dtype]
    kernel.FWD_KERNELS[softmax].ir(spec_q, spec_q, spec_q, False, 0.1, True)


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


@pytest.mark.parametrize(
    ("causal", "softmax"), [(True, "two_pass"), (False, "two_pass"), (True, "online")]
)
def test_torch_gradients_match_autograd_of_the_reference(bound, causal, softmax):
    import torch

    torch.manual_seed(0)
    q = torch.randn(1, 4, 256, 32, requires_grad=True)
    k = torch.randn(1, 2, 256, 32, requires_grad=True)
    v = torch.randn(1, 2, 256, 32, requires_grad=True)
    g = torch.randn(1, 4, 256, 32)
    out = bound(q, k, v, causal=causal, softmax=softmax)
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
@pytest.mark.parametrize("softmax", SOFTMAX)
@pytest.mark.parametrize("dtype", kernel.DTYPES)
def test_attention_large(dtype, softmax):
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
        softmax=softmax,
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
        softmax=softmax,
    )
