"""The hardware numbers a Profile carries: the engines with their own instruction stream, and
:class:`TargetInfo`, what the profiler's summary metrics divide by.

A leaf module (it imports nothing from nkikit): the target tables (``nkikit.targets``) build a
TargetInfo from a full :class:`~nkikit.targets.Target` (``get_target(name).target_info()``), and
the profiler only reads one, so a Profile does not need the tables to exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMPUTE_ENGINES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "sync")
"""Engines with their own instruction stream, in the order every output shows them."""


@dataclass(slots=True)
class TargetInfo:
    """The hardware numbers the summary metrics divide by, for one NeuronCore.

    ``tensor_peak_flops`` maps a dtype class (``"bf16"``, ``"fp8"``, ``"fp32"``) to TensorE
    peak FLOP/s; ``engine_clock_hz`` maps an engine name to its clock.
    """

    name: str
    tensor_peak_flops: dict[str, float]
    hbm_bytes_per_s: float
    engine_clock_hz: dict[str, float]
    dma_queues: int = 16

    def peak_flops(self, dtype_class: str) -> float:
        """Peak TensorE FLOP/s for a dtype class, falling back to bf16 when unknown."""
        return self.tensor_peak_flops.get(dtype_class, self.tensor_peak_flops.get("bf16", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tensor_peak_flops": dict(self.tensor_peak_flops),
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "engine_clock_hz": dict(self.engine_clock_hz),
            "dma_queues": self.dma_queues,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetInfo:
        return cls(
            name=d["name"],
            tensor_peak_flops={k: float(v) for k, v in d["tensor_peak_flops"].items()},
            hbm_bytes_per_s=float(d["hbm_bytes_per_s"]),
            engine_clock_hz={k: float(v) for k, v in d["engine_clock_hz"].items()},
            dma_queues=int(d.get("dma_queues", 16)),
        )
