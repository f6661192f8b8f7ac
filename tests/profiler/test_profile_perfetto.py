"""Perfetto / Chrome trace-event export, checked by a structural validator of the format.

The validator follows the Trace Event Format document (JSON object form): a
``traceEvents`` list; every event has a string ``ph``; complete events ("X") need name,
numeric ts >= 0 and dur >= 0, integer pid/tid; metadata events ("M") name a process or
thread; flow events ("s"/"t"/"f") carry an id and bind to a slice on their track.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nkikit.profiler import Profile
from nkikit.profiler import perfetto as perfetto_mod
from nkikit.profiler.perfetto import trace_events

PHASES = set("BEXIiCbnesMPOND") | {"s", "t", "f", "R", "c", "(", ")"}
METADATA = {
    "process_name",
    "process_labels",
    "process_sort_index",
    "thread_name",
    "thread_sort_index",
}


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate_trace(doc: Any) -> list[str]:
    """Problems with ``doc`` as a trace-event JSON object; empty when valid."""
    errors: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        errors.append("displayTimeUnit must be 'ms' or 'ns'")
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    named_threads: set[tuple[int, int]] = set()
    flows: dict[Any, set[str]] = defaultdict(set)
    flow_points: list[tuple[dict, tuple[int, int]]] = []
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
            if e.get("name") not in METADATA:
                errors.append(f"{where}: unknown metadata {e.get('name')!r}")
            args = e.get("args", {})
            if e.get("name", "").endswith("_name") and not isinstance(args.get("name"), str):
                errors.append(f"{where}: metadata name needs args.name string")
            if e.get("name", "").endswith("sort_index") and not isinstance(
                args.get("sort_index"), int
            ):
                errors.append(f"{where}: sort_index must be an integer")
            if e.get("name") == "thread_name":
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
            slices[track].append((e["ts"], e["ts"] + e["dur"]))
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
        starts = [s for s, _ in lst]
        if starts != sorted(starts):
            errors.append(f"track {track}: complete events are not in time order")
    for fid, phs in flows.items():
        if phs != {"s", "f"} and phs != {"s", "t", "f"}:
            errors.append(f"flow {fid}: needs a start and an end, has {sorted(phs)}")
    for e, track in flow_points:
        if not any(s <= e["ts"] <= end for s, end in slices[track]):
            errors.append(
                f"flow {e.get('id')} ({e['ph']}): no slice on {track} encloses ts {e['ts']}"
            )
    return errors


def test_validator_catches_mistakes() -> None:
    bad = {
        "traceEvents": [
            {"ph": "X", "name": "a", "ts": 5, "dur": -1, "pid": 1, "tid": 1},
            {"ph": "Q", "name": "b"},
            {"ph": "X", "name": "c", "ts": 3, "dur": 1, "pid": 1, "tid": 2},
            {"ph": "X", "name": "d", "ts": 1, "dur": 1, "pid": 1, "tid": 2},
            {"ph": "s", "name": "f", "ts": 1, "pid": 1, "tid": 2, "id": 9},
        ]
    }
    text = "\n".join(validate_trace(bad))
    for part in ("dur must be", "bad ph", "unnamed thread", "not in time order", "flow 9"):
        assert part in text


def test_trace_is_valid(paper_profile: Profile, tmp_path: Path) -> None:
    path = paper_profile.to_perfetto(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    assert validate_trace(doc) == []
    json.dumps(doc, allow_nan=False)


def test_tracks_are_named_and_ordered(paper_profile: Profile) -> None:
    doc = trace_events(paper_profile)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = [e for e in meta if e["name"] == "process_name"]
    assert len(procs) == 1 and "NeuronCore" in procs[0]["args"]["name"]
    names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    order = {e["tid"]: e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    by_order = [names[t] for t in sorted(names, key=order.__getitem__)]
    assert by_order == ["Tensor", "Vector", "Scalar", "DMA q0", "DMA q1", "DMA q2"]


def test_complete_events_carry_instructions(paper_profile: Profile) -> None:
    doc = trace_events(paper_profile)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(paper_profile.instructions)
    names = {
        e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"
    }
    mm = next(e for e in xs if e["name"] == "MATMUL")
    assert names[mm["tid"]] == "Tensor"
    assert mm["ts"] == pytest.approx(0.150) and mm["dur"] == pytest.approx(0.100)
    assert mm["args"]["source"] == "k.py:12"
    assert mm["args"]["code"] == "c = nisa.nc_matmul(a_t, b_t)"
    assert mm["args"]["flops"] == 100_000
    assert mm["args"]["deps"] == [0, 1]
    ld = next(e for e in xs if e["args"]["id"] == 1)
    assert ld["args"]["hbm_read_bytes"] == 8192 and ld["args"]["tensor"] == "b"
    assert ld["cat"] == "dma"
    assert doc["otherData"]["mfu_percent"] == pytest.approx(25.0)
    assert doc["displayTimeUnit"] == "ns"


def test_flows_follow_cross_engine_dependencies(paper_profile: Profile) -> None:
    doc = trace_events(paper_profile, flows=True)
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f"]
    # cross-engine deps: 2<-0, 2<-1, 4<-3, 5<-3, 6<-4, 6<-5 (3<-2 is on the same engine)
    assert len(starts) == len(ends) == 6
    assert validate_trace(doc) == []
    assert not [
        e for e in trace_events(paper_profile, flows=False)["traceEvents"] if e["ph"] in "sf"
    ]


def test_flows_auto_off_for_large_profiles(paper_profile: Profile, monkeypatch) -> None:
    monkeypatch.setattr(perfetto_mod, "FLOWS_AUTO_LIMIT", 3)
    assert not [e for e in trace_events(paper_profile)["traceEvents"] if e["ph"] in "sf"]


def test_unsorted_input_gives_monotonic_tracks(make_profile) -> None:
    p = make_profile([("vector", "B", 50, 60), ("vector", "A", 0, 10), ("dma3", "DMA_LOAD", 5, 9)])
    doc = trace_events(p)
    assert validate_trace(doc) == []


def test_empty_profile_trace(paper_target) -> None:
    doc = trace_events(Profile("empty", paper_target, []))
    assert validate_trace(doc) == []
