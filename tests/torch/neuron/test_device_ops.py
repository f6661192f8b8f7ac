"""Op coverage of the ``neuron`` device per op family and dtype, against CPU torch.

Tolerances: nkikit's per-dtype table (``nkikit.testing.tolerances``: fp32 as torch's default,
bf16 two ulps of its 7-bit mantissa) plus the fp32-arithmetic part of the op's kind.  Views and
data movement are exact.  Shapes come from hypothesis, kept small: each new shape traces and
simulates its kernels.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nkikit.testing.tolerances import tolerance  # noqa: E402
from nkikit.torch.neuron import NeuronFallbackWarning, NeuronTensor, device_stats  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True)
dim = st.integers(1, 24)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronFallbackWarning)
        yield


def close(got, ref, dtype, kind="elementwise"):
    assert isinstance(got, NeuronTensor)
    tol = tolerance(str(dtype).removeprefix("torch."), kind)
    torch.testing.assert_close(got.cpu(), ref, rtol=tol.rtol, atol=tol.atol)


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# -- views and data movement (exact) ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(a=dim, b=dim, c=dim)
def test_views_and_movement_are_exact(dtype, a, b, c):
    x = rand(a, b, c, dtype=dtype)
    d = x.to("neuron")
    cases = [
        (d.reshape(a * b, c), x.reshape(a * b, c)),
        (d.permute(2, 0, 1), x.permute(2, 0, 1)),
        (d.transpose(0, 2).contiguous(), x.transpose(0, 2).contiguous()),
        (d[:, b // 2 :, ::2], x[:, b // 2 :, ::2]),
        (d.select(1, b - 1), x.select(1, b - 1)),
        (d.unsqueeze(1).squeeze(1), x),
        (torch.cat([d, d[:, :1]], 1), torch.cat([x, x[:, :1]], 1)),
        (torch.stack([d, d], 0), torch.stack([x, x], 0)),
        (d.split(max(1, c // 2), -1)[0], x.split(max(1, c // 2), -1)[0]),
        (d.expand(2, a, b, c).clone(), x.expand(2, a, b, c).clone()),
    ]
    for got, ref in cases:
        assert isinstance(got, NeuronTensor) and got.shape == ref.shape
        assert torch.equal(got.cpu(), ref)


def test_cat_and_contiguous_are_dma_kernels():
    device_stats().reset()
    d = rand(4, 6).to("neuron")
    torch.cat([d, d, d], 0)
    d.t().contiguous()
    assert device_stats().kernels["cat.default"] == 3  # one copy per input
    assert device_stats().kernels["clone.default"] == 1
    assert device_stats().kernel_names["cat.default"] == {"dma_copy_kernel"}


# -- matmul family -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(m=dim, k=dim, n=dim, batch=st.integers(1, 3))
def test_matmul_family_matches_cpu(dtype, m, k, n, batch):
    a, b = rand(m, k, dtype=dtype, seed=1), rand(k, n, dtype=dtype, seed=2)
    close(a.to("neuron") @ b.to("neuron"), a @ b, dtype, "matmul")
    a3, b3 = rand(batch, m, k, dtype=dtype, seed=3), rand(batch, k, n, dtype=dtype, seed=4)
    close(torch.bmm(a3.to("neuron"), b3.to("neuron")), torch.bmm(a3, b3), dtype, "matmul")
    w, bias = rand(n, k, dtype=dtype, seed=5), rand(n, dtype=dtype, seed=6)
    got = F.linear(a3.to("neuron"), w.to("neuron"), bias.to("neuron"))
    # the bias add is its own kernel after the matmul, so a bf16 result is rounded twice (CPU
    # addmm rounds once): allow a rounding of the larger addend where the sum cancels
    tol = tolerance(str(dtype).removeprefix("torch."), "matmul")
    scale = max(float((a3 @ w.T).abs().max()), float(bias.abs().max()))
    atol = tol.atol if dtype == torch.float32 else tol.rtol * scale
    torch.testing.assert_close(got.cpu(), F.linear(a3, w, bias), rtol=tol.rtol, atol=atol)


def test_matmul_runs_the_library_kernel():
    device_stats().reset()
    a = rand(8, 16).to("neuron")
    a @ rand(16, 4).to("neuron")
    assert device_stats().kernel_names["mm.default"] == {"matmul_kernel"}
    assert device_stats().total_fallbacks == 0


# -- embedding, norms, attention -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(v=st.integers(1, 40), d=dim, n=dim)
def test_embedding_gathers_exactly(dtype, v, d, n):
    table = rand(v, d, dtype=dtype)
    ids = torch.randint(0, v, (2, n), generator=torch.Generator().manual_seed(n))
    got = F.embedding(ids.to("neuron"), table.to("neuron"))
    assert torch.equal(got.cpu(), F.embedding(ids, table))


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(rows=dim, d=st.integers(1, 96))
def test_norms_match_cpu(dtype, rows, d):
    x, w, b = rand(2, rows, d, dtype=dtype), rand(d, dtype=dtype, seed=1), rand(d, dtype=dtype)
    xd, wd, bd = x.to("neuron"), w.to("neuron"), b.to("neuron")
    close(
        torch.rms_norm(xd, (d,), wd, 1e-6), torch.rms_norm(x, (d,), w, 1e-6), dtype, "normalization"
    )
    close(F.layer_norm(xd, (d,), wd, bd), F.layer_norm(x, (d,), w, b), dtype, "normalization")
    close(torch.rms_norm(xd, (d,)), torch.rms_norm(x, (d,)), dtype, "normalization")


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(s=st.integers(1, 40), d=st.sampled_from([8, 16, 32]), causal=st.booleans())
def test_sdpa_matches_cpu(dtype, s, d, causal):
    q, k, v = (rand(1, 2, s, d, dtype=dtype, seed=i) for i in range(3))
    got = F.scaled_dot_product_attention(*(t.to("neuron") for t in (q, k, v)), is_causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # bf16: the kernel rounds the probabilities to bf16 before P @ V (as on the hardware), a
    # few bf16 ulps of |v| per output element (the library's own BF16_ATOL, kernels/attention)
    tol = tolerance(str(dtype).removeprefix("torch."), "matmul")
    atol = tol.atol if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu(), ref, rtol=tol.rtol, atol=atol)


def test_sdpa_the_kernel_cannot_take_runs_torchs_decomposition_on_the_device():
    # a mask, dropout, other key length, 3-D inputs, an explicit scale: the library kernel takes
    # none of these; torch's decomposition runs them (a wrong call crashed every one)
    q, k, v = rand(1, 2, 8, 16, seed=0), rand(1, 2, 5, 16, seed=1), rand(1, 2, 5, 16, seed=2)
    mask = rand(8, 5, seed=3) > 0
    dev = [t.to("neuron") for t in (q, k, v)]
    for kw in ({"attn_mask": mask}, {"scale": 0.5}, {"attn_mask": mask.float(), "scale": 0.3}):
        dkw = {n: t.to("neuron") if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
        got = F.scaled_dot_product_attention(*dev, **dkw)
        torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(q, k, v, **kw))
    got = F.scaled_dot_product_attention(*(t[0].to("neuron") for t in (q, k, v)))
    torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(q[0], k[0], v[0]))


def test_norms_of_device_tensors_compile():
    # under torch.compile the device's tensors hold fake storage: the norms trace as torch's
    # decomposition (a kernel launch on fake data failed), and the compiled graph runs on the device
    x, w, b = rand(4, 64), rand(64, seed=1), rand(64, seed=2)
    xd, wd, bd = (t.to("neuron") for t in (x, w, b))
    rms = torch.compile(
        lambda a, c: torch.rms_norm(a, (64,), c, 1e-6), backend="neuron", fullgraph=True
    )
    ln = torch.compile(
        lambda a, c, d: F.layer_norm(a, (64,), c, d), backend="neuron", fullgraph=True
    )
    close(rms(xd, wd), torch.rms_norm(x, (64,), w, 1e-6), torch.float32, "normalization")
    close(ln(xd, wd, bd), F.layer_norm(x, (64,), w, b), torch.float32, "normalization")


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_and_attention_backward_match_cpu(dtype):
    x, w = rand(6, 32, dtype=dtype), rand(32, dtype=dtype, seed=1)
    q, k = rand(1, 2, 24, 16, dtype=dtype, seed=2), rand(1, 2, 24, 16, dtype=dtype, seed=3)

    def run(dev):
        ts = [t.clone().to("neuron") if dev else t.clone() for t in (x, w, q, k)]
        for t in ts:
            t.requires_grad_()
        xx, ww, qq, kk = ts
        y = torch.rms_norm(xx, (32,), ww, 1e-6).sum() + F.layer_norm(xx, (32,)).pow(2).sum()
        y = y + F.scaled_dot_product_attention(qq, kk, kk, is_causal=True).sum()
        y.backward()
        return [t.grad.cpu() if dev else t.grad for t in ts]

    tol = tolerance(str(dtype).removeprefix("torch."), "normalization")
    for got, ref in zip(run(True), run(False), strict=True):
        # bf16 gradients pass through several roundings: a few ulps of the gradient's scale
        atol = tol.atol if dtype == torch.float32 else 4 * tol.rtol * float(ref.abs().max())
        torch.testing.assert_close(got, ref, rtol=tol.rtol * 2, atol=atol)


# -- elementwise, comparisons, where, casts, reductions, softmax -----------------------------------
# These run as generated kernels (codegen's one-node regions).


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(a=dim, b=dim, bcast=st.booleans())
def test_elementwise_and_reductions_match_cpu(dtype, a, b, bcast):
    x, y = rand(a, b, dtype=dtype), rand(1 if bcast else a, b, dtype=dtype, seed=1)
    xd, yd = x.to("neuron"), y.to("neuron")
    device_stats().reset()
    close(xd + yd, x + y, dtype)
    close(xd * yd - 2.0, x * y - 2.0, dtype)
    close(torch.where(xd > yd, xd, yd), torch.where(x > y, x, y), dtype)
    assert torch.equal((xd >= yd).cpu(), x >= y)
    close(torch.exp(xd), torch.exp(x), dtype, "transcendental")
    close(F.silu(xd), F.silu(x), dtype, "transcendental")
    close(F.gelu(xd), F.gelu(x), dtype, "transcendental")
    close(xd.to(torch.float32), x.to(torch.float32), torch.float32)
    close(xd.sum(-1), x.sum(-1), dtype, "reduction")
    close(xd.mean(0, keepdim=True), x.mean(0, keepdim=True), dtype, "reduction")
    close(xd.amax(-1), x.amax(-1), dtype, "reduction")
    close(torch.softmax(xd, -1), torch.softmax(x, -1), dtype, "normalization")
    close(torch.log_softmax(xd, -1), torch.log_softmax(x, -1), dtype, "normalization")
    assert device_stats().total_fallbacks == 0  # all generated kernels (codegen)


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), data=st.data())
def test_cat_along_any_dim_is_exact(dtype, shape, data):
    d = data.draw(st.integers(0, len(shape) - 1))
    extra = data.draw(st.integers(1, 5))
    a = rand(*shape, dtype=dtype)
    other = list(shape)
    other[d] = extra
    b = rand(*other, dtype=dtype, seed=1)
    got = torch.cat([a.to("neuron"), b.to("neuron")], d)
    assert torch.equal(got.cpu(), torch.cat([a, b], d))


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_and_min_over_a_dim_match_cpu(dtype):
    x = rand(6, 9, dtype=dtype)
    d = x.to("neuron")
    device_stats().reset()
    for got, ref in ((d.max(-1), x.max(-1)), (d.min(0, keepdim=True), x.min(0, keepdim=True))):
        assert torch.equal(got.values.cpu(), ref.values)
        assert torch.equal(got.indices.cpu(), ref.indices)
    # the values are a generated reduction kernel each (amax / amin)
    assert (
        device_stats().kernels["amax.default"] == 1 and device_stats().kernels["amin.default"] == 1
    )
