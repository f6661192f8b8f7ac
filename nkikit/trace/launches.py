"""Who wants to hear about kernel launches: the hook a profiler installs into ``@nki.jit`` calls.

A call of a jitted kernel (either dialect) normally specializes it and runs the simulator.  When
:func:`active` is true (a recording session is open, or ``torch.profiler`` is running), the call
is handed whole to the installed :data:`hook` instead, which does the same work and records it
(times of tracing, compiling and simulating, the modeled device time).  The hook lives in the
compiler layer (it needs the cost model) and is installed when ``nkikit`` is imported; this
module only holds it, so the trace layer stays below the compiler.

No profiler running costs one call of :func:`active` per launch (a list test and a dict lookup).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Hook = Callable[[Any, tuple, dict], Any]
"""``hook(jit_kernel, args, kwargs)``: specialize, run and record one launch; returns what the
plain call returns."""

hook: Hook | None = None
sessions: list[Any] = []
"""Open recording sessions (the hook appends each launch's record to every one)."""


def install(fn: Hook) -> None:
    """Install the launch hook (the compiler's recorder)."""
    global hook
    hook = fn


_torch_profiler: Any = None


def _find_torch_profiler() -> Any:
    """``torch.autograd.profiler`` once torch is imported (cached), else None: no import here."""
    global _torch_profiler
    _torch_profiler = sys.modules.get("torch.autograd.profiler")
    return _torch_profiler


def torch_profiling() -> bool:
    """True while ``torch.profiler`` records (checked without importing torch)."""
    m = _torch_profiler or _find_torch_profiler()
    # a torch without the flag never records
    return m is not None and bool(getattr(m, "_is_profiler_enabled", False))


def active() -> bool:
    """Should launches go through the hook?"""
    if sessions:
        return hook is not None
    m = _torch_profiler or _find_torch_profiler()
    return m is not None and getattr(m, "_is_profiler_enabled", False) is True and hook is not None
