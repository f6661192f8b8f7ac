"""NKI 0.x size benchmark: how an unrolled NKI 0.x kernel's trace, verify, fast-path code
generation, first run, compile and profile grow with its size.

NKI 0.7 traces kernels with Python, so every loop unrolls: a kernel at production shapes is
10^5 - 10^6 instructions.  The kernel here is the step the NKI Library repeats most -- a DMA
of an input tile into SBUF, a TensorE matmul into PSUM, a PSUM -> SBUF copy, a DMA out -- in a
Python ``for`` loop (4 IR ops per step), written in the dst-first dialect (``nkikit.nki``).
Tiles are 128 x 128 fp32, as in the Beta-1 scale benchmark (``benchmarks/scale``), so the two
rows of a size run the same computation: their first runs do the same BLAS work.

``python -m benchmarks.nki0x`` runs 10^3, 10^4 and 10^5 IR ops (each size in a subprocess of
its own, so that its peak memory is its own); ``--million`` adds 10^6, ``--sizes 1000,1000000``
picks the sizes; ``--tiny`` is a smoke test.  Each size is measured twice in its process: one
``@nki.jit`` call from numpy arguments to the returned array, timed whole (*call->result*),
then the stages of that call one by one on a fresh copy of the kernel (trace, with the steps
folded back into a loop; verify and the outputs' coverage check; fast-path codegen; first run),
then the compiler's build and profile (of the steps: the compiler unrolls the loop again);
``--call-only`` leaves those two out, which keeps a 10^6 row to a few minutes;
``--compare-unrolled`` adds, after each size, the same kernel kept as traced (not re-rolled).
A three-step kernel runs first, so that imports and one-time set-up are not counted.  Results:
``benchmarks/nki0x/results.{json,md}`` (or ``--out DIR``).  As in ``@nki.jit``, the cyclic
garbage collector is paused while a kernel is traced, verified and first run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

# the tile shape of benchmarks/scale/kernels.py (a 128 x 512 tile would make the first run
# four times the BLAS work of the Beta-1 row it is compared with)
P, F, BLOCKS = 128, 128, 16
DEFAULT_SIZES = (1_000, 10_000, 100_000)
MILLION = 1_000_000
TINY_SIZES = (100, 400)
TARGET = "trn2"


def make_kernel(steps: int):
    """The unrolled 0.x kernel of ``steps`` load -> matmul -> copy -> store steps."""
    import nkikit.nki as nki
    import nkikit.nki.isa as nisa
    import nkikit.nki.language as nl

    @nki.jit
    def unrolled(a, w):
        out = nl.ndarray((BLOCKS * P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        ws = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ws, src=w)
        for i in range(steps):
            rows = slice((i % BLOCKS) * P, (i % BLOCKS + 1) * P)
            t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[rows, :])
            acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=acc, stationary=ws, moving=t)
            res = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[rows, :], src=res)
        return out

    return unrolled


def _peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def measure(ops: int, call_only: bool = False, unrolled: bool = False) -> dict[str, Any]:
    """The kernel of about ``ops`` IR ops, in this process: first one ``@nki.jit`` call from
    arguments to result, timed whole (``call``), then every stage of that call on a fresh
    copy of the kernel (trace; verify with the outputs' coverage check, as the call does;
    fast-path codegen; first run), then compile and profile (``call_only``: not those).
    A three-step kernel runs first, so that imports and one-time set-up are not counted.
    ``unrolled``: the kernel's trace is kept as traced, its steps not re-rolled into a loop
    (``nkikit/trace/reroll.py``), for comparison."""
    from nkikit.compiler.build import build_program
    from nkikit.ir.cache import give_back
    from nkikit.sim import fast
    from nkikit.trace import reroll
    from nkikit.trace.outputs import check_outputs

    if unrolled:
        reroll.ROLL_ABOVE = math.inf
    steps = max(1, (ops - 1) // 4)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((BLOCKS * P, F), dtype=np.float32)
    w = rng.standard_normal((P, P), dtype=np.float32)
    times: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def stage(name, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times[name] = time.perf_counter() - t0
        cpu[name] = time.process_time() - c0
        return out

    with warnings.catch_warnings():
        # a kernel of fewer than BLOCKS steps leaves rows of its output unwritten (NkiWarning)
        warnings.simplefilter("ignore")
        make_kernel(3)(a, w)
        kernel = make_kernel(steps)
        called = stage("call", lambda: kernel(a, w))
        # the stages get the process's memory as it was before the call: the call's IR and
        # program go (they are cached, with the kernel and by its IR)
        del kernel
        give_back()
        kernel = make_kernel(steps)
        gc.disable()
        try:
            ir = stage("trace", lambda: kernel._trace(kernel.bind((a, w), {}), TARGET))
            # the dialect's verify, as the call runs it (a folded kernel the verifier refuses
            # is verified as traced)
            stage("verify", lambda: (kernel.verify(ir, TARGET), check_outputs(ir)))
            prog = stage("codegen", lambda: fast.compile_kernel(ir))
            outs = stage("first_run", lambda: prog.run([a, w]))
            if not call_only:
                program = stage("compile", lambda: build_program(ir, TARGET))
                summary = stage("profile", lambda: program.profile().summary)
        finally:
            gc.enable()
    # the instructions the kernel executes (a re-rolled loop's body once per iteration), and
    # the statements its IR holds
    n_ops = sum(math.prod(loop.trip for loop in loops) for _, loops in ir.ops())
    statements = sum(1 for _ in ir.walk())
    # the kernel's own arithmetic: its tile matmuls alone, as the simulator calls BLAS (one
    # thread, the stationary tile transposed), on the same operands; what no front end or
    # simulator design could take off the call
    tiles = a.reshape(BLOCKS, P, F)
    t0 = time.process_time()
    for i in range(steps):
        np.matmul(w.T, tiles[i % BLOCKS], dtype=np.float32)
    matmul_cpu = time.process_time() - t0
    visited = min(steps, BLOCKS) * P
    expect = (w.T @ a.reshape(BLOCKS, P, F)).reshape(BLOCKS * P, F)[:visited]
    staged = [k for k in times if k != "call"]
    return {
        "steps": steps,
        "ir_ops": n_ops,
        "rerolled": not unrolled,
        "statements": statements,
        **{f"{k}_s": v for k, v in times.items()},
        "total_s": sum(times[k] for k in staged),
        "us_per_op": 1e6 * sum(times[k] for k in staged) / n_ops,
        "trace_verify_us_per_op": 1e6 * (times["trace"] + times["verify"]) / n_ops,
        # this process's CPU time: what a busy machine's other processes do not add
        "cpu_trace_verify_us_per_op": 1e6 * (cpu["trace"] + cpu["verify"]) / n_ops,
        "cpu_s": cpu,
        "matmul_cpu_s": matmul_cpu,
        "instructions": None if call_only else len(program),
        "modeled_us": None if call_only else summary["total_us"],
        "peak_rss_mb": _peak_mb(),
        "matches_numpy": bool(
            np.allclose(outs[0][:visited], expect, rtol=1e-4, atol=1e-3)
            and np.array_equal(called[:visited], outs[0][:visited])
        ),
    }


def _child(ops: int, call_only: bool = False, unrolled: bool = False) -> dict[str, Any]:
    # the whole call is traced for TARGET too, as the stages are (a 0.x kernel's own default
    # target is trn3)
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        NEURON_PLATFORM_TARGET_OVERRIDE=TARGET,
    )
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.nki0x.run", "--one", str(ops)]
        + (["--call-only"] if call_only else [])
        + (["--unrolled"] if unrolled else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"size {ops} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = (
        "| IR ops | IR statements | call→result s | CPU s call→result | CPU µs/op call→result "
        "| CPU s trace / verify / codegen / first run | CPU s of its matmuls alone "
        "| compile s | profile s | µs/op (all stages) | peak MB | matches numpy |\n"
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|:---:|\n"
    )
    lines = []
    for r in rows:
        c = r["cpu_s"]
        # a --call-only row has no compile or profile stage
        comp = f"{r['compile_s']:.2f}" if "compile_s" in r else "—"
        prof = f"{r['profile_s']:.2f}" if "profile_s" in r else "—"
        floor = f"{r['matmul_cpu_s']:.2f}" if "matmul_cpu_s" in r else "—"
        # rows of earlier runs have no statement count: their traces were never re-rolled
        stmts = r.get("statements")
        held = (
            "—" if stmts is None else f"{stmts:,}" + ("" if r.get("rerolled") else " (as traced)")
        )
        lines.append(
            f"| {r['ir_ops']:,} | {held} | {r['call_s']:.2f} | {c['call']:.2f} "
            f"| {1e6 * c['call'] / r['ir_ops']:.0f} "
            f"| {c['trace']:.2f} / {c['verify']:.2f} / {c['codegen']:.2f} / {c['first_run']:.2f} "
            f"| {floor} | {comp} | {prof} | {r['us_per_op']:.0f} | {r['peak_rss_mb']:.0f} "
            f"| {'yes' if r['matches_numpy'] else 'NO'} |"
        )
    load = meta.get("load")
    return (
        "# NKI 0.x size benchmark\n\n"
        f"`python -m benchmarks.nki0x` on {meta['machine']} ({meta['cpus']} CPUs), "
        f"{meta['date']}"
        + (f", load average {load} at the start" if load else "")
        + ". One subprocess per size; an unrolled load -> matmul -> copy -> store "
        "loop written dst-first (`nkikit.nki`), 128 x 128 fp32 tiles as in "
        "`benchmarks/scale`.  *call→result*: one `@nki.jit` call from numpy arguments to "
        "the returned array (wall clock, and the process's own CPU time, which other "
        "processes on a busy machine do not inflate); then the stages of that call on a "
        "fresh copy of the kernel (CPU s; trace includes folding the unrolled steps back into "
        "loops, `nkikit/trace/reroll.py`; verify includes the outputs' coverage check), "
        "and the compiler's build and profile (wall s).  *Its matmuls alone*: the kernel's "
        "tile matmuls as the simulator calls BLAS (one thread), nothing else: the part of "
        "the first run that is the kernel's own arithmetic.\n\n" + head + "\n".join(lines) + "\n"
    )


def _sizes(text: str) -> tuple[int, ...]:
    """``--sizes``: comma-separated positive IR op counts (``1000,1e6`` reads as well)."""
    try:
        sizes = tuple(int(float(x)) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated op counts, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"op counts must be at least 2, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.nki0x", description=__doc__)
    ap.add_argument("--million", action="store_true", help="add the 10^6-op row")
    ap.add_argument("--tiny", action="store_true", help="two small sizes (a smoke test)")
    ap.add_argument(
        "--sizes", type=_sizes, help="comma-separated IR op counts, e.g. 1000,100000,1000000"
    )
    ap.add_argument(
        "--call-only",
        action="store_true",
        help="stop each size after its first run (no compile / profile stages)",
    )
    ap.add_argument(
        "--compare-unrolled",
        action="store_true",
        help="after each size, the same kernel kept as traced (its steps not re-rolled into a "
        "loop), in the same run",
    )
    ap.add_argument("--out", type=Path, default=HERE, help="folder for results.{json,md}")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--unrolled", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--markdown", action="store_true", help="rewrite results.md from results.json in --out"
    )
    args = ap.parse_args(argv)
    if args.markdown:
        data = json.loads((args.out / "results.json").read_text())
        (args.out / "results.md").write_text(_markdown(data["rows"], data["meta"]))
        return
    if args.one:
        print(json.dumps(measure(args.one, args.call_only, args.unrolled)))
        return
    if args.sizes:
        sizes = args.sizes
    else:
        sizes = TINY_SIZES if args.tiny else DEFAULT_SIZES + ((MILLION,) if args.million else ())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else ""
    rows = []
    for ops in sizes:
        for unrolled in (False, True) if args.compare_unrolled else (False,):
            row = _child(ops, args.call_only, unrolled)
            rows.append(row)
            print(
                f"{row['ir_ops']:>9,} ops  call {row['call_s']:7.2f} s  stages {row['total_s']:7.2f} s"
                f"  peak {row['peak_rss_mb']:6.0f} MB{'  (as traced)' if unrolled else ''}",
                flush=True,
            )
    meta = {
        "load": load,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "results.md").write_text(_markdown(rows, meta))


if __name__ == "__main__":
    main()
