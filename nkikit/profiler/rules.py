"""Performance warning rules, modelled on Neuron Explorer's automatic warnings (nki.md §6.2).

Each rule is a function ``(analysis, summary) -> list[warning]`` in :data:`RULES`; adding a
warning means adding one function there. A warning is a dict with at least

* ``name``: stable identifier (``"small_dma_transfers"``, ``"input_reload"``, ...),
* ``message``: one paragraph a kernel author can act on, naming the lines,
* ``source``: the responsible source lines, comma separated, worst first,
* ``lines``: the same lines as a list,

plus rule-specific numbers (counts, bytes, the engine) for programs to read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .metrics import LATENCY, SATURATED_PERCENT, reload_groups
from .model import engine_label
from .units import fmt_bytes, fmt_flops, fmt_percent

if TYPE_CHECKING:
    from .metrics import Analysis

Warning_ = dict[str, Any]

# Thresholds. DMA: a transfer pays ~1.3 µs of fixed cost, and under ~512 B per partition
# it is overhead-bound (nki.md §4.4); the 2 KiB floor catches transfers over few bytes on
# many partitions.
SMALL_DMA_PARTITION_BYTES = 512
SMALL_DMA_TOTAL_BYTES = 2048
LOW_TENSOR_ACTIVE_PERCENT = 50.0
ENGINE_BOUND_PERCENT = 90.0
TRANSPOSE_FLOPS_FRACTION = 0.10
LINES_IN_MESSAGE = 5


def _warning(name: str, message: str, lines: list[str], **extra: Any) -> Warning_:
    return {"name": name, "message": message, "source": ", ".join(lines), "lines": lines, **extra}


def _named(counts: dict[str, int], noun: str) -> str:
    """``kernel.py:12 (400 transfers), kernel.py:15 (1 transfer) and 3 more lines``."""
    top = list(counts.items())[:LINES_IN_MESSAGE]
    text = ", ".join(f"{src} ({c} {noun}{'s' if c != 1 else ''})" for src, c in top)
    rest = len(counts) - len(top)
    return text + (f" and {rest} more line{'s' if rest > 1 else ''}" if rest > 0 else "")


def _list(lines: list[str]) -> str:
    return ", ".join(lines) if lines else "unknown lines"


def _counts(d: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in d.items()}


def _small_dma(a: Analysis) -> np.ndarray:
    """Mask of DMA transfers under 512 B per partition or 2 KiB in total."""
    c = a.cols
    size = c.transfer_bytes()
    parts = c.ints["partitions"]
    per_partition = size / np.where(parts > 0, parts, 1)
    return c.on("dma") & (
        (per_partition < SMALL_DMA_PARTITION_BYTES) | (size < SMALL_DMA_TOTAL_BYTES)
    )


def small_dma_transfers(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """DMA transfers under 512 B per partition or 2 KiB in total."""
    c = a.cols
    small = _small_dma(a)
    if not small.any():
        return []
    by_line = _counts(c.per_source(small))
    n = int(small.sum())
    msg = (
        f"{n} of {s['dma_transfer_count']} DMA transfers are small (< {SMALL_DMA_PARTITION_BYTES} B "
        f"per partition or < {fmt_bytes(SMALL_DMA_TOTAL_BYTES)} in total): "
        f"{_named(by_line, 'transfer')}. Every transfer pays a fixed setup cost of about 1.3 µs, "
        "so small ones waste DMA bandwidth: move at least 2 KiB per partition per transfer "
        "(larger tiles along the free dimension, or fewer, merged loads)."
    )
    return [_warning("small_dma_transfers", msg, list(by_line), count=n, counts=by_line)]


def input_reload(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """The same HBM byte range of a tensor read more than once; one warning per tensor."""
    groups = reload_groups(a.cols)
    out = []
    for name, g in sorted(groups.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])):
        many = g["ranges"] > 1
        msg = (
            f"Input {name!r} is reloaded: {g['ranges']} range{'s' if many else ''} "
            f"{'are' if many else 'is'} read from HBM up to {g['times']} times, "
            f"{fmt_bytes(g['bytes'])} read again "
            f"({fmt_percent(100 * g['bytes'] / g['read'])} of its HBM reads), "
            f"loaded at {_named(g['lines'], 'read')}. Keep the tile in SBUF and reuse it (hoist "
            "the load out of the loop) to save HBM bandwidth."
        )
        out.append(
            _warning(
                "input_reload",
                msg,
                list(g["lines"]),
                tensor=name,
                bytes=g["bytes"],
                times=g["times"],
            )
        )
    return out


def _low_tensor(s: dict[str, Any]) -> bool:
    """A kernel with useful matmuls whose TensorE is active under half of the time."""
    return (
        s["matmul_instruction_count"] > 0
        and s["model_flops"] > 0
        and s["tensor_active_percent"] < LOW_TENSOR_ACTIVE_PERCENT
    )


def low_tensor_utilization(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """TensorE active under 50% in a kernel that has matmuls doing useful work.  Matmuls with
    no model FLOPs (partition broadcasts through the TensorE) do not make a kernel
    matmul-bound, so they alone never trigger it."""
    if not _low_tensor(s):
        return []
    n = s["matmul_instruction_count"]
    tensor = s["tensor_active_percent"]
    bound = s["bound_by"]
    if bound in ("tensor", LATENCY):
        lines = a.top_lines("tensor", mask=a.cols.matmul_mask())
        why = (
            f"No engine is busy {fmt_percent(SATURATED_PERCENT)} of the time, so dependencies "
            "serialize the engines: pipeline the loop (more buffers, so loads, matmuls and "
            f"stores of different iterations overlap). Matmul lines: {_list(lines)}."
        )
    else:
        lines = a.top_lines(bound)
        why = (
            f"{engine_label(bound)} is the busiest ({fmt_percent(s['engine_active_percent'][bound])} "
            f"active) and keeps TensorE waiting; its hottest lines are {_list(lines)}. Overlap "
            "that work with the matmuls or shrink it."
        )
    msg = (
        f"TensorE is active only {fmt_percent(tensor)} of the time in a kernel with {n} "
        f"matmul instruction{'s' if n > 1 else ''} (MFU {fmt_percent(s['mfu_percent'])}). {why}"
    )
    return [_warning("low_tensor_utilization", msg, lines, tensor_active_percent=tensor)]


def latency_bound(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """No engine or DMA queue saturated (``bound_by == "latency"``), in a kernel that the
    low-TensorE rule does not already cover: the kernel waits on dependencies."""
    if s["bound_by"] != LATENCY or _low_tensor(s):
        return []
    busiest = s["busiest"]
    pct = s["engine_active_percent"][busiest]
    lines = a.top_lines(busiest)
    msg = (
        f"No engine or DMA queue is busy {fmt_percent(SATURATED_PERCENT)} of the time (the "
        f"busiest, {engine_label(busiest)}, is {fmt_percent(pct)} active): the kernel waits on "
        "dependencies and fixed latencies, not on a resource. Let independent tiles overlap: "
        "loop with nl.affine_range and give the tiles of a loop more buffers, so the load of "
        "the next tile runs while this one computes and the previous one is stored. "
        f"{engine_label(busiest)}'s hottest lines are {_list(lines)}."
    )
    return [_warning("latency_bound", msg, lines, busiest=busiest, active_percent=pct)]


_ENGINE_ADVICE = {
    "vector": "fuse elementwise steps, or move some to ScalarE (activation with scale and bias) or GpSimd",
    "scalar": "fuse multiply, add and activation into one activation instruction, or move plain arithmetic to VectorE",
    "gpsimd": "move elementwise work and reductions to VectorE, which is faster for them",
    "sync": "issue fewer, larger DMAs",
}
HIGH_MBU_PERCENT = 70.0
"""Above this share of HBM bandwidth a kernel that reloads nothing and moves large transfers is
near the memory roofline (nki.md §4.5 sets MBU >= 60% as the bar for memory-bound kernels)."""


def _dma_advice(a: Analysis, s: dict[str, Any]) -> str:
    """A fix for a DMA-bound kernel that applies to this kernel: stop reloads, grow small
    transfers, or (neither applying) move fewer bytes."""
    fixes = []
    if s["reload_bytes"] > 0:
        fixes.append(
            f"keep tiles in SBUF instead of reloading them ({fmt_bytes(s['reload_bytes'])} read "
            "again)"
        )
    small = int(_small_dma(a).sum())
    if small:
        fixes.append(f"merge the {small} small transfers into larger ones (2 KiB per partition)")
    if fixes:
        return " and ".join(fixes)
    if s["mbu_percent"] >= HIGH_MBU_PERCENT:
        return (
            f"move fewer bytes: at {fmt_percent(s['mbu_percent'])} of HBM bandwidth with large "
            "transfers and nothing reloaded, the kernel is near the memory roofline, so only a "
            "smaller dtype or fusing it with its neighbours (one pass through HBM) helps"
        )
    return (
        "spread transfers over more DMA queues and issue them earlier (HBM bandwidth is only "
        f"{fmt_percent(s['mbu_percent'])} used)"
    )


def engine_bound(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """A non-Tensor engine (or the DMA queues) over 90% active while TensorE is under 50%.
    One warning, for the busiest such resource (a kernel is bound by one thing at a time);
    others as busy are named in its message."""
    tensor = s["tensor_active_percent"]
    if tensor >= LOW_TENSOR_ACTIVE_PERCENT:
        return []
    hot = [
        (s["engine_active_percent"][e], e)
        for e in ("vector", "scalar", "gpsimd", "sync", "dma")
        if s["engine_active_percent"][e] > ENGINE_BOUND_PERCENT
    ]
    if not hot:
        return []
    # the busiest first; ties go to the order above
    pct, engine = max(hot, key=lambda pe: pe[0])
    label = engine_label(engine)
    lines = a.top_lines(engine)
    extra = f" (MBU {fmt_percent(s['mbu_percent'])})" if engine == "dma" else ""
    advice = _dma_advice(a, s) if engine == "dma" else _ENGINE_ADVICE[engine]
    others = [f"{engine_label(e)} {fmt_percent(p)}" for p, e in hot if e != engine]
    also = (
        f" {', '.join(others)} active too, so shrinking {label}'s work alone moves the limit there."
        if others
        else ""
    )
    msg = (
        f"{label} is active {fmt_percent(pct)} of the time while TensorE is active "
        f"{fmt_percent(tensor)}: the kernel is {label}-bound{extra}. Its hottest lines are "
        f"{_list(lines)}; to go faster, {advice}.{also}"
    )
    return [
        _warning(
            "engine_bound",
            msg,
            lines,
            engine=engine,
            active_percent=pct,
            also_busy=[e for _, e in hot if e != engine],
        )
    ]


def spill(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """Any bytes spilled from SBUF to HBM; blames instructions whose opcode says SPILL."""
    if s["spill_bytes"] <= 0:
        return []
    by_line = _counts(a.cols.per_source(a.cols.opcode_contains("SPILL")))
    where = f" at {_named(by_line, 'instruction')}" if by_line else ""
    msg = (
        f"{fmt_bytes(s['spill_bytes'])} spilled between SBUF and HBM{where}: the live tiles do "
        "not fit in SBUF. Use smaller tiles or fewer buffers alive at once."
    )
    return [_warning("spill", msg, list(by_line), bytes=s["spill_bytes"])]


def transpose_flops(a: Analysis, s: dict[str, Any]) -> list[Warning_]:
    """TensorE transposes over 10% of all TensorE FLOPs."""
    hw, tr = s["hardware_flops"], s["transpose_flops"]
    if hw <= 0 or tr <= TRANSPOSE_FLOPS_FRACTION * hw:
        return []
    lines = list(a.cols.per_source(a.cols.transpose_mask(), a.cols.flops))
    msg = (
        f"Transposes are {fmt_percent(100 * tr / hw)} of TensorE FLOPs ({fmt_flops(tr)}), "
        f"at {_list(lines[:LINES_IN_MESSAGE])}. They use TensorE without useful work: load the "
        "data already transposed (a transposed DMA access pattern) or transpose once and reuse."
    )
    return [_warning("transpose_flops", msg, lines, percent=100 * tr / hw)]


RULES: list[Callable[[Analysis, dict[str, Any]], list[Warning_]]] = [
    small_dma_transfers,
    input_reload,
    low_tensor_utilization,
    latency_bound,
    engine_bound,
    spill,
    transpose_flops,
]


def collect_warnings(a: Analysis, summary: dict[str, Any]) -> list[Warning_]:
    """Run every rule in order; ``summary`` must already hold all other metrics."""
    return [w for rule in RULES for w in rule(a, summary)]
