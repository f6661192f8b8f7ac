"""``torch.profiler`` sees nkikit: a Neuron profiler configuration and trace exporter in the
style of TorchNeuron's (reference/nki.md §6.3), answered from the cost model.

TorchNeuron users write::

    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir="out")
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
        experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace,
    ) as prof:
        model(x)

With nkikit the same names exist here; the config goes to :class:`NeuronProfiler` (torch's
``experimental_config`` takes only its own type) and ``ProfilerActivity.CPU`` is enough::

    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir="out")
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU], on_trace_ready=NeuronProfiler(cfg).export_trace
    ) as prof:
        model(x)

While ``torch.profiler`` runs, every nkikit kernel launch is a torch range (see
``nkikit.compiler.launches``) and is recorded with its modeled device time; torch ops that run
a kernel through nkikit's fast eager path (no dispatcher) are ranges named like their op.
:meth:`NeuronProfiler.export_trace` joins torch's own trace with those records into one
system trace (``system_trace.json``), key averages (``key_averages.json``, and
:meth:`SystemProfile.table`) and an HTML report (``system_report.html``) in
``profile_output_dir``; see :mod:`nkikit.profiler.system` for the tracks and clocks.

Modes: ``RUNTIME`` (launch, trace and compile events; always on), ``DEVICE`` (each kernel's
engine and DMA-queue instructions on its NeuronCore, up to ``max_events_per_nc``), ``CPU_UTIL``
(host tracks from torch's trace; always on).
"""

from __future__ import annotations

import enum
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..compiler import launches
from ..profiler.system import (
    DEFAULT_LAUNCH_OVERHEAD_US,
    PREFIX,
    SystemProfile,
    build_system_profile,
)

__all__ = [
    "NeuronConfig",
    "NeuronProfiler",
    "ProfileMode",
    "SystemProfile",
    "system_profile",
]


class ProfileMode(enum.Enum):
    """What a system profile collects (TorchNeuron's ``ProfileMode`` names)."""

    DEVICE = "device"
    RUNTIME = "runtime"
    CPU_UTIL = "cpu_util"


@dataclass
class NeuronConfig:
    """The Neuron profiler configuration (TorchNeuron's ``NeuronConfig`` names where they fit).

    ``launch_overhead_us`` is the modeled host-to-device launch overhead per kernel (an
    assumption unless you measured it; see ``nkikit.profiler.system``)."""

    modes: Sequence[ProfileMode] = (ProfileMode.RUNTIME, ProfileMode.CPU_UTIL)
    profile_output_dir: str | os.PathLike[str] = "nkikit-system-profile"
    max_events_per_nc: int = 200_000
    launch_overhead_us: float = DEFAULT_LAUNCH_OVERHEAD_US
    html: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _torch_trace(prof: Any) -> dict[str, Any]:
    """torch's own Chrome trace of ``prof``.  Its Python exporter leaves the trace unsaved, so
    the user can still call ``prof.export_chrome_trace`` (kineto's saves only once)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "torch_trace.json"
        inner = getattr(prof, "profiler", None)
        try:
            inner.export_chrome_trace(str(path), None, use_python_export=True)
        except (AttributeError, TypeError):  # a torch without the Python exporter
            prof.export_chrome_trace(str(path))
        return json.loads(path.read_text(encoding="utf-8"))


def system_profile(prof: Any, config: NeuronConfig | None = None) -> SystemProfile:
    """Join a finished ``torch.profiler.profile`` with nkikit's launch records."""
    config = config or NeuronConfig()
    doc = _torch_trace(prof)
    # Wall-clock ns since 1970 (~1.8e18) are too big for a float to keep the nanosecond: times
    # are kept in ns relative to the trace's first µs, as exact integers for the records.
    base_ns = int(doc.get("baseTimeNanoseconds", 0))
    raw = [
        e
        for e in doc.get("traceEvents", [])
        if e.get("ph") == "X"
        and isinstance(e.get("ts"), int | float)
        and e.get("cat") in ("cpu_op", "user_annotation", "python_function")
    ]
    t0_us = math.floor(min((float(e["ts"]) for e in raw), default=0.0))
    epoch_ns = base_ns + 1000 * t0_us
    threads: dict[int, str] = {}
    for e in doc.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e.get("tid")] = str(e.get("args", {}).get("name", ""))
    host = [{**e, "ts": float(e["ts"]) - t0_us, "dur": float(e.get("dur", 0.0))} for e in raw]
    # the launches of this trace: those whose launch range torch recorded
    wanted = sorted(
        (e["ts"], e["name"][len(PREFIX + "launch ") :])
        for e in host
        if e["name"].startswith(PREFIX + "launch ")
    )
    records = _match(wanted, list(launches.RECENT), epoch_ns)
    return build_system_profile(
        host,
        records,
        host_threads=threads,
        launch_overhead_us=config.launch_overhead_us,
        engines=ProfileMode.DEVICE in config.modes,
        max_engine_events=config.max_events_per_nc,
        meta={"modes": [m.value for m in config.modes]},
        epoch_ns=epoch_ns,
    )


def _match(wanted: list[tuple[float, str]], records: list[Any], epoch_ns: int) -> list[Any]:
    """For each torch launch range (wall µs, kernel), the unused record of that kernel whose
    launch started nearest to it (both clocks are the wall clock; they differ by µs)."""
    by_kernel: dict[str, list[Any]] = {}
    for r in records:
        by_kernel.setdefault(r.kernel, []).append(r)
    used: set[int] = set()
    out = []
    for ts, kernel in wanted:
        best = None
        for r in by_kernel.get(kernel, []):
            if r.seq in used:
                continue
            d = abs((r.start_ns - epoch_ns) / 1000.0 - ts)
            if best is None or d < best[0]:
                best = (d, r)
        if best is not None:
            used.add(best[1].seq)
            out.append(best[1])
    return out


class NeuronProfiler:
    """``on_trace_ready=NeuronProfiler(config).export_trace``: writes the system trace, key
    averages and HTML report of each finished ``torch.profiler`` cycle.

    ``last`` is the latest :class:`SystemProfile`; ``files`` its files."""

    def __init__(self, config: NeuronConfig | None = None) -> None:
        self.config = config or NeuronConfig()
        self.last: SystemProfile | None = None
        self.files: dict[str, Path] = {}
        self._cycle = 0

    def export_trace(self, prof: Any) -> SystemProfile:
        sp = system_profile(prof, self.config)
        out = Path(self.config.profile_output_dir)
        out.mkdir(parents=True, exist_ok=True)
        suffix = f"_{self._cycle}" if self._cycle else ""
        self._cycle += 1
        files = {
            "trace": sp.to_perfetto(out / f"system_trace{suffix}.json"),
            "key_averages": sp.to_json(out / f"key_averages{suffix}.json"),
        }
        if self.config.html:
            files["html"] = sp.to_html(out / f"system_report{suffix}.html")
        self.last, self.files = sp, files
        return sp


def op_range(name: str) -> Any:
    """A ``torch.profiler`` range named like a torch op, for the fast eager path that skips the
    dispatcher (only called while the profiler runs)."""
    return torch.profiler.record_function(name)


def profiling() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)
