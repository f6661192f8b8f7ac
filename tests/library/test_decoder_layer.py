"""A Llama-style decoder layer (pre-norm attention + SwiGLU MLP; hidden 512, 8 query heads,
2 KV heads, head dim 64, MLP width 1024, sequence 256) built from library kernels published to a
local `nkikit.hub` and pulled back, used through their torch bindings inside an `nn.Module`.

Every op with a library kernel runs on it: RMSNorm (both norms, with its backward kernel), all
projections (``x @ W`` as ``matmul(x.T, W)``, backward via the matmul kernel), RoPE (half-split
layout), causal grouped-query attention and the SwiGLU gate.  Residual adds and
reshapes/transposes are torch.

The layer is checked against a plain PyTorch layer with the same weights (forward and every
parameter's gradient; fp32, tolerances sized for fp32 accumulation-order differences), run under
``torch.compile(fullgraph=True)``, and trained for a few Adam steps on a synthetic regression with
the loss going down.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from nkikit import kernels  # noqa: E402

LIBRARY = Path(__file__).resolve().parents[2] / "kernels"
HIDDEN, HEADS, KV_HEADS, SEQ, MLP = 512, 8, 2, 256, 1024
HEAD_DIM = HIDDEN // HEADS
EPS = 1e-6

pytestmark = pytest.mark.slow  # ~1-2 min of simulated kernels (forward + backward, several runs)


# -- ops: the same functions, from the library or from torch ----------------------------------


class TorchOps:
    """Plain PyTorch versions of every op (the reference layer uses these)."""

    @staticmethod
    def rmsnorm(x, w):  # noqa: ANN001, ANN205
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    @staticmethod
    def linear(x, w):  # noqa: ANN001, ANN205
        return x @ w  # w: [in, out]

    @staticmethod
    def attention(q, k, v):  # noqa: ANN001, ANN205
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    @staticmethod
    def swiglu(a, b):  # noqa: ANN001, ANN205
        return F.silu(a) * b

    @staticmethod
    def rope(x, cos, sin):  # noqa: ANN001, ANN205
        """Rotate-half RoPE on [..., S, D]; cos/sin are [S, D/2] (one angle per pair)."""
        x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LibraryOps(TorchOps):
    """Every op on the pulled library kernels."""

    KERNELS = ("rmsnorm", "matmul", "rope", "attention", "swiglu")

    def __init__(self, mods: dict):
        self.mods = mods

    def rmsnorm(self, x, w):  # noqa: ANN001, ANN201
        return self.mods["rmsnorm"].rmsnorm(x, w, eps=EPS)

    def linear(self, x, w):  # noqa: ANN001, ANN201
        return self.mods["matmul"].matmul(x.t(), w)  # x @ W = matmul(lhsT = x.T, rhs = W)

    def attention(self, q, k, v):  # noqa: ANN001, ANN201
        return self.mods["attention"].attention(q, k, v, causal=True)

    def swiglu(self, a, b):  # noqa: ANN001, ANN201
        return self.mods["swiglu"].swiglu(a, b)

    def rope(self, x, cos, sin):  # noqa: ANN001, ANN201
        return self.mods["rope"].rope(x.contiguous(), cos, sin, layout="half")


class DecoderLayer(nn.Module):
    """Pre-norm Llama block on [S, HIDDEN] (batch 1): x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, ops: TorchOps):
        super().__init__()
        self.ops = ops
        g = torch.Generator().manual_seed(0)

        def w(i: int, o: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(i, o, generator=g) / math.sqrt(i))

        self.attn_norm = nn.Parameter(1.0 + 0.1 * torch.randn(HIDDEN, generator=g))
        self.mlp_norm = nn.Parameter(1.0 + 0.1 * torch.randn(HIDDEN, generator=g))
        self.wq = w(HIDDEN, HIDDEN)
        self.wk = w(HIDDEN, KV_HEADS * HEAD_DIM)
        self.wv = w(HIDDEN, KV_HEADS * HEAD_DIM)
        self.wo = w(HIDDEN, HIDDEN)
        self.w_gate_up = w(HIDDEN, 2 * MLP)
        self.w_down = w(MLP, HIDDEN)
        pos = torch.arange(SEQ, dtype=torch.float32)[:, None]
        inv = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        ang = pos * inv  # [S, D/2]: one angle per rotated pair
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        h = ops.rmsnorm(x, self.attn_norm)
        q = ops.linear(h, self.wq).view(SEQ, HEADS, HEAD_DIM).transpose(0, 1)
        k = ops.linear(h, self.wk).view(SEQ, KV_HEADS, HEAD_DIM).transpose(0, 1)
        v = ops.linear(h, self.wv).view(SEQ, KV_HEADS, HEAD_DIM).transpose(0, 1)
        q, k = ops.rope(q, self.cos, self.sin), ops.rope(k, self.cos, self.sin)
        a = ops.attention(q[None].contiguous(), k[None].contiguous(), v[None].contiguous())
        x = x + ops.linear(a[0].transpose(0, 1).reshape(SEQ, HIDDEN), self.wo)
        h = ops.rmsnorm(x, self.mlp_norm)
        gate, up = ops.linear(h, self.w_gate_up).split(MLP, dim=-1)
        return x + ops.linear(ops.swiglu(gate.contiguous(), up.contiguous()), self.w_down)


# -- fixtures ---------------------------------------------------------------------------------


def _publish_pull(name: str, hub_url: str, cache: Path):  # noqa: ANN202
    repo = f"nkikit/{name}"
    kernels.publish(LIBRARY / name, repo, endpoint=hub_url, run_tests=False)
    return kernels.pull(repo, version=1, endpoint=hub_url, cache_dir=cache)


@pytest.fixture(scope="module")
def library(hub_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    cache = tmp_path_factory.mktemp("cache")
    return LibraryOps({n: _publish_pull(n, hub_url, cache) for n in LibraryOps.KERNELS})


def _layers(library: LibraryOps) -> tuple[DecoderLayer, DecoderLayer]:
    lib, ref = DecoderLayer(library), DecoderLayer(TorchOps())
    ref.load_state_dict(lib.state_dict())
    return lib, ref


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(SEQ, HIDDEN, generator=g), torch.randn(SEQ, HIDDEN, generator=g)


# -- tests ------------------------------------------------------------------------------------


def test_every_kernel_used_has_a_backward(library: LibraryOps) -> None:
    for name in ("rmsnorm", "matmul", "rope", "attention", "swiglu"):
        fn = getattr(library.mods[name], name)
        assert fn.backward is not None, name


def test_decoder_layer_matches_torch(library: LibraryOps) -> None:
    lib, ref = _layers(library)
    x, g = _inputs()
    xl, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    yl, yr = lib(xl), ref(xr)
    torch.testing.assert_close(yl, yr, atol=2e-4, rtol=2e-4)
    yl.backward(g)
    yr.backward(g)
    torch.testing.assert_close(xl.grad, xr.grad, atol=1e-3, rtol=1e-3)
    for (name, pl), (_, pr) in zip(lib.named_parameters(), ref.named_parameters()):
        scale = pr.grad.abs().max().item()
        torch.testing.assert_close(pl.grad, pr.grad, atol=1e-4 * scale + 1e-5, rtol=1e-3, msg=name)


def test_decoder_layer_compiles_fullgraph(library: LibraryOps) -> None:
    torch._dynamo.reset()
    lib, ref = _layers(library)
    x, g = _inputs()
    explain = torch._dynamo.explain(lib)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(lib, fullgraph=True, backend="aot_eager")
    xl, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    yl, yr = compiled(xl), ref(xr)
    torch.testing.assert_close(yl, yr, atol=2e-4, rtol=2e-4)
    yl.backward(g)
    yr.backward(g)
    torch.testing.assert_close(xl.grad, xr.grad, atol=1e-3, rtol=1e-3)


def test_decoder_layer_trains(library: LibraryOps) -> None:
    lib, _ = _layers(library)
    x, _ = _inputs()
    target = torch.tanh(x.roll(1, dims=0))  # learn a fixed map of the input
    opt = torch.optim.Adam(lib.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = F.mse_loss(lib(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] * 0.9 and losses == sorted(losses, reverse=True), losses
