"""The PyTorch story of ``nkikit demo``: RMSNorm three ways on an emulated NeuronCore.

1. naive: six PyTorch ops (square, mean, add, rsqrt, multiply, multiply) in eager mode on the
   ``neuron`` device: one generated kernel per op, every intermediate through HBM, a launch
   each;
2. ``torch.rms_norm`` on the device: one kernel (the library's RMSNorm);
3. ``torch.compile(naive, backend="neuron")``: the same six ops fused into ONE generated kernel.

Each way runs once, under ``torch.profiler`` with nkikit's
:class:`~nkikit.torch.profiler.NeuronProfiler` (a first call: its kernels are traced and
compiled, and Dynamo captures the compiled way's graph, all shown on the host and runtime
tracks); its system trace, key averages and HTML system report go to ``<out>/<way>/``. Device times are the cost model's, launch overhead the profile's
(an assumed per-launch cost, ``nkikit.profiler.system.DEFAULT_LAUNCH_OVERHEAD_US``); all runs
are simulated at the shape given, so the outputs are checked against CPU torch too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EPS = 1e-6


def rmsnorm_naive(x: Any, w: Any) -> Any:
    """RMSNorm from six separate PyTorch ops, as a user writes it first."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


@dataclass
class Way:
    """One way of running RMSNorm, profiled: launches, modeled device time, files."""

    name: str
    what: str
    launches: int
    kernels: list[str]
    device_us: float
    overhead_us: float
    fallbacks: int
    max_error: float
    files: dict[str, Path] = field(default_factory=dict)
    profile: Any = None

    @property
    def modeled_us(self) -> float:
        """Device time plus launch overhead: what the program costs the device's host queue."""
        return self.device_us + self.overhead_us


def _profiled(fn: Callable[[], Any], out: Path) -> tuple[Any, Any, dict[str, Path]]:
    import torch
    from torch.profiler import ProfilerActivity

    from ..torch.profiler import NeuronConfig, NeuronProfiler, ProfileMode

    cfg = NeuronConfig(
        modes=[ProfileMode.RUNTIME, ProfileMode.CPU_UTIL], profile_output_dir=str(out)
    )
    exporter = NeuronProfiler(cfg)
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU], on_trace_ready=exporter.export_trace
    ):
        y = fn()
    return y, exporter.last, exporter.files


def run_ways(n: int, d: int, dtype: str, out: Path, seed: int = 0) -> list[Way]:
    """Run and profile the three ways on an ``n x d`` input of ``dtype``; returns them in the
    order naive, rms_norm, compile."""
    import torch

    import nkikit.torch.neuron  # noqa: F401  (the "neuron" device and compile backend)

    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(tdt)
    w = torch.randn(d, generator=g).to(tdt)
    ref = rmsnorm_naive(x.float(), w.float())
    xd, wd = x.to("neuron"), w.to("neuron")
    compiled = torch.compile(rmsnorm_naive, backend="neuron", dynamic=False)
    ways = [
        ("naive", "6 PyTorch ops, eager on the device", lambda: rmsnorm_naive(xd, wd).cpu()),
        (
            "rms_norm",
            "torch.rms_norm, eager on the device",
            lambda: torch.rms_norm(xd, (d,), wd, EPS).cpu(),
        ),
        ("compile", 'torch.compile(naive, backend="neuron")', lambda: compiled(xd, wd).cpu()),
    ]
    from ..torch.neuron import compile_report, device_stats, reset_compile_report

    rows = []
    with torch.no_grad():
        for name, what, fn in ways:
            device_stats().reset()
            reset_compile_report()
            y, sp, files = _profiled(fn, out / name)
            fallbacks = device_stats().total_fallbacks + sum(compile_report().fallbacks.values())
            err = float((y.float() - ref).abs().max())
            rows.append(
                Way(
                    name,
                    what,
                    len(sp.runs),
                    sorted({r.kernel for r in sp.runs}),
                    sp.device_total_us,
                    len(sp.runs) * sp.launch_overhead_us,
                    fallbacks,
                    err,
                    files,
                    sp,
                )
            )
    return rows


def run_torch_story(
    out: Path, n: int = 4096, d: int = 4096, dtype: str = "bfloat16", target: str | None = None
) -> list[Way]:
    """Tell the story: run the three ways (on ``target``, nkikit's default if None), print the
    comparison, key averages of each, and where the reports are; returns the ways."""
    import os

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    old = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    if target:
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = target
    try:
        ways = run_ways(n, d, dtype, out)
    finally:
        if target:
            if old is None:
                os.environ.pop("NEURON_PLATFORM_TARGET_OVERRIDE", None)
            else:
                os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = old
    tgt = _target_name(ways)
    table = Table(
        title=f"PyTorch on an emulated NeuronCore: RMSNorm {n}x{d} {dtype} on {tgt} "
        "(simulated; times modeled)"
    )
    for col in (
        "way",
        "kernel launches",
        "device µs",
        "launch overhead µs",
        "device + launches µs",
        "CPU fallbacks",
        "max |error| vs CPU fp32",
    ):
        table.add_column(col, justify="left" if col == "way" else "right")
    for w in ways:
        table.add_row(
            w.name,
            str(w.launches),
            f"{w.device_us:,.1f}",
            f"{w.overhead_us:,.1f}",
            f"{w.modeled_us:,.1f}",
            str(w.fallbacks),
            f"{w.max_error:.2e}",
        )
    console.print(table)
    console.print("; ".join(f"{w.name}: {w.what}" for w in ways))
    naive, rms, comp = ways
    console.print(
        f"naive launches {naive.launches} kernels ({naive.device_us:,.1f} µs on the device plus "
        f"{naive.overhead_us:,.1f} µs of launches); torch.rms_norm is one kernel "
        f"({rms.device_us:,.1f} µs); torch.compile fused the six ops into "
        f"{comp.launches} generated kernel ({comp.device_us:,.1f} µs, "
        f"{naive.modeled_us / comp.modeled_us:.1f}x faster than naive end to end).",
        soft_wrap=True,
    )
    for w in ways:
        console.print(w.profile.table(row_limit=8))
    from ..torch.neuron import generated_kernels, write_kernel_folder

    fused = [k for k in comp.kernels if k in generated_kernels()]
    if fused:
        folder = write_kernel_folder(fused[0], out / "compile" / "kernel")
        console.print(f"The fused kernel's NKI source: {folder / 'kernel.py'} (a kernel folder)")
    console.print(
        "System traces and reports: "
        + ", ".join(str(p) for w in ways for k, p in w.files.items() if k in ("trace", "html")),
        soft_wrap=True,
    )
    return ways


def _target_name(ways: list[Way]) -> str:
    for w in ways:
        for r in w.profile.runs:
            if r.profile is not None:
                return r.profile.target.name
    return "?"
