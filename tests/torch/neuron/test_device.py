"""The emulated ``neuron`` device: setup, tensors, factories, modules, autograd, fallbacks,
one-kernel ops and the system profile."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from nkikit.compiler.launches import Session  # noqa: E402
from nkikit.torch.neuron import (  # noqa: E402
    NeuronFallbackWarning,
    NeuronTensor,
    device_stats,
    kernel_source,
    neuron_device,
)


@pytest.fixture(autouse=True)
def _fresh_stats():
    device_stats().reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronFallbackWarning)
        yield


def test_device_setup_is_idempotent():
    assert neuron_device() == neuron_device() == torch.device("neuron", 0)
    assert torch._C._get_privateuse1_backend_name() == "neuron"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_keeps_values(dtype):
    x = torch.randn(5, 7).to(dtype)
    d = x.to("neuron")
    assert isinstance(d, NeuronTensor)
    assert d.device.type == "neuron" and d.dtype == dtype and d.shape == x.shape
    back = d.cpu()
    assert back.device.type == "cpu" and not isinstance(back, NeuronTensor)
    assert torch.equal(back, x)
    assert sum(device_stats().transfers.values()) >= 2  # host -> device, device -> host


def test_factories_on_the_device():
    z = torch.zeros(3, 4, device="neuron")
    o = torch.ones(2, 5, dtype=torch.bfloat16, device="neuron")
    e = torch.empty(6, device="neuron")
    r = torch.randn(4, 4, device="neuron")
    assert {t.device.type for t in (z, o, e, r)} == {"neuron"}
    assert torch.equal(z.cpu(), torch.zeros(3, 4))
    assert torch.equal(o.cpu(), torch.ones(2, 5, dtype=torch.bfloat16))
    assert e.shape == (6,) and r.shape == (4, 4)
    # zeros and ones are memset kernels on the device, not fallbacks
    assert device_stats().kernels["zero_.default"] == 1
    assert device_stats().kernels["fill_.Scalar"] == 1


def test_printing_names_the_device():
    text = repr(torch.arange(3.0).to("neuron"))
    assert "device='neuron:0'" in text and "0., 1., 2." in text


def test_dtype_conversion_matches_cpu():
    x = torch.randn(4, 9)
    got = x.to("neuron").to(torch.bfloat16)
    assert got.device.type == "neuron" and got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), x.to(torch.bfloat16))


def test_module_to_device_and_forward_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    assert all(p.device.type == "neuron" for p in dev.parameters())
    x = torch.randn(4, 16)
    torch.testing.assert_close(dev(x.to("neuron")).cpu(), cpu(x), rtol=1.3e-6, atol=1e-5)
    assert device_stats().kernels["mm.default"] == 2  # each Linear: a library matmul


def test_autograd_through_device_ops_matches_cpu():
    torch.manual_seed(1)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8)
    w0 = torch.randn(8)
    dev_lin = torch.nn.Linear(8, 4)
    dev_lin.load_state_dict(lin.state_dict())
    dev_lin.to("neuron")
    xd = x.to("neuron").requires_grad_()
    wd = w0.to("neuron").requires_grad_()
    xc, wc = x.clone().requires_grad_(), w0.clone().requires_grad_()
    dev_lin(torch.rms_norm(xd, (8,), wd, 1e-6)).sum().backward()
    lin(torch.rms_norm(xc, (8,), wc, 1e-6)).sum().backward()
    assert isinstance(xd.grad, NeuronTensor)
    tol = {"rtol": 2e-5, "atol": 1e-4}
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **tol)
    torch.testing.assert_close(wd.grad.cpu(), wc.grad, **tol)
    torch.testing.assert_close(dev_lin.weight.grad.cpu(), lin.weight.grad, **tol)
    torch.testing.assert_close(dev_lin.bias.grad.cpu(), lin.bias.grad, **tol)
    assert device_stats().kernels["rms_norm_backward"] == 1


def test_an_op_on_device_and_host_tensors_is_refused_as_torch_refuses_two_devices():
    x = torch.randn(4, 8)
    xd = x.to("neuron")
    for f in (
        lambda: xd + x,
        lambda: xd @ torch.randn(8, 3),
        lambda: torch.rms_norm(xd, (8,), x[0]),
    ):
        with pytest.raises(RuntimeError, match="same device"):
            f()
    # a 0-d host tensor is a scalar on any device, and host indices index a device tensor
    torch.testing.assert_close((xd + torch.tensor(2.0)).cpu(), x + 2)
    torch.testing.assert_close(xd[torch.tensor([0, 2])].cpu(), x[[0, 2]])


def test_views_share_storage_and_cost_nothing():
    x = torch.arange(24.0).reshape(4, 6).to("neuron")
    v = x.view(6, 4)
    s = x[1:3, ::2]
    t = x.t()
    x.mul_(1)  # the views see writes through any of them
    s.fill_(-1.0)
    ref = torch.arange(24.0).reshape(4, 6)
    ref[1:3, ::2] = -1.0
    assert torch.equal(x.cpu(), ref)
    assert torch.equal(v.cpu(), ref.view(6, 4))
    assert torch.equal(t.cpu(), ref.t())
    assert device_stats().views["view.default"] >= 1
    assert device_stats().views["t.default"] == 1


def test_rms_norm_is_one_kernel_launch():
    x = torch.randn(2, 8, 64).to("neuron")
    w = torch.randn(64).to("neuron")
    with Session() as s:
        y = torch.rms_norm(x, (64,), w, 1e-6)
    assert [r.kernel for r in s.records] == ["rmsnorm_kernel"]
    assert s.records[0].device_ns > 0  # the cost model's time of the launch
    torch.testing.assert_close(
        y.cpu(), torch.rms_norm(x.cpu(), (64,), w.cpu(), 1e-6), rtol=2e-5, atol=2e-5
    )
    assert device_stats().total_fallbacks == 0


def test_one_kernel_ops_in_inference_mode():
    x, w = torch.randn(4, 64).to("neuron"), torch.randn(64).to("neuron")
    q = torch.randn(1, 2, 8, 16).to("neuron")
    with torch.inference_mode(), Session() as s:
        y = torch.rms_norm(x, (64,), w, 1e-6)
        F.layer_norm(x, (64,))
        F.scaled_dot_product_attention(q, q, q)
    kernels = [r.kernel for r in s.records]
    assert kernels == ["rmsnorm_kernel", "layernorm_kernel", "flash_attention_fwd_kernel"]
    torch.testing.assert_close(
        y.cpu(), torch.rms_norm(x.cpu(), (64,), w.cpu(), 1e-6), rtol=2e-5, atol=2e-5
    )


def test_rms_norm_the_library_cannot_take_decomposes_on_the_device():
    x = torch.randn(3, 4).to("neuron")
    w = torch.randn(4, dtype=torch.bfloat16).to("neuron")  # mixed dtypes: not the kernel's
    y = torch.rms_norm(x, (4,), w, 1e-6)
    ref = torch.rms_norm(x.cpu(), (4,), w.cpu(), 1e-6)
    torch.testing.assert_close(y.cpu(), ref, rtol=1.6e-2, atol=1e-5)
    assert device_stats().kernels["rms_norm.default"] == 0


def test_sdpa_runs_the_library_attention_kernel():
    q = torch.randn(1, 2, 16, 8).to("neuron")
    k = torch.randn(1, 2, 16, 8).to("neuron")
    with Session() as s:
        out = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    assert [r.kernel for r in s.records] == ["flash_attention_fwd_kernel"]
    ref = F.scaled_dot_product_attention(q.cpu(), k.cpu(), k.cpu(), is_causal=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-5, atol=2e-5)


def test_fallback_is_counted_warned_once_and_correct():
    x = torch.randn(3, 5)
    d = x.to("neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NeuronFallbackWarning)
        a = torch.logcumsumexp(d, 1)  # no device kernel (and no other test uses it)
        b = torch.logcumsumexp(d, 0)
    assert isinstance(a, NeuronTensor)
    assert torch.equal(a.cpu(), torch.logcumsumexp(x, 1))
    assert torch.equal(b.cpu(), torch.logcumsumexp(x, 0))
    assert device_stats().fallbacks["logcumsumexp.default"] == 2
    assert device_stats().fallback_reasons["logcumsumexp.default"]
    mine = [w for w in caught if "logcumsumexp" in str(w.message)]
    assert len(mine) == 1  # once per op and process
    assert mine[0].category is NeuronFallbackWarning
    assert mine[0].filename == __file__  # the user's own line, not nkikit's or torch's
    assert "logcumsumexp.default" in str(device_stats())


def test_in_place_fallback_returns_the_same_tensor():
    d = torch.randn(4).to("neuron")
    ref = d.cpu().clone()
    out = d.cumsum_(0)
    assert out is d
    assert torch.equal(d.cpu(), ref.cumsum(0))


def test_stats_reset_and_table():
    torch.ones(3, device="neuron")
    assert device_stats().total_kernels == 1
    a, b = torch.randn(4, 8).to("neuron"), torch.randn(8, 2).to("neuron")
    a @ b, a @ b, a[:2] @ b  # two shapes: two cached specializations of the matmul kernel
    assert device_stats().kernels["mm.default"] == 3
    assert len(device_stats().specializations["mm.default"]) == 2
    assert "memset_kernel" in str(device_stats())
    device_stats().reset()
    assert device_stats().total_kernels == 0 and device_stats().total_fallbacks == 0
    assert not device_stats().specializations


def test_kernel_source_prints_nki():
    src = kernel_source("mm.default")
    assert "def matmul_kernel" in src and "nc_matmul" in src
    assert "def dma_copy_kernel" in kernel_source(torch.ops.aten.cat.default)
    with pytest.raises(ValueError, match="view"):
        kernel_source("view.default")


def test_system_profile_lists_device_kernels_and_fallbacks(tmp_path):
    from nkikit.torch.profiler import NeuronConfig, NeuronProfiler

    torch.manual_seed(2)

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 32)
            self.w = torch.nn.Parameter(torch.ones(32))

        def forward(self, x):
            h = torch.rms_norm(self.lin(x), (32,), self.w, 1e-6)
            return torch.cumsum(h, -1)  # no device kernel: a fallback

    model = Small().to("neuron")
    x = torch.randn(8, 32).to("neuron")
    exporter = NeuronProfiler(NeuronConfig(profile_output_dir=tmp_path, html=False))
    with torch.no_grad():
        model(x)  # warm up: kernels traced and compiled outside the window
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=exporter.export_trace
        ):
            model(x)
    sp = exporter.last
    kernels = {r.kernel for r in sp.runs}
    assert {"matmul_kernel", "rmsnorm_kernel"} <= kernels
    assert all(r.device_us > 0 for r in sp.runs)
    names = {
        e.get("name", "") for e in json.loads(exporter.files["trace"].read_text())["traceEvents"]
    }
    assert "neuron.fallback cumsum.default" in names
    rows = {k.name: k for k in sp.key_averages}
    assert rows["aten::cumsum"].fallbacks == 1  # the op the user called, counted once
    assert rows["aten::t"].calls >= 1 and rows["aten::t"].fallbacks == 0  # a view: no fallback


def test_elementwise_ops_run_as_generated_kernels():
    cg = pytest.importorskip("nkikit.torch.neuron.codegen")
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    xd, yd = x.to("neuron"), y.to("neuron")
    with Session() as s:
        z = xd + yd
    assert len(s.records) == 1
    assert device_stats().kernels["add.Tensor"] == 1 and device_stats().total_fallbacks == 0
    assert torch.equal(z.cpu(), x + y)
    src = kernel_source(torch.ops.aten.add.Tensor, xd, yd)
    assert "nl." in src and "def " in src
    assert isinstance(cg.compile_region, object)


class _Decoder(torch.nn.Module):
    """A small Llama-style decoder layer: RMSNorm, GQA attention, SwiGLU MLP, residuals."""

    def __init__(self, d=64, heads=4, kv_heads=2, ff=128):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q, self.k, self.v, self.o = (
            lin(d, d),
            lin(d, kv_heads * self.hd),
            lin(d, kv_heads * self.hd),
            lin(d, d),
        )
        self.gate, self.up, self.down = lin(d, ff), lin(d, ff), lin(ff, d)
        self.n1, self.n2 = torch.nn.RMSNorm(d, eps=1e-6), torch.nn.RMSNorm(d, eps=1e-6)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_forward_backward_matches_cpu(dtype):
    torch.manual_seed(3)
    cpu = _Decoder().to(dtype)
    dev = _Decoder().to(dtype)
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    x = torch.randn(2, 16, 64).to(dtype)
    with Session() as s:
        yd = dev(x.to("neuron"))
        yd.float().pow(2).mean().backward()
    yc = cpu(x)
    yc.float().pow(2).mean().backward()
    tol = {"rtol": 2e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 3e-2}
    torch.testing.assert_close(yd.cpu(), yc, **tol)
    for (name, pd), pc in zip(dev.named_parameters(), cpu.parameters(), strict=True):
        scale = float(pc.grad.abs().max())
        torch.testing.assert_close(
            pd.grad.cpu(), pc.grad, rtol=tol["rtol"], atol=tol["atol"] * scale, msg=name
        )
    names = {r.kernel for r in s.records}
    assert {"matmul_kernel", "rmsnorm_kernel", "flash_attention_fwd_kernel"} <= names
    assert {"rmsnorm_backward_kernel", "flash_attention_bwd_kernel"} <= names
    st = device_stats()
    assert (
        st.kernels["rms_norm.default"] == 2
        and st.kernels["scaled_dot_product_attention.default"] == 1
    )
    # every launch is accounted to an op, and nothing fell back to the CPU
    assert st.total_kernels == len(s.records)
    assert st.total_fallbacks == 0, st.fallback_reasons


def test_more_factories_and_host_reads():
    assert torch.equal(torch.tensor([1.0, 2.0], device="neuron").cpu(), torch.tensor([1.0, 2.0]))
    assert torch.ones(2, device="neuron").tolist() == [1.0, 1.0]
    z = torch.zeros(4, device="neuron")
    z[1:3] = 1.0
    assert torch.equal(z.cpu(), torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert torch.full((2, 2), 7.0, device="neuron").sum().item() == 28.0
    torch.randn(3, device="neuron")
    assert "random numbers" in device_stats().fallback_reasons["normal_.default"]


def test_rng_state_is_the_cpu_generators():
    # fork_rng and AOTAutograd (opcheck) visit every registered device's RNG state
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert torch.equal(torch.neuron.get_rng_state(), before)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.randn(5)
    assert torch.equal(torch.get_rng_state(), before)


NOT_A_DEVICE = {
    "factory": lambda x: torch.zeros(2, device="neuron:1"),
    "random factory": lambda x: torch.randn(2, device=torch.device("neuron", 1)),
    "host to device": lambda x: x.to("neuron:1"),
    "device to device": lambda x: x.to("neuron").to("neuron:1"),
    "allocation like": lambda x: torch.empty_like(x.to("neuron"), device="neuron:1"),
    "module": lambda x: torch.nn.Linear(3, 2).to("neuron:1"),
}


@pytest.mark.parametrize("how", sorted(NOT_A_DEVICE))
def test_a_device_index_other_than_0_is_refused_by_name(how):
    """There is one emulated NeuronCore: ``neuron:1`` is refused where a tensor is created or
    moved there (as torch refuses a device ordinal it lacks), never silently ``neuron:0``."""
    from nkikit.errors import ErrNoSuchNeuronDevice

    x = torch.randn(2, 3)
    with pytest.raises(ErrNoSuchNeuronDevice, match="err_no_such_neuron_device: neuron:1"):
        NOT_A_DEVICE[how](x)
    assert x.to("neuron:0").device == x.to("neuron").device == torch.device("neuron", 0)


def test_a_compiled_graph_that_makes_a_tensor_on_device_1_is_refused_by_name():
    torch._dynamo.reset()
    x = torch.randn(2, 3)
    for fn, arg in (
        (lambda t: (t * 2).to("neuron:1"), x),
        (lambda t: t + torch.ones(3, device="neuron:1"), x.to("neuron")),
    ):
        with pytest.raises(Exception, match="err_no_such_neuron_device: neuron:1"):
            torch.compile(fn, backend="neuron", fullgraph=True)(arg)
        torch._dynamo.reset()


def test_backward_runs_on_the_calling_thread_once_the_device_is_set_up():
    # an autograd device thread holding Python state aborts the process at exit
    neuron_device()
    assert not torch._C._is_multithreading_enabled()


_BACKWARD_THEN_EXIT = """
import torch
import nkikit.torch.neuron
lin = torch.nn.Linear(8, 8).to("neuron")
lin(torch.randn(4, 8).to("neuron")).sum().backward()
"""


@pytest.mark.slow
def test_a_process_that_ran_a_backward_on_the_device_exits_cleanly():
    import subprocess
    import sys

    # before: about one exit in two aborted ("terminate called without an active exception")
    codes = [
        subprocess.run([sys.executable, "-c", _BACKWARD_THEN_EXIT], capture_output=True).returncode
        for _ in range(8)
    ]
    assert codes == [0] * 8
