"""A small Llama-style decoder layer (RMSNorm, rotary attention, SwiGLU MLP) forward and
backward on the emulated NeuronCore, eager on the ``neuron`` device and under
``torch.compile(backend="neuron")``, against CPU torch; its system profile lists every kernel
and fallback. Slow: run with ``pytest -m slow``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity

import nkikit.torch.neuron as neuron
from nkikit.torch.profiler import NeuronConfig, NeuronProfiler

pytestmark = pytest.mark.slow


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class DecoderLayer(nn.Module):
    """Pre-norm attention with rotary embeddings and a SwiGLU MLP, as in Llama."""

    def __init__(self, d: int = 64, heads: int = 4, ffn: int = 128, seq: int = 32) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (
            p(h).view(b, s, self.heads, self.hd).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def run(model, x):
    """Forward and backward of ``model`` on ``x``: (output, input grad, parameter grads)."""
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.float().pow(2).mean().backward()
    grads = {n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters()}
    return y, x.grad, grads


def max_err(a, b):
    return (a.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()


def check(dev, cpu, exact, dtype):
    """fp32: within the matmul tolerance of CPU torch; bf16: as close to the fp64 result as
    CPU torch in bf16 is, within 2x (both round every op, in different orders)."""
    pairs = [(dev[0], cpu[0], exact[0]), (dev[1], cpu[1], exact[1])]
    pairs += [(dev[2][n], cpu[2][n], exact[2][n]) for n in cpu[2]]
    for d, c, e in pairs:
        if dtype == torch.float32:
            scale = e.abs().max().item()
            assert max_err(d, c) <= 1e-4 * max(scale, 1.0), (max_err(d, c), scale)
        else:
            assert max_err(d, e) <= 2 * max_err(c, e) + 1e-3, (max_err(d, e), max_err(c, e))


def profiled(fn, out):
    exporter = NeuronProfiler(NeuronConfig(profile_output_dir=str(out)))
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU], on_trace_ready=exporter.export_trace
    ):
        result = fn()
    return result, exporter.last


def listed(sp):
    """Every kernel launched is a kernel row of the key averages."""
    kernels = {r.kernel for r in sp.runs}
    rows = {k.name for k in sp.key_averages if k.kind == "kernel"}
    assert kernels and kernels <= rows


@pytest.fixture
def models():
    torch.manual_seed(0)
    return DecoderLayer()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_eager_on_the_device(models, dtype, tmp_path):
    cpu_model = models.to(dtype)
    x = torch.randn(1, 32, 64, dtype=dtype)
    cpu = run(cpu_model, x)
    exact = run(copy.deepcopy(cpu_model).double(), x.double())
    dev_model = copy.deepcopy(cpu_model).to("neuron")
    neuron.device_stats().reset()
    dev, sp = profiled(lambda: run(dev_model, x.to("neuron")), tmp_path)
    check(dev, cpu, exact, dtype)
    stats = neuron.device_stats()
    assert stats.total_kernels > 0
    listed(sp)
    print(stats)
    print(sp.table_text(row_limit=40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_compiled(models, dtype, tmp_path):
    torch._dynamo.reset()
    neuron.reset_compile_report()
    cpu_model = models.to(dtype)
    x = torch.randn(1, 32, 64, dtype=dtype)
    cpu = run(cpu_model, x)
    exact = run(copy.deepcopy(cpu_model).double(), x.double())
    compiled = torch.compile(copy.deepcopy(cpu_model), backend="neuron", dynamic=False)
    dev, sp = profiled(lambda: run(compiled, x), tmp_path)
    check(dev, cpu, exact, dtype)
    rep = neuron.compile_report()
    assert {g.kind for g in rep.graphs} == {"forward", "backward"}
    assert rep.regions > 0 and rep.launches["matmul_kernel"] > 0
    listed(sp)
    # fallbacks are listed in the report with their reasons and shown as host ranges
    ranges = {e["name"] for e in sp.host}
    for op in rep.fallbacks:
        assert op in rep.fallback_reasons() and f"neuron.fallback {op}" in ranges
    print(rep)
    print(sp.table_text(row_limit=40))
