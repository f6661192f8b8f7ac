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
* ``swiglu`` and ``swiglu_backward``: ``chunk`` (columns per tile), 512 to 8192.
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


SWIGLU = "kernels.swiglu.kernel:swiglu_kernel"
SWIGLU_BWD = "kernels.swiglu.kernel:swiglu_backward_kernel"
SWIGLU_CONFIGS = [{}] + [{"chunk": c} for c in (512, 1024, 4096, 8192)]
ROWS = (1024, 8192)
D_SIZES = (2048, 4096, 11008, 14336)


def _arr(shape: list[int], dtype: str) -> dict:
    return {"shape": shape, "dtype": dtype}


def points(quick: bool, kernels: tuple[str, ...]) -> list[dict]:
    """Every search of the grid: the kernel, its shape and dtype, and its sweep's arguments."""
    out = []
    for dt in ("bfloat16",) if quick else ("bfloat16", "float32"):
        if "matmul" in kernels:
            for k in (256, 2048) if quick else K_SIZES:
                for m, n in MN_SIZES[:1] if quick else MN_SIZES:
                    out.append(
                        {
                            "kernel": "matmul",
                            "shape": f"K={k} M={m} N={n}",
                            "dtype": dt,
                            "ref": MATMUL,
                            "args": [_arr([k, m], dt), _arr([k, n], dt), None],
                            "configs": MATMUL_CONFIGS,
                        }
                    )
        for name, ref, n_in in (("swiglu", SWIGLU, 2), ("swiglu_backward", SWIGLU_BWD, 3)):
            if name not in kernels:
                continue
            for rows in ROWS[:1] if quick else ROWS:
                for d in D_SIZES[:2] if quick else D_SIZES:
                    out.append(
                        {
                            "kernel": name,
                            "shape": f"N={rows} D={d}",
                            "dtype": dt,
                            "ref": ref,
                            "args": [_arr([rows, d], dt)] * n_in,
                            "configs": SWIGLU_CONFIGS,
                        }
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local", choices=("local", "ray"))
    ap.add_argument("--num-cpus", type=int, default=2, help="Ray: workers of a local cluster")
    ap.add_argument("--address", default=None, help="Ray: a cluster address (default: local)")
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--quick", action="store_true", help="a few shapes (a smoke test)")
    ap.add_argument("--kernels", default="matmul,swiglu,swiglu_backward")
    ap.add_argument("--name", default="library", help="results file stem")
    ap.add_argument("--out", default=str(HERE))
    ns = ap.parse_args(argv)

    grid_points = points(ns.quick, tuple(ns.kernels.split(",")))
    searches = [autotune_sweep(p["ref"], p["args"], p["configs"], ns.target) for p in grid_points]
    # one sweep of every search's tasks: the cluster sees the whole grid at once
    grid = Sweep([t for s in searches for t in s.tasks], name="library grid")
    options = {}
    if ns.backend == "ray":
        options = {"address": ns.address, "num_cpus": None if ns.address else ns.num_cpus}
    t0 = time.perf_counter()
    results = grid.run(ns.backend, progress=True, **options)
    seconds = time.perf_counter() - t0

    rows = []
    for p, s in zip(grid_points, searches):
        report = report_from_results(s, results)
        base = report.candidates[0]
        rows.append(
            {
                "kernel": p["kernel"],
                "shape": p["shape"],
                "dtype": p["dtype"],
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
        "configs": {"matmul": MATMUL_CONFIGS, "swiglu": SWIGLU_CONFIGS},
        "rows": rows,
    }
    (out / f"{ns.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# Library meta-parameters, autotuned on the {ns.target} cost model",
        "",
        f"{len(grid)} modeling tasks ({len(grid_points)} searches) "
        f"in {seconds:.0f} s on the {ns.backend} backend. `hand` is the kernel's own rule "
        "(config `{}`); `best` the autotuned winner.",
        "",
        "| kernel | dtype | shape | hand µs | best config | best µs | speedup |",
        "| --- | --- | --- | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["best"].items()) or "(hand)"
        lines.append(
            f"| {r['kernel']} | {r['dtype']} | {r['shape']} | "
            f"{r['hand_us']:.1f} | {cfg} | {r['best_us']:.1f} | {r['speedup']:.3f}× |"
        )
    (out / f"{ns.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
