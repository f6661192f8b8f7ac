"""Regions of ATen ops → readable NKI 0.x kernels, compiled once per region and target.

:func:`compile_region` writes the source of one ``@nki.jit`` kernel for a
:class:`~.region.Region` (``import nki`` / ``nki.language as nl`` / ``nki.isa as nisa``, the
form a user can save to a file and publish), loads it as an nkikit NKI 0.x kernel, and caches
it by ``(region.key, target)``, like a NEFF cache: a region that differs only in value names
gets the same :class:`CompiledRegion`.  :meth:`CompiledRegion.run` calls the kernel through
nkikit's normal launch path, so a system profile records each launch and its modeled time.

The kernel tiles the region as :mod:`.layout` plans it (partitions × free elements, reductions
on the free axis) and computes each node as :mod:`.rules` says; :func:`supported` answers,
per node, why a node cannot be generated (the device falls back to the CPU for it, the compile
backend cuts the region there).

Multi-result ops (``native_layer_norm``, ``var_mean``) follow FX: the node's ``out`` is its
first result and a ``getitem`` node (``args=(name, k)``) names result ``k``.

Numerics: the engines compute in fp32 and round on write (reference/nki-0x.md §6.1).  Each op
writes its result in its own dtype, so a one-op region rounds exactly where torch does (bit
for bit for single-instruction ops); inside a fused region an op folded into its consumer's
instruction (an activation summed by its accumulate, a scalar stage of a two-stage
``tensor_scalar``, a scale or bias of an activation) and the per-row statistics stay fp32,
as ``torch.compile`` keeps them.

Dtypes: float32, bfloat16 and float16 compute; bool and small integer types are accepted by
casts, comparisons and ``where``.  int64 has no NKI tile dtype (NKI's dtype list,
reference/nki-0x.md §3.11): regions with int64 tensors are not generated.  Float-to-integer
casts are not generated either: the engines round to nearest even (§6.1), torch truncates.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import importlib
import keyword
import linecache
import math
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .layout import PMAX, Plan, Unsupported, plan
from .region import Node, Region
from .rules import NL_DTYPES, RULES, SBUF_DTYPES, Body, Tile, tensor_dtypes

__all__ = [
    "CompiledRegion",
    "Unsupported",
    "cache_clear",
    "compile_region",
    "render",
    "supported",
]


@dataclass(slots=True)
class CompiledRegion:
    """A region's generated kernel.  ``source`` is its NKI 0.x text, ``name`` its function
    name, ``kernel`` the nkikit ``@nki.jit`` kernel; ``region`` is the region it was generated
    for (value names as there)."""

    name: str
    source: str
    kernel: Any
    region: Region
    target: str | None = None

    def run(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Run the kernel on the region's inputs (numpy arrays, bf16 as ``ml_dtypes``), in
        order; returns the region's outputs, in order, with the outputs' shapes."""
        if len(arrays) != len(self.region.inputs):
            raise TypeError(
                f"{self.name}: expected {len(self.region.inputs)} arrays, got {len(arrays)}"
            )
        args = []
        for a, v in zip(arrays, self.region.inputs):
            a = np.ascontiguousarray(a)
            if tuple(a.shape) != v.shape and a.size != math.prod(v.shape):
                raise ValueError(f"{self.name}: {v.name} has shape {a.shape}, expected {v.shape}")
            args.append(a.reshape(v.shape or (1,)))
        with _target(self.target):
            out = self.kernel(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(
            np.asarray(o).reshape(self.region.value(name).shape)
            for o, name in zip(outs, self.region.outputs)
        )


_CACHE: dict[tuple, CompiledRegion] = {}
_LOCK = threading.Lock()


def cache_clear() -> None:
    """Forget every compiled region (their kernels' own trace caches go with them)."""
    with _LOCK:
        _CACHE.clear()


def supported(node: Node, region: Region) -> str | None:
    """None if ``node`` can be generated as part of ``region`` (the region it is, or would
    be, part of), else why not, in words a fallback report can show."""
    rule = RULES.get(node.op)
    if rule is None:
        return f"no NKI code generator for aten.{node.op}"
    why = _check_node(node, region)
    if why is not None:
        return why
    if node in region.nodes:
        try:
            plan(region, _kinds(region))
        except Unsupported as e:
            return str(e)
    return None


def compile_region(region: Region, target: str | None = None) -> CompiledRegion:
    """The kernel for ``region`` on ``target`` (None: nkikit's default target, as
    ``NEURON_PLATFORM_TARGET_OVERRIDE`` names it), generated on first use and cached by
    ``(region.key, target)``.  Raises :class:`Unsupported` (with the reason) for a region
    that cannot be generated."""
    key = (region.key, target)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    name, source = render(region)
    kernel = _load(name, source)
    compiled = CompiledRegion(name, source, kernel, region, target)
    with _LOCK:
        return _CACHE.setdefault(key, compiled)


# -- rendering ---------------------------------------------------------------------------------


def render(region: Region) -> tuple[str, str]:
    """``(kernel name, NKI 0.x source)`` for ``region``; Unsupported if it cannot be."""
    for node in region.nodes:
        if node.op not in RULES:
            raise Unsupported(f"no NKI code generator for aten.{node.op}")
        why = _check_node(node, region)
        if why is not None:
            raise Unsupported(why)
    p = plan(region, _kinds(region))
    return _Writer(region, p).source()


def _check_node(node: Node, region: Region) -> str | None:
    def dtype_of(name: str) -> str | None:
        try:
            return region.value(name).dtype
        except KeyError:
            return None

    for v in [node.out] + [region.value(a) for a in _names(node, region)]:
        if v.dtype == "int64":
            return f"{v.name} is int64, which has no NKI tile dtype (it stays on the CPU)"
        if v.dtype not in NL_DTYPES:
            return f"{v.name} is {v.dtype}, which the code generator does not handle"
        if 0 in v.shape:
            # an NKI tensor has no empty dimension (nl.ndarray refuses one): there is nothing
            # for a kernel to compute, so CPU torch makes the empty (or reduced-from-empty) result
            return f"{v.name} has no elements (shape {list(v.shape)}), which an NKI tensor cannot"
    return RULES[node.op].check(node, tensor_dtypes(node, dtype_of))


def _names(node: Node, region: Region) -> list[str]:
    known = {v.name for v in region.inputs} | {n.out.name for n in region.nodes}
    out = []
    for a in list(node.args) + [v for _, v in node.kwargs]:
        for e in a if isinstance(a, tuple | list) else (a,):
            if isinstance(e, str) and e in known:
                out.append(e)
    return out


def _kinds(region: Region) -> dict[str, tuple[str, tuple[int, ...]]]:
    kinds = {}
    for node in region.nodes:
        rule = RULES[node.op]
        dims = rule.dims(node) if rule.dims is not None else ()
        kinds[node.out.name] = (rule.kind, dims, rule.folds)
    return kinds


_RESERVED = {"nki", "nl", "nisa", "p", "f", "r", "c", "min", "range", "float"}


def _kernel_name(region: Region) -> str:
    parts: list[str] = []
    for n in region.nodes:
        if n.op == "getitem":
            continue
        base = n.op.split(".")[0].strip("_")
        if base in ("to_copy", "clone", "alias"):
            base = "cast" if base == "to_copy" else "copy"
        if not parts or parts[-1] != base:
            parts.append(base)
    if len(parts) > 5:
        parts = parts[:4] + [f"{len(parts) - 4}more"]
    return "_".join(parts) or "identity"


class _Writer:
    """Writes one region's kernel: arguments, output allocations, loops, one tile body."""

    def __init__(self, region: Region, p: Plan) -> None:
        self.region, self.plan = region, p
        self.params: dict[str, str] = {}
        used = set(_RESERVED)
        for v in region.inputs:
            base = v.name if v.name.isidentifier() and not keyword.iskeyword(v.name) else "x"
            name = base
            k = 1
            while name in used:
                name, k = f"{base}_{k}", k + 1
            used.add(name)
            self.params[v.name] = name
        self.outs = []
        for k in range(len(region.outputs)):
            name = f"out{k}" if len(region.outputs) > 1 else "out"
            while name in used:
                name += "_"
            used.add(name)
            self.outs.append(name)

    # access patterns ------------------------------------------------------------------------
    def _looped_part(self) -> bool:
        return self.plan.part_size > PMAX

    def _chunked(self) -> bool:
        return self.plan.free_size > self.plan.chunk

    def pattern(self, name: str, wide: bool, hoisted: bool = False) -> tuple[str, str]:
        """``(pattern, offset)`` of the HBM tensor ``name`` for the current tile."""
        p, st = self.plan, self.plan.strides[name]
        ps = st[p.part] if p.part is not None else 0
        if hoisted:
            rows = f"[0, {min(p.part_size, PMAX)}]"
        elif p.fold and not wide:
            rows = "[0, 1]"  # a whole-region reduction result: one element
        else:
            rows = f"[{ps}, {'p' if self._looped_part() else p.part_size}]"
        if not wide:
            free = ["[1, 1]"]
        elif self._chunked():
            free = [f"[{st[p.free[0]]}, f]"]
        else:
            free = [f"[{st[d]}, {p.dims[d]}]" for d in p.free]
        terms = []
        if not hoisted:
            for k, d in enumerate(p.outer):
                if st[d]:
                    terms.append(f"i{k} * {st[d]}")
            if self._looped_part() and ps:
                terms.append(f"r * {ps}")
            if self._chunked() and wide and st[p.free[0]]:
                terms.append(f"c * {st[p.free[0]]}")
        return f"[{rows}, {', '.join(free)}]", " + ".join(terms) or "0"

    def _hoistable(self, name: str) -> bool:
        p, st = self.plan, self.plan.strides[name]
        if any(st[d] for d in p.outer):
            return False
        if p.part is not None and st[p.part]:
            return False
        return not (self._chunked() and p.wide[name])

    # source ------------------------------------------------------------------------------------
    def source(self) -> tuple[str, str]:
        r, p = self.region, self.plan
        name = _kernel_name(r)
        lines = [
            f'"""{name}: generated by nkikit from {len(r.nodes)} ATen op(s).',
            "",
        ]
        for v in r.inputs:
            lines.append(f"{self.params[v.name]}: {v.shape} {v.dtype}")
        for n in r.nodes:
            lines.append(
                f"{n.out.name} = aten.{n.op}{_show_args(n)}  # {n.out.shape} {n.out.dtype}"
            )
        lines.append(f"returns {', '.join(r.outputs)}")
        lines.append('"""')
        lines += ["", "import nki", "import nki.isa as nisa", "import nki.language as nl", "", ""]
        lines.append("@nki.jit")
        lines.append(f"def {name}({', '.join(self.params[v.name] for v in r.inputs)}):")
        ind = "    "
        for o, out in zip(r.outputs, self.outs):
            v = r.value(o)
            lines.append(
                f"{ind}{out} = nl.ndarray({v.shape or (1,)}, dtype={NL_DTYPES[v.dtype]}, "
                "buffer=nl.shared_hbm)"
            )
        env: dict[str, Tile] = {}
        pa = min(p.part_size, PMAX)
        ragged = self._looped_part() and p.part_size % PMAX
        for v in r.inputs:
            if self._hoistable(v.name):
                wide = p.wide[v.name]
                var = f"{self.params[v.name]}_sb"
                fsz = p.chunk if wide else 1
                lines.append(
                    f"{ind}{var} = nl.ndarray(({pa}, {fsz}), dtype={SBUF_DTYPES[v.dtype]}, "
                    "buffer=nl.sbuf)"
                )
                pat, off = self.pattern(v.name, wide, hoisted=True)
                lines.append(
                    f"{ind}nisa.dma_copy(dst={var}, src={self.params[v.name]}.ap({pat}, "
                    f"offset={off}))"
                )
                env[v.name] = Tile(f"{var}[:p]" if ragged else var, wide, v.dtype)
        for k, d in enumerate(p.outer):
            lines.append(f"{ind}for i{k} in range({p.dims[d]}):")
            ind += "    "
        if self._looped_part():
            lines.append(f"{ind}for r in range(0, {p.part_size}, {PMAX}):")
            ind += "    "
            lines.append(f"{ind}p = min({PMAX}, {p.part_size} - r)")
        if self._chunked():
            lines.append(f"{ind}for c in range(0, {p.free_size}, {p.chunk}):")
            ind += "    "
            lines.append(f"{ind}f = min({p.chunk}, {p.free_size} - c)")
        body = Body(
            "p" if self._looped_part() else str(pa),
            "f" if self._chunked() else str(p.chunk),
            ind,
            p.free_size * (p.part_size if p.fold else 1) if p.reduced else 1,
            p.fold,
        )
        for v in r.inputs:
            if v.name in env:
                continue
            wide = p.wide[v.name]
            t = body.new(v.dtype, wide, f"{self.params[v.name]}_sb")
            pat, off = self.pattern(v.name, wide)
            body.emit(f"nisa.dma_copy(dst={t}, src={self.params[v.name]}.ap({pat}, offset={off}))")
            env[v.name] = t
        results: dict[str, list[Tile]] = {}
        consumer = _single_consumers(r)
        fused = len([n for n in r.nodes if n.op != "getitem"]) > 1
        for n in r.nodes:
            if n.op == "getitem":
                t = results[n.args[0]][n.args[1]]
                if t.dtype != n.out.dtype:
                    t = body.copy(n.out.dtype, t)
                env[n.out.name] = t
                continue
            rule = RULES[n.op]
            body.prefix = _ident(n.out.name) + "_sb"
            body.out_wide = p.wide[n.out.name]
            if fused and not p.wide[n.out.name] and n.out.name not in r.outputs:
                # a per-row statistic inside a fused kernel stays fp32 (it is a (P, 1) operand,
                # which the engines take in fp32 anyway), as torch.compile keeps it
                if n.out.dtype in ("bfloat16", "float16"):
                    n = dataclasses.replace(n, out=dataclasses.replace(n.out, dtype="float32"))
            args = [_resolve(a, env) for a in n.args]
            kwargs = {k: _resolve(a, env) for k, a in n.kwargs}
            if not rule.takes_lazy:
                args = [_forced(body, a) for a in args]
                kwargs = {k: _forced(body, a) for k, a in kwargs.items()}
            user = consumer.get(n.out.name)
            if rule.lazy is not None and user is not None and RULES[user.op].takes_lazy:
                pending = rule.lazy(body, n, args, kwargs)
                if pending is not None and pending.kind == RULES[user.op].takes_lazy:
                    env[n.out.name] = pending
                    continue
            out = rule.emit(body, n, args, kwargs)
            outs = out if isinstance(out, list) else [out]
            results[n.out.name] = outs
            env[n.out.name] = outs[0]
        for o, out in zip(r.outputs, self.outs):
            t = env[o]
            pat, off = self.pattern(o, t.wide)
            body.emit(f"nisa.dma_copy(dst={out}.ap({pat}, offset={off}), src={t})")
        lines += body.lines
        lines.append(f"    return {', '.join(self.outs)}")
        return name, "\n".join(lines) + "\n"


def _single_consumers(region: Region) -> dict[str, Node]:
    """Each node result used by exactly one later node (once) and not returned: that node.
    Only such a result may stay pending (:class:`.rules.Lazy`) for its consumer to fold."""
    uses: dict[str, list[Node]] = {}
    for n in region.nodes:
        for a in set(_flat_args(n)):
            uses.setdefault(a, []).append(n)
    out = {}
    for n in region.nodes:
        users = uses.get(n.out.name, [])
        if len(users) == 1 and n.out.name not in region.outputs:
            if _flat_args(users[0]).count(n.out.name) == 1:
                out[n.out.name] = users[0]
    return out


def _flat_args(n: Node) -> list:
    out = []
    for a in list(n.args) + [v for _, v in n.kwargs]:
        out.extend(a if isinstance(a, tuple | list) else (a,))
    return [a for a in out if isinstance(a, str)]


def _forced(body: Body, a: Any) -> Any:
    if isinstance(a, tuple | list):
        return type(a)(_forced(body, e) for e in a)
    return body.force(a)


def _ident(name: str) -> str:
    return name if name.isidentifier() and not keyword.iskeyword(name) else "v"


def _resolve(a: Any, env: dict[str, Tile]) -> Any:
    if isinstance(a, str) and a in env:
        return env[a]
    if isinstance(a, tuple | list):
        return type(a)(_resolve(e, env) for e in a)
    return a


def _show_args(n: Node) -> str:
    parts = [repr(a) if not isinstance(a, str) else a for a in n.args]
    parts += [f"{k}={v!r}" for k, v in n.kwargs]
    return f"({', '.join(parts)})"


# -- loading -----------------------------------------------------------------------------------


def _import_nki(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` for generated sources: ``nki`` is nkikit's NKI 0.x dialect (as
    ``nkikit.nki.install_alias`` makes it), without installing the alias process-wide."""
    if level == 0 and (name == "nki" or name.startswith("nki.")):
        mod = importlib.import_module("nkikit." + name)
        return mod if fromlist else importlib.import_module("nkikit.nki")
    return builtins.__import__(name, globals, locals, fromlist, level)


def _load(name: str, source: str):
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    filename = f"<nkikit.neuron {name} {digest}>"
    # errors and tracebacks show the generated lines
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {
        "__name__": f"nkikit_neuron_{name}",
        "__builtins__": {**builtins.__dict__, "__import__": _import_nki},
    }
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated source
    return namespace[name]


@contextlib.contextmanager
def _target(target: str | None):
    if target is None:
        yield
        return
    from ...targets import ENV_VAR

    old = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = target
    try:
        yield
    finally:
        if old is None:
            del os.environ[ENV_VAR]
        else:
            os.environ[ENV_VAR] = old
