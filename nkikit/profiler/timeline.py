"""Timeline data for the HTML report: per-track instruction lists, or time bins when large.

A browser draws tens of thousands of rectangles per frame comfortably, not hundreds of
thousands, and the page embeds its data, so above ``max_events`` instructions every track
is cut into at most ``bins`` equal time bins. A bin keeps how busy the track was in it
(0..1, the union of its instructions' intervals) and which opcode and source line took
most of that time; adjacent instructions inside a bin merge into one bar.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from .model import COMPUTE_ENGINES, Instruction, engine_label, engine_sort_key
from .metrics import merge_intervals

if TYPE_CHECKING:
    from .model import Profile

DEFAULT_MAX_EVENTS = 20_000
DEFAULT_BINS = 2_000


def build_timeline(
    profile: Profile, *, max_events: int = DEFAULT_MAX_EVENTS, bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """JSON-ready timeline, times in ns from the kernel start.

    Keys: ``total_ns``, ``aggregated``, ``bin_ns`` (0 unless aggregated), ``opcodes`` and
    ``lines`` (string tables, hottest first, indexed by the tracks), ``code`` (source text
    per line), ``tracks``: one per compute engine and per used DMA queue, each with
    ``engine``, ``label``, ``count`` and either raw columns ``s`` (start), ``d``
    (duration), ``o`` (opcode index), ``l`` (line index), ``id``, or sparse bin columns ``i``
    (bin index), ``b`` (busy fraction), ``o``, ``l``.
    """
    ins = profile.instructions
    origin = profile.start_ns
    total = profile.total_ns
    aggregated = len(ins) > max_events and total > 0

    op_time: Counter[str] = Counter()
    line_time: Counter[str] = Counter()
    code: dict[str, str] = {}
    by_engine: dict[str, list[Instruction]] = defaultdict(list)
    for i in ins:
        op_time[i.opcode] += i.duration_ns
        src = i.source or "<unknown>"
        line_time[src] += i.duration_ns
        if i.source_text and src not in code:
            code[src] = i.source_text
        by_engine[i.engine].append(i)
    opcodes = [op for op, _ in sorted(op_time.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines = [src for src, _ in sorted(line_time.items(), key=lambda kv: (-kv[1], kv[0]))]
    op_index = {op: k for k, op in enumerate(opcodes)}
    line_index = {src: k for k, src in enumerate(lines)}

    engines = sorted(set(COMPUTE_ENGINES) | set(by_engine), key=engine_sort_key)
    nbins = max(1, bins)
    bin_ns = total / nbins if aggregated else 0.0
    tracks = []
    for e in engines:
        lst = sorted(by_engine.get(e, []), key=lambda i: (i.start_ns, i.end_ns))
        track: dict[str, Any] = {"engine": e, "label": engine_label(e), "count": len(lst)}
        if aggregated:
            track.update(_binned(lst, origin, bin_ns, nbins, op_index, line_index))
        else:
            track["s"] = [round(i.start_ns - origin, 3) for i in lst]
            track["d"] = [round(i.end_ns - i.start_ns, 3) for i in lst]
            track["o"] = [op_index[i.opcode] for i in lst]
            track["l"] = [line_index[i.source or "<unknown>"] for i in lst]
            track["id"] = [i.id for i in lst]
        tracks.append(track)
    return {
        "total_ns": total,
        "aggregated": aggregated,
        "bins": nbins if aggregated else 0,
        "bin_ns": bin_ns,
        "instruction_count": len(ins),
        "opcodes": opcodes,
        "lines": lines,
        "code": [code.get(src, "") for src in lines],
        "tracks": tracks,
    }


def _spread(acc: list[float], s: float, e: float, width: float, n: int) -> None:
    """Add the overlap of [s, e) with each bin of ``width`` to ``acc``."""
    b0 = min(int(s / width), n - 1)
    b1 = min(int(e / width), n - 1)
    if b0 == b1:
        acc[b0] += e - s
        return
    acc[b0] += (b0 + 1) * width - s
    for b in range(b0 + 1, b1):
        acc[b] += width
    acc[b1] += e - b1 * width


def _binned(
    lst: list[Instruction],
    origin: float,
    width: float,
    n: int,
    op_index: dict[str, int],
    line_index: dict[str, int],
) -> dict[str, list[Any]]:
    busy = [0.0] * n
    for s, e in merge_intervals([(i.start_ns - origin, i.end_ns - origin) for i in lst]):
        _spread(busy, s, e, width, n)
    # Dominance is a display hint, so each instruction counts in the bin of its midpoint.
    op_in_bin: dict[int, Counter[int]] = defaultdict(Counter)
    line_in_bin: dict[int, Counter[int]] = defaultdict(Counter)
    for i in lst:
        b = min(int(((i.start_ns + i.end_ns) / 2 - origin) / width), n - 1)
        d = i.end_ns - i.start_ns
        op_in_bin[b][op_index[i.opcode]] += d
        line_in_bin[b][line_index[i.source or "<unknown>"]] += d
    out: dict[str, list[Any]] = {"i": [], "b": [], "o": [], "l": []}
    last_op = last_line = 0
    for b in range(n):
        frac = busy[b] / width
        if frac <= 0:
            continue
        # A long instruction covers bins without its midpoint: they inherit the last owner.
        if b in op_in_bin:
            last_op = op_in_bin[b].most_common(1)[0][0]
            last_line = line_in_bin[b].most_common(1)[0][0]
        out["i"].append(b)
        out["b"].append(round(min(frac, 1.0), 3))
        out["o"].append(last_op)
        out["l"].append(last_line)
    return out
