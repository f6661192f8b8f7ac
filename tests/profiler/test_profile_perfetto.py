"""Perfetto / Chrome trace-event export, checked by the package's structural validator of the
format (:mod:`nkikit.profiler.tracecheck`: format, time order, nesting, flows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nkikit.profiler import Profile
from nkikit.profiler import perfetto as perfetto_mod
from nkikit.profiler.perfetto import trace_events
from nkikit.profiler.tracecheck import trace_problems as validate_trace


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


def test_validator_catches_partial_overlap() -> None:
    doc = {
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "q"}},
            {"ph": "X", "name": "outer", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
            {"ph": "X", "name": "inner", "ts": 2, "dur": 3, "pid": 1, "tid": 1},
            {"ph": "X", "name": "across", "ts": 8, "dur": 5, "pid": 1, "tid": 1},
        ]
    }
    problems = validate_trace(doc)
    assert len(problems) == 1 and "'across'" in problems[0] and "'outer'" in problems[0]


def test_overlapping_dma_transfers_get_sub_tracks(make_profile) -> None:
    # three transfers in flight at once on queue 3, then one after they all ended
    p = make_profile(
        [
            ("dma3", "DMA_LOAD", 0, 100),
            ("dma3", "DMA_LOAD", 50, 150),
            ("dma3", "DMA_LOAD", 60, 70),
            ("dma3", "DMA_LOAD", 160, 200),
        ]
    )
    doc = trace_events(p)
    assert validate_trace(doc) == []
    names = {
        e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"
    }
    assert sorted(names.values()) == ["DMA q3", "DMA q3 · 2", "DMA q3 · 3"]
    lane = {e["args"]["id"]: names[e["tid"]] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert lane == {0: "DMA q3", 1: "DMA q3 · 2", 2: "DMA q3 · 3", 3: "DMA q3"}


def test_writer_checks_traces_in_tests(make_profile, tmp_path: Path) -> None:
    # tests/conftest.py turns the check on: a bad document is refused before it is written
    from nkikit.profiler.perfetto import write_trace

    bad = {"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}
    with pytest.raises(ValueError, match="unnamed thread"):
        write_trace(bad, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


def test_gzip_trace(paper_profile: Profile, tmp_path: Path) -> None:
    import gzip

    path = paper_profile.to_perfetto(tmp_path / "trace.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert validate_trace(doc) == [] and doc == trace_events(paper_profile)


def test_dependency_arrows_land_inside_the_slices_as_written():
    # slice edges are written rounded to the nanosecond: an arrow end 5% into an instruction of
    # a few nanoseconds (a 4-byte DMA: 1616.38 -> 1619.38 ns) landed past the rounded edge
    from nkikit.profiler.perfetto import _inside, us_span

    for k in range(2000):
        start = 1000.0 + k * 0.37
        for length in (0.0, 0.4, 1.0, 3.0, 7.3, 12.0, 250.0):
            ts, dur = us_span(start, start + length)
            for at in (0.05, 0.95):
                assert ts <= _inside((ts, dur), at) <= round(ts + dur, 3)
