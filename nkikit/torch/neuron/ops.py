"""The device's ops table: one entry per ATen op that does not take the default route.

An entry is ``(kind, run)``:

- ``"view"``: a metadata op (view, reshape, permute, slice...): applied to the CPU storage, so
  the result shares it, as on any torch device; no kernel, zero device time.
- ``"transfer"``: host <-> device movement (``.cpu()``, ``.to("neuron")``, ``.item()``).
- ``"kernel"``: ``run(*args, **kwargs)`` launches library or data-movement kernels
  (:mod:`nkikit.torch.neuron.kernels`); it returns the result, or a ``str`` reason to fall
  back instead (a shape or dtype the kernel cannot take).
- ``"alloc"``: ``run`` allocates device memory (``empty_like``...): no kernel, no data moved.
- ``"fallback"``: always runs on CPU (counted and warned), ``run`` is the reason.

Every other op takes the default route (:mod:`nkikit.torch.neuron.dispatch`): a one-node
:class:`~nkikit.torch.neuron.region.Region` compiled by ``codegen.compile_region`` when
``codegen.supported`` accepts it (elementwise, comparisons, ``where``, casts, reductions,
softmax...), else a CPU fallback with codegen's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import fused, kernels


@dataclass(frozen=True, slots=True)
class OpEntry:
    kind: str
    run: Callable[..., Any] | str | None = None


VIEW_OPS = (
    "view.default",
    "_unsafe_view.default",
    "_reshape_alias.default",
    "reshape.default",
    "expand.default",
    "permute.default",
    "transpose.int",
    "t.default",
    "slice.Tensor",
    "select.int",
    "unsqueeze.default",
    "squeeze.default",
    "squeeze.dim",
    "squeeze.dims",
    "detach.default",
    "alias.default",
    "split.Tensor",
    "split_with_sizes.default",
    "unbind.int",
    "chunk.default",
    "narrow.default",
    "as_strided.default",
    "diagonal.default",
    "unfold.default",
    "view_as.default",
    "expand_as.default",
    "lift_fresh.default",
    "_unsafe_split.Tensor",
)

TRANSFER_OPS = ("_local_scalar_dense.default", "is_same_size.default")

OPS: dict[str, OpEntry] = {
    **{op: OpEntry("view") for op in VIEW_OPS},
    **{op: OpEntry("transfer") for op in TRANSFER_OPS},
    # these reach the dispatcher whole only where autograd is off (torch.inference_mode);
    # elsewhere their AutogradPrivateUse1 kernels (nkikit.torch.neuron.fused) take them first
    "rms_norm.default": OpEntry("kernel", fused.rms_norm),
    "layer_norm.default": OpEntry("kernel", fused.layer_norm),
    "scaled_dot_product_attention.default": OpEntry("kernel", fused.scaled_dot_product_attention),
    "max.dim": OpEntry("kernel", kernels.values_and_indices("amax", "argmax")),
    "min.dim": OpEntry("kernel", kernels.values_and_indices("amin", "argmin")),
    "mm.default": OpEntry("kernel", kernels.mm),
    "bmm.default": OpEntry("kernel", kernels.bmm),
    "addmm.default": OpEntry("kernel", kernels.addmm),
    "embedding.default": OpEntry("kernel", kernels.embedding),
    "clone.default": OpEntry("kernel", kernels.clone),
    "cat.default": OpEntry("kernel", kernels.cat),
    "fill_.Scalar": OpEntry("kernel", kernels.fill_),
    "fill_.Tensor": OpEntry("kernel", kernels.fill_),
    "zero_.default": OpEntry("kernel", kernels.zero_),
    "zeros_like.default": OpEntry("kernel", kernels.filled_like("zeros_like.default", 0)),
    "ones_like.default": OpEntry("kernel", kernels.filled_like("ones_like.default", 1)),
    "full_like.default": OpEntry("kernel", kernels.filled_like("full_like.default", None)),
    "new_zeros.default": OpEntry("kernel", kernels.new_filled("new_zeros.default", 0)),
    "new_ones.default": OpEntry("kernel", kernels.new_filled("new_ones.default", 1)),
    "new_full.default": OpEntry("kernel", kernels.new_filled("new_full.default", None)),
    "empty_like.default": OpEntry("alloc", kernels.empty_like),
    "new_empty.default": OpEntry("alloc", kernels.new_empty),
    "new_empty_strided.default": OpEntry("alloc", kernels.new_empty_strided),
    **{
        op: OpEntry(
            "fallback", "random numbers are drawn by the CPU generator (seeds reproduce CPU)"
        )
        for op in (
            "normal_.default",
            "uniform_.default",
            "bernoulli_.float",
            "bernoulli.default",
            "random_.default",
            "random_.from",
            "random_.to",
            "exponential_.default",
            "randperm.default",
        )
    },
    "embedding_dense_backward.default": OpEntry(
        "fallback", "scatter-add of row gradients: no device kernel (indirect DMA accumulate)"
    ),
}
"""Ops with a fixed route; ``_to_copy`` and ``copy_`` are routed by device in the dispatcher."""


def entry(op: str) -> OpEntry | None:
    """The table entry of an ATen overload name (``"mm.default"``), None for the default route."""
    return OPS.get(op)
