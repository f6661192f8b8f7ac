"""How an ATen op runs on the ``neuron`` device (``NeuronTensor.__torch_dispatch__``).

Routes, in order (see the table in :mod:`nkikit.torch.neuron.ops`):

1. ``_to_copy`` / ``copy_``: transfers between host and device; on the device, a cast (a
   generated kernel) or a DMA copy kernel.
2. The op's table entry: a view of the storage, a transfer, library / data-movement kernels,
   or a fixed fallback.
3. A composite op (CompositeImplicitAutograd) that still arrives whole, which happens only
   where autograd is off (``torch.inference_mode``): its decomposition, as elsewhere.
4. An in-place op without an entry (``add_``): its out-of-place op on the device, written back
   into the tensor's storage.
5. The default route: a one-node region compiled by ``codegen.compile_region`` (a generated NKI
   kernel) when ``codegen.supported`` accepts it.  A generated kernel that fails to build or
   run falls back too, with the error as the reason (warned, so a codegen gap never hides).
6. Anything else: a CPU fallback.  The op runs on the CPU storage, its results are wrapped back
   onto the device, it is counted per op with its reason (:func:`device_stats`), warned once per
   op (:class:`NeuronFallbackWarning`) and, while ``torch.profiler`` runs, recorded as a range
   ``neuron.fallback <op>``.  A fallback computes with CPU torch's numerics, never silently
   wrong, and never fails where CPU torch would not.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils._pytree import tree_flatten, tree_map

from .device import NeuronTensor, check_index, storage, wrap
from .ops import entry
from .region import Node, Region, Value
from .stats import device_stats


class NeuronFallbackWarning(UserWarning):
    """An ATen op ran on the CPU instead of as a device kernel (once per op and process)."""


_WARNED: set[str] = set()


def op_name(func: Any) -> str:
    """The ATen overload name without namespace (``"add.Tensor"``); other namespaces keep it."""
    name = f"{func._opname}.{func._overloadname}"
    return name if func.namespace == "aten" else f"{func.namespace}::{name}"


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func(*args, **kwargs)`` for device tensors (see the module doc for the routes)."""
    name = op_name(func)
    check_index(kwargs.get("device"))  # ``.to("neuron:1")``, ``new_empty(..., device=...)``
    if name == "_to_copy.default":
        return _to_copy(func, args, kwargs)
    if name == "copy_.default":
        return _copy(func, args, kwargs)
    _one_device(name, args, kwargs)
    e = entry(name)
    if e is not None:
        if e.kind == "view":
            device_stats().view(name)
            return tree_map(_wrap_cpu, func(*_unwrap(args), **_unwrap(kwargs)))
        if e.kind == "transfer":
            device_stats().transfer(name)
            return func(*_unwrap(args), **_unwrap(kwargs))
        if e.kind == "alloc":
            return e.run(*args, **kwargs)
        if e.kind == "kernel":
            out = e.run(*args, **kwargs)
            return fallback(func, args, kwargs, out) if isinstance(out, str) else out
        return fallback(func, args, kwargs, str(e.run))
    if func.has_kernel_for_dispatch_key(DispatchKey.CompositeImplicitAutograd):
        # a composite op arrives whole only where autograd is off (inference mode): run its
        # decomposition, as torch does everywhere else (``to`` becomes ``_to_copy``...)
        return func.decompose(*args, **kwargs)
    if func._opname.endswith("_") and not kwargs.get("out"):
        return _in_place(func, args, kwargs)
    out = region_call(func, args, kwargs)
    return fallback(func, args, kwargs, out) if isinstance(out, str) else out


def _one_device(name: str, args: tuple, kwargs: dict) -> None:
    """Refuse an op on device tensors and host tensors together, as torch refuses one on two
    devices; a 0-d host tensor may join, as it may on any device (a scalar), and so may host
    indices of an indexing op (torch moves them)."""
    if name.startswith(("index", "_index")):
        return
    for t in tree_flatten((args, kwargs))[0]:
        if isinstance(t, torch.Tensor) and not isinstance(t, NeuronTensor) and t.dim() > 0:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, neuron:0 and {t.device}! (aten::{name})"
            )


# -- the default route: one generated kernel per op --------------------------------------------


def _codegen() -> Any:
    try:
        from . import codegen
    except ImportError:
        return None
    return codegen


def one_node_region(func: Any, args: tuple, kwargs: dict) -> tuple[Region, list[Any]] | str:
    """The one-node region of ``func(*args, **kwargs)`` and its input tensors (in order), or
    the reason there is none (its result is not one tensor, or torch has no meta kernel)."""
    inputs: list[Value] = []
    tensors: list[Any] = []

    def name_of(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            v = Value(f"t{len(inputs)}", tuple(x.shape), _dtype(x.dtype))
            inputs.append(v)
            tensors.append(x)
            return v.name
        if isinstance(x, torch.dtype):
            return _dtype(x)
        if isinstance(x, list):
            return tuple(name_of(e) for e in x)
        if isinstance(x, torch.device | torch.layout | torch.memory_format):
            return str(x)
        return x

    try:
        meta = func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    except (NotImplementedError, RuntimeError) as err:
        return f"no shape rule (meta kernel) for this op: {str(err).splitlines()[0][:80]}"
    if not isinstance(meta, torch.Tensor):
        return "the op returns more than one tensor (a region node has one result)"
    node_args = tuple(name_of(a) for a in args)
    node_kwargs = tuple((k, name_of(v)) for k, v in kwargs.items() if v is not None)
    out = Value(f"t{len(inputs)}", tuple(meta.shape), _dtype(meta.dtype))
    node = Node(op_name(func), node_args, node_kwargs, out)
    return Region(tuple(inputs), (node,), (out.name,)), tensors


def region_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run the op as a generated kernel; returns the result or the reason it cannot."""
    cg = _codegen()
    if cg is None:
        return "no generated kernels yet (nkikit.torch.neuron.codegen is not installed)"
    built = one_node_region(func, args, kwargs)
    if isinstance(built, str):
        return built
    region, tensors = built
    why = cg.supported(region.nodes[0], region)
    if why is not None:
        return why
    from .kernels import to_device, to_np

    try:
        compiled = cg.compile_region(region)
        outs = compiled.run(*(to_np(t) for t in tensors))
    except Exception as err:  # noqa: BLE001 - a kernel nkikit cannot build: counted, warned, CPU
        # (reported as this op's fallback reason, with the error's name and first line)
        return f"generated kernel failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    device_stats().kernel(region.nodes[0].op, compiled.name, spec=region.key[0])
    return to_device(outs[0])


def _in_place(func: Any, args: tuple, kwargs: dict) -> Any:
    """``x.op_(...)``: the out-of-place op on the device, written into ``x``'s storage."""
    packet = getattr(torch.ops.aten, func._opname[:-1], None)
    pure = getattr(packet, func._overloadname, None) if packet is not None else None
    if pure is None or not isinstance(args[0], NeuronTensor):
        return fallback(func, args, kwargs, "in-place op without an out-of-place form")
    out = dispatch(pure, args, kwargs)
    dst = storage(args[0])
    dst.copy_(storage(out))
    return args[0]


# -- transfers and copies ----------------------------------------------------------------------


def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    device = kwargs.get("device")
    dtype = kwargs.get("dtype") or x.dtype
    if device is not None and torch.device(device).type != "neuron":
        device_stats().transfer("_to_copy.default")  # device -> host (e.g. ``.cpu()``)
        return storage(x).to(device=device, dtype=dtype, copy=True)
    if not isinstance(x, NeuronTensor):  # host -> device
        device_stats().transfer("_to_copy.default")
        return wrap(x.to(dtype=dtype, copy=True))
    if dtype == x.dtype:
        return dispatch(torch.ops.aten.clone.default, (x,), {})
    out = region_call(func, (x,), {"dtype": dtype})
    return fallback(func, (x,), {"dtype": dtype}, out) if isinstance(out, str) else out


def _copy(func: Any, args: tuple, kwargs: dict) -> Any:
    from . import kernels

    dst, src = args[0], args[1]
    if not (isinstance(dst, NeuronTensor) and isinstance(src, NeuronTensor)):
        device_stats().transfer("copy_.default")  # host <-> device
        storage(dst).copy_(storage(src))
        return dst
    if src.dtype != dst.dtype:
        src = dispatch(torch.ops.aten._to_copy.default, (src,), {"dtype": dst.dtype})
    out = kernels.copy_between(dst, src)
    return fallback(func, args, kwargs, out) if isinstance(out, str) else out


# -- CPU fallback ------------------------------------------------------------------------------


def fallback(func: Any, args: tuple, kwargs: dict, reason: str) -> Any:
    """Run ``func`` on the CPU storage, counted, warned once per op, and profiled."""
    name = op_name(func)
    device_stats().fallback(name, reason)
    if name not in _WARNED:
        _WARNED.add(name)
        filename, lineno = _user_frame()
        warnings.warn_explicit(
            f"neuron: aten::{name} runs on the CPU (fallback): {reason}",
            NeuronFallbackWarning,
            filename,
            lineno,
        )
    rng = (
        torch.profiler.record_function(f"neuron.fallback {name}")
        if torch.autograd.profiler._is_profiler_enabled
        else contextlib.nullcontext()
    )
    with rng:
        out = func(*_unwrap(args), **_unwrap(kwargs))
    mine = {
        id(storage(t)): t for t in tree_flatten((args, kwargs))[0] if isinstance(t, NeuronTensor)
    }
    return tree_map(lambda t: mine[id(t)] if id(t) in mine else _wrap_cpu(t), out)


# -- helpers -----------------------------------------------------------------------------------


def _dtype(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _unwrap(x: Any) -> Any:
    return tree_map(storage, x)


def _wrap_cpu(t: Any) -> Any:
    return wrap(t) if isinstance(t, torch.Tensor) and not isinstance(t, NeuronTensor) else t


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        s = storage(x)
        return torch.empty_strided(s.shape, s.stride(), dtype=s.dtype, device="meta")
    return x


_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    os.path.dirname(os.path.abspath(torch.__file__)),
)


def _user_frame() -> tuple[str, int]:
    """The innermost calling frame outside nkikit and torch: the user's file and line."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_INTERNAL):
        f = f.f_back
    if f is None:
        return "<unknown>", 0
    return f.f_code.co_filename, f.f_lineno
