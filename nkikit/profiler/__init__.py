"""Profiles of scheduled NKI kernels: data model, summary metrics, Perfetto/HTML/terminal output.

The compiler fills a :class:`Profile` with scheduled :class:`Instruction` objects for a
:class:`TargetInfo`; everything else here only reads it. This package imports nothing from
the rest of nkikit, so it can be used (and tested) on its own.
"""

from .metrics import LineStat, dtype_class
from .model import (
    COMPUTE_ENGINES,
    Instruction,
    Profile,
    TargetInfo,
    engine_label,
    engine_sort_key,
    is_dma_engine,
)

__all__ = [
    "COMPUTE_ENGINES",
    "Instruction",
    "LineStat",
    "Profile",
    "TargetInfo",
    "dtype_class",
    "engine_label",
    "engine_sort_key",
    "is_dma_engine",
]
