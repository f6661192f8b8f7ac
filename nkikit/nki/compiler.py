"""``nki.compiler``: the NKI 0.7 compile configuration objects.

They are accepted so kernels that pass them run; simulation does not depend on them, and
the cost model (``nkikit.compile``) rotates addresses as the Neuron compiler does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class AddressRotation(enum.Enum):
    """How the compiler rotates the addresses of tensors allocated in a loop."""

    enable = "enable"
    disable = "disable"


@dataclass(frozen=True)
class CompileConfig:
    address_rotation: AddressRotation | bool | None = None
    non_ssa_legalization: bool | None = None
    dead_code_elim: bool | None = None
    barrier_check: bool | None = None


@dataclass(frozen=True)
class SpecializationConfig:
    allow_nested_config_override: bool = False


def skip_middle_end_transformations(fn):
    """Beta-1 decorator kept for old kernels: no effect on simulation."""
    return fn


__all__ = ["AddressRotation", "CompileConfig", "SpecializationConfig"]
