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


def torch_profiling() -> bool:
    """True while ``torch.profiler`` records (checked without importing torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except AttributeError:  # a torch too old or too new to have the flag: never record
        return False


def active() -> bool:
    """Should launches go through the hook?"""
    return hook is not None and (bool(sessions) or torch_profiling())
