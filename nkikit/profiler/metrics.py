"""Summary metrics of a Profile, defined as Neuron Explorer defines them (nki.md §6.1-6.2).

* ``mfu`` = useful matmul FLOPs / (peak FLOP/s of the dominant matmul dtype x total time);
  ``hfu`` = the same with every FLOP TensorE executed (transposes included);
  ``mbu`` = HBM bytes read + written / (HBM bytes/s x total time). The bare names are
  fractions in [0, 1]; the ``*_percent`` keys are the same numbers x 100.
* An engine's active percent is the union of its busy intervals over the total time;
  ``dma_active_percent`` is the union over every DMA queue.
* ``mm_arithmetic_intensity`` = model (useful) matmul FLOPs / HBM bytes (0 without HBM traffic).
* ``bound_by`` is the resource with the highest active percent: an engine name or ``"dma"``.

Every percentage is of the kernel's total time and 0 for an empty profile.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .model import COMPUTE_ENGINES, Instruction, engine_sort_key, is_dma_engine

if TYPE_CHECKING:
    from .model import Profile


@dataclass(slots=True)
class LineStat:
    """Time spent on one source line, summed over all engines.

    ``time_ns`` adds the durations of the line's instructions (engine-time, so parallel
    work counts on each engine); ``share`` is that over all instructions' engine-time, so
    the shares of all lines add up to 1. ``engines`` splits ``time_ns`` by engine.
    """

    source: str
    code: str
    time_ns: float
    share: float
    count: int
    engines: dict[str, float] = field(default_factory=dict)

    @property
    def main_engine(self) -> str:
        """The engine where this line spends most of its time."""
        return max(self.engines, key=self.engines.__getitem__) if self.engines else ""


def dtype_class(dtype: str) -> str:
    """Map a dtype name to a TensorE peak class: ``"fp8"``, ``"fp32"`` or ``"bf16"``.

    bf16, fp16 and tf32 share one peak, so every dtype that is neither 8-bit nor fp32 is
    counted as bf16 (also unknown or empty names).
    """
    d = dtype.lower().replace("_", "").replace("-", "")
    if "e4m3" in d or "e5m2" in d or "e3m4" in d or d in ("fp8", "float8", "cfp8", "int8", "uint8"):
        return "fp8"
    if d.startswith("mxfp") or d.startswith("float8") or d.startswith("fp8"):
        return "fp8"
    if d in ("fp32", "float32", "f32"):
        return "fp32"
    return "bf16"


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of half-open ``(start, end)`` intervals; empty ones dropped."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def union_ns(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of half-open intervals."""
    return sum(e - s for s, e in merge_intervals(intervals))


@dataclass(slots=True)
class Analysis:
    """Facts derived once from a Profile and shared by the summary and the warning rules."""

    profile: Profile
    total_ns: float
    by_engine: dict[str, list[Instruction]]
    busy_ns: dict[str, float]
    active_percent: dict[str, float]
    line_engine_ns: dict[str, dict[str, float]]
    line_text: dict[str, str]

    def top_lines(self, engine: str, n: int = 3, pred: Any = None) -> list[str]:
        """Source lines with the most time on ``engine`` (``"dma"`` = all queues).

        With ``pred``, only instructions for which ``pred(ins)`` is true count.
        """
        times: Counter[str] = Counter()
        for ins in self.instructions_on(engine):
            if ins.source and (pred is None or pred(ins)):
                times[ins.source] += ins.duration_ns
        return [src for src, _ in times.most_common(n)]

    def instructions_on(self, engine: str) -> list[Instruction]:
        if engine == "dma":
            return [i for e, lst in self.by_engine.items() if is_dma_engine(e) for i in lst]
        return self.by_engine.get(engine, [])


def analyze(profile: Profile) -> Analysis:
    """Group instructions by engine and line and compute busy time per engine."""
    by_engine: dict[str, list[Instruction]] = defaultdict(list)
    line_engine_ns: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    line_text: dict[str, str] = {}
    for ins in profile.instructions:
        by_engine[ins.engine].append(ins)
        src = ins.source or "<unknown>"
        line_engine_ns[src][ins.engine] += ins.duration_ns
        if ins.source_text and src not in line_text:
            line_text[src] = ins.source_text

    total = profile.total_ns
    busy: dict[str, float] = {}
    for engine, lst in by_engine.items():
        busy[engine] = union_ns([(i.start_ns, i.end_ns) for i in lst])
    dma_ivs = [(i.start_ns, i.end_ns) for e, lst in by_engine.items() if is_dma_engine(e) for i in lst]
    busy["dma"] = union_ns(dma_ivs)

    def pct(ns: float) -> float:
        return 100.0 * ns / total if total > 0 else 0.0

    active = {e: pct(busy.get(e, 0.0)) for e in COMPUTE_ENGINES}
    active["dma"] = pct(busy["dma"])
    queues = {f"dma{q}" for q in range(profile.target.dma_queues)} | {
        e for e in by_engine if is_dma_engine(e)
    }
    for q in sorted(queues, key=engine_sort_key):
        active[q] = pct(busy.get(q, 0.0))
    for e in by_engine:  # engines outside the contract still get a number
        active.setdefault(e, pct(busy[e]))
    return Analysis(
        profile=profile,
        total_ns=total,
        by_engine=dict(by_engine),
        busy_ns=busy,
        active_percent=active,
        line_engine_ns={k: dict(v) for k, v in line_engine_ns.items()},
        line_text=line_text,
    )


def compute_summary(profile: Profile, analysis: Analysis | None = None) -> dict[str, Any]:
    """The summary dict of :attr:`Profile.summary`; see the module docstring for definitions."""
    from .rules import collect_warnings

    a = analysis or analyze(profile)
    ins = profile.instructions
    total = a.total_ns
    target = profile.target

    hw_flops = model_flops = transpose_flops = 0.0
    flops_by_class: Counter[str] = Counter()
    matmuls = transposes = 0
    sums = Counter()
    for i in ins:
        if i.engine == "tensor":
            # flops are TensorE work by contract; other engines' numbers would not be
            # comparable to the TensorE peak, so they are ignored.
            hw_flops += i.flops
            model_flops += i.model_flops
            if i.is_transpose:
                transposes += 1
                transpose_flops += i.flops
            elif i.is_matmul:
                matmuls += 1
                flops_by_class[dtype_class(i.dtype)] += i.flops
        sums["hbm_read_bytes"] += i.hbm_read_bytes
        sums["hbm_write_bytes"] += i.hbm_write_bytes
        sums["sbuf_read_bytes"] += i.sbuf_read_bytes
        sums["sbuf_write_bytes"] += i.sbuf_write_bytes
        sums["psum_read_bytes"] += i.psum_read_bytes
        sums["psum_write_bytes"] += i.psum_write_bytes

    # The dominant dtype sets the peak: a bf16 kernel with one fp32 matmul is a bf16 kernel.
    matmul_dtype = flops_by_class.most_common(1)[0][0] if flops_by_class else "bf16"
    peak = target.peak_flops(matmul_dtype)
    seconds = total * 1e-9
    compute_capacity = peak * seconds
    hbm_bytes = sums["hbm_read_bytes"] + sums["hbm_write_bytes"]
    hbm_capacity = target.hbm_bytes_per_s * seconds
    mfu = model_flops / compute_capacity if compute_capacity > 0 else 0.0
    hfu = hw_flops / compute_capacity if compute_capacity > 0 else 0.0
    mbu = hbm_bytes / hbm_capacity if hbm_capacity > 0 else 0.0

    dma = a.instructions_on("dma")
    dma_bytes = sum(i.transfer_bytes for i in dma)
    counts = {e: len(a.by_engine.get(e, ())) for e in COMPUTE_ENGINES}
    counts["dma"] = len(dma)

    reload_bytes = input_reload_bytes(ins)
    hbm_read = sums["hbm_read_bytes"]

    active = a.active_percent
    s: dict[str, Any] = {
        "kernel": profile.kernel,
        "target": target.name,
        "total_ns": total,
        "total_us": total / 1000.0,
        "instruction_count": len(ins),
        "model_flops": model_flops,
        "hardware_flops": hw_flops,
        "transpose_flops": transpose_flops,
        "transpose_flops_percent": 100.0 * transpose_flops / hw_flops if hw_flops else 0.0,
        "matmul_dtype": matmul_dtype,
        "peak_flops_per_s": peak,
        "mfu": mfu,
        "hfu": hfu,
        "mbu": mbu,
        "mfu_percent": 100.0 * mfu,
        "hfu_percent": 100.0 * hfu,
        "mbu_percent": 100.0 * mbu,
        **{k: sums[k] for k in _BYTE_KEYS},
        "hbm_bytes": hbm_bytes,
        "achieved_hbm_bytes_per_s": hbm_bytes / seconds if seconds > 0 else 0.0,
        "mm_arithmetic_intensity": model_flops / hbm_bytes if hbm_bytes else 0.0,
        "engine_active_percent": {e: active[e] for e in (*COMPUTE_ENGINES, "dma")},
        **{f"{e}_active_percent": active[e] for e in COMPUTE_ENGINES},
        "dma_active_percent": active["dma"],
        "dma_queue_active_percent": {e: v for e, v in active.items() if is_dma_engine(e)},
        "instruction_count_by_engine": counts,
        **{f"{e}_instruction_count": counts[e] for e in COMPUTE_ENGINES},
        "matmul_instruction_count": matmuls,
        "transpose_instruction_count": transposes,
        "dma_transfer_count": len(dma),
        "dma_bytes": dma_bytes,
        "dma_transfer_average_bytes": dma_bytes / len(dma) if dma else 0.0,
        "reload_bytes": reload_bytes,
        "useful_read_percent": 100.0 * (hbm_read - reload_bytes) / hbm_read if hbm_read else 100.0,
        "spill_bytes": profile.spill_bytes,
        "bound_by": _bound_by(active, bool(ins)),
    }
    s["warnings"] = collect_warnings(a, s)
    return s


_BYTE_KEYS = (
    "hbm_read_bytes",
    "hbm_write_bytes",
    "sbuf_read_bytes",
    "sbuf_write_bytes",
    "psum_read_bytes",
    "psum_write_bytes",
)


def _bound_by(active: dict[str, float], nonempty: bool) -> str | None:
    if not nonempty:
        return None
    candidates = (*COMPUTE_ENGINES, "dma")
    # max() keeps the first of equals, so ties go to the engine listed first (Tensor).
    return max(candidates, key=lambda e: active[e])


def reload_key(i: Instruction) -> tuple[str, int, int, int, int]:
    """What makes two HBM reads "the same data" for the input-reload metric."""
    return (i.tensor_name, i.hbm_offset, i.hbm_read_bytes, i.partitions, i.elements)


def input_reload_bytes(instructions: list[Instruction]) -> int:
    """HBM bytes read again: for each tensor range read n > 1 times, (n - 1) x its bytes."""
    seen: Counter[tuple[str, int, int, int, int]] = Counter()
    for i in instructions:
        if i.tensor_name and i.hbm_read_bytes > 0:
            seen[reload_key(i)] += 1
    return sum((n - 1) * key[2] for key, n in seen.items() if n > 1)


def per_line(profile: Profile, analysis: Analysis | None = None) -> list[LineStat]:
    """One :class:`LineStat` per source line, hottest first (ties by line name)."""
    a = analysis or analyze(profile)
    counts: Counter[str] = Counter(i.source or "<unknown>" for i in profile.instructions)
    grand = sum(sum(e.values()) for e in a.line_engine_ns.values())
    stats = []
    for src, engines in a.line_engine_ns.items():
        t = sum(engines.values())
        stats.append(
            LineStat(
                source=src,
                code=a.line_text.get(src, ""),
                time_ns=t,
                share=t / grand if grand > 0 else 0.0,
                count=counts[src],
                engines=dict(sorted(engines.items(), key=lambda kv: engine_sort_key(kv[0]))),
            )
        )
    stats.sort(key=lambda st: (-st.time_ns, st.source))
    return stats


def validate_profile(profile: Profile) -> list[str]:
    """Every way the profile breaks the producer contract in :mod:`nkikit.profiler.model`."""
    problems: list[str] = []
    ids: dict[int, Instruction] = {}
    nq = profile.target.dma_queues
    for i in profile.instructions:
        where = f"instruction {i.id} ({i.engine} {i.opcode} at {i.source or '?'})"
        if i.id in ids:
            problems.append(f"{where}: duplicate id")
        ids[i.id] = i
        if not (i.engine in COMPUTE_ENGINES or (is_dma_engine(i.engine) and int(i.engine[3:]) < nq)):
            problems.append(f"{where}: unknown engine {i.engine!r}")
        if i.end_ns < i.start_ns:
            problems.append(f"{where}: ends ({i.end_ns}) before it starts ({i.start_ns})")
        for name in _BYTE_KEYS:
            if getattr(i, name) < 0:
                problems.append(f"{where}: negative {name}")
        if i.flops < 0 or i.model_flops < 0 or i.model_flops > i.flops * (1 + 1e-9):
            problems.append(f"{where}: need 0 <= model_flops <= flops, got {i.model_flops} / {i.flops}")
    eps = 1e-6
    for i in profile.instructions:
        for d in i.deps:
            dep = ids.get(d)
            if dep is None:
                problems.append(f"instruction {i.id}: depends on unknown id {d}")
            elif dep.end_ns > i.start_ns + eps:
                problems.append(
                    f"instruction {i.id} starts at {i.start_ns} before its dependency {d} "
                    f"ends at {dep.end_ns}"
                )
    by_engine: dict[str, list[Instruction]] = defaultdict(list)
    for i in profile.instructions:
        if i.engine in COMPUTE_ENGINES:
            by_engine[i.engine].append(i)
    for engine, lst in by_engine.items():
        lst = sorted(lst, key=lambda x: (x.start_ns, x.end_ns))
        for prev, cur in zip(lst, lst[1:]):
            if cur.start_ns < prev.end_ns - eps:
                problems.append(
                    f"{engine}: instructions {prev.id} and {cur.id} overlap "
                    f"({prev.start_ns}-{prev.end_ns} and {cur.start_ns}-{cur.end_ns})"
                )
    if profile.spill_bytes < 0:
        problems.append("negative spill_bytes")
    return problems
