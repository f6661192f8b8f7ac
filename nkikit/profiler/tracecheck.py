"""A checker for the Chrome trace-event JSON that nkikit writes (what ui.perfetto.dev reads).

It follows the Trace Event Format document (JSON object form): a ``traceEvents`` list; every
event has a string ``ph``; complete events (``"X"``) need a name, a numeric ``ts >= 0`` and
``dur >= 0`` and integer pid/tid on a named thread; metadata events (``"M"``) name a process or
thread; flow events (``"s"``/``"t"``/``"f"``) carry an id and bind to a slice on their track.

On top of the format it checks what the viewers need to show every slice: on one track,
complete events are in time order and two slices are either disjoint or one holds the other
(ui.perfetto.dev drops or truncates a slice that partially overlaps its neighbour). Async
events (``"b"``/``"e"``) are exempt: each id is its own lane.

Every trace writer in nkikit calls :func:`check_if_asked` before writing, so the test suite
(which sets ``NKIKIT_CHECK_TRACES=1`` in ``tests/conftest.py``) checks every trace the tests
write.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
from collections import defaultdict
from typing import Any

PHASES = set("BEXIiCbnesMPOND") | {"s", "t", "f", "R", "c", "(", ")"}
METADATA = {
    "process_name",
    "process_labels",
    "process_sort_index",
    "thread_name",
    "thread_sort_index",
}
EPS_US = 1e-6
"""Slack for float rounding when comparing slice ends (a picosecond)."""
ENV = "NKIKIT_CHECK_TRACES"


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def trace_problems(doc: Any, *, limit: int = 50) -> list[str]:
    """Problems with ``doc`` as a trace-event JSON object (at most ``limit``); empty when valid."""
    errors: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        errors.append("displayTimeUnit must be 'ms' or 'ns'")
    slices: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    named_threads: set[tuple[Any, Any]] = set()
    flows: dict[Any, set[str]] = defaultdict(set)
    flow_points: list[tuple[dict, tuple[Any, Any]]] = []
    for k, e in enumerate(doc["traceEvents"]):
        where = f"event {k}"
        if not isinstance(e, dict):
            errors.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if not isinstance(ph, str) or ph not in PHASES:
            errors.append(f"{where}: bad ph {ph!r}")
            continue
        for key in ("pid", "tid"):
            if key in e and not (isinstance(e[key], int) and not isinstance(e[key], bool)):
                errors.append(f"{where}: {key} must be an integer")
        if "args" in e and not isinstance(e["args"], dict):
            errors.append(f"{where}: args must be an object")
        track = (e.get("pid"), e.get("tid"))
        if ph == "M":
            name = e.get("name", "")
            if name not in METADATA:
                errors.append(f"{where}: unknown metadata {name!r}")
            args = e.get("args", {})
            if name.endswith("_name") and not isinstance(args.get("name"), str):
                errors.append(f"{where}: metadata name needs args.name string")
            if name.endswith("sort_index") and not isinstance(args.get("sort_index"), int):
                errors.append(f"{where}: sort_index must be an integer")
            if name == "thread_name":
                named_threads.add(track)
            continue
        if not isinstance(e.get("name"), str):
            errors.append(f"{where}: name must be a string")
        if not _is_num(e.get("ts")) or e["ts"] < 0:
            errors.append(f"{where}: ts must be a number >= 0")
            continue
        if ph == "X":
            if not _is_num(e.get("dur")) or e["dur"] < 0:
                errors.append(f"{where}: dur must be a number >= 0")
                continue
            if "pid" not in e or "tid" not in e:
                errors.append(f"{where}: X needs pid and tid")
            slices[track].append((e["ts"], e["ts"] + e["dur"], str(e.get("name"))))
        elif ph in ("s", "t", "f"):
            if "id" not in e:
                errors.append(f"{where}: flow event needs an id")
            if ph == "f" and e.get("bp", "e") != "e":
                errors.append(f"{where}: flow end bp must be 'e'")
            flows[e.get("id")].add(ph)
            flow_points.append((e, track))
    for track, lst in slices.items():
        if track not in named_threads:
            errors.append(f"track {track}: complete events on an unnamed thread")
        starts = [s for s, _, _ in lst]
        if starts != sorted(starts):
            errors.append(f"track {track}: complete events are not in time order")
        errors.extend(nesting_problems(track, lst))
    for fid, phs in flows.items():
        if phs != {"s", "f"} and phs != {"s", "t", "f"}:
            errors.append(f"flow {fid}: needs a start and an end, has {sorted(phs)}")
    index = {track: _EnclosingIndex(lst) for track, lst in slices.items()}
    empty = _EnclosingIndex([])
    for e, track in flow_points:
        if not index.get(track, empty).encloses(e["ts"]):
            errors.append(
                f"flow {e.get('id')} ({e['ph']}): no slice on {track} encloses ts {e['ts']}"
            )
    return errors[:limit]


def nesting_problems(track: Any, lst: list[tuple[float, float, str]]) -> list[str]:
    """Slices of one track that partially overlap another (neither disjoint nor nested)."""
    out: list[str] = []
    stack: list[tuple[float, float, str]] = []
    for s, e, name in sorted(lst, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1][1] <= s + EPS_US:
            stack.pop()
        if stack and e > stack[-1][1] + EPS_US:
            ps, pe, pname = stack[-1]
            out.append(
                f"track {track}: {name!r} [{s}, {e}] partially overlaps {pname!r} [{ps}, {pe}]"
            )
            continue
        stack.append((s, e, name))
    return out


class _EnclosingIndex:
    """Answers "does a slice of this track hold time t" in log time: sorted starts and the
    running maximum of the ends."""

    def __init__(self, lst: list[tuple[float, float, str]]) -> None:
        ordered = sorted(lst)
        self.starts = [s for s, _, _ in ordered]
        self.max_end = list(itertools.accumulate((e for _, e, _ in ordered), max))

    def encloses(self, ts: float) -> bool:
        k = bisect.bisect_right(self.starts, ts + EPS_US) - 1
        return k >= 0 and self.max_end[k] >= ts - EPS_US


def check_if_asked(doc: dict[str, Any], what: str) -> None:
    """Raise ValueError listing :func:`trace_problems` when ``NKIKIT_CHECK_TRACES`` is set."""
    if not os.environ.get(ENV):
        return
    problems = trace_problems(doc)
    if problems:
        raise ValueError(f"{what}: invalid trace:\n  " + "\n  ".join(problems[:20]))
