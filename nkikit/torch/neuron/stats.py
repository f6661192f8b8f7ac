"""Device statistics: what each ATen op did on the emulated device.

Per op (ATen overload name, ``"mm.default"``): kernels launched (and the kernel names), views
(zero-cost metadata ops), host<->device transfers, and CPU fallbacks with their reason.
``device_stats()`` is the process-wide instance; ``reset()`` clears it.  ``table()`` renders
it with rich (``print(device_stats())`` prints the same as text).
"""

from __future__ import annotations

import io
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DeviceStats:
    """Counts per op name; ``fallback_reasons[op]`` is the reason of the op's (latest) fallback."""

    kernels: Counter = field(default_factory=Counter)
    kernel_names: dict[str, set[str]] = field(default_factory=dict)
    specializations: dict[str, set[tuple]] = field(default_factory=dict)
    """Per op, the distinct (shape, dtype) signatures its kernels ran with: one cached kernel
    each (a specialization of a library kernel, or a generated region kernel), like a NEFF
    cache."""
    views: Counter = field(default_factory=Counter)
    transfers: Counter = field(default_factory=Counter)
    fallbacks: Counter = field(default_factory=Counter)
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def kernel(self, op: str, name: str, launches: int = 1, spec: tuple | None = None) -> None:
        """Count ``launches`` launches of kernel ``name`` for ``op``; ``spec``: the operands'
        (shape, dtype) signature."""
        with self._lock:
            self.kernels[op] += launches
            self.kernel_names.setdefault(op, set()).add(name)
            if spec is not None:
                self.specializations.setdefault(op, set()).add(spec)

    def view(self, op: str) -> None:
        with self._lock:
            self.views[op] += 1

    def transfer(self, op: str) -> None:
        with self._lock:
            self.transfers[op] += 1

    def fallback(self, op: str, reason: str) -> None:
        with self._lock:
            self.fallbacks[op] += 1
            self.fallback_reasons[op] = reason

    @property
    def total_kernels(self) -> int:
        return sum(self.kernels.values())

    @property
    def total_fallbacks(self) -> int:
        return sum(self.fallbacks.values())

    def reset(self) -> None:
        """Forget everything counted so far."""
        with self._lock:
            for c in (self.kernels, self.views, self.transfers, self.fallbacks):
                c.clear()
            self.kernel_names.clear()
            self.specializations.clear()
            self.fallback_reasons.clear()

    def table(self) -> Any:
        """A ``rich.table.Table``: one row per op, device kernels first, then fallbacks."""
        from rich.table import Table

        t = Table(title="neuron device: ops")
        for col in ("op", "runs as", "count", "shapes", "kernel / reason"):
            t.add_column(col)
        for op, n in sorted(self.kernels.items(), key=lambda kv: -kv[1]):
            names = ", ".join(sorted(self.kernel_names.get(op, ())))
            t.add_row(op, "kernel", str(n), str(len(self.specializations.get(op, ()))), names)
        for op, n in sorted(self.views.items(), key=lambda kv: -kv[1]):
            t.add_row(op, "view", str(n), "", "metadata only")
        for op, n in sorted(self.transfers.items(), key=lambda kv: -kv[1]):
            t.add_row(op, "transfer", str(n), "", "host <-> device")
        for op, n in sorted(self.fallbacks.items(), key=lambda kv: -kv[1]):
            t.add_row(op, "CPU fallback", str(n), "", self.fallback_reasons.get(op, ""))
        return t

    def __str__(self) -> str:
        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=120, color_system=None).print(self.table())
        return buf.getvalue()


_STATS = DeviceStats()


def device_stats() -> DeviceStats:
    """The process-wide :class:`DeviceStats`."""
    return _STATS
