"""``torch.compile(model, backend="neuron")``: graphs fused into generated NKI kernels.

Dynamo captures the model's graphs; AOTAutograd (``torch._dynamo.backends.common.aot_autograd``)
turns each into an ATen forward graph and, when a gradient is needed, an ATen backward graph,
so both passes reach this backend as FX graphs of ATen ops. Each graph is partitioned once
(:mod:`nkikit.torch.neuron.partition`): maximal groups of elementwise ops and reductions become
ONE region, compiled once per shape and dtype into ONE generated NKI kernel
(:func:`nkikit.torch.neuron.codegen.compile_region`, cached by the region's key like a NEFF
cache); matmuls and attention run the library's kernels; views are metadata; every other op
runs on CPU torch, is counted and shown as a fallback. Kernels launch through nkikit's normal
call path, so a system profile (``nkikit.torch.profiler``) records each one with its modeled
device time, and each compiled graph call is a ``torch.profiler`` range
(``neuron graph <n> <pass>``) with its fallbacks inside as ``neuron.fallback <op>`` ranges.

The model and its inputs live on the ``neuron`` device, as with TorchNeuron (Dynamo and
AOTAutograd see through a device tensor to its storage, and the results come back as device
tensors); CPU tensors work too, the graph still runs on the emulated device. Inside a graph
every value is a host tensor (a device tensor's storage): tensors the graph makes on the device
(factories, ``.to("neuron")``) are made on the host, and each output is returned on the device
the graph traced it on, so ``.cpu()`` and ``.to("neuron")`` inside a graph give what they give
in eager mode. Shapes are static: compile with ``dynamic=False`` (a node whose shape is
symbolic falls back).

:func:`compile_report` tells what happened: graphs compiled, graph breaks (from Dynamo's
counters, with their reasons), regions, library calls and fallbacks (with reasons).
:func:`generated_kernels` returns the NKI source of every kernel generated so far, and
:func:`write_kernel_folder` writes one as a kernel folder the registry publishes.
"""

from __future__ import annotations

import io
import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from .partition import FusedStep, OpStep, Partition, op_name, partition

BACKEND_NAME = "neuron"

aten = torch.ops.aten


@dataclass
class GraphRecord:
    """One compiled graph: its number (per Dynamo graph), pass (``forward``, ``backward`` or
    ``inference``), partition, and what its calls ran."""

    graph: int
    kind: str
    partition: Partition
    calls: int = 0
    launches: Counter = field(default_factory=Counter)  # kernel name -> launches
    fallbacks: Counter = field(default_factory=Counter)  # op -> CPU runs


@dataclass
class _State:
    graphs: list[GraphRecord] = field(default_factory=list)
    dynamo_graphs: int = 0
    breaks_at_reset: Counter = field(default_factory=Counter)
    compiled: dict[str, Any] = field(default_factory=dict)  # kernel name -> CompiledRegion


_STATE = _State()
_GRAPH_IDS = itertools.count()


def _codegen() -> Any:
    from . import codegen

    return codegen


def _supported(node: Any, region: Any) -> str | None:
    """The code generator's verdict (every node falls back while there is none)."""
    try:
        codegen = _codegen()
    except ImportError:
        return "no code generator (nkikit.torch.neuron.codegen) in this build"
    return codegen.supported(node, region)


class CompiledGraph:
    """The callable AOTAutograd gets for one ATen graph (boxed: takes the list of arguments)."""

    def __init__(self, gm: fx.GraphModule, record: GraphRecord) -> None:
        # an instance attribute: wrappers (functools.wraps) copy it, so AOTAutograd still sees
        # the boxed convention through Dynamo's disable wrapper of the backward
        self._boxed_call = True
        _on_host(gm.graph)
        gm.recompile()
        self.gm = gm
        self.record = record
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.constants = {n: _get_attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
        # which outputs the graph was traced to put on the device (made there by a factory or
        # a ``.to("neuron")``): the graph computes them on the host, they are returned on it
        self.on_device = [_traced_on_device(o) for o in self.output.args[0]]

    def __call__(self, *args: Any) -> list[Any]:
        """Run the graph on its arguments: one list (AOTAutograd's boxed convention; the list
        is emptied, the graph owns its inputs) or the tensors themselves."""
        if len(args) == 1 and isinstance(args[0], list):
            boxed: list[Any] = args[0]
            args = tuple(boxed)
            boxed.clear()
        return self._run(list(args))

    def _run(self, args: list[Any]) -> list[Any]:
        from .device import NeuronTensor, storage, wrap

        rec = self.record
        rec.calls += 1
        # Device tensors are run on their storage (the emulated HBM) and the results the graph
        # traced on the device put back on it: the graph is one device program, its ops are
        # not dispatched one by one.  (Which device an output belongs on is the trace's to say,
        # not the arguments': a backward graph handed device tensors saved by its forward still
        # returns a host input's gradient on the host.)
        host = [storage(a) if isinstance(a, NeuronTensor) else a for a in args]
        env: dict[fx.Node, Any] = dict(zip(self.placeholders, host, strict=True))
        args.clear()
        env.update({n: storage(c) for n, c in self.constants.items()})
        with torch.profiler.record_function(f"neuron graph {rec.graph} {rec.kind}"):
            for step in rec.partition.steps:
                if isinstance(step, FusedStep):
                    self._fused(step, env)
                else:
                    self._op(step, env)
        outs = list(_load(self.output.args[0], env))
        return [
            wrap(o) if isinstance(o, torch.Tensor) and dev else o
            for o, dev in zip(outs, self.on_device, strict=True)
        ]

    def _fused(self, step: FusedStep, env: dict[fx.Node, Any]) -> None:
        compiled = _compile(step.region)
        outs = compiled.run(*(_to_numpy(env[a]) for a in step.args))
        self.record.launches[compiled.name] += 1
        for n, o in zip(step.results, outs, strict=True):
            env[n] = _strided_like(_from_numpy(o), n)

    def _op(self, step: OpStep, env: dict[fx.Node, Any]) -> None:
        n = step.node
        args, kwargs = _load(n.args, env), _load(n.kwargs, env)
        if step.kind == "library":
            out = _library(n.target, args, kwargs, self.record)
            if out is not None:
                env[n] = _strided_like(out, n)
                return
        elif step.kind == "view":
            env[n] = n.target(*args, **kwargs)
            return
        op = op_name(n.target)
        self.record.fallbacks[op] += 1
        with torch.profiler.record_function(f"neuron.fallback {op}"):
            env[n] = n.target(*args, **kwargs)


def _traced_on_device(n: Any) -> bool:
    """Whether the graph output ``n`` was traced as a tensor on the ``neuron`` device."""
    from .device import DEVICE

    val = n.meta.get("val") if isinstance(n, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == DEVICE


def _on_host(graph: fx.Graph) -> None:
    """Make the ops of ``graph`` that create a tensor on the device create it on the host.

    A compiled graph is one device program run on host tensors (device tensors' storages, the
    emulated HBM; :meth:`CompiledGraph._run`), so a factory the graph traced on the device
    (``torch.ones(..., device="neuron")``, the scalar of ``torch.where(c, a, 0.0)``, a causal
    mask) and a ``.to("neuron")`` inside it must give host tensors like every other op:
    a device tensor there would meet kernels and host tensors that cannot take it. The
    outputs traced on the device are put back on it when the graph returns."""
    from .device import DEVICE, HOST, check_index

    for n in graph.nodes:
        dev = n.kwargs.get("device") if n.op == "call_function" else None
        check_index(dev)  # a graph that makes a tensor on ``neuron:1`` is refused as eager is
        if dev is not None and torch.device(dev).type == DEVICE:
            n.kwargs = {**n.kwargs, "device": HOST}


def _strided_like(out: Any, n: fx.Node) -> Any:
    """``out`` (a kernel's contiguous result, or a tuple of them) laid out with the strides the
    graph was traced with: views later in the graph (``view`` after a ``transpose``) rely on
    them, as on any device."""
    val = n.meta.get("val")
    if isinstance(out, tuple | list):
        vals = val if isinstance(val, tuple | list) else [None] * len(out)
        return type(out)(_restride(o, v) for o, v in zip(out, vals, strict=True))
    return _restride(out, val)


def _restride(t: Any, val: Any) -> Any:
    if not isinstance(t, torch.Tensor) or not isinstance(val, torch.Tensor):
        return t
    if t.shape != val.shape or t.stride() == val.stride():
        return t
    out = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=t.dtype)
    return out.copy_(t)


def _get_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _load(x: Any, env: dict[fx.Node, Any]) -> Any:
    if isinstance(x, fx.Node):
        return env[x]
    if isinstance(x, tuple | list):
        return type(x)(_load(e, env) for e in x)
    if isinstance(x, dict):
        return {k: _load(v, env) for k, v in x.items()}
    return x


def _to_numpy(t: torch.Tensor) -> Any:
    from ..convert import to_numpy

    return to_numpy(t.detach().contiguous())


def _from_numpy(a: Any) -> torch.Tensor:
    from ..convert import from_numpy

    return from_numpy(a)


def _compile(region: Any) -> Any:
    compiled = _codegen().compile_region(region)
    _STATE.compiled[compiled.name] = compiled  # the latest use of a name (shapes differ)
    return compiled


# ----------------------------------------------------------------------------- library ops


def _library(target: Any, args: Sequence[Any], kwargs: dict[str, Any], rec: GraphRecord) -> Any:
    """Run a matmul or attention op with the library's kernels; None when the library takes
    no such call (the op then falls back, counted)."""
    fn = _LIBRARY.get(target)
    if fn is None:
        return None
    return fn(rec, *args, **kwargs)


def _matmul_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    from nkikit.library.matmul.kernel import FLOAT_DTYPES, MAX_K

    return (
        a.dtype == b.dtype
        and dtype_of(a) in FLOAT_DTYPES
        and 1 <= a.shape[-1] <= MAX_K
        and a.numel() > 0
        and b.numel() > 0
    )


def dtype_of(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _mm(rec: GraphRecord, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    from nkikit.library.matmul.kernel import matmul

    if not _matmul_ok(a, b):
        return None
    rec.launches["matmul_kernel"] += 1
    return matmul(a.detach().t().contiguous(), b.detach().contiguous())


def _bmm(rec: GraphRecord, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    if not _matmul_ok(a, b):
        return None
    # one library matmul per batch element (the library kernel is 2-D)
    return torch.stack([_mm(rec, a[i], b[i]) for i in range(a.shape[0])])


def _addmm(
    rec: GraphRecord,
    bias: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
) -> torch.Tensor | None:
    if beta != 1 or alpha != 1 or bias.dtype != a.dtype:
        return None
    prod = _mm(rec, a, b)
    if prod is None:
        return None
    return _elementwise(rec, "add.Tensor", prod, bias)


def _elementwise(rec: GraphRecord, op: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``op(x, y)`` as a one-node region (a generated kernel)."""
    from .region import Node, Region, Value

    shape = tuple(torch.broadcast_shapes(x.shape, y.shape))
    vx = Value("t0", tuple(x.shape), dtype_of(x))
    vy = Value("t1", tuple(y.shape), dtype_of(y))
    node = Node(op, ("t0", "t1"), (), Value("t2", shape, dtype_of(x)))
    region = Region((vx, vy), (node,), ("t2",))
    compiled = _compile(region)
    rec.launches[compiled.name] += 1
    (out,) = compiled.run(_to_numpy(x), _to_numpy(y))
    return _from_numpy(out)


def _attn_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout: float) -> bool:
    return (
        mask is None
        and not dropout
        and q.dim() == 4
        and q.dtype == k.dtype == v.dtype
        and dtype_of(q) in ("float32", "bfloat16")
        and k.shape == v.shape
        and q.shape[0] == k.shape[0]
        and q.shape[2] == k.shape[2]
        and q.shape[3] == k.shape[3]
        and q.shape[1] % k.shape[1] == 0
        and 1 <= q.shape[2] <= 4096
        and 1 <= q.shape[3] <= 128
    )


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return float(scale) if scale else 1.0 / math.sqrt(q.shape[-1])


def _sdpa(
    rec: GraphRecord,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    attn_mask: Any = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``_scaled_dot_product_flash_attention_for_cpu``: (out, logsumexp) from the library's
    forward kernel (its log-sum-exp is the same quantity, [B, H, S] fp32)."""
    from nkikit.library.attention.kernel import flash_attention_fwd_kernel

    if not _attn_ok(q, k, v, attn_mask, dropout_p):
        return None
    rec.launches["flash_attention_fwd_kernel"] += 1
    out, lse = flash_attention_fwd_kernel(
        *(t.detach().contiguous() for t in (q, k, v)), bool(is_causal), _scale(q, scale), True
    )
    return out, lse


def _sdpa_backward(
    rec: GraphRecord,
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    attn_mask: Any = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The backward of the op above: the library's attention backward (which reruns its
    forward for ``out`` and the log-sum-exp)."""
    from nkikit.library.attention.kernel import attention_backward

    if not _attn_ok(q, k, v, attn_mask, dropout_p) or grad.dtype != q.dtype:
        return None
    rec.launches["attention_backward"] += 1
    ts = (t.detach().contiguous() for t in (grad, q, k, v))
    return tuple(attention_backward(*ts, causal=bool(is_causal), scale=_scale(q, scale)))


_LIBRARY: dict[Any, Callable[..., Any]] = {
    aten.mm.default: _mm,
    aten.bmm.default: _bmm,
    aten.addmm.default: _addmm,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _sdpa_backward,
}


# ----------------------------------------------------------------------------- the backend


def _graph_compiler(graph: int, kind: str) -> Callable[[fx.GraphModule, list[Any]], Any]:
    def compile_graph(gm: fx.GraphModule, example_inputs: list[Any]) -> CompiledGraph:
        part = partition(gm.graph, _supported)
        # compile every region once per shape, now rather than at the first call; a region the
        # generator turns down as a whole (it accepted each node) runs its ops on the CPU
        steps: list[Any] = []
        for step in part.steps:
            if isinstance(step, FusedStep):
                try:
                    _compile(step.region)
                except Exception as e:  # noqa: BLE001  (codegen's Unsupported and its checks)
                    why = f"its fused region was not generated: {str(e).splitlines()[0]}"
                    steps += [_unfused(n, why) for n in step.nodes]
                    continue
            steps.append(step)
        part.steps = steps
        rec = GraphRecord(graph, kind, part)
        _STATE.graphs.append(rec)
        return CompiledGraph(gm, rec)

    return compile_graph


def _unfused(n: fx.Node, why: str) -> OpStep:
    return OpStep(n, "view" if n.target is operator.getitem else "fallback", why)


def neuron_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """The ``torch.compile`` backend: ``torch.compile(model, backend="neuron")`` (the name is
    registered when ``nkikit.torch.neuron`` is imported) or ``backend=nkikit.torch.neuron.backend``.
    Returns AOTAutograd's callable, whose forward and backward graphs run on the device."""
    from torch._dynamo.backends.common import aot_autograd

    graph = next(_GRAPH_IDS)
    _STATE.dynamo_graphs += 1
    return aot_autograd(
        fw_compiler=_graph_compiler(graph, "forward"),
        bw_compiler=_graph_compiler(graph, "backward"),
        inference_compiler=_graph_compiler(graph, "inference"),
    )(gm, example_inputs, **kwargs)


def register() -> None:
    """Register :func:`neuron_backend` as Dynamo's ``"neuron"`` backend (idempotent)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if _COMPILER_FNS.get(BACKEND_NAME) is not neuron_backend:
        _COMPILER_FNS.pop(BACKEND_NAME, None)
        register_backend(neuron_backend, name=BACKEND_NAME)


# ----------------------------------------------------------------------------- reports


def _graph_breaks() -> Counter:
    from torch._dynamo.utils import counters

    now = Counter(dict(counters["graph_break"]))
    now.subtract(_STATE.breaks_at_reset)
    return Counter({k: v for k, v in now.items() if v > 0})


@dataclass
class CompileReport:
    """What the backend compiled and ran since the last :func:`reset_compile_report`."""

    graphs: list[GraphRecord]
    dynamo_graphs: int
    graph_breaks: Counter  # reason -> count

    @property
    def fallbacks(self) -> Counter:
        """op -> CPU runs, over every graph call."""
        total: Counter = Counter()
        for g in self.graphs:
            total.update(g.fallbacks)
        return total

    @property
    def launches(self) -> Counter:
        """kernel -> launches, over every graph call."""
        total: Counter = Counter()
        for g in self.graphs:
            total.update(g.launches)
        return total

    @property
    def regions(self) -> int:
        return sum(len(g.partition.regions) for g in self.graphs)

    def fallback_reasons(self) -> dict[str, str]:
        """op -> why it has no device kernel (from the partition)."""
        return {
            op_name(s.node.target): s.reason or "no device implementation"
            for g in self.graphs
            for s in g.partition.of_kind("fallback")
        }

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        t = Table(title="torch.compile(backend='neuron')")
        for col in ("graph", "pass", "calls", "fused kernels", "library", "views", "fallbacks"):
            t.add_column(col, justify="left" if col in ("pass", "fallbacks") else "right")
        for g in self.graphs:
            p = g.partition
            fb = Counter(op_name(s.node.target) for s in p.of_kind("fallback"))
            t.add_row(
                str(g.graph),
                g.kind,
                str(g.calls),
                str(len(p.regions)),
                str(len(p.of_kind("library"))),
                str(len(p.of_kind("view"))),
                ", ".join(f"{op} x{c}" for op, c in fb.items()) or "-",
            )
        parts: list[Any] = [t]
        nb = sum(self.graph_breaks.values())
        title = f"graph breaks: {nb} (Dynamo graphs: {self.dynamo_graphs})"
        if nb:
            b = Table(title=title)
            b.add_column("count", justify="right")
            b.add_column("reason")
            for reason, c in self.graph_breaks.most_common():
                b.add_row(str(c), reason.splitlines()[0][:200])
            parts.append(b)
        else:
            parts.append(title)
        reasons = self.fallback_reasons()
        if reasons:
            f = Table(title="CPU fallbacks")
            f.add_column("op")
            f.add_column("runs", justify="right")
            f.add_column("reason")
            runs = self.fallbacks
            for op, why in reasons.items():
                f.add_row(op, str(runs.get(op, 0)), why)
            parts.append(f)
        return Group(*parts)

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=120, record=True, file=io.StringIO())
        console.print(self)
        return console.export_text()


def compile_report() -> CompileReport:
    """The report of every graph compiled since the last :func:`reset_compile_report`; print
    it (rich) for the tables."""
    return CompileReport(list(_STATE.graphs), _STATE.dynamo_graphs, _graph_breaks())


def reset_compile_report() -> None:
    """Forget the graphs compiled so far (the kernels stay cached) and count graph breaks from
    now on."""
    from torch._dynamo.utils import counters

    _STATE.graphs.clear()
    _STATE.dynamo_graphs = 0
    _STATE.breaks_at_reset = Counter(dict(counters["graph_break"]))


# ----------------------------------------------------------------------------- kernels


def generated_kernels() -> dict[str, str]:
    """Kernel name -> NKI source, for every kernel the backend generated in this process (for
    a name generated at several shapes, the one used last)."""
    return {name: c.source for name, c in _STATE.compiled.items()}


_NKI_IMPORTS = (
    ("import nki.isa as nisa", "import nkikit.nki.isa as nisa"),
    ("import nki.language as nl", "import nkikit.nki.language as nl"),
    ("import nki\n", "import nkikit.nki as nki\n"),
)


def write_kernel_folder(name: str, path: str | Path) -> Path:
    """Write the generated kernel ``name`` (a key of :func:`generated_kernels`) as a kernel
    folder the registry takes (``kernel.toml`` + ``kernel.py``, see
    :mod:`nkikit.registry.manifest`): its NKI source, importing nkikit's NKI 0.x dialect (which
    ``nkikit publish`` maps back onto ``nki``); the entry takes and returns numpy arrays.
    Returns the folder."""
    compiled = _STATE.compiled[name]
    region = compiled.region
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    source = compiled.source
    for old, new in _NKI_IMPORTS:
        source = source.replace(old, new, 1)
    (folder / "kernel.py").write_text(source, encoding="utf-8")
    inputs = ", ".join(f'"{v.name}"' for v in region.inputs)
    dtypes_ = ", ".join(f'"{d}"' for d in sorted({v.dtype for v in region.inputs}))
    example = ", ".join(f"{v.name} = {list(v.shape)}" for v in region.inputs)
    ops = ", ".join(n.op for n in region.nodes)
    (folder / "kernel.toml").write_text(
        "[kernel]\n"
        f'name = "{name}"\n'
        "version = 1\n"
        'license = "Apache-2.0"\n'
        f'description = "Generated by the nkikit torch.compile backend: {ops}"\n\n'
        f"[functions.{name}]\n"
        f'entry = "kernel:{name}"\n'
        f"inputs = [{inputs}]\n"
        f"dtypes = [{dtypes_}]\n"
        f"example = {{ {example} }}\n",
        encoding="utf-8",
    )
    return folder
