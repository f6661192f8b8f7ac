"""A region: a small dataflow graph of ATen ops that runs as ONE generated NKI kernel.

The emulated Neuron device (eager: one op per region) and the ``torch.compile`` backend (a
fused chain of elementwise ops and reductions per region) describe what to run in this one
form; :mod:`nkikit.torch.neuron.codegen` turns a region into readable NKI 0.x source and a
kernel, cached by :attr:`Region.key` (like a NEFF cache: same ops, shapes and dtypes, same
kernel).

A region is pure data (no torch tensors, no callables), so it hashes, prints and pickles:

    x = Value("x", (4096, 4096), "bfloat16")
    sq = Node("mul.Tensor", ("x", "x"), {}, Value("v0", (4096, 4096), "float32"))
    Region(inputs=(x,), nodes=(sq, ...), outputs=("v5",))

Names refer to inputs or earlier nodes' results. ``Node.op`` is the ATen overload name
without its namespace (``"add.Tensor"``, ``"sum.dim_IntList"``, ``"_to_copy.default"``);
``args``/``kwargs`` are as torch passes them, with every tensor argument replaced by its
value's name (a ``str``) and every other argument kept as the Python scalar, list, or
``torch.dtype`` *name* (``"bfloat16"``) it was. Dtype names are torch's (``str(t.dtype)``
without ``torch.``). Value names are generated (``t0``, ``t1``...) so that they never equal a
string argument such as gelu's ``approximate="tanh"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Value:
    """A tensor in a region: its name, shape and torch dtype name (``"float32"``...)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Node:
    """One ATen op: ``out = op(*args, **kwargs)``; tensor arguments are value names."""

    op: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    out: Value = field(default_factory=lambda: Value("", (), "float32"))


@dataclass(frozen=True, slots=True)
class Region:
    """Inputs (in kernel-argument order), nodes (in execution order), and the names of the
    values the kernel returns (in order)."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]

    @property
    def key(self) -> tuple:
        """The cache key: the region up to renaming of its values (two regions with the same
        ops, shapes, dtypes and wiring share one kernel)."""
        rename = {v.name: f"i{k}" for k, v in enumerate(self.inputs)}
        nodes = []
        for k, n in enumerate(self.nodes):
            rename[n.out.name] = f"n{k}"
            nodes.append(
                (
                    n.op,
                    _renamed(n.args, rename),
                    _renamed(n.kwargs, rename),
                    n.out.shape,
                    n.out.dtype,
                )
            )
        ins = tuple((v.shape, v.dtype) for v in self.inputs)
        return ins, tuple(nodes), tuple(rename[o] for o in self.outputs)

    def value(self, name: str) -> Value:
        """The input or node result called ``name`` (KeyError if none)."""
        for v in self.inputs:
            if v.name == name:
                return v
        for n in self.nodes:
            if n.out.name == name:
                return n.out
        raise KeyError(name)


def _renamed(x: Any, rename: dict[str, str]) -> Any:
    if isinstance(x, str):
        return rename.get(x, x)
    if isinstance(x, tuple | list):
        return tuple(_renamed(e, rename) for e in x)
    return x
