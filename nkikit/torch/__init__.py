"""nkikit's torch integration: kernels as torch custom ops, and layer replacement.

Importing this module imports torch. A pulled kernel's functions register their ops on first
use with torch tensors (see nkikit.registry.runtime); `kernelize` swaps model layers for kernels;
`NeuronProfiler(NeuronConfig(...)).export_trace` is torch.profiler's `on_trace_ready` for a system
profile (see nkikit.torch.profiler).
"""

from .layers import LAYER_KINDS, LayerKind, kernelize, unkernelize
from .ops import TorchBinding, backward_schema_of, schema_of
from .profiler import NeuronConfig, NeuronProfiler, ProfileMode, system_profile

__all__ = [
    "LAYER_KINDS",
    "LayerKind",
    "NeuronConfig",
    "NeuronProfiler",
    "ProfileMode",
    "TorchBinding",
    "backward_schema_of",
    "kernelize",
    "schema_of",
    "system_profile",
    "unkernelize",
]
