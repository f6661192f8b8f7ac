"""Reproduce published NKI results with nkikit's cost model.

``python -m benchmarks.calibration`` (or ``python benchmarks/calibration/run.py``) compiles
the four matmul tutorial steps (``matmul_kernels.py``) for [4096, 8192] @ [8192, 8192] bf16 on
trn1, compares time and HFU with the published Trn1 measurements [T-MM], checks the trn2
profiling walkthrough's engine activity qualitatively [T-OPT], and adds the tutorial rows:
fused Mamba v1-v3 [T-MAMBA], LayerNorm v1/v2 [T-LN] and the small-head SD attention CI limit
(published / modeled / error / source).  It writes ``results.json`` and ``results.md`` next to
this file.  The exit status is 0 when the order of the four matmul kernels is reproduced and
every matmul time and HFU is within 25%; the tutorial checks (orders, 15%) are reported.

``--tutorials-only`` runs only the tutorial rows.  ``--scan-dma-efficiency 0.36,0.40,0.44``
shows how the fitted DMA constant moves the three DMA-bound matmul kernels (the fit behind
``TRN1.dma_efficiency``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.calibration"

import nkikit.language as nl  # noqa: E402
import nkikit.typing as nt  # noqa: E402
from nkikit.compiler.build import build_program  # noqa: E402
from nkikit.targets import get_target  # noqa: E402

from . import attention_kernels, layernorm_kernels, mamba_kernels  # noqa: E402
from .matmul_kernels import KERNELS  # noqa: E402

HERE = Path(__file__).resolve().parent
TOLERANCE = 0.25
GOAL = 0.15  # the cost model's goal on every published row (DESIGN.md)
K, M, N = 8192, 4096, 8192

# [T-MM]: Trn1.32xlarge, one NeuronCore, [4096, 8192] @ [8192, 8192] bf16, nki.benchmark P99
PUBLISHED_TRN1 = {
    "tiled": {"ms": 51.80, "hfu": 10.98},
    "hoisted_load": {"ms": 42.96, "hfu": 13.24},
    "blocked_free_dim": {"ms": 22.07, "hfu": 26.51},
    "fully_optimized": {"ms": 6.97, "hfu": 85.24},
}
# [T-OPT]: Trn2 profiling walkthrough of the same four steps (engine active %, Neuron Explorer)
PUBLISHED_TRN2 = {
    "tiled": {"tensor": 87.28, "dma": 99.93},
    "hoisted_load": {"tensor": 99.85, "dma": 99.73},
    "blocked_free_dim": {"tensor": 99.52, "dma": 95.70},
    "fully_optimized": {"tensor": 99.50, "dma": 21.54, "vector": 10.55},
}


def _args():
    return nt.tensor[[K, M], nl.bfloat16], nt.tensor[[K, N], nl.bfloat16]


def model(name: str, target) -> dict:
    """Compile one kernel and return its modeled numbers."""
    lhsT, rhs = _args()
    t0 = time.perf_counter()
    ir, _ = KERNELS[name].specialize(lhsT, rhs)
    t1 = time.perf_counter()
    program = build_program(ir, target)
    t2 = time.perf_counter()
    summary = program.profile().summary
    active = summary["engine_active_percent"]
    return {
        "kernel": name,
        "modeled_ms": program.total_us / 1000.0,
        "modeled_hfu": summary["hfu_percent"],
        "tensor_active": active["tensor"],
        "vector_active": active["vector"],
        "dma_active": active["dma"],
        "instructions": len(program),
        "trace_s": t1 - t0,
        "compile_schedule_s": t2 - t1,
        "buffers": {p["tensor"]: p["buffers"] for p in program.meta["allocation"]},
    }


def run_trn1() -> list[dict]:
    target = get_target("trn1")
    rows = []
    for name in KERNELS:
        r = model(name, target)
        pub = PUBLISHED_TRN1[name]
        r["published_ms"] = pub["ms"]
        r["published_hfu"] = pub["hfu"]
        r["time_error_percent"] = 100.0 * (r["modeled_ms"] / pub["ms"] - 1.0)
        r["hfu_error_percent"] = 100.0 * (r["modeled_hfu"] / pub["hfu"] - 1.0)
        rows.append(r)
        print(
            f"trn1 {name:18s} {r['modeled_ms']:8.2f} ms (published {pub['ms']:6.2f}, {r['time_error_percent']:+5.1f}%)"
            f"  HFU {r['modeled_hfu']:5.2f}% (published {pub['hfu']:5.2f}%)"
            f"  {r['instructions']:>9,} instructions, compile+schedule {r['compile_schedule_s']:.2f} s",
            flush=True,
        )
    return rows


def run_trn2() -> list[dict]:
    target = get_target("trn2")
    rows = []
    for name in KERNELS:
        r = model(name, target)
        r["published"] = PUBLISHED_TRN2[name]
        rows.append(r)
        print(
            f"trn2 {name:18s} {r['modeled_ms']:8.2f} ms  TensorE {r['tensor_active']:5.1f}%  DMA {r['dma_active']:5.1f}%"
            f"  VectorE {r['vector_active']:5.1f}%   published {PUBLISHED_TRN2[name]}",
            flush=True,
        )
    return rows


# [T-MAMBA]: trn1, fp32, batch 1, channels 4096, 16 states; device latency in ms.  Seq 512:
# the text's 2.34 ms (v1) and 1.61 ms (v2); seq >= 1024: the tutorial's scaling table.
MAMBA_SRC = "T-MAMBA (aws-neuron-sdk general/nki/tutorials/fused_mamba.rst)"
MAMBA_ROWS = [("v1", 512, 2.34), ("v2", 512, 1.61), ("v3", 512, 1.6)] + [
    (v, seq, ms)
    for seq, v2, v3 in [
        (1024, 4.4, 3.3),
        (2048, 8.9, 6.6),
        (3072, 13.1, 10.1),
        (4096, 17.6, 13.3),
        (5120, 23.7, 17.3),
        (6144, 27.5, 19.6),
    ]
    for v, ms in (("v2", v2), ("v3", v3))
]
MAMBA_SPILL_ROW = ("v2", 8192, 53.33)  # the compiler spills [T-MAMBA]
# [T-LN]: trn1, p50 NC latency in us; the page's --nrows 4096 --ncols 8192 size (the text
# also mentions a (300, 1000) input, which the times cannot be: 2.3 ms for 1.2 MB)
LN_SRC = "T-LN (aws-neuron-sdk general/nki/tutorials/layernorm.rst)"
LN_ROWS = [("v1", 2311.0), ("v2", 1969.0)]
# nki-samples CI: the bf16 seq-4096 d-128 case of fused_self_attn_for_SD_small_head_size must
# run within this latency (p1 <= limit x 1.05); an upper bound on the hardware time, in us
ATT_SRC = "nki-samples@0898a77 test/unit/test_SD_attention_small_head.py (CI limit)"
ATT_LIMIT_US = 536.0


def _mamba_args(seq: int, channels: int = 4096, states: int = 16):
    f32 = nl.float32
    return (
        nt.tensor[[1, channels, seq], f32],
        nt.tensor[[1, channels, seq], f32],
        nt.tensor[[channels, states], f32],
        nt.tensor[[1, states, seq], f32],
        nt.tensor[[1, states, seq], f32],
    )


def _row(kernel: str, published: float, unit: str, source: str, build) -> dict:
    """One published figure against the model: ``build()`` returns the Program."""
    from nkikit.errors import NkiError

    row = {"kernel": kernel, "published": published, "unit": unit, "source": source}
    try:
        program = build()
    except NkiError as e:
        row.update(modeled=None, error_percent=None, rejected=str(e).splitlines()[0])
        return row
    scale = 1000.0 if unit == "ms" else 1.0
    modeled = program.total_us / scale
    active = program.profile().summary["engine_active_percent"]
    row.update(
        modeled=modeled,
        error_percent=100.0 * (modeled / published - 1.0),
        vector_active=active["vector"],
        dma_active=active["dma"],
    )
    return row


def run_tutorials() -> list[dict]:
    """The fused-Mamba and LayerNorm tutorial rows on trn1."""
    target = get_target("trn1")
    rows = []
    for v, seq, ms in [*MAMBA_ROWS, MAMBA_SPILL_ROW]:
        k = mamba_kernels.KERNELS[v]
        r = _row(
            f"mamba_{v} seq {seq}",
            ms,
            "ms",
            MAMBA_SRC,
            lambda k=k, seq=seq: build_program(
                k.specialize_for("trn1", *_mamba_args(seq))[0], target
            ),
        )
        rows.append(r)
        _print(r)
    x = nt.tensor[[4096, 8192], nl.float32]
    g = nt.tensor[[8192], nl.float32]
    for v, us in LN_ROWS:
        k = layernorm_kernels.KERNELS[v]
        r = _row(
            f"layernorm_{v} 4096x8192",
            us,
            "us",
            LN_SRC,
            lambda k=k: build_program(k.specialize_for("trn1", x, g, g)[0], target),
        )
        rows.append(r)
        _print(r)
    bf = nl.bfloat16
    k = attention_kernels.sd_attention_small_head
    r = _row(
        "sd_attention bf16 seq 4096 d128",
        ATT_LIMIT_US,
        "us",
        ATT_SRC,
        lambda: build_program(
            k[1].specialize_for(
                "trn1",
                nt.tensor[[1, 128, 4096], bf],
                nt.tensor[[1, 4096, 128], bf],
                nt.tensor[[1, 4096, 128], bf],
            )[0],
            target,
        ),
    )
    rows.append(r)
    _print(r)
    return rows


def _print(r: dict) -> None:
    if r["modeled"] is None:
        print(f"trn1 {r['kernel']:24s} rejected: {r['rejected']}", flush=True)
    else:
        print(
            f"trn1 {r['kernel']:24s} {r['modeled']:9.3f} {r['unit']} (published {r['published']},"
            f" {r['error_percent']:+5.1f}%)  VectorE {r['vector_active']:5.1f}%",
            flush=True,
        )


def tutorial_checks(rows: list[dict]) -> dict[str, bool]:
    by = {r["kernel"]: r for r in rows}

    def ms(v: str, seq: int) -> float:
        return by[f"mamba_{v} seq {seq}"]["modeled"]

    seqs = [s for _, s, _ in MAMBA_ROWS if s > 512][::2]
    return {
        "mamba_v1_slower_than_v2": ms("v1", 512) > ms("v2", 512),
        "mamba_v3_faster_than_v2_seq_1024_6144": all(ms("v3", s) < ms("v2", s) for s in seqs),
        "layernorm_v2_faster_than_v1": by["layernorm_v2 4096x8192"]["modeled"]
        < by["layernorm_v1 4096x8192"]["modeled"],
        "rows_within_15_percent": all(
            r["modeled"] is not None and abs(r["error_percent"]) <= 100 * GOAL for r in rows
        ),
    }


def checks(rows: list[dict]) -> dict[str, bool]:
    times = [r["modeled_ms"] for r in rows]
    return {
        "order_reproduced": all(a > b for a, b in zip(times, times[1:])),
        "times_within_25_percent": all(
            abs(r["time_error_percent"]) <= 100 * TOLERANCE for r in rows
        ),
        "hfu_within_25_percent": all(abs(r["hfu_error_percent"]) <= 100 * TOLERANCE for r in rows),
    }


# The measured cause of each row the model misses by more than 15% (README "Misses"); a
# row listed here that comes within 15% is not shown.
MISS_CAUSES = {
    "mamba_v2 seq 8192": (
        "SBUF is exactly full where the broadcast multiply runs (six 32 KiB tiles), so every "
        "tile has one buffer and the compiler spills `d_a` (exp(delta A), 4 MiB per state "
        "step, 4.3 GB of spill traffic) and `c_row`; per state step the model has ~68 us of "
        "VectorE work plus the save (~27 us) and the reload (~39 us at the 0.41 load "
        "efficiency) on the chain (~144 us); the published time leaves ~36 us per step, one "
        "transfer.  Which tensor the Neuron compiler spills, and how fast its spill queues "
        "run, is not published."
    ),
    "sd_attention": (
        "the PSUM evacuations are now balanced (Q.K^T copies on ScalarE, transposed "
        "probabilities on VectorE: each ~53% / ~50% active), but TensorE runs its "
        "instructions in program order: the Q.K^T matmuls of query tile i+1 queue behind the "
        "transposes and P.V matmuls of tile i, which wait for tile i's softmax chain, so one "
        "tile's softmax never overlaps the next tile's matmuls (the Neuron compiler "
        "schedules across iterations; the model keeps source order)."
    ),
}


def tutorial_markdown(rows: list[dict], ok: dict[str, bool]) -> str:
    lines = [
        "Fused Mamba [T-MAMBA] (trn1, fp32, channels 4096, 16 states) and LayerNorm [T-LN] "
        "(trn1, fp32, 4096 x 8192): published vs modeled.",
        "",
        "| kernel | published | modeled | error % | VectorE active % | source |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if r["modeled"] is None:
            lines.append(
                f"| {r['kernel']} | {r['published']} {r['unit']} | rejected | - | - "
                f"| {r['source']} |"
            )
            continue
        lines.append(
            f"| {r['kernel']} | {r['published']} {r['unit']} | {r['modeled']:.3f} {r['unit']} "
            f"| {r['error_percent']:+.1f} | {r['vector_active']:.1f} | {r['source']} |"
        )
    lines += ["", "Checks: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ok.items()), ""]
    misses = [
        (r["kernel"], cause)
        for r in rows
        for key, cause in MISS_CAUSES.items()
        if r["kernel"].startswith(key)
        and (r["error_percent"] is None or abs(r["error_percent"]) > 15.0)
    ]
    if misses:
        lines += ["Rows missed by more than 15%, with their measured causes:", ""]
        lines += [f"* **{k}**: {cause}" for k, cause in misses]
        lines.append("")
    return "\n".join(lines)


def markdown(trn1: list[dict], trn2: list[dict], ok: dict[str, bool]) -> str:
    lines = [
        "Matmul tutorial, [4096, 8192] @ [8192, 8192] bf16, one NeuronCore: published Trn1 measurements "
        "[T-MM] vs nkikit's model (`python -m benchmarks.calibration`).",
        "",
        "| kernel | published ms | modeled ms | error % | published HFU | modeled HFU |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in trn1:
        lines.append(
            f"| {r['kernel']} | {r['published_ms']:.2f} | {r['modeled_ms']:.2f} | {r['time_error_percent']:+.1f} "
            f"| {r['published_hfu']:.2f}% | {r['modeled_hfu']:.2f}% |"
        )
    lines += ["", "Checks: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ok.items()), ""]
    if trn2:
        lines += [
            "Trn2 walkthrough [T-OPT], engine active % (qualitative; Neuron Explorer counts an engine active "
            "while its instructions wait on semaphores, nkikit only while they execute):",
            "",
            "| kernel | modeled ms | TensorE published / modeled | DMA published / modeled | VectorE published / modeled |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for r in trn2:
            p = r["published"]
            vec = (
                f"{p['vector']:.2f} / {r['vector_active']:.2f}"
                if "vector" in p
                else f"- / {r['vector_active']:.2f}"
            )
            lines.append(
                f"| {r['kernel']} | {r['modeled_ms']:.2f} | {p['tensor']:.2f} / {r['tensor_active']:.2f} "
                f"| {p['dma']:.2f} / {r['dma_active']:.2f} | {vec} |"
            )
        lines.append("")
    return "\n".join(lines)


def scan(values: list[float]) -> None:
    base = get_target("trn1")
    for v in values:
        t = base.with_overrides(dma_efficiency=v)
        errs = []
        for name in ("tiled", "hoisted_load", "blocked_free_dim"):
            lhsT, rhs = _args()
            ir, _ = KERNELS[name].specialize(lhsT, rhs)
            ms = build_program(ir, t).total_us / 1000.0
            errs.append(f"{name} {ms:.2f} ms ({100 * (ms / PUBLISHED_TRN1[name]['ms'] - 1):+.1f}%)")
        print(f"dma_efficiency={v:.3f}: " + ", ".join(errs), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-trn2", action="store_true", help="skip the trn2 walkthrough check")
    ap.add_argument(
        "--tutorials-only", action="store_true", help="only the Mamba and LayerNorm rows"
    )
    ap.add_argument(
        "--scan-dma-efficiency",
        default="",
        help="comma-separated values to try for trn1's dma_efficiency",
    )
    ap.add_argument("--out", default=str(HERE), help="folder for results.json and results.md")
    ns = ap.parse_args(argv)
    if ns.scan_dma_efficiency:
        scan([float(x) for x in ns.scan_dma_efficiency.split(",")])
        return 0
    tut = run_tutorials()
    tut_ok = tutorial_checks(tut)
    if ns.tutorials_only:
        print(tutorial_markdown(tut, tut_ok))
        return 0 if all(tut_ok.values()) else 1
    trn1 = run_trn1()
    trn2 = [] if ns.no_trn2 else run_trn2()
    ok = checks(trn1)
    t1 = get_target("trn1")
    result = {
        "shape": {"lhsT": [K, M], "rhs": [K, N], "dtype": "bfloat16"},
        "trn1": trn1,
        "trn2": trn2,
        "checks": ok,
        "tolerance": TOLERANCE,
        "tutorials": tut,
        "tutorial_checks": tut_ok,
        "fitted_constants": {
            "trn1.dma_efficiency": t1.dma_efficiency,
            "trn1.dma_row_overhead_bytes": t1.dma_row_overhead_bytes,
            "sequential_buffers": t1.sequential_buffers,
            "dependent_overhead_cycles": t1.dependent_overhead_cycles,
            "vector_dependent_overhead_cycles": t1.vector_dependent_overhead_cycles,
            "vector_two_input_cycles": t1.vector_two_input_cycles,
            "trn1.dma_store_efficiency": t1.dma_store_efficiency,
        },
    }
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md = markdown(trn1, trn2, ok) + "\n" + tutorial_markdown(tut, tut_ok)
    (out / "results.md").write_text(md, encoding="utf-8")
    print(md)
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
