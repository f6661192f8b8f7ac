"""Scale benchmark: how trace, verify, fast-path codegen, simulation, compile and profile grow
with the size of an unrolled kernel, and what address rotation does to its modeled time.

Run ``python -m benchmarks.scale`` (10^3, 10^4 and 10^5 IR ops; several minutes on 2 cores),
``python -m benchmarks.scale --million`` (adds the 10^6 row: much longer, a few GB), or
``python -m benchmarks.scale --tiny`` (two small sizes: a smoke test).  Results go to
``benchmarks/scale/results.json`` and ``benchmarks/scale/results.md`` unless ``--out`` names
another folder.

The kernel (``benchmarks/scale/kernels.py``) is a Python ``for`` loop of load -> matmul ->
copy -> store steps, which the tracer unrolls: 4 IR ops per step, each DMA split over the 16
DMA queues when scheduled (8.5 scheduled instructions per IR op).  Each size runs in a
subprocess of its own, so that its peak memory (``ru_maxrss``) is its own:

* ``trace``: the tracer builds the IR (``JitKernel._trace``);
* ``verify``: ``nkikit.ir.verify.verify`` on it;
* ``codegen``: the fast simulator compiles it (``nkikit.sim.fast.compile_kernel``);
* ``first run``: the compiled program runs once on random inputs;
* ``compile``: allocation, lowering and scheduling for trn2 (``build_program``);
* ``profile``: ``Program.profile()`` and its ``summary`` (every metric and warning).

``µs/op`` is the time of all six stages over the IR ops (``CPU µs/op``: their CPU time; each
stage also has a ``<stage>_cpu_s`` in the JSON).  Every stage runs with the cyclic garbage
collector paused, as the library's own entry points run them.  With ``--check`` the fast path's
outputs are also compared with the reference interpreter's (bit for bit; slow).  BLAS runs
single-threaded in the subprocesses (``OPENBLAS_NUM_THREADS=1``).

The rotation table compiles the same 256-step loop written with ``range``,
``nl.static_range`` and ``nl.affine_range`` (identical instructions), and the ``range`` form
once more with address rotation off (``build_program(..., rotation=False)``): before
rotation, unrolled tiles sat at one address and every step waited for the previous one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.scale.kernels import (  # noqa: E402
    F,
    P,
    make_loop,
    make_unrolled,
    ops_for,
    steps_for,
)

DEFAULT_SIZES = (1_000, 10_000, 100_000)
MILLION = 1_000_000
TINY_SIZES = (100, 400)
BLOCKS = 16  # input row blocks the steps cycle through (16 x 64 KiB of input)
ROTATION_STEPS = 256
TARGET = "trn2"


def _rss_mb() -> float:
    """Resident memory now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def _reset_peak() -> bool:
    """Start a new peak-RSS window (Linux: ``/proc/self/clear_refs`` 5 resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _window_peak_mb() -> float:
    """Peak resident memory since the last :func:`_reset_peak` (VmHWM; 0 if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10
    except (OSError, ValueError):
        pass
    return 0.0


def _peak_mb() -> float:
    """Peak resident memory of this process so far (ru_maxrss: KiB on Linux, B on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def measure(ops: int, blocks: int = BLOCKS, check: bool = False) -> dict[str, Any]:
    """Run every stage once on the unrolled kernel of about ``ops`` IR ops (in this
    process) and return the row: seconds per stage, counts and memory."""
    from nkikit.compiler.build import build_program, gc_paused
    from nkikit.ir.verify import verify
    from nkikit.sim import fast, same_bits

    steps = steps_for(ops)
    kernel = make_unrolled(steps, blocks)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((blocks * P, F), dtype=np.float32)
    w = rng.standard_normal((P, F), dtype=np.float32)
    row: dict[str, Any] = {"steps": steps, "ir_ops": ops_for(steps)}
    rss = {"start": _rss_mb()}
    peak_rise: dict[str, float] = {}  # per stage: its peak RSS above the RSS it started at
    overall_peak = 0.0
    times: dict[str, float] = {}

    cpu: dict[str, float] = {}

    def stage(name: str, fn):
        # the collector paused as the library's own entry points pause it (specialize_for:
        # trace + verify, a kernel call: the first run, build_program: compile); left on,
        # each full collection walks the whole IR (1.2 s in verify at 10^5 ops, ~10x that
        # at 10^6), which is the collector's cost, not the stage's
        nonlocal overall_peak
        overall_peak = max(overall_peak, _window_peak_mb())
        before = _rss_mb()
        windowed = _reset_peak()
        with gc_paused():
            t, c = time.perf_counter(), time.process_time()
            out = fn()
            times[name] = time.perf_counter() - t
            cpu[name] = time.process_time() - c
        rss[name] = _rss_mb()
        if windowed:
            peak_rise[name] = _window_peak_mb() - before
        return out

    bound = kernel.bind((a, w), {})
    ir = stage("trace", lambda: kernel._trace(bound, TARGET))
    stage("verify", lambda: verify(ir, TARGET))
    prog = stage("codegen", lambda: fast.compile_kernel(ir))
    outs = stage("first_run", lambda: prog.run([a, w]))
    program = stage("compile", lambda: build_program(ir, TARGET))
    summary = stage("profile", lambda: program.profile().summary)
    row.update({f"{k}_s": v for k, v in times.items()})
    # CPU seconds too: on a loaded machine wall time measures the other processes as well
    row.update({f"{k}_cpu_s": v for k, v in cpu.items()})
    row["instructions"] = len(program)
    row["instruction_kinds"] = len(program.infos)
    row["fast_templates"] = prog.source.count("\ndef _t") + prog.source.startswith("def _t")
    row["fast_fallbacks"] = prog.n_fallback
    row["modeled_us"] = summary["total_us"]
    row["total_s"] = sum(times.values())
    row["us_per_op"] = 1e6 * row["total_s"] / row["ir_ops"]
    row["cpu_us_per_op"] = 1e6 * sum(cpu.values()) / row["ir_ops"]
    row["compile_profile_us_per_instruction"] = (
        1e6 * (times["compile"] + times["profile"]) / max(len(program), 1)
    )
    row["rss_mb"] = rss
    if peak_rise:
        # the peak windows were reset per stage: the process's peak is the highest of them
        row["stage_peak_rise_mb"] = peak_rise
        row["peak_rss_mb"] = max(overall_peak, _window_peak_mb())
    else:
        row["peak_rss_mb"] = _peak_mb()
    expect = _expected(a, w, steps, blocks)
    row["matches_numpy"] = bool(np.allclose(outs[0], expect, rtol=1e-4, atol=1e-3, equal_nan=True))
    if check:
        from nkikit.sim.interp import simulate as reference

        row["fast_equals_reference"] = all(
            same_bits(x, y) for x, y in zip(outs, reference(ir, [a, w]))
        )
    return row


def _expected(a: np.ndarray, w: np.ndarray, steps: int, blocks: int) -> np.ndarray:
    """What the kernel computes: ``w.T @ block`` for every block a step has visited (the
    rest of the output is never written and holds NaN poison)."""
    out = np.full((blocks * P, F), np.nan, np.float32)
    for b in range(min(steps, blocks)):
        out[b * P : (b + 1) * P] = w.T @ a[b * P : (b + 1) * P]
    return out


def rotation_rows(steps: int = ROTATION_STEPS) -> list[dict[str, Any]]:
    """Modeled time of one loop written three ways, and unrolled without rotation."""
    import nkikit.language as nl
    import nkikit.typing as nt
    from nkikit.compiler.build import build_program

    args = (nt.tensor[[steps * P, F], nl.float32], nt.tensor[[P, F], nl.float32])
    rows = []
    for form, rotation in (
        ("range", True),
        ("static_range", True),
        ("affine_range", True),
        ("range", False),
    ):
        ir, _ = make_loop(steps, form).specialize_for(TARGET, *args)
        program = build_program(ir, TARGET, rotation=rotation)
        rows.append(
            {
                "form": form,
                "rotation": rotation,
                "steps": steps,
                "ir_ops": sum(1 for _ in ir.ops()),
                "instructions": len(program),
                "modeled_us": program.total_us,
            }
        )
    return rows


def _child(ops: int, check: bool) -> dict[str, Any]:
    """Measure one size in a fresh interpreter and return its row."""
    cmd = [sys.executable, "-m", "benchmarks.scale.run", "--one", str(ops)]
    if check:
        cmd.append("--check")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # one BLAS thread: the 128 x 128 matmuls gain nothing from more, and spinning BLAS
    # threads on a busy machine made the first run's time mostly noise
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"size {ops} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt_s(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"


def _compile_peak(r: dict[str, Any]) -> str:
    """Compile and profile's peak above the RSS compile started at (``-`` if not measured)."""
    rise = r.get("stage_peak_rise_mb")
    if not rise or "compile" not in rise:
        return "-"
    after = r["rss_mb"]["compile"] - r["rss_mb"]["first_run"]  # what compile kept
    return f"{max(rise['compile'], after + rise.get('profile', 0.0)):,.0f} MB"


def render_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Compiler scale",
        "",
        f"Generated by `python -m benchmarks.scale` ({meta['mode']}) on {meta['machine']}, "
        f"{meta['cores']} cores, load average {meta['loadavg_start']} at the start. "
        "One unrolled kernel (a Python `for` loop of load -> matmul -> copy -> store steps, "
        "4 IR ops per step) per row, each in its own process; *instructions* are the "
        "scheduled ones (each DMA split over 16 queues); *µs/op* is all six stages over the "
        "IR ops (*CPU µs/op*: the same in CPU time, which other processes on a busy machine do "
        "not inflate); peak RSS is the process's, *compile peak* how far compile (with "
        "profile) took it above the RSS compile started at.",
        "",
        "| IR ops | instructions | trace | verify | fast-path codegen | first run | compile "
        "| profile | µs/op | CPU µs/op | peak RSS | compile peak |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['ir_ops']:,} | {r['instructions']:,} | {_fmt_s(r['trace_s'])} "
            f"| {_fmt_s(r['verify_s'])} | {_fmt_s(r['codegen_s'])} | {_fmt_s(r['first_run_s'])} "
            f"| {_fmt_s(r['compile_s'])} | {_fmt_s(r['profile_s'])} | {r['us_per_op']:.0f} "
            f"| {r.get('cpu_us_per_op', float('nan')):.0f} | {r['peak_rss_mb']:,.0f} MB "
            f"| {_compile_peak(r)} |"
        )
    rot = results.get("rotation") or []
    if rot:
        lines += [
            "",
            f"Address rotation: the same {rot[0]['steps']}-step loop "
            f"({rot[0]['instructions']:,} instructions in every form), modeled on {TARGET}:",
            "",
            "| loop | address rotation | modeled µs |",
            "| --- | --- | ---: |",
        ]
        for r in rot:
            lines.append(
                f"| `{r['form']}` | {'on' if r['rotation'] else 'off'} | {r['modeled_us']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    ap.add_argument("--million", action="store_true", help="add the 10^6-op row")
    ap.add_argument("--tiny", action="store_true", help="two small sizes (smoke test)")
    ap.add_argument("--sizes", default="", help="comma-separated IR op counts")
    ap.add_argument("--check", action="store_true", help="compare with the reference too")
    ap.add_argument("--no-rotation", action="store_true", help="skip the rotation table")
    ap.add_argument("--out", default=str(HERE), help="folder for results.{json,md}")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.one:
        print(json.dumps(measure(ns.one, check=ns.check)))
        return {}
    if ns.sizes:
        sizes = [int(x) for x in ns.sizes.split(",") if x.strip()]
    elif ns.tiny:
        sizes = list(TINY_SIZES)
    else:
        sizes = list(DEFAULT_SIZES) + ([MILLION] if ns.million else [])
    meta = {
        "mode": "tiny" if ns.tiny else ("with 10^6" if ns.million else "default"),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cores": os.cpu_count(),
        "loadavg_start": tuple(round(x, 2) for x in os.getloadavg()),
        "target": TARGET,
        "blas_threads": 1,
    }
    rows = []
    for ops in sizes:
        print(f"scale: {ops:,} IR ops ...", file=sys.stderr, flush=True)
        row = _child(ops, ns.check)
        print(
            f"  {row['instructions']:,} instructions, {row['total_s']:.1f} s, "
            f"{row['peak_rss_mb']:,.0f} MB",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    rotation = [] if ns.no_rotation else rotation_rows(32 if ns.tiny else ROTATION_STEPS)
    meta["loadavg_end"] = tuple(round(x, 2) for x in os.getloadavg())
    results = {"meta": meta, "rows": rows, "rotation": rotation}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(render_markdown(results))
    print(render_markdown(results))
    return results


if __name__ == "__main__":
    main()
