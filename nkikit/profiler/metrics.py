"""Summary metrics of a Profile, defined as Neuron Explorer defines them (nki.md §6.1-6.2).

* ``mfu`` = useful matmul FLOPs / (peak FLOP/s of the dominant matmul dtype x total time);
  ``hfu`` = the same with every FLOP TensorE executed (transposes included);
  ``mbu`` = HBM bytes read + written / (HBM bytes/s x total time). The bare names are
  fractions in [0, 1]; the ``*_percent`` keys are the same numbers x 100.
* An engine's active percent is the union of its busy intervals over the total time;
  ``dma_active_percent`` is the union over every DMA queue.
* ``mm_arithmetic_intensity`` = model (useful) matmul FLOPs / HBM bytes (0 without HBM traffic).
* ``busiest`` is the resource with the highest active percent: an engine name or ``"dma"``.
  ``bound_by`` is the busiest resource when it is saturated (at least
  :data:`SATURATED_PERCENT` active), else ``"latency"``: no engine or DMA queue limits the
  kernel, which waits on dependencies and fixed latencies.

Every percentage is of the kernel's total time and 0 for an empty profile.

Summary keys: ``kernel``, ``target``, ``total_ns``, ``total_us``, ``instruction_count``;
FLOPs ``model_flops``, ``hardware_flops``, ``transpose_flops``, ``transpose_flops_percent``,
``matmul_dtype``, ``peak_flops_per_s``, ``mfu``/``hfu``/``mbu`` and their ``*_percent``;
bytes ``{hbm,sbuf,psum}_{read,write}_bytes``, ``hbm_bytes``, ``achieved_hbm_bytes_per_s``,
``mm_arithmetic_intensity``, ``reload_bytes``, ``useful_read_percent``, ``spill_bytes``;
activity ``engine_active_percent`` (dict over the five engines and ``"dma"``),
``{tensor,vector,scalar,gpsimd,sync}_active_percent``, ``dma_active_percent``,
``dma_queue_active_percent`` (dict per queue); counts ``instruction_count_by_engine``,
``{engine}_instruction_count``, ``matmul_instruction_count``,
``transpose_instruction_count``, ``dma_transfer_count``, ``dma_bytes``,
``dma_transfer_average_bytes``; ``busiest``, ``bound_by``; ``warnings`` (see :mod:`.rules`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .columns import Columns, union_ns
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


@dataclass(slots=True)
class Analysis:
    """Facts derived once from a Profile and shared by the summary, rules and outputs."""

    profile: Profile
    cols: Columns
    start_ns: float
    end_ns: float
    total_ns: float
    busy_ns: dict[str, float]
    active_percent: dict[str, float]

    def top_lines(self, engine: str, n: int = 3, mask: np.ndarray | None = None) -> list[str]:
        """Source lines with the most time on ``engine`` (``"dma"`` = all queues).

        With ``mask``, only the instructions it selects count.
        """
        m = self.cols.on(engine)
        if mask is not None:
            m = m & mask
        return list(self.cols.per_source(m, self.cols.dur))[:n]


def analyze(profile: Profile) -> Analysis:
    """Build the column view and the busy time of every engine, queue and all DMA."""
    cols = Columns.build(profile.instructions)
    start = float(cols.start.min()) if cols.n else 0.0
    end = float(cols.end.max()) if cols.n else 0.0
    total = end - start
    busy: dict[str, float] = {}
    for code, engine in enumerate(cols.engines):
        m = cols.engine == code
        busy[engine] = union_ns(cols.start[m], cols.end[m])
    dma = cols.on("dma")
    busy["dma"] = union_ns(cols.start[dma], cols.end[dma])

    def pct(ns: float) -> float:
        return 100.0 * ns / total if total > 0 else 0.0

    active = {e: pct(busy.get(e, 0.0)) for e in COMPUTE_ENGINES}
    active["dma"] = pct(busy["dma"])
    queues = {f"dma{q}" for q in range(profile.target.dma_queues)} | {
        e for e in cols.engines if is_dma_engine(e)
    }
    for q in sorted(queues, key=engine_sort_key):
        active[q] = pct(busy.get(q, 0.0))
    for e in cols.engines:  # engines outside the contract still get a number
        active.setdefault(e, pct(busy[e]))
    return Analysis(
        profile=profile,
        cols=cols,
        start_ns=start,
        end_ns=end,
        total_ns=total,
        busy_ns=busy,
        active_percent=active,
    )


def compute_summary(profile: Profile, analysis: Analysis | None = None) -> dict[str, Any]:
    """The summary dict of :attr:`Profile.summary`; see the module docstring for definitions."""
    from .rules import collect_warnings

    a = analysis or analyze(profile)
    c = a.cols
    total = a.total_ns
    target = profile.target

    # flops are TensorE work by contract; other engines' numbers would not be comparable
    # to the TensorE peak, so they are ignored.
    tensor = c.on("tensor")
    hw_flops = float(c.flops[tensor].sum())
    model_flops = float(c.model_flops[tensor].sum())
    transposes = c.transpose_mask()
    matmuls = c.matmul_mask()
    transpose_flops = float(c.flops[transposes].sum())

    # The dominant dtype sets the peak: a bf16 kernel with one fp32 matmul is a bf16 kernel.
    by_dtype = np.bincount(c.dtype[matmuls], weights=c.flops[matmuls], minlength=len(c.dtypes))
    by_class: Counter[str] = Counter()
    for code, f in enumerate(by_dtype):
        if f > 0:
            by_class[dtype_class(c.dtypes[code])] += float(f)
    matmul_dtype = by_class.most_common(1)[0][0] if by_class else "bf16"
    peak = target.peak_flops(matmul_dtype)

    sums = {k: int(c.ints[k].sum()) for k in _BYTE_KEYS}
    seconds = total * 1e-9
    compute_capacity = peak * seconds
    hbm_bytes = sums["hbm_read_bytes"] + sums["hbm_write_bytes"]
    hbm_capacity = target.hbm_bytes_per_s * seconds
    mfu = model_flops / compute_capacity if compute_capacity > 0 else 0.0
    hfu = hw_flops / compute_capacity if compute_capacity > 0 else 0.0
    mbu = hbm_bytes / hbm_capacity if hbm_capacity > 0 else 0.0

    dma = c.on("dma")
    n_dma = int(dma.sum())
    dma_bytes = int(c.transfer_bytes()[dma].sum())
    counts = {e: int(c.on(e).sum()) for e in COMPUTE_ENGINES}
    counts["dma"] = n_dma

    reload_bytes = sum(g["bytes"] for g in reload_groups(c).values())
    hbm_read = sums["hbm_read_bytes"]

    active = a.active_percent
    s: dict[str, Any] = {
        "kernel": profile.kernel,
        "target": target.name,
        "total_ns": total,
        "total_us": total / 1000.0,
        "instruction_count": c.n,
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
        **sums,
        "hbm_bytes": hbm_bytes,
        "achieved_hbm_bytes_per_s": hbm_bytes / seconds if seconds > 0 else 0.0,
        "mm_arithmetic_intensity": model_flops / hbm_bytes if hbm_bytes else 0.0,
        "engine_active_percent": {e: active[e] for e in (*COMPUTE_ENGINES, "dma")},
        **{f"{e}_active_percent": active[e] for e in COMPUTE_ENGINES},
        "dma_active_percent": active["dma"],
        "dma_queue_active_percent": {e: v for e, v in active.items() if is_dma_engine(e)},
        "instruction_count_by_engine": counts,
        **{f"{e}_instruction_count": counts[e] for e in COMPUTE_ENGINES},
        "matmul_instruction_count": int(matmuls.sum()),
        "transpose_instruction_count": int(transposes.sum()),
        "dma_transfer_count": n_dma,
        "dma_bytes": dma_bytes,
        "dma_transfer_average_bytes": dma_bytes / n_dma if n_dma else 0.0,
        "reload_bytes": reload_bytes,
        "useful_read_percent": 100.0 * (hbm_read - reload_bytes) / hbm_read if hbm_read else 100.0,
        "spill_bytes": profile.spill_bytes,
        "busiest": _busiest(active, c.n > 0),
        "bound_by": _bound_by(active, c.n > 0),
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


SATURATED_PERCENT = 80.0
"""An engine (or the DMA queues together) busier than this share of the kernel's time is what
the kernel waits on.  nkikit's own threshold, a judgment call: Neuron Explorer names no "bound
by" verdict (nki.md §6.2)."""
LATENCY = "latency"


def _busiest(active: dict[str, float], nonempty: bool) -> str | None:
    if not nonempty:
        return None
    candidates = (*COMPUTE_ENGINES, "dma")
    # max() keeps the first of equals, so ties go to the engine listed first (Tensor).
    return max(candidates, key=lambda e: active[e])


def _bound_by(active: dict[str, float], nonempty: bool) -> str | None:
    busiest = _busiest(active, nonempty)
    if busiest is None or active[busiest] >= SATURATED_PERCENT:
        return busiest
    return LATENCY


RELOAD_KEY_FIELDS = ("hbm_offset", "hbm_read_bytes", "partitions", "elements")
"""With the tensor name, what makes two HBM reads "the same data" for input reload."""


def reload_groups(c: Columns) -> dict[str, dict[str, Any]]:
    """Per tensor with a range read more than once: reloaded bytes, times, lines.

    Reloaded bytes count (n - 1) x size for each range read n > 1 times. Each entry has
    ``bytes``, ``times`` (most reads of one range), ``ranges`` (how many ranges were
    re-read), ``read`` (all HBM bytes read from the tensor) and ``lines`` (source line ->
    reads of re-read ranges, most first).
    """
    got = c.memo.get("reload_groups")
    if got is None:  # the summary and the input-reload warning both ask
        got = c.memo["reload_groups"] = _reload_groups(c)
    return got


def _reload_groups(c: Columns) -> dict[str, dict[str, Any]]:
    named = np.array([bool(t) for t in c.tensors], dtype=bool)
    m = named[c.tensor] & (c.ints["hbm_read_bytes"] > 0) if c.n else np.zeros(0, dtype=bool)
    rows = np.flatnonzero(m)
    if rows.size == 0:
        return {}
    # the distinct (tensor, offset, bytes, partitions, elements) rows, sorted as np.unique
    # sorts them, with one stable lexsort (np.unique(axis=0) sorts byte strings: 10x slower)
    keys = [c.tensor[rows], *(c.ints[f][rows] for f in RELOAD_KEY_FIELDS)]
    order = np.lexsort(keys[::-1])
    ordered = [k[order] for k in keys]
    first = np.zeros(rows.size, dtype=bool)
    first[0] = True
    for k in ordered:
        first[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(first)
    uniq = np.stack([k[starts] for k in ordered], axis=1)
    counts = np.diff(np.append(starts, rows.size))
    inverse = np.empty(rows.size, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    out: dict[str, dict[str, Any]] = {}
    for t in np.unique(uniq[:, 0]):
        mine = uniq[:, 0] == t
        sizes, n = uniq[mine, 2], counts[mine]
        again = int(((n - 1) * sizes).sum())
        if again == 0:
            continue
        in_repeat = (counts[inverse] > 1) & (uniq[inverse, 0] == t)
        sel = np.zeros(c.n, dtype=bool)
        sel[rows[in_repeat]] = True
        out[c.tensors[int(t)]] = {
            "bytes": again,
            "times": int(n.max()),
            "ranges": int((n > 1).sum()),
            "read": int((sizes * n).sum()),
            "lines": {k: int(v) for k, v in c.per_source(sel).items()},
        }
    return out


def per_line(profile: Profile, analysis: Analysis | None = None) -> list[LineStat]:
    """One :class:`LineStat` per source line, hottest first (ties by line name)."""
    a = analysis or analyze(profile)
    c = a.cols
    if c.n == 0:
        return []
    n_eng = len(c.engines)
    grid = np.bincount(c.source * n_eng + c.engine, weights=c.dur, minlength=len(c.sources) * n_eng)
    grid = grid.reshape(len(c.sources), n_eng)
    counts = np.bincount(c.source, minlength=len(c.sources))
    grand = float(grid.sum())
    eng_order = sorted(range(n_eng), key=lambda k: engine_sort_key(c.engines[k]))
    stats = []
    for k, src in enumerate(c.sources):
        t = float(grid[k].sum())
        stats.append(
            LineStat(
                source=src,
                code=c.source_text[k],
                time_ns=t,
                share=t / grand if grand > 0 else 0.0,
                count=int(counts[k]),
                engines={
                    c.engines[e]: float(grid[k, e])
                    for e in eng_order
                    if counts[k] and grid[k, e] > 0
                },
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
        if not (
            i.engine in COMPUTE_ENGINES or (is_dma_engine(i.engine) and int(i.engine[3:]) < nq)
        ):
            problems.append(f"{where}: unknown engine {i.engine!r}")
        if not (math.isfinite(i.start_ns) and math.isfinite(i.end_ns)):
            problems.append(f"{where}: times must be finite, got {i.start_ns}..{i.end_ns}")
        elif i.end_ns < i.start_ns:
            problems.append(f"{where}: ends ({i.end_ns}) before it starts ({i.start_ns})")
        for name in _BYTE_KEYS:
            if getattr(i, name) < 0:
                problems.append(f"{where}: negative {name}")
        if i.flops < 0 or i.model_flops < 0 or i.model_flops > i.flops * (1 + 1e-9):
            problems.append(
                f"{where}: need 0 <= model_flops <= flops, got {i.model_flops} / {i.flops}"
            )
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
