"""System profiles: host work, kernel launches and modeled device time in one trace.

Input: host events (Chrome trace-event ``"X"`` dicts, e.g. from ``torch.profiler``'s trace,
times in wall-clock microseconds) and launch records (:class:`Launch`, one per ``@nki.jit``
call: when it was traced, compiled, launched and simulated, and the cost model's
:class:`Profile` of the kernel).  Output: a :class:`SystemProfile` with a Perfetto/Chrome trace,
key averages and an HTML report.

The clocks, and why:

* **Host clock without the simulator.**  On hardware the NeuronCore computes while the host
  goes on; here the CPU simulator computes, on the host, in the middle of the launch.  That is
  nkikit's own work, not host time of the modeled program, so it is cut out of the host clock:
  every host time ``t`` becomes ``t`` minus the simulator time that ended before it (host
  events keep their nesting, and an op that launched a kernel is as long as its host work).
  The simulator's CPU time is shown on a track of its own ("nkikit simulator"), placed where
  it was cut, one run after another.
* **Device clock.**  Each NeuronCore runs its kernels in launch order: a kernel starts at the
  later of its launch plus the launch overhead and the end of the core's previous kernel, and
  lasts the cost model's total time.  The launch overhead is a labelled assumption
  (:data:`DEFAULT_LAUNCH_OVERHEAD_US`) that the caller may replace.

Tracks: ``Host`` (one per thread: torch ops, Python functions), ``Neuron runtime (nkikit)``
(trace / compile / launch per kernel call, cache hits marked), ``NeuronCore <n>`` (kernels on
the device clock; with ``engines=True`` also each kernel's engine and DMA-queue instructions),
``nkikit simulator``; flow arrows from each launch to its kernel.  Every track holds properly
nested slices (see :mod:`.tracecheck`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .model import Profile

DEFAULT_LAUNCH_OVERHEAD_US = 15.0
"""Host-to-device launch overhead per kernel.  An assumption, not a measurement: AWS publishes
no per-launch latency of the Neuron runtime for Trainium (reference/nki.md §6 names none);
15 µs is the order of a GPU kernel launch plus a queue doorbell.  Pass your own measurement."""

PREFIX = "nkikit."
"""Host ranges nkikit itself opens (``nkikit.trace K``, ``nkikit.compile K``,
``nkikit.launch K``, ``nkikit.simulate K``): drawn on the runtime and simulator tracks."""

HOST_PID, RUNTIME_PID, SIM_PID, CORE_PID = 1, 2, 3, 10


class Launch(Protocol):
    """What a system profile reads from a launch record (``nkikit.compiler.launches``)."""

    kernel: str
    thread: int
    start_ns: int
    end_ns: int
    sim_start_ns: int
    sim_end_ns: int
    trace_ns: int
    traced: bool
    compile_ns: int
    compiled: bool
    profile: Profile | None

    @property
    def device_ns(self) -> float: ...


@dataclass
class KernelRun:
    """One launch placed on the system timeline (all times µs from the trace's origin, host
    times on the simulator-free host clock)."""

    index: int
    kernel: str
    thread: int
    trace_start: float
    compile_start: float
    launch_start: float
    launch_end: float
    device_start: float
    device_end: float
    sim_us: float
    traced: bool
    compiled: bool
    core: int
    profile: Profile | None

    @property
    def device_us(self) -> float:
        return self.device_end - self.device_start


@dataclass
class KeyAverage:
    """One row of the key averages: a host operation or a kernel."""

    name: str
    kind: str  # "op" (a host operation) or "kernel"
    calls: int = 0
    host_total_us: float = 0.0
    device_total_us: float = 0.0
    fallbacks: int = 0
    kernels: list[str] = field(default_factory=list)
    traced: int = 0
    compiled: int = 0

    @property
    def host_avg_us(self) -> float:
        return self.host_total_us / self.calls if self.calls else 0.0

    @property
    def device_avg_us(self) -> float:
        return self.device_total_us / self.calls if self.calls else 0.0

    def to_dict(self, device_total: float) -> dict[str, Any]:
        d = {
            "name": self.name,
            "kind": self.kind,
            "calls": self.calls,
            "host_total_us": self.host_total_us,
            "host_avg_us": self.host_avg_us,
            "device_total_us": self.device_total_us,
            "device_avg_us": self.device_avg_us,
            "device_percent": 100.0 * self.device_total_us / device_total if device_total else 0.0,
            "fallbacks": self.fallbacks,
            "kernels": self.kernels,
        }
        if self.kind == "kernel":
            d["traced"] = self.traced
            d["compiled"] = self.compiled
        return d


class HostClock:
    """Wall-clock ns -> µs from ``origin`` with the simulator's intervals cut out."""

    def __init__(self, sim: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for s, e in sorted(sim):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self.before = [0, *itertools.accumulate(e - s for s, e in merged)]
        self.origin_ns = 0.0

    def removed(self, t_ns: float) -> float:
        """Simulator ns before wall time ``t_ns``."""
        k = bisect.bisect_right(self.starts, t_ns) - 1
        if k < 0:
            return 0.0
        return self.before[k] + min(t_ns, self.ends[k]) - self.starts[k]

    def __call__(self, t_ns: float) -> float:
        return (t_ns - self.removed(t_ns) - self.origin_ns) / 1000.0


@dataclass
class SystemProfile:
    """The result: kernel runs on the system timeline, host events, key averages, trace."""

    runs: list[KernelRun]
    host: list[dict[str, Any]]
    host_threads: dict[int, str]
    launch_overhead_us: float
    key_averages: list[KeyAverage]
    engines: bool = False
    max_engine_events: int = 200_000
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def device_total_us(self) -> float:
        return sum(r.device_us for r in self.runs)

    @property
    def host_total_us(self) -> float:
        """Span of the host timeline (simulator time cut out)."""
        if not self.host and not self.runs:
            return 0.0
        ends = [e["ts"] + e["dur"] for e in self.host] + [r.launch_end for r in self.runs]
        return max(ends)

    def key_averages_dicts(self) -> list[dict[str, Any]]:
        total = self.device_total_us
        return [k.to_dict(total) for k in self.key_averages]

    def table(self, *, row_limit: int = 30, sort_by: str = "device_total_us") -> Any:
        """A rich table of the key averages (``rich.print(sp.table())``)."""
        from rich import box
        from rich.table import Table

        from .units import fmt_ns

        rows = sorted(self.key_averages_dicts(), key=lambda d: -d[sort_by])[:row_limit]
        t = Table(
            title=f"Key averages (device time modeled; launch overhead {self.launch_overhead_us:g} µs, assumed)",
            box=box.SIMPLE_HEAD,
        )
        for col in ("name", "calls", "host total", "host avg", "device total", "device avg"):
            t.add_column(col, justify="left" if col == "name" else "right")
        t.add_column("% device", justify="right")
        t.add_column("CPU fallbacks", justify="right")
        for d in rows:
            t.add_row(
                ("kernel " if d["kind"] == "kernel" else "") + d["name"],
                f"{d['calls']:,}",
                fmt_ns(1000 * d["host_total_us"]),
                fmt_ns(1000 * d["host_avg_us"]),
                fmt_ns(1000 * d["device_total_us"]),
                fmt_ns(1000 * d["device_avg_us"]),
                f"{d['device_percent']:.1f}%",
                f"{d['fallbacks']:,}" if d["kind"] == "op" else "",
            )
        return t

    def table_text(self, **kw: Any) -> str:
        """:meth:`table` as plain text."""
        import io

        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=140, color_system=None, force_terminal=False).print(
            self.table(**kw)
        )
        return buf.getvalue()

    def trace_events(self) -> dict[str, Any]:
        """The system trace as a JSON-ready Chrome trace-event document."""
        return system_trace(self)

    def to_perfetto(self, path: str | Path) -> Path:
        from .perfetto import write_trace

        return write_trace(self.trace_events(), path, what="system trace")

    def to_json(self, path: str | Path) -> Path:
        """The key averages (and totals) as JSON."""
        import json

        path = Path(path)
        path.write_text(json.dumps(self.summary(), indent=1), encoding="utf-8")
        return path

    def to_html(self, path: str | Path) -> Path:
        from .system_html import write_system_html

        return write_system_html(self, path)

    def summary(self) -> dict[str, Any]:
        return {
            "launches": len(self.runs),
            "host_total_us": self.host_total_us,
            "device_total_us": self.device_total_us,
            "simulator_cpu_us": sum(r.sim_us for r in self.runs),
            "launch_overhead_us": self.launch_overhead_us,
            "launch_overhead_source": "assumption (DEFAULT_LAUNCH_OVERHEAD_US) unless given",
            "key_averages": self.key_averages_dicts(),
            **self.meta,
        }


def build_system_profile(
    host_events: list[dict[str, Any]],
    launches: list[Launch],
    *,
    host_threads: dict[int, str] | None = None,
    launch_overhead_us: float = DEFAULT_LAUNCH_OVERHEAD_US,
    engines: bool = False,
    max_engine_events: int = 200_000,
    meta: dict[str, Any] | None = None,
    epoch_ns: int = 0,
) -> SystemProfile:
    """Place ``launches`` and ``host_events`` (``"X"`` events, ``ts``/``dur`` in µs since
    ``epoch_ns`` on the wall clock, ``tid`` the OS thread) on the system timeline; see the
    module docstring for the clocks.  The records' wall-clock ns have ``epoch_ns`` taken off
    in integers first: a float holds ns since 1970 only to a quarter of a microsecond.

    The simulator's time is cut out of the host clock where the host events say it ran (their
    ``nkikit.simulate`` ranges, on the host events' own clock), else where the records do."""
    launches = [_Shifted(r, epoch_ns) for r in sorted(launches, key=lambda r: r.start_ns)]
    sim = [
        (round(1000.0 * e["ts"]), round(1000.0 * (e["ts"] + e["dur"])))
        for e in host_events
        if e.get("ph") == "X" and e["name"].startswith(PREFIX + "simulate ")
    ]
    clock = HostClock(sim or [(r.sim_start_ns, r.sim_end_ns) for r in launches])
    starts = [1000.0 * e["ts"] for e in host_events if not e["name"].startswith(PREFIX)]
    starts += [r.start_ns - r.trace_ns - r.compile_ns for r in launches]
    clock.origin_ns = 0.0
    origin = min((s - clock.removed(s) for s in starts), default=0.0)
    clock.origin_ns = origin

    host: list[dict[str, Any]] = []
    for e in host_events:
        if e.get("ph") != "X" or e["name"].startswith(PREFIX):
            continue
        a, b = 1000.0 * e["ts"], 1000.0 * (e["ts"] + e["dur"])
        ts, end = clock(a), clock(b)
        host.append({**e, "ts": round(ts, 3), "dur": round(max(end - ts, 0.0), 3)})
    host = _nested(host)

    overhead = launch_overhead_us
    core_free: dict[int, float] = {}
    runs: list[KernelRun] = []
    for k, r in enumerate(launches):
        launch_start = clock(r.start_ns)
        core = 0  # one NeuronCore is modeled; an LNC=2 launch is one kernel on it
        start = max(launch_start + overhead, core_free.get(core, 0.0))
        end = start + r.device_ns / 1000.0
        core_free[core] = end
        runs.append(
            KernelRun(
                index=k,
                kernel=r.kernel,
                thread=r.thread,
                trace_start=clock(r.start_ns - r.trace_ns - r.compile_ns),
                compile_start=clock(r.start_ns - r.compile_ns),
                launch_start=launch_start,
                launch_end=clock(r.end_ns),
                device_start=start,
                device_end=end,
                # what was cut out of the host clock during this launch
                sim_us=(clock.removed(r.end_ns) - clock.removed(r.start_ns)) / 1000.0,
                traced=r.traced,
                compiled=r.compiled,
                core=core,
                profile=r.profile,
            )
        )
    return SystemProfile(
        runs=runs,
        host=host,
        host_threads=dict(host_threads or {}),
        launch_overhead_us=overhead,
        key_averages=key_averages(host, runs),
        engines=engines,
        max_engine_events=max_engine_events,
        meta=dict(meta or {}),
    )


class _Shifted:
    """A launch record with its wall-clock times taken relative to ``epoch_ns``."""

    def __init__(self, r: Launch, epoch_ns: int) -> None:
        self.r = r
        self.start_ns = r.start_ns - epoch_ns
        self.end_ns = r.end_ns - epoch_ns
        self.sim_start_ns = r.sim_start_ns - epoch_ns
        self.sim_end_ns = r.sim_end_ns - epoch_ns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.r, name)


def _nested(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Host events per thread in time order, each clipped to its enclosing event: a child that
    outlives its parent by a rounding error would otherwise partially overlap it."""
    out: list[dict[str, Any]] = []
    by_tid: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        by_tid.setdefault(e.get("tid"), []).append(e)
    for lst in by_tid.values():
        lst.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[float] = []
        for e in lst:
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]:
                e["dur"] = round(stack[-1] - e["ts"], 3)
            stack.append(e["ts"] + e["dur"])
            out.append(e)
    return out


METADATA_OPS = frozenset(
    f"aten::{op}"
    for op in (
        "view", "_unsafe_view", "_reshape_alias", "reshape", "expand", "permute", "transpose",
        "t", "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "split",
        "split_with_sizes", "unbind", "chunk", "narrow", "as_strided", "diagonal", "view_as",
        "expand_as", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
        "new_empty_strided", "resolve_conj", "resolve_neg", "to", "contiguous",
    )
) | {"detach"}  # fmt: skip
"""Host operations that only describe or allocate memory (views, aliases, empty tensors), or
that are a no-op unless a child op does the work (``to`` -> ``_to_copy``, ``contiguous`` ->
``clone``, counted themselves): without a kernel they are not CPU fallbacks."""


def _outermost_aten(host: list[dict[str, Any]]) -> set[int]:
    """The ids of the ``aten::`` events that no other ``aten::`` event on their thread holds."""
    out: set[int] = set()
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in host:
        if e["name"].startswith("aten::"):
            by_thread.setdefault(e.get("tid"), []).append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        end = -math.inf
        for e in events:
            if e["ts"] >= end:
                out.add(id(e))
                end = e["ts"] + e["dur"]
    return out


def key_averages(host: list[dict[str, Any]], runs: list[KernelRun]) -> list[KeyAverage]:
    """Per host operation (by name) and per kernel: calls, host and device time, fallbacks.

    A launch belongs to every host operation on its thread whose interval holds the middle of
    its launch (as torch attributes a child's time to each enclosing op); an operation call
    that launched no kernel ran on the CPU: a fallback, in TorchNeuron's words. Only the
    outermost ATen operations count (an op inside another is part of its parent: the
    ``neuron`` device's dispatcher, for one, calls ATen ops on host storage inside the op it
    runs as a kernel), and the metadata ops of ``METADATA_OPS`` compute nothing."""
    rows: dict[tuple[str, str], KeyAverage] = {}
    by_thread: dict[Any, list[tuple[float, KernelRun]]] = {}
    for r in runs:
        by_thread.setdefault(r.thread, []).append(((r.launch_start + r.launch_end) / 2, r))
    for lst in by_thread.values():
        lst.sort(key=lambda x: x[0])
    outermost = _outermost_aten(host)
    for e in host:
        row = rows.setdefault(("op", e["name"]), KeyAverage(e["name"], "op"))
        row.calls += 1
        row.host_total_us += e["dur"]
        lst = by_thread.get(e.get("tid"), [])
        mids = [m for m, _ in lst]
        lo = bisect.bisect_left(mids, e["ts"])
        hi = bisect.bisect_right(mids, e["ts"] + e["dur"])
        inside = [r for _, r in lst[lo:hi]]
        if not inside and id(e) in outermost and e["name"] not in METADATA_OPS:
            row.fallbacks += 1
        for r in inside:
            row.device_total_us += r.device_us
            if r.kernel not in row.kernels:
                row.kernels.append(r.kernel)
    for r in runs:
        row = rows.setdefault(
            ("kernel", r.kernel), KeyAverage(r.kernel, "kernel", kernels=[r.kernel])
        )
        row.calls += 1
        row.host_total_us += r.launch_end - r.trace_start
        row.device_total_us += r.device_us
        row.traced += int(r.traced)
        row.compiled += int(r.compiled)
    return sorted(rows.values(), key=lambda k: (-k.device_total_us, -k.host_total_us, k.name))


# -- the trace ------------------------------------------------------------------------------


def _meta(pid: int, tid: int, kind: str, value: Any) -> dict[str, Any]:
    key = "name" if kind.endswith("_name") else "sort_index"
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {key: value}}


def system_trace(sp: SystemProfile) -> dict[str, Any]:
    """The Chrome trace-event document of a :class:`SystemProfile`."""
    from .perfetto import instruction_events

    ev: list[dict[str, Any]] = []
    ev.append(_meta(HOST_PID, 0, "process_name", "Host (CPU, simulator time cut out)"))
    ev.append(_meta(HOST_PID, 0, "process_sort_index", 0))
    host_tid: dict[Any, int] = {}
    for e in sp.host:
        if e.get("tid") not in host_tid:
            t = host_tid[e.get("tid")] = len(host_tid) + 1
            label = sp.host_threads.get(e.get("tid"), f"thread {e.get('tid')}")
            ev.append(_meta(HOST_PID, t, "thread_name", label))
            ev.append(_meta(HOST_PID, t, "thread_sort_index", t))
    for e in sp.host:
        ev.append(
            {
                "ph": "X",
                "name": e["name"],
                "cat": e.get("cat", "host"),
                "ts": e["ts"],
                "dur": e["dur"],
                "pid": HOST_PID,
                "tid": host_tid[e.get("tid")],
                "args": {k: v for k, v in e.get("args", {}).items() if _small(v)},
            }
        )

    ev.append(_meta(RUNTIME_PID, 0, "process_name", "Neuron runtime (nkikit)"))
    ev.append(_meta(RUNTIME_PID, 0, "process_sort_index", 1))
    ev.append(_meta(SIM_PID, 0, "process_name", "nkikit simulator (CPU time, not host time)"))
    ev.append(_meta(SIM_PID, 0, "process_sort_index", 2))
    ev.append(_meta(SIM_PID, 1, "thread_name", "simulator"))
    ev.append(_meta(SIM_PID, 1, "thread_sort_index", 1))
    rt_tid: dict[int, int] = {}
    cores = sorted({r.core for r in sp.runs})
    for c in cores:
        pid = CORE_PID + c
        ev.append(
            _meta(
                pid,
                0,
                "process_name",
                f"NeuronCore {c} (modeled device clock; launch overhead "
                f"{sp.launch_overhead_us:g} µs, assumed)",
            )
        )
        ev.append(_meta(pid, 0, "process_sort_index", 3 + c))
        ev.append(_meta(pid, 1, "thread_name", "kernels"))
        ev.append(_meta(pid, 1, "thread_sort_index", 1))
    sim_free = 0.0
    engine_tids: dict[int, dict[tuple[str, int], int]] = {c: {} for c in cores}
    engine_events = 0
    for r in sp.runs:
        if r.thread not in rt_tid:
            t = rt_tid[r.thread] = len(rt_tid) + 1
            ev.append(_meta(RUNTIME_PID, t, "thread_name", f"launches (thread {r.thread})"))
            ev.append(_meta(RUNTIME_PID, t, "thread_sort_index", t))
        t = rt_tid[r.thread]
        common = {"pid": RUNTIME_PID, "tid": t, "cat": "runtime"}
        ev.append(
            {
                **common,
                "ph": "X",
                "name": f"trace {r.kernel}" + ("" if r.traced else " (cache hit)"),
                "ts": round(r.trace_start, 3),
                "dur": round(r.compile_start - r.trace_start, 3),
                "args": {"cache": "miss" if r.traced else "hit"},
            }
        )
        ev.append(
            {
                **common,
                "ph": "X",
                "name": f"compile {r.kernel}" + ("" if r.compiled else " (cache hit)"),
                "ts": round(r.compile_start, 3),
                "dur": round(r.launch_start - r.compile_start, 3),
                "args": {"cache": "miss" if r.compiled else "hit"},
            }
        )
        launch_dur = round(r.launch_end - r.launch_start, 3)
        ev.append(
            {
                **common,
                "ph": "X",
                "name": f"launch {r.kernel}",
                "ts": round(r.launch_start, 3),
                "dur": launch_dur,
                "args": {"launch": r.index, "device_us": round(r.device_us, 3)},
            }
        )
        sim_start = max(r.launch_start, sim_free)
        sim_free = sim_start + r.sim_us
        ev.append(
            {
                "ph": "X",
                "name": f"simulate {r.kernel}",
                "cat": "simulator",
                "ts": round(sim_start, 3),
                "dur": round(r.sim_us, 3),
                "pid": SIM_PID,
                "tid": 1,
                "args": {"launch": r.index, "note": "nkikit's CPU work; not in the host clock"},
            }
        )
        pid = CORE_PID + r.core
        args: dict[str, Any] = {"launch": r.index, "device_us": round(r.device_us, 3)}
        if r.profile is not None:
            s = r.profile.summary
            args.update(
                bound_by=s["bound_by"],
                mfu_percent=round(s["mfu_percent"], 2),
                mbu_percent=round(s["mbu_percent"], 2),
                instructions=s["instruction_count"],
            )
        ev.append(
            {
                "ph": "X",
                "name": r.kernel,
                "cat": "kernel",
                "ts": round(r.device_start, 3),
                "dur": round(r.device_end - r.device_start, 3),
                "pid": pid,
                "tid": 1,
                "args": args,
            }
        )
        flow = {"name": "launch", "cat": "launch", "id": r.index + 1}
        ev.append(
            {
                **flow,
                "ph": "s",
                "ts": round(r.launch_start + launch_dur / 2, 3),
                "pid": RUNTIME_PID,
                "tid": t,
            }
        )
        ev.append(
            {
                **flow,
                "ph": "f",
                "bp": "e",
                "ts": round(r.device_start + (r.device_end - r.device_start) / 2, 3),
                "pid": pid,
                "tid": 1,
            }
        )
        if sp.engines and r.profile is not None:
            n = len(r.profile.instructions)
            if engine_events + n <= sp.max_engine_events:
                engine_events += n
                ev += instruction_events(
                    r.profile,
                    pid=pid,
                    offset_ns=1000.0 * r.device_start - r.profile.start_ns,
                    first_tid=2,
                    flows=False,
                    tids=engine_tids[r.core],
                )
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ns",
        "otherData": {
            "nkikit": "system profile",
            "clocks": "host: wall clock with the simulator's CPU time cut out; device: modeled",
            **{k: v for k, v in sp.summary().items()},
        },
    }


def _small(v: Any) -> bool:
    return isinstance(v, int | float | str | bool) and not (isinstance(v, str) and len(v) > 500)
