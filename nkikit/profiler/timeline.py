"""Timeline data for the HTML report: per-track instruction lists, or time bins when large.

A browser draws tens of thousands of rectangles per frame comfortably, not hundreds of
thousands, and the page embeds its data, so above ``max_events`` instructions every track
is cut into at most ``bins`` equal time bins. A bin keeps how busy the track was in it
(0..1, the union of its instructions' intervals) and which opcode and source line
overlapped it longest; adjacent instructions inside a bin merge into one bar.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .colours import opcode_colour
from .columns import merge_intervals
from .model import COMPUTE_ENGINES, engine_label, engine_sort_key

if TYPE_CHECKING:
    from .model import Profile

DEFAULT_MAX_EVENTS = 20_000
DEFAULT_BINS = 2_000
_MAX_PIECES = 5_000_000
"""Cap on (instruction, bin) pieces for dominance; past it, an instruction counts whole
in the bin of its midpoint (only reachable with many instructions spanning many bins)."""


def build_timeline(
    profile: Profile, *, max_events: int = DEFAULT_MAX_EVENTS, bins: int = DEFAULT_BINS
) -> dict[str, Any]:
    """JSON-ready timeline, times in ns from the kernel start.

    Keys: ``total_ns``, ``aggregated``, ``bins`` and ``bin_ns`` (0 unless aggregated),
    ``instruction_count``, ``opcodes`` and ``lines`` (string tables, most time first, that
    tracks index into), ``colours`` (per opcode, from :func:`.colours.opcode_colour`: the same
    in every report), ``code`` (source text per line), and ``tracks``: one per compute
    engine and per used DMA queue, each with ``engine``, ``label``, ``count`` and either
    raw columns ``s`` (start), ``d`` (duration), ``o`` (opcode index), ``l`` (line index),
    ``id``, or sparse bin columns ``i`` (bin index), ``b`` (busy fraction), ``o``, ``l``.
    """
    c = profile.analysis().cols
    origin = profile.start_ns
    total = profile.total_ns
    aggregated = c.n > max_events and total > 0

    # Re-rank the string tables by time so the legend lists what matters first.
    op_rank = _rank(c.opcode, c.dur, c.opcodes)
    line_rank = _rank(c.source, c.dur, c.sources)
    opcodes = [c.opcodes[k] for k in np.argsort(op_rank)] if c.n else []
    lines = [c.sources[k] for k in np.argsort(line_rank)] if c.n else []
    code_of = dict(zip(c.sources, c.source_text))
    op = op_rank[c.opcode] if c.n else c.opcode
    line = line_rank[c.source] if c.n else c.source

    engines = sorted(set(COMPUTE_ENGINES) | set(c.engines), key=engine_sort_key)
    nbins = max(1, bins)
    width = total / nbins if aggregated else 0.0
    tracks = []
    for e in engines:
        rows = np.flatnonzero(c.on(e))
        rows = rows[np.lexsort((c.end[rows], c.start[rows]))]
        track: dict[str, Any] = {"engine": e, "label": engine_label(e), "count": int(rows.size)}
        s = c.start[rows] - origin
        d = c.dur[rows]
        if aggregated:
            track.update(_binned(s, d, op[rows], line[rows], width, nbins))
        else:
            track["s"] = np.round(s, 3).tolist()
            track["d"] = np.round(d, 3).tolist()
            track["o"] = op[rows].tolist()
            track["l"] = line[rows].tolist()
            track["id"] = c.ints["id"][rows].tolist()
        tracks.append(track)
    return {
        "total_ns": total,
        "aggregated": aggregated,
        "bins": nbins if aggregated else 0,
        "bin_ns": width,
        "instruction_count": c.n,
        "opcodes": opcodes,
        "colours": [opcode_colour(o) for o in opcodes],
        "lines": lines,
        "code": [code_of.get(src, "") for src in lines],
        "tracks": tracks,
    }


def _rank(codes: np.ndarray, dur: np.ndarray, table: list[str]) -> np.ndarray:
    """New index per code: 0 for the code with the most time, ties by name."""
    if not table:
        return np.zeros(0, dtype=np.int64)
    time = np.bincount(codes, weights=dur, minlength=len(table))
    order = sorted(range(len(table)), key=lambda k: (-time[k], table[k]))
    rank = np.empty(len(table), dtype=np.int64)
    rank[order] = np.arange(len(table))
    return rank


def busy_per_bin(start: np.ndarray, end: np.ndarray, width: float, n: int) -> np.ndarray:
    """Busy time (union of ``[start, end)``) inside each of ``n`` bins of ``width``."""
    gs, ge = merge_intervals(start, end)
    if gs.size == 0:
        return np.zeros(n)
    done = np.concatenate([[0.0], np.cumsum(ge - gs)])  # busy time before each group
    edges = np.arange(n + 1) * width

    # covered(t): busy time in [0, t), from the last group starting at or before t
    k = np.searchsorted(gs, edges, side="right") - 1
    kk = np.clip(k, 0, None)
    covered = np.where(k >= 0, done[kk] + np.clip(edges - gs[kk], 0.0, ge[kk] - gs[kk]), 0.0)
    # the last bin also owns anything ending exactly at or rounding past its edge
    covered[-1] = done[-1]
    return np.diff(covered)


def _dominant(
    start: np.ndarray, dur: np.ndarray, what: np.ndarray, width: float, n: int
) -> np.ndarray:
    """Per bin, the value of ``what`` with the longest overlap (-1 for an empty bin)."""
    end = start + dur
    b0 = np.clip((start / width).astype(np.int64), 0, n - 1)
    b1 = np.clip((end / width).astype(np.int64), 0, n - 1)
    span = b1 - b0 + 1
    if int(span.sum()) <= _MAX_PIECES:
        piece = np.repeat(np.arange(start.size), span)
        offset = np.arange(piece.size) - np.repeat(np.cumsum(span) - span, span)
        b = b0[piece] + offset
        lo = np.maximum(start[piece], b * width)
        hi = np.minimum(end[piece], (b + 1) * width)
        weight = np.maximum(hi - lo, 0.0)
        # zero-length instructions still mark their bin, just with the least weight
        weight = np.where(dur[piece] == 0, 1e-12, weight)
        val = what[piece]
    else:
        b = np.clip(((start + end) / 2 / width).astype(np.int64), 0, n - 1)
        weight, val = np.maximum(dur, 1e-12), what
    key = b * (int(what.max()) + 1) + val
    uniq, inverse = np.unique(key, return_inverse=True)
    w = np.bincount(inverse.reshape(-1), weights=weight)
    ubin, uval = uniq // (int(what.max()) + 1), uniq % (int(what.max()) + 1)
    order = np.lexsort((w, ubin))  # within a bin, heaviest last
    last = np.append(ubin[order][1:] != ubin[order][:-1], True)
    out = np.full(n, -1, dtype=np.int64)
    out[ubin[order][last]] = uval[order][last]
    return out


def _binned(
    s: np.ndarray, d: np.ndarray, op: np.ndarray, line: np.ndarray, width: float, n: int
) -> dict[str, list[Any]]:
    if s.size == 0:
        return {"i": [], "b": [], "o": [], "l": []}
    frac = np.minimum(busy_per_bin(s, s + d, width, n) / width, 1.0)
    dom_op = _dominant(s, d, op, width, n)
    dom_line = _dominant(s, d, line, width, n)
    keep = np.flatnonzero((frac > 0) & (dom_op >= 0))
    # Three decimals is below what a bar of ~20 px can show and keeps the page small; the
    # floor keeps a barely busy bin visible.
    frac = np.maximum(np.round(frac, 3), 0.001)
    return {
        "i": keep.tolist(),
        "b": frac[keep].tolist(),
        "o": dom_op[keep].tolist(),
        "l": dom_line[keep].tolist(),
    }
