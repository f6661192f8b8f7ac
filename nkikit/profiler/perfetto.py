"""Chrome trace-event JSON export, readable by ui.perfetto.dev and chrome://tracing.

Layout: one process (the NeuronCore), one thread per engine and per DMA queue, ordered
Tensor, Vector, Scalar, GpSimd, Sync, then DMA queues; a queue with transfers in flight at
once gets sub-tracks (``DMA q3 · 2``) so that slices on a track never partially overlap.
Every instruction is a complete event (``"ph": "X"``) with ``ts``/``dur`` in microseconds;
dependencies become flow events (``"s"``/``"f"``) from the end of the producer to the start
of the consumer.
"""

from __future__ import annotations

import gzip
import json
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import engine_label, engine_sort_key, is_dma_engine
from .tracecheck import check_if_asked

if TYPE_CHECKING:
    from .model import Profile

PID = 1
_BYTE_FIELDS = (
    "hbm_read_bytes",
    "hbm_write_bytes",
    "sbuf_read_bytes",
    "sbuf_write_bytes",
    "psum_read_bytes",
    "psum_write_bytes",
)
FLOWS_AUTO_LIMIT = 50_000
"""Above this many instructions, flows are left out unless asked for: they double the file."""


def trace_events(profile: Profile, *, flows: bool | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], ...}``.

    ``flows=None`` includes dependency arrows for profiles of up to
    :data:`FLOWS_AUTO_LIMIT` instructions.
    """
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": PID,
            "tid": 0,
            "args": {"name": f"NeuronCore ({profile.target.name}) · {profile.kernel}"},
        },
        {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "args": {"sort_index": 0}},
    ]
    events += instruction_events(profile, pid=PID, flows=flows)
    s = profile.summary
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "kernel": profile.kernel,
            "target": profile.target.name,
            "total_us": s["total_us"],
            "mfu_percent": s["mfu_percent"],
            "hfu_percent": s["hfu_percent"],
            "mbu_percent": s["mbu_percent"],
            "bound_by": s["bound_by"],
        },
    }


def instruction_events(
    profile: Profile,
    *,
    pid: int,
    offset_ns: float = 0.0,
    first_tid: int = 1,
    flows: bool | None = None,
    tids: dict[tuple[str, int], int] | None = None,
) -> list[dict[str, Any]]:
    """Thread metadata, one complete event per instruction and (optionally) dependency flows
    for ``profile`` inside process ``pid``, times shifted by ``offset_ns``.

    One track per engine; a DMA queue whose transfers overlap in time (queues run several at
    once) gets as many sub-tracks ``DMA q3 · 2``, ``· 3`` as it has transfers in flight, each
    transfer on the first free one, so no track holds partially overlapping slices (which
    ui.perfetto.dev would drop or truncate).

    ``tids`` maps ``(engine, lane)`` to a thread id; pass the same dict for several kernels of
    one NeuronCore (one after another in time) to put them on the same tracks: new tracks are
    numbered from ``first_tid`` on and added to it."""
    if flows is None:
        flows = len(profile.instructions) <= FLOWS_AUTO_LIMIT
    c = profile.analysis().cols
    engines = sorted(c.engines, key=engine_sort_key) if c.n else []
    rank = {e: k for k, e in enumerate(engines)}
    # Sorting by engine then time keeps every track's events monotonic, which trace viewers
    # need to nest complete events correctly.
    track_of_code = np.array([rank[e] for e in c.engines], dtype=np.int64)
    order = (
        np.lexsort((c.ints["id"], -c.end, c.start, track_of_code[c.engine])).tolist() if c.n else []
    )
    instructions = profile.instructions
    lane_of, lanes_of_engine = _lanes(instructions, order)
    tid: dict[tuple[str, int], int] = {} if tids is None else tids
    events: list[dict[str, Any]] = []
    for e in engines:
        for lane in range(lanes_of_engine[e]):
            if (e, lane) in tid:
                continue
            t = tid[e, lane] = first_tid + len(tid)
            label = engine_label(e) + (f" · {lane + 1}" if lane else "")
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": label}}
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": t,
                    "args": {"sort_index": t},
                }
            )
    cat = {e: ("dma" if is_dma_engine(e) else e) for e in engines}
    byte_values = attrgetter(*_BYTE_FIELDS)
    append = events.append
    tid_of_id: dict[int, int] = {}
    span_of: dict[int, tuple[float, float]] = {}
    for k in order:
        i = instructions[k]
        # the opcode is the slice's name already: not repeated in args (it was 4% of a file)
        args: dict[str, Any] = {"id": i.id, "source": i.source}
        if i.source_text:
            args["code"] = i.source_text
        if i.operands:
            args["operands"] = i.operands
        if i.flops:
            args["flops"] = i.flops
            args["model_flops"] = i.model_flops
        for name, v in zip(_BYTE_FIELDS, byte_values(i)):
            if v:
                args[name] = v
        if i.partitions:
            args["partitions"] = i.partitions
            args["elements"] = i.elements
        if i.dtype:
            args["dtype"] = i.dtype
        if i.tensor_name:
            args["tensor"] = i.tensor_name
            args["hbm_offset"] = i.hbm_offset
        if i.deps:
            args["deps"] = list(i.deps)
        t = tid_of_id[i.id] = tid[i.engine, lane_of[k]]
        ts, dur = us_span(i.start_ns + offset_ns, max(i.end_ns, i.start_ns) + offset_ns)
        if flows:  # the slices as written, which the arrows' ends must land inside
            span_of[i.id] = ts, dur
        append(
            {
                "name": i.opcode,
                "cat": cat[i.engine],
                "ph": "X",
                "ts": ts,
                "dur": dur,
                "pid": pid,
                "tid": t,
                "args": args,
            }
        )
    if flows:
        events.extend(_flow_events(profile, tid_of_id, span_of, pid))
    return events


def us_span(start_ns: float, end_ns: float) -> tuple[float, float]:
    """``(ts, dur)`` in microseconds rounded to the nanosecond.  Both ends are rounded (not the
    duration), so slices that touch or nest before rounding still do after it; three decimals
    also keep the file small."""
    ts = round(start_ns / 1000.0, 3)
    return ts, round(round(end_ns / 1000.0, 3) - ts, 3)


def _lanes(instructions: list, order: list[int]) -> tuple[dict[int, int], dict[str, int]]:
    """Per instruction (index into ``instructions``), its lane on its engine's track, and the
    number of lanes per engine.  ``order`` is sorted by engine, then start: each instruction
    takes the lowest lane whose last slice has ended (an in-order engine has one lane)."""
    lane_of: dict[int, int] = {}
    count: dict[str, int] = {}
    engine = None
    ends: list[float] = []
    for k in order:
        i = instructions[k]
        if i.engine != engine:
            if engine is not None:
                count[engine] = len(ends)
            engine, ends = i.engine, []
        start = round(i.start_ns, 3)
        lane = next((n for n, end in enumerate(ends) if end <= start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = round(max(i.end_ns, i.start_ns), 3)
        lane_of[k] = lane
    if engine is not None:
        count[engine] = len(ends)
    return lane_of, count


def _inside(span: tuple[float, float], at: float) -> float:
    """The time (µs) ``at`` of the way through a slice ``(ts, dur)`` as written: within its
    rounded edges whatever the rounding of the point itself."""
    ts, dur = span
    return min(max(round(ts + at * dur, 4), ts), round(ts + dur, 3))


def _flow_events(
    profile: Profile,
    tid_of_id: dict[int, int],
    span_of: dict[int, tuple[float, float]],
    pid: int,
) -> list[dict[str, Any]]:
    by_id = {i.id: i for i in profile.instructions}
    out: list[dict[str, Any]] = []
    flow_id = 0
    for i in profile.instructions:
        for d in i.deps:
            dep = by_id.get(d)
            if dep is None or dep.engine == i.engine:
                # Same-engine order is already visible on the track; arrows would be noise.
                continue
            flow_id += 1
            # Flow ends bind to the slice enclosing their timestamp; an instant exactly at a
            # boundary could bind to the neighbouring instruction, so step just inside -- of the
            # slice as written (edges rounded to the nanosecond, ``us_span``), or an arrow of a
            # few-nanosecond instruction would land past its rounded edge.
            common = {"name": "dep", "cat": "dep", "id": flow_id, "pid": pid}
            out.append(
                {
                    **common,
                    "ph": "s",
                    "ts": _inside(span_of[dep.id], 0.95),
                    "tid": tid_of_id[dep.id],
                }
            )
            out.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "ts": _inside(span_of[i.id], 0.05),
                    "tid": tid_of_id[i.id],
                }
            )
    return out


def write_perfetto(profile: Profile, path: str | Path, *, flows: bool | None = None) -> Path:
    """Write :func:`trace_events` to ``path`` (gzip-compressed when it ends in ``.gz``, which
    ui.perfetto.dev opens as it is) and return it."""
    return write_trace(trace_events(profile, flows=flows), path, what=profile.kernel)


def write_trace(doc: dict[str, Any], path: str | Path, *, what: str = "trace") -> Path:
    """Write a trace-event document as compact JSON (gzip for a ``.gz`` path).  Checked with
    :mod:`.tracecheck` first when ``NKIKIT_CHECK_TRACES`` is set (the test suite sets it)."""
    check_if_asked(doc, what)
    path = Path(path)
    # dumps, not dump: only the one-shot encoder runs in C (10x faster on big traces).
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=6, mtime=0)
    path.write_bytes(data)
    return path
