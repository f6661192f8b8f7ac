"""``kernel_source(op, *args, **kwargs)``: the NKI source of the kernel an op runs as on the
``neuron`` device for these arguments.

Generated kernels (the default route) print codegen's NKI 0.x text for the op's one-node
region; library and data-movement kernels print the source file of their kernel module (the
kernel with the helpers it calls), as it is published.  Views, transfers, allocations and
fallbacks run no kernel: asking for their source raises ``ValueError`` with what they run as.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from .ops import entry

# ops whose device kernels are library or data-movement kernels: module and kernel function
_LIBRARY = {
    "mm.default": ("nkikit.library.matmul.kernel", "matmul_kernel"),
    "bmm.default": ("nkikit.library.matmul.kernel", "matmul_kernel"),
    "addmm.default": ("nkikit.library.matmul.kernel", "matmul_kernel"),
    "rms_norm.default": ("nkikit.library.rmsnorm.kernel", "rmsnorm_kernel"),
    "layer_norm.default": ("nkikit.library.layernorm.kernel", "layernorm_kernel"),
    "scaled_dot_product_attention.default": (
        "nkikit.library.attention.kernel",
        "flash_attention_fwd_kernel",
    ),
    "embedding.default": ("nkikit.torch.neuron.movement", "gather_rows_kernel"),
    "clone.default": ("nkikit.torch.neuron.movement", "dma_copy_kernel"),
    "cat.default": ("nkikit.torch.neuron.movement", "dma_copy_kernel"),
    "copy_.default": ("nkikit.torch.neuron.movement", "dma_copy_kernel"),
}
_FILLS = ("fill_.", "zero_.", "zeros_like.", "ones_like.", "full_like.", "new_zeros.", "new_ones.")


def _resolve(op: Any) -> tuple[Any, str]:
    if isinstance(op, str):
        name = op.removeprefix("aten::").removeprefix("aten.")
        base, _, overload = name.partition(".")
        func = getattr(getattr(torch.ops.aten, base), overload or "default")
        return func, f"{base}.{overload or 'default'}"
    from .dispatch import op_name

    return op, op_name(op)


def kernel_source(op: Any, *args: Any, **kwargs: Any) -> str:
    """NKI source of the kernel ``op`` (an ``OpOverload`` such as ``torch.ops.aten.mm.default``
    or its name ``"mm.default"``) runs as on the device for ``args``/``kwargs`` (tensors on
    the device or CPU, used for their shapes and dtypes)."""
    func, name = _resolve(op)
    if name.startswith(_FILLS) or name.startswith("new_full."):
        return _module_source("nkikit.torch.neuron.movement")
    if name in _LIBRARY:
        return _module_source(_LIBRARY[name][0])
    e = entry(name)
    if e is not None:
        raise ValueError(f"aten::{name} runs as a {e.kind} on the neuron device: no kernel")
    from .dispatch import _codegen, one_node_region

    cg = _codegen()
    if cg is None:
        raise ValueError(f"aten::{name}: no generated kernels (codegen is not installed)")
    built = one_node_region(func, args, kwargs)
    if isinstance(built, str):
        raise ValueError(f"aten::{name} falls back to the CPU: {built}")
    region = built[0]
    why = cg.supported(region.nodes[0], region)
    if why is not None:
        raise ValueError(f"aten::{name} falls back to the CPU: {why}")
    return cg.compile_region(region).source


def _module_source(module: str) -> str:
    __import__(module)
    return inspect.getsource(sys.modules[module])
