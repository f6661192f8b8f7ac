"""Swap layers of a torch model for pulled kernels, in the style of HF kernels' `kernelize`.

    k = kernels.pull("nkikit/rmsnorm", version=1)
    kernelize(model, {"RMSNorm": k})          # every *RMSNorm layer now runs the NKI kernel
    unkernelize(model)                         # and back

Replacement is per module instance (its `forward` attribute), never on the class, so other
models are untouched and `unkernelize` restores exactly what was there. Each layer kind knows
how to call the kernel from the layer's own parameters (weight, eps, ...); the kernel function
is found in a KernelModule by the kind's function name (`rmsnorm`, `layernorm`) or given
directly as a callable.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_MARK = "_nkikit_kernel"  # instance attribute recording the kernel a module was given


@dataclass(frozen=True)
class LayerKind:
    """How to recognise a layer and how to run it with a kernel function."""

    name: str
    function: str
    matches: Callable[[nn.Module], bool]
    make_forward: Callable[[Callable[..., Any]], Callable[..., torch.Tensor]]


def _rms_eps(module: nn.Module, dtype: torch.dtype) -> float:
    for attr in ("variance_epsilon", "eps"):
        eps = getattr(module, attr, None)
        if eps is not None:
            return float(eps)
    return float(torch.finfo(dtype).eps)  # torch.nn.RMSNorm's eps=None default


def _rmsnorm_forward(fn: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        d = hidden_states.shape[-1]
        weight = getattr(self, "weight", None)
        if weight is None:
            weight = torch.ones(d, dtype=hidden_states.dtype, device=hidden_states.device)
        elif weight.dtype != hidden_states.dtype:
            weight = weight.to(hidden_states.dtype)
        out = fn(hidden_states.reshape(-1, d), weight, eps=_rms_eps(self, hidden_states.dtype))
        return out.reshape(hidden_states.shape)

    return forward


def _layernorm_forward(fn: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        weight = getattr(self, "weight", None)
        bias = getattr(self, "bias", None)
        weight = torch.ones(d, dtype=x.dtype) if weight is None else weight.to(x.dtype)
        bias = torch.zeros(d, dtype=x.dtype) if bias is None else bias.to(x.dtype)
        out = fn(x.reshape(-1, d), weight, bias, eps=float(getattr(self, "eps", 1e-5)))
        return out.reshape(x.shape)

    return forward


def _is_rmsnorm(m: nn.Module) -> bool:
    return type(m).__name__.endswith("RMSNorm")


def _is_layernorm(m: nn.Module) -> bool:
    if isinstance(m, nn.LayerNorm):
        return len(m.normalized_shape) == 1
    return type(m).__name__.endswith("LayerNorm") and hasattr(m, "weight")


LAYER_KINDS: dict[str, LayerKind] = {
    "RMSNorm": LayerKind("RMSNorm", "rmsnorm", _is_rmsnorm, _rmsnorm_forward),
    "LayerNorm": LayerKind("LayerNorm", "layernorm", _is_layernorm, _layernorm_forward),
}


def _kernel_function(kind: LayerKind, kernel: Any) -> Callable[..., Any]:
    if isinstance(kernel, types.ModuleType):
        fn = getattr(kernel, kind.function, None)
        if fn is None:
            raise ValueError(
                f"{kind.name}: the kernel module {getattr(kernel, '__name__', kernel)} has no "
                f"function {kind.function!r} (it has {', '.join(getattr(kernel, '__all__', []))})"
            )
        return fn
    if callable(kernel):
        return kernel
    raise TypeError(
        f"{kind.name}: expected a kernel module or a callable, got {type(kernel).__name__}"
    )


def kernelize(model: nn.Module, mapping: Mapping[str, Any]) -> list[str]:
    """Replace the forward of every layer of a kind in `mapping` with its kernel.

    mapping: layer kind name (see LAYER_KINDS: 'RMSNorm', 'LayerNorm') -> a KernelModule (its
    function named after the kind is used) or a kernel function. Returns the qualified names of
    the replaced modules. Raises KeyError for an unknown kind, ValueError/TypeError for a kernel
    that lacks the function.
    """
    plan = []
    for kind_name, kernel in mapping.items():
        if kind_name not in LAYER_KINDS:
            raise KeyError(f"unknown layer kind {kind_name!r}; known: {', '.join(LAYER_KINDS)}")
        kind = LAYER_KINDS[kind_name]
        plan.append((kind, _kernel_function(kind, kernel)))
    replaced = []
    for qualname, module in model.named_modules():
        for kind, fn in plan:
            if kind.matches(module):
                module.forward = types.MethodType(kind.make_forward(fn), module)
                setattr(module, _MARK, fn)
                replaced.append(qualname)
                break
    return replaced


def unkernelize(model: nn.Module) -> int:
    """Give every layer `kernelize` changed its class's forward back; returns how many."""
    count = 0
    for module in model.modules():
        if _MARK in module.__dict__:
            module.__dict__.pop("forward", None)
            delattr(module, _MARK)
            count += 1
    return count
