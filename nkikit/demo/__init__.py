"""``nkikit demo``: the RMSNorm story, on the embedded defaults (no network, no hardware).

0. PyTorch on an emulated NeuronCore (:mod:`nkikit.demo.torch_story`): RMSNorm three ways,
   naive PyTorch ops eager on the ``neuron`` device (a kernel per op), ``torch.rms_norm`` (one
   kernel) and ``torch.compile(backend="neuron")`` (one fused generated kernel), each with a
   system trace, key averages and an HTML system report.
1. Check three NKI RMSNorm kernels against numpy on the simulator.
2. Model them on a NeuronCore (4096 x 4096 bf16 by default): naive (one kernel per
   PyTorch-level op, each through HBM), fused (one kernel, written the obvious way) and tuned
   (the library kernel, its work spread over the engines); print a
   side-by-side table, write each one's HTML report and Perfetto trace, and say why the fastest
   is fastest.
3. Share: publish the library's RMSNorm to a local Hub server, pull it back, and use it in a
   torch module.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import dtypes
from ..typing import TensorSpec


@dataclass
class Row:
    name: str
    total_us: float
    hbm_bytes: int
    mbu: float
    active: dict[str, float]
    dma_transfers: int
    bound_by: str
    reports: list[Path]


def _profiles(n: int, d: int, dtype, target: str | None):
    from ..compiler.api import profile_kernel
    from ..library.rmsnorm.kernel import rmsnorm_kernel
    from .variants import naive_calls, rmsnorm_fused

    x = TensorSpec((n, d), dtype)
    g = TensorSpec((d,), dtype)
    naive = [
        (kernel.func.__name__, profile_kernel(kernel, *args, target=target))
        for kernel, args in naive_calls(x, g)
    ]
    fused = profile_kernel(rmsnorm_fused, x, g, 1e-6, target=target)
    tuned = profile_kernel(rmsnorm_kernel, x, g, 1e-6, target=target)
    return naive, fused, tuned


def _row(name: str, profiles: list, out: Path) -> Row:
    total_ns = sum(p.total_ns for p in profiles)
    hbm = 0
    busy: dict[str, float] = {}
    transfers = 0
    reports = []
    for i, p in enumerate(profiles):
        s = p.summary
        hbm += s["hbm_read_bytes"] + s["hbm_write_bytes"]
        transfers += s.get("dma_transfer_count", 0)
        for eng in ("tensor", "vector", "scalar", "gpsimd", "dma"):
            busy[eng] = busy.get(eng, 0.0) + s[f"{eng}_active_percent"] / 100 * p.total_ns
        stem = name if len(profiles) == 1 else f"{name}-{i + 1}-{p.kernel}"
        reports.append(p.to_html(out / f"{stem}.html"))
        p.to_perfetto(out / f"{stem}.perfetto.json")
    target = profiles[0].target
    active = {k: 100 * v / total_ns for k, v in busy.items()}
    bound = max(active, key=active.get)
    return Row(
        name,
        total_ns / 1e3,
        hbm,
        hbm / (target.hbm_bytes_per_s * total_ns * 1e-9),
        active,
        transfers,
        bound,
        reports,
    )


_ENGINE = {
    "dma": "the DMA queues",
    "tensor": "the TensorE",
    "vector": "the VectorE",
    "scalar": "the ScalarE",
    "gpsimd": "GpSimd",
}


def _why(rows: list[Row]) -> str:
    """One line, from the measured rows: why the fastest version is fastest."""
    ranked = sorted(rows, key=lambda r: r.total_us)
    best, second, worst = ranked[0], ranked[1], ranked[-1]
    line = (
        f"{best.name} is fastest ({worst.total_us / best.total_us:.1f}x over {worst.name}, "
        f"{second.total_us / best.total_us:.2f}x over {second.name}): "
    )
    if worst.hbm_bytes > 1.05 * best.hbm_bytes:
        line += (
            f"{worst.name} moves {worst.hbm_bytes / 2**20:.0f} MiB through HBM, "
            f"{best.name} {best.hbm_bytes / 2**20:.0f} MiB"
        )
    if (
        abs(second.hbm_bytes - best.hbm_bytes) <= 0.05 * best.hbm_bytes
        and second.bound_by != best.bound_by
    ):
        line += (
            f"; {second.name} moves the same bytes but waits on {_ENGINE[second.bound_by]} "
            f"({second.active[second.bound_by]:.0f}% busy), while {best.name} spreads its "
            f"compute so that only {_ENGINE[best.bound_by]} limit it "
            f"({best.mbu:.0%} of HBM bandwidth)"
        )
    return line + "."


# rows simulated for the numerics check: the model covers the whole shape, the simulator
# checks a slab of it (every column, so the reduction is the full one)
NUMERICS_ROWS = 256


def check_numerics(
    n: int = 256, d: int = 1024, dtype: str = "float32", seed: int = 0
) -> tuple[float, bool, int]:
    """Run the three versions on a ``min(n, NUMERICS_ROWS) x d`` input of ``dtype``; return
    (the largest error against numpy, whether every output is within the dtype's tolerance for
    a normalization (``nkikit.testing.tolerances``), the rows checked)."""
    from ..library.rmsnorm.kernel import rmsnorm
    from ..testing.tolerances import tolerance
    from .variants import rmsnorm_fused, rmsnorm_naive, rmsnorm_reference

    dt = dtypes.as_dtype(dtype)
    rows = min(n, NUMERICS_ROWS)
    rng = np.random.default_rng(seed)
    x = dtypes.cast(rng.standard_normal((rows, d)).astype(np.float32), dt)
    g = dtypes.cast(rng.standard_normal(d).astype(np.float32), dt)
    ref = rmsnorm_reference(x, g).astype(np.float64)
    tol = tolerance(dt, "normalization")
    err, ok = 0.0, True
    for f in (rmsnorm_naive, rmsnorm_fused, rmsnorm):
        diff = np.abs(np.asarray(f(x, g), dtype=np.float64) - ref)
        err = max(err, float(diff.max()))
        ok &= bool((diff <= tol.atol + tol.rtol * np.abs(ref)).all())
    return err, ok, rows


def run_profile_demo(
    out: Path, n: int = 4096, d: int = 4096, dtype: str = "bfloat16", target: str | None = None
) -> list[Row]:
    """Model the three versions, write their reports into ``out`` and print the comparison."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    out.mkdir(parents=True, exist_ok=True)
    err, ok, rows = check_numerics(n, d, dtype)
    verdict = "match" if ok else "[red]DO NOT match[/]"
    console.print(
        f"[bold]1. Numerics[/]: naive, fused and tuned RMSNorm {verdict} numpy on {rows}x{d} "
        f"{dtype} (max error {err:.2e})"
    )
    naive, fused, tuned = _profiles(n, d, dtypes.as_dtype(dtype), target)
    rows = [
        _row("naive", [p for _, p in naive], out),
        _row("fused", [fused], out),
        _row("tuned", [tuned], out),
    ]
    tgt = fused.target.name
    table = Table(title=f"2. RMSNorm {n}x{d} {dtype} on {tgt} (modeled)")
    for col in (
        "version",
        "time µs",
        "MBU",
        "HBM MiB",
        "DMA xfers",
        "TensorE",
        "VectorE",
        "ScalarE",
        "GpSimd",
        "DMA",
        "bound by",
    ):  # noqa: E501
        table.add_column(col, justify="right" if col not in ("version", "bound by") else "left")
    for r in rows:
        a = r.active
        table.add_row(
            r.name,
            f"{r.total_us:,.1f}",
            f"{r.mbu:.0%}",
            f"{r.hbm_bytes / 2**20:,.0f}",
            f"{r.dma_transfers:,}",
            *(f"{a[e]:.0f}%" for e in ("tensor", "vector", "scalar", "gpsimd", "dma")),
            r.bound_by,
        )
    console.print(table)
    console.print(_why(rows))
    console.print(
        f"Reports: {', '.join(str(p) for r in rows for p in r.reports)} (+ a Perfetto trace "
        "beside each, open in ui.perfetto.dev)",
        soft_wrap=True,
    )
    return rows


def add_demo(sub: argparse._SubParsersAction) -> None:
    """``nkikit demo``: its parser in the ``nkikit`` tree."""
    from ..cli.options import add_out, add_target

    p = sub.add_parser(
        "demo",
        help="the RMSNorm story: profile three versions, then share one",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_out(p, "folder for reports (default: ./nkikit-demo)", default="nkikit-demo")
    p.add_argument(
        "--shape",
        default="4096x4096",
        help="ROWSxCOLUMNS, the rows a multiple of 128 (default 4096x4096)",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],  # the library RMSNorm's dtypes (its kernel.toml)
        help="element type (default bfloat16)",
    )
    add_target(p)
    p.add_argument("--no-share", action="store_true", help="skip the publish/pull half")
    p.add_argument(
        "--no-torch", action="store_true", help="skip the PyTorch story (the three torch ways)"
    )
    p.set_defaults(fn=cmd_demo)


def parse_shape(text: str) -> tuple[int, int]:
    """``--shape ROWSxCOLUMNS`` -> (rows, columns), a shape the demo's kernels run at.
    Raises UsageError."""
    from ..cli.options import UsageError
    from .variants import P

    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m is None:
        raise UsageError(f"--shape: expected ROWSxCOLUMNS, e.g. 256x1024, got {text!r}")
    n, d = int(m[1]), int(m[2])
    # the naive and fused kernels walk the rows in whole tiles of P partitions (rows left over
    # would be left unwritten)
    if n == 0 or n % P:
        raise UsageError(
            f"--shape {text}: the rows must be a positive multiple of {P}, e.g. {P}x{d}"
        )
    if d == 0:
        raise UsageError(f"--shape {text}: the columns must be at least 1")
    return n, d


def cmd_demo(ns: argparse.Namespace) -> int:
    from ..cli.options import UsageError, output_folder, parse_target
    from ..errors import NkiError

    n, d = parse_shape(ns.shape)
    out = output_folder(ns.out)  # before minutes of work
    parse_target(ns.target)  # also before it (the torch story names the variable it sets)
    try:
        if not ns.no_torch:
            from .torch_story import run_torch_story

            run_torch_story(out / "torch", n, d, ns.dtype, ns.target)
            print("Kernel level: the same RMSNorm as three hand-written NKI kernels")
        run_profile_demo(out, n, d, ns.dtype, ns.target)
    except NkiError as e:  # the demo's own kernels: the shape asked too much of them
        first = str(e).splitlines()[0]
        raise UsageError(
            f"--shape {ns.shape}: the demo's kernels cannot run at this shape: {first}"
        ) from e
    if not ns.no_share:
        from ..registry.demo import sharing_demo

        print("3. Share: publish the library RMSNorm to a local Hub, pull it, use it from torch")
        sharing_demo(out / "hub")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``nkikit demo ARGV``."""
    from ..cli import main as nkikit

    return nkikit(["demo", *(argv or [])])


if __name__ == "__main__":
    raise SystemExit(main())
