"""Autotune the library's meta-parameters over a grid of shapes and compare with the kernels'
hand-tuned choices, in the cost model (trn2).

Run ``python -m benchmarks.autotune.library [--backend ray] [--quick]``.  Every (kernel, shape,
dtype) point is an autotuning search; every search is a sweep of ``model_config`` tasks (one
per config), so the whole grid runs locally or on a Ray cluster with the same results.  Config
0 of each search is ``{}``: the kernel's own choice (its hand-tuned rule), the baseline.
Results go to ``benchmarks/autotune/library.json`` and ``library.md``.

Kernels and meta-parameters:

* ``matmul``: ``block_m`` (128-row tiles per lhsT block) x ``block_n`` (512-column tiles per
  rhs block), each of 1, 2, 4.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from nkikit.tune import Sweep, space
from nkikit.tune.tasks import autotune_sweep, report_from_results

HERE = Path(__file__).resolve().parent

MATMUL = "kernels.matmul.kernel:matmul_kernel"
MATMUL_CONFIGS = [{}] + space(block_m=[1, 2, 4], block_n=[1, 2, 4])
K_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)
MN_SIZES = ((1024, 1024), (2048, 8192), (4096, 4096))


def matmul_points(quick: bool) -> list[dict]:
    ks = (256, 2048) if quick else K_SIZES
    mns = MN_SIZES[:1] if quick else MN_SIZES
    dts = ("bfloat16",) if quick else ("bfloat16", "float32")
    return [{"k": k, "m": m, "n": n, "dtype": dt} for dt in dts for k in ks for (m, n) in mns]


def matmul_sweep(p: dict, target: str) -> Sweep:
    lhsT = {"shape": [p["k"], p["m"]], "dtype": p["dtype"]}
    rhs = {"shape": [p["k"], p["n"]], "dtype": p["dtype"]}
    return autotune_sweep(MATMUL, [lhsT, rhs, None], MATMUL_CONFIGS, target=target)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local", choices=("local", "ray"))
    ap.add_argument("--num-cpus", type=int, default=2, help="Ray: workers of a local cluster")
    ap.add_argument("--address", default=None, help="Ray: a cluster address (default: local)")
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--quick", action="store_true", help="a few shapes (a smoke test)")
    ap.add_argument("--out", default=str(HERE))
    ns = ap.parse_args(argv)

    points = matmul_points(ns.quick)
    searches = [matmul_sweep(p, ns.target) for p in points]
    # one sweep of every search's tasks: the cluster sees the whole grid at once
    grid = Sweep([t for s in searches for t in s.tasks], name="matmul grid")
    options = {}
    if ns.backend == "ray":
        options = {"address": ns.address, "num_cpus": None if ns.address else ns.num_cpus}
    t0 = time.perf_counter()
    results = grid.run(ns.backend, progress=True, **options)
    seconds = time.perf_counter() - t0

    rows = []
    for p, s in zip(points, searches):
        report = report_from_results(s, results)
        base = report.candidates[0]
        rows.append(
            {
                **p,
                "kernel": "matmul",
                "hand_us": base.total_us,
                "best": report.best,
                "best_us": report.winner.total_us,
                "speedup": base.total_us / report.winner.total_us,
                "pruned": {json.dumps(c.config): c.rule for c in report.pruned},
            }
        )
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "target": ns.target,
        "backend": ns.backend,
        "tasks": len(grid),
        "seconds": seconds,
        "configs": MATMUL_CONFIGS,
        "rows": rows,
    }
    (out / "library.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# Library meta-parameters, autotuned on the {ns.target} cost model",
        "",
        f"{len(grid)} modeling tasks ({len(points)} searches x {len(MATMUL_CONFIGS)} configs) "
        f"in {seconds:.0f} s on the {ns.backend} backend. `hand` is the kernel's own rule "
        "(config `{}`); `best` the autotuned winner.",
        "",
        "| kernel | dtype | K | M | N | hand µs | best config | best µs | speedup |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["best"].items()) or "(hand)"
        lines.append(
            f"| {r['kernel']} | {r['dtype']} | {r['k']} | {r['m']} | {r['n']} | "
            f"{r['hand_us']:.1f} | {cfg} | {r['best_us']:.1f} | {r['speedup']:.3f}× |"
        )
    (out / "library.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
