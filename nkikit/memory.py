"""How much memory this process holds and may still take, for whatever must not outgrow it
(the simulator's memory guard, ``nkikit/sim/memory.py``; the kernel caches,
``nkikit/ir/cache.py``).

Three limits can bind: ``NKIKIT_MEMORY_LIMIT_MB`` (the NKI 0.x tracer's guard reads it too),
the machine's available memory (``MemAvailable``) and the address space left under
``ulimit -v``.
"""

from __future__ import annotations

import os
import resource

MB = 1 << 20


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
        rooms.append((int(float(env) * MB) - rss, "NKIKIT_MEMORY_LIMIT_MB"))
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


def short_of_memory() -> bool:
    """Whether less than a quarter of what this process may use is left under one of the
    limits (resident memory for ``NKIKIT_MEMORY_LIMIT_MB`` and the machine, address space for
    ``ulimit -v``): the point where caches should give their memory back."""
    rss = (_status_kb("VmRSS") or 0) * 1024
    checks: list[tuple[int, int]] = []  # (bytes left, bytes the process may use in all)
    env = os.environ.get("NKIKIT_MEMORY_LIMIT_MB")
    if env:
        limit = int(float(env) * MB)
        checks.append((limit - rss, limit))
    avail = _available_bytes()
    if avail is not None:
        checks.append((avail, avail + rss))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    vm = _status_kb("VmSize")
    if soft != resource.RLIM_INFINITY and vm is not None:
        checks.append((soft - vm * 1024, soft))
    return any(left < total // 4 for left, total in checks)
