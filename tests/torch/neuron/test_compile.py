"""torch.compile(backend="neuron"): partition into fused regions, library ops and fallbacks,
graph breaks, forward and backward against CPU torch, generated kernels as kernel folders."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

import nkikit.torch.neuron as neuron
from nkikit.testing.tolerances import tolerance
from nkikit.torch.neuron.partition import FusedStep, OpStep, partition


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    neuron.reset_compile_report()
    torch.manual_seed(0)  # each test's inputs, whatever ran before it
    yield
    torch._dynamo.reset()


def compiled(fn, **kw):
    return torch.compile(fn, backend="neuron", dynamic=False, **kw)


def graphs(kind=None):
    return [g for g in neuron.compile_report().graphs if kind is None or g.kind == kind]


def close(out, ref, dtype, kind="normalization"):
    tol = tolerance(str(dtype).removeprefix("torch."), kind)
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol.rtol, atol=tol.atol)


def as_good_as_cpu(out, cpu, exact):
    """``out`` (the device's, in a low-precision dtype) is as close to the fp64 result
    ``exact`` as CPU torch's result ``cpu`` in the same dtype is, within 2x plus the dtype's
    epsilon times the largest result (about a unit in its last place: both round every op to the
    dtype, in different orders; a
    gradient with cancellation differs per element, and a sum's last bit with its order: an
    fp32 weight gradient summed over 32 rows was 2.7e-5 off where CPU torch was 1.2e-5, at a
    magnitude of 197, where the epsilon term is 2.3e-5)."""
    err_dev = (out.double() - exact).abs().max().item()
    err_cpu = (cpu.double() - exact).abs().max().item()
    ulp = torch.finfo(out.dtype).eps * exact.abs().max().item()
    assert err_dev <= 2 * err_cpu + ulp, (err_dev, err_cpu, ulp)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


# -- partition on FX graphs (a code generator verdict given by the test) ------------------------


def aten_graphs(fn, *args):
    """The ATen forward (and backward) graphs AOTAutograd makes of ``fn``."""
    out = []

    def keep(gm, example_inputs):
        out.append(gm)
        return gm

    torch.compile(fn, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))(*args)
    return out


ELEMENTWISE = {"mul.Tensor", "add.Tensor", "relu.default", "exp.default", "sum.dim_IntList"}


def last_axis_only(node, region):
    """Elementwise ops and sums over the last axis, as one code generator might accept."""
    if node.op not in ELEMENTWISE:
        return f"no template for {node.op}"
    if node.op == "sum.dim_IntList" and tuple(node.args[1]) not in ((-1,), (1,)):
        return "reductions over the last axis only"
    return None


def kinds(part):
    return [s.kind for s in part.steps]


def test_partition_puts_an_elementwise_chain_and_its_reduction_in_one_region():
    (gm,) = aten_graphs(lambda x: torch.relu(x * 2 + 1).exp().sum(-1), torch.randn(8, 16))
    part = partition(gm.graph, last_axis_only)
    assert kinds(part) == ["fused"]
    (step,) = part.regions
    assert [n.op for n in step.region.nodes] == [
        "mul.Tensor",
        "add.Tensor",
        "relu.default",
        "exp.default",
        "sum.dim_IntList",
    ]
    assert [v.shape for v in step.region.inputs] == [(8, 16)]
    assert step.region.value(step.region.outputs[0]).shape == (8,)


def test_partition_keeps_a_matmul_out_of_regions_and_orders_steps_by_dependency():
    def fn(x, w, y):
        a = (x * 2).relu()  # does not depend on the matmul: joins the region after it
        m = x @ w
        return a + 1, (m * 3).exp(), y + 1

    (gm,) = aten_graphs(fn, torch.randn(8, 16), torch.randn(16, 16), torch.randn(8, 16))
    part = partition(gm.graph, last_axis_only)
    # the region reads the matmul, so the matmul runs first; the independent chains join it
    assert kinds(part) == ["library", "fused"]
    (step,) = part.regions
    assert len(step.region.outputs) == 3


def test_partition_cuts_a_region_where_the_generator_refuses_and_falls_back_there():
    def fn(x):
        return (x * 2).sum(0).relu(), torch.cumsum(x, 0) + 1

    (gm,) = aten_graphs(fn, torch.randn(8, 16))
    part = partition(gm.graph, last_axis_only)
    fallbacks = part.of_kind("fallback")
    assert {str(s.node.target) for s in fallbacks} >= {
        "aten.sum.dim_IntList",
        "aten.cumsum.default",
    }
    assert all(s.reason for s in fallbacks)
    # the add after the CPU cumsum cannot be in the region before it
    steps = part.steps
    cum = next(
        i for i, s in enumerate(steps) if isinstance(s, OpStep) and "cumsum" in str(s.node.target)
    )
    assert isinstance(steps[-1], FusedStep) and cum < len(steps) - 1


# -- torch.compile end to end -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_forward_is_one_generated_kernel_and_matches_cpu(dtype):
    x, w = torch.randn(64, 256, dtype=dtype), torch.randn(256, dtype=dtype)
    with torch.no_grad():
        y = compiled(rmsnorm)(x, w)
    close(y, rmsnorm(x, w), dtype)
    (g,) = graphs("inference")
    assert len(g.partition.regions) == 1 and not g.partition.of_kind("fallback")
    assert sum(g.launches.values()) == 1
    (name,) = g.launches
    assert "def " + name in neuron.generated_kernels()[name]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_backward_run_on_the_device_and_match_cpu(dtype):
    x = torch.randn(32, 128, dtype=dtype, requires_grad=True)
    w = torch.randn(128, dtype=dtype, requires_grad=True)
    y = compiled(rmsnorm)(x, w)
    y.float().pow(2).sum().backward()
    x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
    y2 = rmsnorm(x2, w2)
    y2.float().pow(2).sum().backward()
    x3, w3 = (t.detach().double().requires_grad_() for t in (x, w))
    rmsnorm(x3, w3).pow(2).sum().backward()
    if dtype == torch.float32:
        close(y, y2, dtype)
        close(x.grad, x2.grad, dtype)
        close(w.grad, w2.grad, dtype, "reduction")
    for out, cpu, exact in (
        (y, y2, rmsnorm(x3, w3)),
        (x.grad, x2.grad, x3.grad),
        (w.grad, w2.grad, w3.grad),
    ):
        as_good_as_cpu(out, cpu, exact)
    fw, bw = graphs("forward"), graphs("backward")
    assert len(fw) == 1 and len(bw) == 1 and bw[0].calls == 1
    assert sum(bw[0].launches.values()) >= 1
    assert not neuron.compile_report().fallbacks


def test_matmul_runs_the_library_kernel_between_fused_regions():
    lin = torch.nn.Linear(64, 32, bias=False)

    def fn(x):
        return F.silu(lin(x * 2)).sum(-1)

    x = torch.randn(16, 64)
    with torch.no_grad():
        y = compiled(fn)(x)
        ref = fn(x)
    close(y, ref, torch.float32, "matmul")
    (g,) = graphs("inference")
    assert [s.kind for s in g.partition.steps if s.kind != "view"] == ["fused", "library", "fused"]
    assert g.launches["matmul_kernel"] == 1


def test_fullgraph_compiles_a_fusible_function():
    fn = compiled(lambda x, y: torch.where(x > y, x * y, (x - y).abs()).softmax(-1), fullgraph=True)
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    with torch.no_grad():
        out = fn(x, y)
    close(
        out, torch.where(x > y, x * y, (x - y).abs()).softmax(-1), torch.float32, "transcendental"
    )
    assert neuron.compile_report().graph_breaks == {}


def test_graph_breaks_are_reported_and_the_pieces_still_run():
    def fn(x):
        y = x * 2
        print("a graph break")
        return (y + 1).relu()

    x = torch.randn(8, 32)
    with torch.no_grad():
        out = compiled(fn)(x)
    close(out, (x * 2 + 1).relu(), torch.float32, "elementwise")
    rep = neuron.compile_report()
    assert sum(rep.graph_breaks.values()) >= 1 and rep.dynamo_graphs == 2
    assert "graph breaks: " in str(rep)


def test_item_graph_break():
    def fn(x):
        s = x.sum().item()
        return x * s

    x = torch.randn(8, 16)
    with torch.no_grad():
        out = compiled(fn)(x)
    close(out, x * x.sum().item(), torch.float32, "reduction")
    assert sum(neuron.compile_report().graph_breaks.values()) >= 1


def test_an_op_without_a_device_kernel_falls_back_counted_with_its_reason():
    def fn(x):
        return torch.cumsum(x * 2, dim=0) + 1

    x = torch.randn(8, 16)
    with torch.no_grad():
        out = compiled(fn)(x)
    close(out, torch.cumsum(x * 2, dim=0) + 1, torch.float32, "reduction")
    rep = neuron.compile_report()
    assert rep.fallbacks["cumsum.default"] == 1
    assert rep.fallback_reasons()["cumsum.default"]
    assert "cumsum.default" in str(rep)


def test_regions_compile_once_per_shape():
    fn = compiled(lambda x: (x * 2).relu())
    with torch.no_grad():
        for _ in range(3):
            fn(torch.randn(8, 16))
        fn(torch.randn(16, 16))
    gs = graphs("inference")
    assert [g.calls for g in gs] == [3, 1]  # one graph per shape, reused
    assert len(neuron.generated_kernels()) >= 2


def test_a_generated_kernel_is_a_kernel_folder_the_registry_reads(tmp_path):
    import numpy as np

    from nkikit.registry.manifest import load_manifest

    with torch.no_grad():
        compiled(rmsnorm)(torch.randn(32, 64), torch.randn(64))
    (g,) = graphs("inference")
    (name,) = g.launches
    folder = neuron.write_kernel_folder(name, tmp_path / name)
    m = load_manifest(folder)
    assert name in m.functions
    # the folder's kernel runs on numpy arrays
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_kernel", folder / "kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x, w = (
        np.random.default_rng(0).standard_normal((32, 64), dtype=np.float32),
        np.ones(64, np.float32),
    )
    out = np.asarray(getattr(mod, name)(x, w))
    ref = rmsnorm(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_a_compiled_graph_returns_each_output_on_the_device_it_was_traced_on():
    """The backend runs a graph on host tensors (device tensors' storages) and returns the
    outputs the graph traced on the device as device tensors, the others on the host, whatever
    its arguments' devices (a backward graph is handed device tensors its forward saved and
    still returns a host input's gradient on the host)."""
    from nkikit.torch.neuron.backend import CompiledGraph, GraphRecord

    (gm,) = aten_graphs(lambda x: ((x * 2).relu().to("neuron"), x + 1), torch.randn(8, 16))
    rec = GraphRecord(0, "inference", partition(gm.graph, last_axis_only))
    x = torch.randn(8, 16)
    for arg in (x, x.to("neuron")):
        dev, host = CompiledGraph(gm, rec)([arg])
        assert type(dev) is neuron.NeuronTensor and type(dev._storage) is torch.Tensor
        assert type(host) is torch.Tensor
        close(dev.cpu(), (x * 2).relu(), torch.float32, "elementwise")
        close(host, x + 1, torch.float32, "elementwise")


def test_compile_on_device_tensors_runs_one_graph_and_returns_device_tensors():
    x, w = torch.randn(32, 64), torch.randn(64)
    with torch.no_grad():
        y = compiled(rmsnorm)(x.to("neuron"), w.to("neuron"))
    assert y.device.type == "neuron"
    close(y.cpu(), rmsnorm(x, w), torch.float32)
    rep = neuron.compile_report()
    assert rep.dynamo_graphs == 1 and not rep.graph_breaks
    (g,) = graphs("inference")
    assert len(g.partition.regions) == 1 and sum(g.launches.values()) == 1


def test_a_module_on_the_device_trains_under_compile():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.SiLU())
    dev = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(16, 64)
    compiled(dev)(x.to("neuron")).pow(2).mean().backward()
    cpu(x).pow(2).mean().backward()
    (wd,), (wc,) = dev.parameters(), cpu.parameters()
    assert wd.grad.device.type == "neuron"
    close(wd.grad.cpu(), wc.grad, torch.float32, "matmul")
    assert {g.kind for g in graphs()} == {"forward", "backward"}
    assert neuron.compile_report().launches["matmul_kernel"] >= 2


def test_the_backend_object_works_as_well_as_its_name():
    assert callable(neuron.backend)
    fn = torch.compile(lambda x: (x + 1).exp(), backend=neuron.backend, dynamic=False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        close(fn(x), (x + 1).exp(), torch.float32, "transcendental")
    assert sum(neuron.compile_report().launches.values()) == 1


# -- graphs that make tensors on the device, transfers inside graphs ---------------------------

MAKES_DEVICE_TENSORS = {
    # a scalar tensor made on the device (torch.where's 0.0)
    "where_scalar": lambda a: torch.where(a > 0, a, 0.0),
    # a factory that falls back (arange) and one returned as an output
    "arange_and_full": lambda a: (
        a + torch.arange(a.shape[-1], device=a.device, dtype=a.dtype),
        torch.full((2, 3), 3.0, device="neuron"),
    ),
    # attention's decomposition (grouped heads: not the library kernel) builds its causal mask
    # on the device
    "causal_attention_gqa": lambda a: F.scaled_dot_product_attention(
        a.view(1, 4, 4, 4),
        a[:4].view(1, 2, 4, 4).flip(-1),
        a[4:].view(1, 2, 4, 4),
        is_causal=True,
        enable_gqa=True,
    ),
}


@pytest.mark.parametrize("name", sorted(MAKES_DEVICE_TENSORS))
def test_a_graph_of_device_tensors_that_makes_tensors_on_the_device_matches_cpu(name):
    fn = MAKES_DEVICE_TENSORS[name]
    a = torch.randn(8, 8)
    with torch.no_grad():
        out = compiled(fn, fullgraph=True)(a.to("neuron"))
    ref = fn(a)
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs, strict=True):
        assert type(o) is neuron.NeuronTensor, name
        close(o.cpu(), r.cpu(), torch.float32, "transcendental")
    assert neuron.compile_report().dynamo_graphs == 1


def test_causal_attention_on_device_tensors_trains_under_compile():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled(attend, fullgraph=True)(*dev).pow(2).sum().backward()
    attend(*cpu).pow(2).sum().backward()
    # the library's attention kernels, forward and backward, as for compiled CPU tensors
    rep = neuron.compile_report()
    assert rep.launches["flash_attention_fwd_kernel"] == rep.launches["attention_backward"] == 1
    assert not rep.fallbacks
    for d, c in zip(dev, cpu, strict=True):
        assert d.grad.device.type == "neuron"
        close(d.grad.cpu(), c.grad, torch.float32, "matmul")


def test_a_transfer_inside_a_compiled_graph_lands_where_eager_puts_it():
    """``.cpu()`` in a graph of device tensors gives a host tensor, ``.to("neuron")`` in a
    graph of host tensors a device tensor, as in eager mode; gradients flow back through
    both to their inputs' devices."""
    a = torch.randn(4, 8)

    def to_host(t):
        return (t * 2).cpu().exp()

    def to_device(t):
        return (t * 2).to("neuron").exp()

    for fn, x, want in ((to_host, a.to("neuron"), "cpu"), (to_device, a.clone(), "neuron")):
        x.requires_grad_()
        out = compiled(fn, fullgraph=True)(x)
        assert out.device.type == want == fn(x).device.type
        close(out.cpu(), (2 * a).exp(), torch.float32, "transcendental")
        out.sum().backward()
        assert x.grad.device == x.device
        close(x.grad.cpu(), 2 * (2 * a).exp(), torch.float32, "transcendental")


def test_zero_size_device_tensors_compile_and_match_cpu():
    """A device tensor with no elements compiles (its wrapper storage is never resized: a
    Python device has no resize hook), and every op with an empty operand or result runs on
    the CPU, counted, since an NKI tensor has no empty dimension."""
    a = torch.randn(0, 8)
    x = a.to("neuron").requires_grad_()
    y = compiled(lambda t: ((t * 2).exp().sum(0), t[:, :0] + 1), fullgraph=True)(x)
    assert [type(o) for o in y] == [neuron.NeuronTensor] * 2
    assert y[0].shape == (8,) and torch.equal(y[0].cpu(), torch.zeros(8))
    assert y[1].shape == (0, 0)
    y[0].sum().backward()
    assert x.grad.device.type == "neuron" and x.grad.shape == (0, 8)
    b = torch.randn(4, 8)
    with torch.no_grad():
        empty = compiled(lambda t: t[:0] * 2, fullgraph=True)(b.to("neuron"))
    assert type(empty) is neuron.NeuronTensor and empty.shape == (0, 8)
    assert "no elements" in neuron.compile_report().fallback_reasons()["mul.Tensor"]
