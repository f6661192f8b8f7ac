"""The HTML system report: one self-contained page (no network) for a :class:`SystemProfile`.

Sections: totals; a timeline of the host threads (nested torch ops by depth), the runtime
(trace / compile / launch), the simulator and each NeuronCore's kernels on the device clock;
the key averages; and per kernel a drill-down (its summary, engine timeline and hottest source
lines), linked from the key-averages rows of the operations that launched it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .colours import opcode_colour
from .html import _environment, _json_for_script
from .timeline import build_timeline

if TYPE_CHECKING:
    from .system import SystemProfile

ENGINE_EVENTS = 4_000
ENGINE_BINS = 400
TOP_LINES = 8


def _anchor(name: str, k: int = 0) -> str:
    return "k-" + re.sub(r"[^A-Za-z0-9_-]", "_", name) + (f"-{k}" if k else "")


def _rows(sp: SystemProfile) -> list[dict[str, Any]]:
    """Timeline rows: host threads (one row per nesting depth), runtime, simulator, cores."""
    rows: list[dict[str, Any]] = []
    by_tid: dict[Any, list[dict[str, Any]]] = {}
    for e in sp.host:
        by_tid.setdefault(e.get("tid"), []).append(e)
    for tid, events in by_tid.items():
        depth_rows: list[list[list[Any]]] = []
        stack: list[float] = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            d = len(stack)
            stack.append(e["ts"] + e["dur"])
            while len(depth_rows) <= d:
                depth_rows.append([])
            depth_rows[d].append([e["ts"], e["dur"], e["name"], "#8c959f" if d else "#57606a"])
        label = sp.host_threads.get(tid, f"thread {tid}")
        for d, items in enumerate(depth_rows[:6]):
            rows.append({"group": "host", "label": label if d == 0 else "", "items": items})
    runtime: list[list[Any]] = []
    sim: list[list[Any]] = []
    cores: dict[int, list[list[Any]]] = {}
    anchors = kernel_anchors(sp)
    free = 0.0
    for r in sp.runs:
        runtime.append(
            [
                r.trace_start,
                r.compile_start - r.trace_start,
                f"trace {r.kernel}" + ("" if r.traced else " (cache hit)"),
                "#bf8700",
            ]
        )
        runtime.append(
            [
                r.compile_start,
                r.launch_start - r.compile_start,
                f"compile {r.kernel}" + ("" if r.compiled else " (cache hit)"),
                "#8250df",
            ]
        )
        runtime.append(
            [r.launch_start, r.launch_end - r.launch_start, f"launch {r.kernel}", "#0969da"]
        )
        start = max(r.launch_start, free)
        free = start + r.sim_us
        sim.append([start, r.sim_us, f"simulate {r.kernel}", "#afb8c1"])
        cores.setdefault(r.core, []).append(
            [
                r.device_start,
                r.device_us,
                r.kernel,
                opcode_colour(r.kernel),
                anchors.get(id(r.profile), ""),
            ]
        )
    rows.append({"group": "runtime", "label": "runtime", "items": runtime})
    rows.append({"group": "sim", "label": "simulator (CPU)", "items": sim})
    for c, items in sorted(cores.items()):
        rows.append({"group": "device", "label": f"NeuronCore {c}", "items": items})
    return rows


def kernel_anchors(sp: SystemProfile) -> dict[int, str]:
    """An HTML anchor per distinct kernel profile (a kernel specialized for two shapes has two),
    keyed by the profile's id."""
    out: dict[int, str] = {}
    count: dict[str, int] = {}
    for r in sp.runs:
        if r.profile is None or id(r.profile) in out:
            continue
        k = count[r.kernel] = count.get(r.kernel, -1) + 1
        out[id(r.profile)] = _anchor(r.kernel, k)
    return out


def render_system_html(sp: SystemProfile) -> str:
    """The report as a string; see :func:`write_system_html`."""
    rows = _rows(sp)
    end = max([0.0] + [it[0] + it[1] for row in rows for it in row["items"]])
    kernels = []
    anchors = kernel_anchors(sp)
    seen: set[int] = set()
    for r in sp.runs:
        if r.profile is None or id(r.profile) in seen:
            continue
        seen.add(id(r.profile))
        p = r.profile
        s = p.summary
        kernels.append(
            {
                "name": r.kernel,
                "anchor": anchors[id(p)],
                "s": s,
                "lines": p.per_line()[:TOP_LINES],
                "timeline": _json_for_script(
                    build_timeline(p, max_events=ENGINE_EVENTS, bins=ENGINE_BINS)
                ),
            }
        )
    ka = sp.key_averages_dicts()
    data = {"end": end, "rows": rows}
    return (
        _environment()
        .get_template("system_report.html.j2")
        .render(
            sp=sp,
            summary=sp.summary(),
            key_averages=ka,
            anchors={k["name"]: k["anchor"] for k in reversed(kernels)},
            kernels=kernels,
            data_json=_json_for_script(data),
            track_count=len(rows),
        )
    )


def write_system_html(sp: SystemProfile, path: str | Path) -> Path:
    """Write the system report to ``path``."""
    path = Path(path)
    path.write_text(render_system_html(sp), encoding="utf-8")
    return path
