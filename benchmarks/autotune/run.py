"""Autotuning and sweep benchmarks: how long one library kernel takes to autotune, and a
sweep's throughput locally and on a local Ray cluster with 1 and 2 workers (paired runs).

Run ``python -m benchmarks.autotune [--rounds 2] [--tasks 40] [--no-ray]``.  Results go to
``benchmarks/autotune/results.json`` and ``results.md``.

* ``autotune``: ``nki.autotune`` of the library matmul (10 configs: the kernel's own rule and
  ``block_m`` x ``block_n`` in {1, 2, 4}^2) on trn2 for abstract bf16 operands; the cold
  search (trace, verify, compile and model every config), a hit in a fresh process's disk
  cache (a new ``Autotuner`` on the same folder, which re-models the winner for its profile
  only when asked) and an in-memory hit.
* ``sweep``: one sweep of ``--tasks`` modeling tasks (matmul configs over several K) run by
  the local backend (this process, one task after another) and by Ray with ``num_cpus`` 1 and 2
  (tasks of 1 CPU: one worker process per CPU).  Rounds alternate the order of the backends
  (paired runs, so a load change on the machine hits all of them).  ``cold`` is the first
  sweep after ``ray.init`` (workers start and import nkikit), ``warm`` a second sweep of as
  many other tasks (other K), on the started workers.  The local backend runs the same two
  sweeps in this process (nkikit already imported).
  Cluster start-up (``ray.init``) is reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MATMUL = "kernels.matmul.kernel:matmul_kernel"


def bench_autotune() -> dict:
    import nkikit as nki
    from kernels.matmul.kernel import matmul_kernel
    from nkikit import dtypes
    from nkikit.typing import TensorSpec

    configs = [{}] + nki.tune.space(block_m=[1, 2, 4], block_n=[1, 2, 4])
    a = TensorSpec((2048, 2048), dtypes.as_dtype("bfloat16"))
    b = TensorSpec((2048, 2048), dtypes.as_dtype("bfloat16"))
    with tempfile.TemporaryDirectory() as folder:
        cold = nki.autotune(configs=configs, key=["lhsT", "rhs"], cache=folder)(matmul_kernel)
        t0 = time.perf_counter()
        report = cold.tune(a, b, None)
        t_cold = time.perf_counter() - t0
        fresh = nki.autotune(configs=configs, key=["lhsT", "rhs"], cache=folder)(matmul_kernel)
        t0 = time.perf_counter()
        hit = fresh.tune(a, b, None)
        t_disk = time.perf_counter() - t0
        assert hit.cached and hit.best == report.best
        t0 = time.perf_counter()
        for _ in range(100):
            fresh.tune(a, b, None)
        t_mem = (time.perf_counter() - t0) / 100
    return {
        "kernel": "matmul 2048x2048x2048 bf16 (trn2)",
        "configs": len(configs),
        "pruned": len(report.pruned),
        "best": report.best,
        "speedup_vs_hand": report.speedup,
        "cold_s": t_cold,
        "disk_hit_s": t_disk,
        "memory_hit_us": t_mem * 1e6,
    }


def sweep_tasks(n: int, first_k: int = 128):
    from nkikit.tune import Sweep
    from nkikit.tune.tasks import autotune_sweep

    configs = [{}] + [{"block_m": m, "block_n": b} for m in (1, 2, 4) for b in (1, 2, 4)]
    tasks = []
    k = first_k
    while len(tasks) < n:
        spec = [{"shape": [k, 1024], "dtype": "bfloat16"}] * 2 + [None]
        tasks += autotune_sweep(MATMUL, spec, configs).tasks
        k += 128
    return Sweep(tasks[:n], name="throughput")


def bench_sweeps(n_tasks: int, rounds: int, with_ray: bool) -> dict:
    # two sweeps of distinct tasks, so the second gains nothing from the first's trace caches
    sweeps = {"cold": sweep_tasks(n_tasks), "warm": sweep_tasks(n_tasks, first_k=64)}
    backends = ["local"] + (["ray1", "ray2"] if with_ray else [])
    times: dict[str, dict[str, list[float]]] = {
        b: {"cold": [], "warm": [], "init": []} for b in backends
    }
    reference: dict[str, dict] = {}

    def same_as_first(backend: str, phase: str, res) -> None:
        values = res.values_by_id()
        assert len(values) == n_tasks, f"{backend}: {len(res.failed)} tasks failed"
        first = reference.setdefault(phase, values)
        assert values == first, f"{backend} gave other results than the first backend"

    for r in range(rounds):
        order = backends if r % 2 == 0 else list(reversed(backends))
        for b in order:
            if b == "local":
                for phase, sweep in sweeps.items():
                    t0 = time.perf_counter()
                    res = sweep.run(progress=False)
                    times[b][phase].append(time.perf_counter() - t0)
                    same_as_first(b, phase, res)
            else:
                import ray

                t0 = time.perf_counter()
                from nkikit.tune.ray_backend import _local_runtime_env

                ray.init(
                    num_cpus=int(b[3:]),
                    object_store_memory=200 * 1024**2,
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env=_local_runtime_env(),
                )
                times[b]["init"].append(time.perf_counter() - t0)
                try:
                    for phase, sweep in sweeps.items():
                        t0 = time.perf_counter()
                        res = sweep.run("ray", progress=False)
                        times[b][phase].append(time.perf_counter() - t0)
                        same_as_first(b, phase, res)
                finally:
                    ray.shutdown()
    out = {}
    for b, t in times.items():
        out[b] = {
            phase: {
                "median_s": statistics.median(v),
                "runs_s": v,
                "tasks_per_s": n_tasks / statistics.median(v),
            }
            for phase, v in t.items()
            if v
        }
    return {"tasks": n_tasks, "rounds": rounds, "identical_results": True, "backends": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", default=str(HERE))
    ns = ap.parse_args(argv)
    from nkikit.tune.ray_backend import ray_available

    load_before = os.getloadavg()[0]
    doc = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs)",
        "autotune": bench_autotune(),
        "sweep": bench_sweeps(ns.tasks, ns.rounds, not ns.no_ray and ray_available()),
    }
    doc["load_average_1min"] = {"start": load_before, "end": os.getloadavg()[0]}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    a = doc["autotune"]
    lines = [
        "# Autotuning and sweep benchmarks",
        "",
        f"Machine: {doc['machine']}; 1-minute load average {load_before:.1f} at the start, "
        f"{doc['load_average_1min']['end']:.1f} at the end.",
        "",
        f"## Autotuning one library kernel: {a['kernel']}",
        "",
        f"{a['configs']} configs ({a['pruned']} pruned by the verifier or allocator); winner "
        f"{a['best']}, {a['speedup_vs_hand']:.3f}× the kernel's own rule in the model.",
        "",
        "| search | time |",
        "| --- | ---: |",
        f"| cold (every config traced, verified, compiled, modeled) | {a['cold_s']:.2f} s |",
        f"| disk-cache hit (fresh tuner) | {a['disk_hit_s'] * 1e3:.1f} ms |",
        f"| memory hit | {a['memory_hit_us']:.0f} µs |",
        "",
        f"## Sweep throughput: {ns.tasks} modeling tasks, median of {ns.rounds} paired rounds",
        "",
        "| backend | cluster start | cold sweep | tasks/s | warm sweep | tasks/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for b, t in doc["sweep"]["backends"].items():
        init = f"{t['init']['median_s']:.1f} s" if "init" in t else "-"
        lines.append(
            f"| {b} | {init} | {t['cold']['median_s']:.1f} s | {t['cold']['tasks_per_s']:.1f} | "
            f"{t['warm']['median_s']:.1f} s | {t['warm']['tasks_per_s']:.1f} |"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
