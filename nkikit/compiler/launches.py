"""Recording kernel launches: what a system profile knows about each ``@nki.jit`` call.

Installed as the launch hook of :mod:`nkikit.trace.launches` when ``nkikit`` is imported, and
used only while a :class:`Session` is open or ``torch.profiler`` runs.  For each launch it

1. specializes the kernel (traced on a cache miss), timing it;
2. compiles the specialization for its target once (cached here by the traced kernel) to get
   the modeled device time: the cost model's :class:`Profile` of the kernel;
3. runs the simulator, timing it: the simulator's CPU time is nkikit's own work, not host time
   of the modeled program, and a system profile shows it apart;
4. appends a :class:`LaunchRecord` to every open session, and (while ``torch.profiler`` runs)
   to :data:`RECENT`, where the torch exporter finds it.

While ``torch.profiler`` runs, the phases are also ``torch.profiler`` ranges on the calling
thread: ``nkikit.trace <kernel>`` and ``nkikit.compile <kernel>`` (cache misses only), then
``nkikit.launch <kernel>`` holding ``nkikit.simulate <kernel>``; the launch range carries the
modeled device time (``device_us``), shown in torch's own trace when it records shapes.

Times are wall-clock nanoseconds (``time.time_ns``): torch's trace puts its events on the same
clock (its ``ts`` plus ``baseTimeNanoseconds``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..ir.cache import KernelCache, op_count
from ..profiler.model import Profile
from ..profiler.system import SystemProfile
from ..trace import launches

RECENT: deque[LaunchRecord] = deque(maxlen=100_000)
"""Launches made while ``torch.profiler`` ran, oldest first (bounded: a long run keeps the last)."""

# (id(kernel), target) -> (kernel, profile, error): bounded by the kernels' ops, with the
# other caches of kernels (nkikit/ir/cache.py)
_PROFILES = KernelCache()
_SEQ = [0]
_LOCK = threading.Lock()


@dataclass(slots=True)
class LaunchRecord:
    """One kernel launch.  ``*_ns`` fields are wall-clock times or durations in nanoseconds;
    ``profile`` is the cost model's profile of the kernel (None when it did not compile, with
    the reason in ``compile_error``), shared by every launch of the same specialization."""

    seq: int
    kernel: str
    target: str
    grid: tuple[int, ...]
    thread: int
    start_ns: int
    end_ns: int
    sim_start_ns: int
    sim_end_ns: int
    trace_ns: int = 0
    traced: bool = False
    compile_ns: int = 0
    compiled: bool = False
    profile: Profile | None = None
    compile_error: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def device_ns(self) -> float:
        """Modeled device time of the kernel (0 when it did not compile)."""
        return self.profile.total_ns if self.profile is not None else 0.0

    @property
    def sim_ns(self) -> int:
        return self.sim_end_ns - self.sim_start_ns


class Session:
    """``with Session() as s: ...`` records every launch made inside into ``s.records``."""

    def __init__(self) -> None:
        self.records: list[LaunchRecord] = []
        self.start_ns = 0
        self.end_ns = 0

    def __enter__(self) -> Session:
        self.start_ns = time.time_ns()
        launches.sessions.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.end_ns = time.time_ns()
        launches.sessions.remove(self)


def _range(torch_on: bool, name: str, kwargs: dict[str, Any] | None = None):
    """A ``torch.profiler`` range while it runs; otherwise nothing."""
    if not torch_on:
        return contextlib.nullcontext()
    import torch

    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    if fast is not None:
        return fast(name, (), kwargs or {})
    return torch.profiler.record_function(name)


def device_profile(kernel: Any, target: str) -> tuple[Profile | None, str, bool]:
    """The cost model's profile of a traced ``kernel`` on ``target`` (compiled once):
    ``(profile or None, error text, compiled now)``."""
    key = (id(kernel), target)
    got = _PROFILES.get(key)
    if got is not None and got[0] is kernel:
        return got[1], got[2], False
    from .build import build_program

    try:
        prof: Profile | None = build_program(kernel, target).profile()
        error = ""
    except (ValueError, NotImplementedError) as e:  # too big to schedule, or not modeled
        prof, error = None, str(e)
    # the kernel is kept, so its id stays its own
    _PROFILES.put(key, (kernel, prof, error), op_count(kernel))
    return prof, error, True


def record_launch(jit: Any, args: tuple, kwargs: dict) -> Any:
    """The launch hook: specialize, compile (once), simulate and record one launch."""
    from ..collector import gc_paused
    from ..trace.jit import run

    torch_on = launches.torch_profiling()
    name = jit.func.__name__
    target = jit.default_target()
    t0 = time.time_ns()
    before = jit._cache.puts
    with _range(torch_on, f"nkikit.trace {name}"):
        kernel, bound = jit.specialize(*args, **kwargs)
    t1 = time.time_ns()
    traced = jit._cache.puts != before
    with _range(torch_on, f"nkikit.compile {name}"):
        prof, error, compiled = device_profile(kernel, target)
        device_us = prof.total_us if prof is not None else 0.0  # computes the summary once
    t2 = time.time_ns()
    with _range(torch_on, f"nkikit.launch {name}", {"device_us": device_us, "kernel": name}):
        with _range(torch_on, f"nkikit.simulate {name}"):
            s0 = time.time_ns()
            with gc_paused():
                out = run(kernel, bound)
            s1 = time.time_ns()
    t3 = time.time_ns()
    with _LOCK:
        _SEQ[0] += 1
        seq = _SEQ[0]
    rec = LaunchRecord(
        seq=seq,
        kernel=name,
        target=target,
        grid=tuple(jit.grid),
        thread=threading.get_native_id(),
        start_ns=t2,
        end_ns=t3,
        sim_start_ns=s0,
        sim_end_ns=s1,
        trace_ns=t1 - t0,
        traced=traced,
        compile_ns=t2 - t1,
        compiled=compiled,
        profile=prof,
        compile_error=error,
        meta={"trace_start_ns": t0},
    )
    for s in list(launches.sessions):
        s.records.append(rec)
    if torch_on:
        RECENT.append(rec)
    return out


launches.install(record_launch)


def profile_launches(
    fn: Any,
    *args: Any,
    launch_overhead_us: float | None = None,
    engines: bool = True,
    **kwargs: Any,
) -> tuple[Any, SystemProfile]:
    """Call ``fn(*args, **kwargs)`` (arrays or CPU tensors in) and profile every kernel it
    launches: returns ``(fn's result, SystemProfile)``.  The host track holds the call itself;
    each launch is its own kernel on the device clock (see :mod:`nkikit.profiler.system`)."""
    from ..profiler.system import DEFAULT_LAUNCH_OVERHEAD_US, build_system_profile

    with Session() as s:
        t0 = time.time_ns()
        result = fn(*args, **kwargs)
        t1 = time.time_ns()
    host = [
        {
            "ph": "X",
            "name": getattr(fn, "__qualname__", getattr(fn, "__name__", "call")),
            "cat": "python_function",
            "ts": 0.0,
            "dur": (t1 - t0) / 1000.0,
            "tid": threading.get_native_id(),
        }
    ]
    sp = build_system_profile(
        host,
        s.records,
        host_threads={threading.get_native_id(): "Python"},
        launch_overhead_us=(
            DEFAULT_LAUNCH_OVERHEAD_US if launch_overhead_us is None else launch_overhead_us
        ),
        engines=engines,
        epoch_ns=t0,
    )
    return result, sp
