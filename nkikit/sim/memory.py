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

from ..errors import ErrSimulationOutOfMemory, SourceLoc
from ..memory import MB, room


def reserve(nbytes: int, what: str, loc: SourceLoc | None) -> None:
    """Raise ``err_simulation_out_of_memory`` at ``loc`` (the kernel's line) if ``nbytes``
    more do not fit in this process's room (:func:`room`); allocations below 64 MiB are
    never checked (reading the limits costs more than they risk)."""
    if nbytes < 64 * MB:
        return
    left, used, limit = room()
    if left is None or nbytes <= left:
        return
    from ..ir.cache import give_back

    give_back()  # the kernel caches' memory first: the kernel being run is held by its caller
    left, used, limit = room()
    if left is None or nbytes <= left:
        return
    raise ErrSimulationOutOfMemory(
        loc,
        need_mb=nbytes // MB,
        what=what,
        used_mb=used // MB,
        room_mb=left // MB,
        limit=limit,
    )
