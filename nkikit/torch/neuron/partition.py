"""Partitioning an ATen FX graph into steps for the emulated NeuronCore.

The ``torch.compile`` backend (:mod:`nkikit.torch.neuron.backend`) hands every forward and
backward graph AOTAutograd produces to :func:`partition`, which returns the graph's work as an
ordered list of steps:

- :class:`FusedStep`: a maximal group of ops that the code generator accepts together
  (elementwise ops, casts and reductions over a shared axis: ``supported(node, region)`` of
  :mod:`nkikit.torch.neuron.codegen` decides) as ONE :class:`Region`, so ONE generated kernel;
- :class:`OpStep` of kind ``"library"``: a matmul or attention op, run by a library kernel;
- :class:`OpStep` of kind ``"view"``: a view, reshape, transpose, alias or tuple item: no
  kernel (metadata only on the device);
- :class:`OpStep` of kind ``"fallback"``: anything else, run by CPU torch and counted, with the
  reason the device has no kernel for it.

Grouping is greedy in the graph's order: a fusible node joins the open region unless it reads
a value computed by a step that must run after the region (a step that itself reads the
region), in which case the region is closed first. Steps that do not read the open region run
before it, so a matmul between two elementwise chains that do not depend on it does not split
them. The partition is pure: it reads the graph and its ``meta["val"]`` fake tensors, and
changes nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .region import Node, Region, Value

Supported = Callable[[Node, Region], "str | None"]

aten = torch.ops.aten

# Ops that only rename a value (same data, same layout): they never close a region, and a
# region reads through them.
ALIAS_OPS = frozenset({aten.detach.default, aten.alias.default, aten.lift_fresh_copy.default})

# Ops that change only shape or layout metadata, or pick an item of a tuple: no kernel.
VIEW_OPS = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.t.default,
        aten.transpose.int,
        aten.permute.default,
        aten.expand.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.unbind.int,
        aten.clone.default,
        aten.cat.default,
        operator.getitem,
    }
)

# Ops a library kernel runs (matmul, attention); see :mod:`nkikit.torch.neuron.backend`.
LIBRARY_OPS = frozenset(
    {
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    }
)

# kwargs of ATen ops that do not change the values a kernel computes on the device
_PLACEMENT_KWARGS = frozenset({"layout", "device", "pin_memory", "memory_format", "non_blocking"})


@dataclass
class FusedStep:
    """A region (one generated kernel) and, per region value, the FX node it stands for:
    ``args`` are the FX nodes feeding its inputs (in order), ``results`` those it produces for
    its outputs (in order)."""

    region: Region
    args: tuple[fx.Node, ...]
    results: tuple[fx.Node, ...]
    nodes: tuple[fx.Node, ...]

    kind: str = "fused"


@dataclass
class OpStep:
    """One FX node run alone: ``kind`` is ``"library"``, ``"view"`` or ``"fallback"``
    (``reason`` says why there is no device kernel for a fallback)."""

    node: fx.Node
    kind: str
    reason: str = ""


Step = FusedStep | OpStep


@dataclass
class Partition:
    """The steps of one graph, in an order that respects every dependency."""

    steps: list[Step] = field(default_factory=list)

    @property
    def regions(self) -> list[FusedStep]:
        return [s for s in self.steps if isinstance(s, FusedStep)]

    def of_kind(self, kind: str) -> list[OpStep]:
        return [s for s in self.steps if isinstance(s, OpStep) and s.kind == kind]


def op_name(target: Any) -> str:
    """The ATen overload name without namespace (``"add.Tensor"``), as regions name ops."""
    if isinstance(target, torch._ops.OpOverload):
        name = target.name().split("::", 1)[-1]
        return name if "." in name else name + ".default"
    return getattr(target, "__name__", str(target))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _fake(n: fx.Node) -> Any:
    return n.meta.get("val")


def _is_tensor_node(n: Any) -> bool:
    return isinstance(n, fx.Node) and isinstance(_fake(n), torch.Tensor)


def _tensor_inputs(n: fx.Node) -> list[fx.Node]:
    return [a for a in n.all_input_nodes if isinstance(a, fx.Node)]


class _Builder:
    """The open region while partitioning: its FX nodes and the names of its values."""

    def __init__(self) -> None:
        self.fx_nodes: list[fx.Node] = []
        self.members: set[fx.Node] = set()
        self.inputs: list[fx.Node] = []
        self.names: dict[fx.Node, str] = {}
        self.rnodes: list[Node] = []

    def _name(self, n: fx.Node) -> str:
        if n not in self.names:
            self.names[n] = f"t{len(self.names)}"
        return self.names[n]

    def candidate(
        self,
        n: fx.Node,
        root: Callable[[fx.Node], fx.Node],
        used_outside: Callable[[fx.Node, set[fx.Node]], bool],
    ) -> tuple[Node, Region, tuple[dict[fx.Node, str], list[fx.Node]]]:
        """The region node for ``n``, the region it would make with the open one, and the
        builder state to :meth:`add` it with (the builder is unchanged until then).

        The region's outputs are every value read outside it so far: nodes that join later
        can only remove outputs, so a region the generator accepts now stays acceptable."""
        names = dict(self.names)
        inputs = list(self.inputs)

        def name(m: fx.Node) -> str:
            m = root(m)
            if m not in names:
                names[m] = f"t{len(names)}"
                if m not in self.members:
                    inputs.append(m)
            return names[m]

        op = "getitem" if n.target is operator.getitem else op_name(n.target)
        args = tuple(_encode(a, name) for a in n.args)
        kwargs = tuple(
            (k, _encode(v, name)) for k, v in n.kwargs.items() if k not in _PLACEMENT_KWARGS
        )
        val = _first(_fake(n))
        out = Value(f"t{len(names)}", tuple(val.shape), dtype_name(val.dtype))
        names[n] = out.name
        node = Node(op, args, kwargs, out)
        members = self.members | {n}
        outs = tuple(names[m] for m in (*self.fx_nodes, n) if used_outside(m, members))
        region = Region(
            tuple(_value(m, names[m]) for m in inputs), (*self.rnodes, node), outs or (out.name,)
        )
        return node, region, (names, inputs)

    def add(self, n: fx.Node, node: Node, state: tuple[dict[fx.Node, str], list[fx.Node]]) -> None:
        self.names, self.inputs = state
        self.fx_nodes.append(n)
        self.members.add(n)
        self.rnodes.append(node)

    def close(self, used_outside: Callable[[fx.Node], bool]) -> FusedStep:
        results = tuple(n for n in self.fx_nodes if used_outside(n))
        region = Region(
            tuple(_value(m, self.names[m]) for m in self.inputs),
            tuple(self.rnodes),
            tuple(self.names[n] for n in results),
        )
        return FusedStep(region, tuple(self.inputs), results, tuple(self.fx_nodes))


def _encode(x: Any, name: Callable[[fx.Node], str]) -> Any:
    if isinstance(x, fx.Node):
        return name(x)
    if isinstance(x, list | tuple):
        return tuple(_encode(e, name) for e in x)
    if isinstance(x, torch.dtype):
        return dtype_name(x)
    return x


def _first(val: Any) -> Any:
    """A multi-result op's first result (a region node's ``out``, as FX names it)."""
    return val[0] if isinstance(val, tuple | list) else val


def _value(n: fx.Node, name: str) -> Value:
    val = _first(_fake(n))
    return Value(name, tuple(val.shape), dtype_name(val.dtype))


def _static(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and all(isinstance(d, int) for d in t.shape)


def _fusible_shape(n: fx.Node) -> str | None:
    """Why ``n`` cannot be in a region whatever the code generator says (None if it can).
    Multi-result ops qualify (their ``getitem`` users name the other results)."""
    val = _fake(n)
    vals = val if isinstance(val, tuple | list) and val else (val,)
    if not all(_static(v) for v in vals):
        return "its result is not tensors of a static shape (compile with dynamic=False)"
    for a in _tensor_inputs(n):
        if not _static(_fake(a)):
            return f"its argument {a.name} is not a tensor of a static shape"
    return None


def partition(graph: fx.Graph, supported: Supported) -> Partition:
    """The steps of ``graph`` (an ATen graph whose nodes carry ``meta["val"]``); ``supported``
    is the code generator's ``supported(node, region) -> reason | None``, asked with the region
    the node would join (the node last)."""
    alias: dict[fx.Node, fx.Node] = {}

    def root(n: fx.Node) -> fx.Node:
        while n in alias:
            n = alias[n]
        return n

    users: dict[fx.Node, set[fx.Node]] = {}
    for n in graph.nodes:
        for a in _tensor_inputs(n):
            users.setdefault(a, set()).add(n)

    out = Partition()
    builder = _Builder()
    after: list[OpStep] = []  # steps that read the open region: they run after it
    late: set[fx.Node] = set()  # their nodes (and aliases of region values)

    def used_outside(n: fx.Node, members: set[fx.Node]) -> bool:
        todo, seen = [n], set()
        while todo:
            m = todo.pop()
            for u in users.get(m, ()):
                if u in alias and u not in seen:
                    seen.add(u)
                    todo.append(u)
                elif u not in members:
                    return True
        return False

    def flush() -> None:
        nonlocal builder, after
        if builder.fx_nodes:
            members = builder.members
            out.steps.append(builder.close(lambda n: used_outside(n, members)))
        out.steps.extend(after)
        builder, after = _Builder(), []
        late.clear()

    for n in graph.nodes:
        if n.op != "call_function":
            continue
        ins = [root(a) for a in _tensor_inputs(n)]
        reads_open = any(a in builder.members or a in late for a in ins)
        if n.target in ALIAS_OPS and len(n.args) >= 1 and isinstance(n.args[0], fx.Node):
            alias[n] = n.args[0]
            step = OpStep(n, "view")
            if reads_open:
                after.append(step)
            else:
                out.steps.append(step)
            continue
        kind, reason = _classify(n)
        if n.target is operator.getitem and root(n.args[0]) in builder.members:
            kind = "fuse"  # an item of a multi-result op in the open region: a region value
        if kind == "fuse":
            if any(a in late for a in ins):
                flush()
            node, region, state = builder.candidate(n, root, used_outside)
            reason = supported(node, region)
            if reason is not None and builder.fx_nodes:
                node1, region1, state1 = _Builder().candidate(n, root, used_outside)
                if supported(node1, region1) is None:
                    flush()
                    node, state, reason = node1, state1, None
            if reason is None:
                builder.add(n, node, state)
                continue
            kind = "fallback"
        step = OpStep(n, kind, reason or "")
        if reads_open:
            late.add(n)
            after.append(step)
        else:
            out.steps.append(step)
    flush()
    return out


def _classify(n: fx.Node) -> tuple[str, str | None]:
    """``("view" | "library" | "fuse" | "fallback", reason)`` for a call node."""
    if n.target in VIEW_OPS:
        return "view", None
    if n.target in LIBRARY_OPS:
        return "library", None
    if not isinstance(n.target, torch._ops.OpOverload):
        return "fallback", f"{op_name(n.target)} is not an ATen op"
    why = _fusible_shape(n)
    if why is not None:
        return "fallback", why
    return "fuse", None


def summary(steps: Iterable[Step]) -> dict[str, int]:
    """Steps counted by kind (``fused``, ``library``, ``view``, ``fallback``)."""
    counts: dict[str, int] = {"fused": 0, "library": 0, "view": 0, "fallback": 0}
    for s in steps:
        counts[s.kind] += 1
    return counts
