"""The simulator's memory guard: stop with a named error before an allocation the machine
cannot hold, instead of being killed by the operating system.

A kernel at production shapes (an MoE layer's expert weights, an LNC=2 launch's output) asks
the simulator for gigabytes of HBM.  Before a run allocates its HBM tensors (and a run of
several ranks its per-rank copies), :func:`reserve` compares the bytes with the room this
process has: the smallest of the memory the kernel may still take under
``NKIKIT_MEMORY_LIMIT_MB`` (the same limit the NKI 0.x tracer's guard reads), the machine's
available memory (``MemAvailable``) and the address space left under ``ulimit -v``.  An OOM
kill loses a test runner's other results; ``err_simulation_out_of_memory`` names the kernel's
line and the sizes.
"""

from __future__ import annotations

import os
import resource

from ..errors import ErrSimulationOutOfMemory, SourceLoc

_MB = 1 << 20


def _status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (VmRSS, VmSize), None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def room() -> tuple[int | None, int, str]:
    """(bytes this process may still allocate or None if unknown, bytes it holds now, which
    limit is the tightest)."""
    rss = (_status_kb("VmRSS") or 0) * 1024
    rooms: list[tuple[int, str]] = []
    env = os.environ.get("NKIKIT_MEMORY_LIMIT_MB")
    if env:
        rooms.append((int(float(env) * _MB) - rss, "NKIKIT_MEMORY_LIMIT_MB"))
    avail = _available_bytes()
    if avail is not None:
        rooms.append((avail, "the machine's available memory"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    vm = _status_kb("VmSize")
    if soft != resource.RLIM_INFINITY and vm is not None:
        rooms.append((soft - vm * 1024, "ulimit -v"))
    if not rooms:
        return None, rss, ""
    least = min(rooms)
    return max(least[0], 0), rss, least[1]


def reserve(nbytes: int, what: str, loc: SourceLoc | None) -> None:
    """Raise ``err_simulation_out_of_memory`` at ``loc`` (the kernel's line) if ``nbytes``
    more do not fit in this process's room (:func:`room`); allocations below 64 MiB are
    never checked (reading the limits costs more than they risk)."""
    if nbytes < 64 * _MB:
        return
    left, used, limit = room()
    if left is None or nbytes <= left:
        return
    raise ErrSimulationOutOfMemory(
        loc,
        need_mb=nbytes // _MB,
        what=what,
        used_mb=used // _MB,
        room_mb=left // _MB,
        limit=limit,
    )
