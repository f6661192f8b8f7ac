"""nkikit's torch integration: kernels as torch custom ops, and layer replacement.

Importing this module imports torch. A pulled kernel's functions register their ops on first
use with torch tensors (see nkikit.registry.runtime); `kernelize` swaps model layers for kernels.
"""

from .layers import LAYER_KINDS, LayerKind, kernelize, unkernelize
from .ops import TorchBinding, backward_schema_of, schema_of

__all__ = [
    "LAYER_KINDS",
    "LayerKind",
    "TorchBinding",
    "backward_schema_of",
    "kernelize",
    "schema_of",
    "unkernelize",
]
