"""Chrome trace-event JSON export, readable by ui.perfetto.dev and chrome://tracing.

Layout: one process (the NeuronCore), one thread per engine and per DMA queue, ordered
Tensor, Vector, Scalar, GpSimd, Sync, then DMA queues. Every instruction is a complete
event (``"ph": "X"``) with ``ts``/``dur`` in microseconds; dependencies become flow
events (``"s"``/``"f"``) from the end of the producer to the start of the consumer.
"""

from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import engine_label, engine_sort_key, is_dma_engine

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
    if flows is None:
        flows = len(profile.instructions) <= FLOWS_AUTO_LIMIT
    engines = sorted(profile.analysis().cols.engines, key=engine_sort_key)
    tid = {e: k + 1 for k, e in enumerate(engines)}
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
    for e in engines:
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": PID,
                "tid": tid[e],
                "args": {"name": engine_label(e)},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": PID,
                "tid": tid[e],
                "args": {"sort_index": tid[e]},
            }
        )

    # Sorting by track then time keeps every track's events monotonic, which trace viewers
    # need to nest complete events correctly.
    c = profile.analysis().cols
    track_of_code = np.array([tid[e] for e in c.engines], dtype=np.int64)
    order = (
        np.lexsort((c.ints["id"], c.end, c.start, track_of_code[c.engine])).tolist() if c.n else []
    )
    cat = {e: ("dma" if is_dma_engine(e) else e) for e in engines}
    byte_values = attrgetter(*_BYTE_FIELDS)
    instructions = profile.instructions
    append = events.append
    for k in order:
        i = instructions[k]
        args: dict[str, Any] = {"id": i.id, "opcode": i.opcode, "source": i.source}
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
        append(
            {
                "name": i.opcode,
                "cat": cat[i.engine],
                "ph": "X",
                "ts": i.start_ns / 1000.0,
                "dur": max(i.end_ns - i.start_ns, 0.0) / 1000.0,
                "pid": PID,
                "tid": tid[i.engine],
                "args": args,
            }
        )

    if flows:
        events.extend(_flow_events(profile, tid))

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


def _flow_events(profile: Profile, tid: dict[str, int]) -> list[dict[str, Any]]:
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
            # boundary could bind to the neighbouring instruction, so step just inside.
            s_ts = dep.end_ns - 0.05 * max(dep.end_ns - dep.start_ns, 0.0)
            f_ts = i.start_ns + 0.05 * max(i.end_ns - i.start_ns, 0.0)
            common = {"name": "dep", "cat": "dependency", "id": flow_id, "pid": PID}
            out.append({**common, "ph": "s", "ts": s_ts / 1000.0, "tid": tid[dep.engine]})
            out.append({**common, "ph": "f", "bp": "e", "ts": f_ts / 1000.0, "tid": tid[i.engine]})
    return out


def write_perfetto(profile: Profile, path: str | Path, *, flows: bool | None = None) -> Path:
    """Write :func:`trace_events` to ``path`` and return it."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        # dumps, not dump: only the one-shot encoder runs in C (10x faster on big traces).
        f.write(json.dumps(trace_events(profile, flows=flows), separators=(",", ":")))
    return path
