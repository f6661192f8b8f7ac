"""First-run benchmark: time and peak memory of executing an unrolled, matmul-heavy NKI 0.x
kernel on the fast simulator, with numpy's BLAS at one thread (what both simulators do since
``nkikit/sim/blas.py``) and at the thread count numpy starts with (what they did before).

The kernel is the shape of an MLP projection at context-encoding sizes, the pattern that
dominates the NKI Library's slow tests: bf16 activations and weights, per row block a
K-loop of ``nc_matmul`` accumulating 128 x 128 by 128 x 512 tiles into one fp32 PSUM tile,
a PSUM add of a second accumulation (gate and up), and a bf16 result stored -- all in Python
``for`` loops, so every instruction is unrolled (NKI 0.x traces with Python).

Each configuration runs in a subprocess of its own so that its peak RSS is its own.  The
time is the kernel's execution (``Program.run``; trace, verification and code generation
are measured and reported apart, as "build").  ``--tiny`` is a smoke test.  Results:
``benchmarks/firstrun/results.{json,md}`` (or ``--out DIR``).
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
# ``--against DIR`` measures another checkout's nkikit (the benchmark's own code stays this one)
if os.environ.get("FIRSTRUN_NKIKIT"):
    sys.path.insert(0, os.environ["FIRSTRUN_NKIKIT"])

import numpy as np  # noqa: E402

P, N = 128, 512
SIZES = ((512, 2048), (1024, 4096))  # (rows of the activation, hidden = K)
TINY = ((256, 512),)


def make_kernel(rows: int, hidden: int):
    """gate/up projection of ``x`` (rows x hidden, bf16) by two hidden x 512 weights:
    ``(x @ wg) + (x @ wu)`` per 128-row block, K accumulated in PSUM 128 at a time."""
    import nkikit.nki as nki
    import nkikit.nki.isa as nisa
    import nkikit.nki.language as nl

    kt = hidden // P

    @nki.jit
    def gate_up(xt, wg, wu):
        # xt: hidden x rows (K on partitions), wg / wu: hidden x 512
        out = nl.ndarray((rows, N), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        wg_s = nl.ndarray((P, kt, N), dtype=nl.bfloat16, buffer=nl.sbuf)
        wu_s = nl.ndarray((P, kt, N), dtype=nl.bfloat16, buffer=nl.sbuf)
        for k in range(kt):
            nisa.dma_copy(dst=wg_s[:, k, :], src=wg[k * P : (k + 1) * P, :])
            nisa.dma_copy(dst=wu_s[:, k, :], src=wu[k * P : (k + 1) * P, :])
        for r in range(rows // P):
            x_s = nl.ndarray((P, kt, P), dtype=nl.bfloat16, buffer=nl.sbuf)
            for k in range(kt):
                nisa.dma_copy(dst=x_s[:, k, :], src=xt[k * P : (k + 1) * P, r * P : (r + 1) * P])
            g = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.psum)
            u = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.psum)
            for k in range(kt):
                nisa.nc_matmul(dst=g, stationary=x_s[:, k, :], moving=wg_s[:, k, :])
            for k in range(kt):
                nisa.nc_matmul(dst=u, stationary=x_s[:, k, :], moving=wu_s[:, k, :])
            # VectorE reads at most one PSUM operand: the up projection goes to SBUF first
            u_s = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=u_s, src=u)
            s = nl.ndarray((P, N), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=s, data1=g, data2=u_s, op=nl.add)
            nisa.dma_copy(dst=out[r * P : (r + 1) * P, :], src=s)
        return out

    return gate_up


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def measure(rows: int, hidden: int, pinned: bool) -> dict[str, Any]:
    """Build once, run once, in this process; ``pinned``: one BLAS thread (the simulators'
    setting) or the BLAS threads left as numpy started them."""
    import contextlib

    import ml_dtypes
    from threadpoolctl import threadpool_info

    import nkikit.sim.fast.runtime as rt
    from nkikit.sim.fast import compile_kernel

    if not pinned and hasattr(rt, "one_blas_thread"):
        # what the simulators did before sim/blas.py: leave numpy's BLAS threads alone
        rt.one_blas_thread = contextlib.nullcontext
    rng = np.random.default_rng(0)
    bf = ml_dtypes.bfloat16
    xt = rng.standard_normal((hidden, rows)).astype(bf)
    wg = (rng.standard_normal((hidden, N)) / 32).astype(bf)
    wu = (rng.standard_normal((hidden, N)) / 32).astype(bf)
    kern = make_kernel(rows, hidden)
    t0 = time.perf_counter()
    ir = kern.ir(xt, wg, wu) if hasattr(kern, "ir") else None
    prog = compile_kernel(ir)
    t1 = time.perf_counter()
    (got,) = prog.run([xt, wg, wu])
    t2 = time.perf_counter()
    want = (xt.astype(np.float32).T @ wg.astype(np.float32)) + (
        xt.astype(np.float32).T @ wu.astype(np.float32)
    )
    err = float(np.max(np.abs(got.astype(np.float32) - want)) / np.max(np.abs(want)))
    threads = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    import nkikit

    return {
        "nkikit": str(Path(nkikit.__file__).parents[1]),
        "rows": rows,
        "hidden": hidden,
        "blas": "one thread" if pinned else f"as numpy has it ({threads[0] if threads else '?'})",
        "matmuls": 2 * (rows // P) * (hidden // P),
        "build_s": round(t1 - t0, 3),
        "run_s": round(t2 - t1, 3),
        "peak_rss_mb": round(_peak_mb(), 1),
        "rel_err": err,
        "out_sum": float(np.asarray(got, np.float64).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.firstrun", description=__doc__)
    ap.add_argument("--tiny", action="store_true", help="one small size (a smoke test)")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument(
        "--against",
        type=Path,
        help="another checkout (e.g. the main branch before this change): its nkikit runs "
        "first in each pair, with BLAS threads as numpy has them",
    )
    ap.add_argument("--one", nargs=3, metavar=("ROWS", "HIDDEN", "PINNED"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        r = measure(int(a.one[0]), int(a.one[1]), a.one[2] == "1")
        print(json.dumps(r))
        return 0
    configs = [(None, False), (None, True)]  # (checkout, one BLAS thread)
    if a.against is not None:
        configs.insert(0, (a.against.resolve(), False))
    rows = []
    for rws, hidden in TINY if a.tiny else SIZES:
        for checkout, pinned in configs:
            cmd = [sys.executable, "-m", "benchmarks.firstrun", "--one", str(rws), str(hidden)]
            cmd.append("1" if pinned else "0")
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            env.pop("FIRSTRUN_NKIKIT", None)
            if checkout is not None:
                env["FIRSTRUN_NKIKIT"] = str(checkout)
            res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return 1
            row = json.loads(res.stdout.strip().splitlines()[-1])
            row["checkout"] = "this" if checkout is None else str(checkout)
            rows.append(row)
            print(row)
    meta = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# First run of an unrolled matmul-heavy NKI 0.x kernel (`python -m benchmarks.firstrun`)",
        "",
        f"{meta['when']}, Python {meta['python']}, numpy {meta['numpy']}, {meta['cpus']} CPUs, "
        f"load average at the end {', '.join(f'{x:.1f}' for x in meta['loadavg'])}.",
        "",
        "Pairs run back to back, each configuration in a fresh process.  *build*: trace, verify",
        "and fast-path code generation; *first run*: `Program.run`; peak RSS of the process.",
        "",
        "| rows x hidden | tile matmuls | nkikit | BLAS | build s | first run s | peak RSS MB "
        "| rel. err |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['rows']} x {r['hidden']} | {r['matmuls']} | {r['checkout']} | {r['blas']} | "
            f"{r['build_s']} | {r['run_s']} | {r['peak_rss_mb']} | {r['rel_err']:.1e} |"
        )
    (a.out / "results.md").write_text("\n".join(lines) + "\n")
    return 0
