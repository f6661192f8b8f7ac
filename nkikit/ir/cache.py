"""Caches of what is derived from traced kernels, bounded by the kernels' size.

An unrolled NKI 0.x kernel at production shapes is 10^5 - 10^6 ops, and its IR (with the
program compiled from it) takes hundreds of megabytes.  A test suite specializes the same
``@nki.jit`` kernel for hundreds of shapes, so a cache bounded by its number of entries grows
until the process runs out of memory; and every ``@nki.jit`` kernel has a cache of its own, so
a bound per cache still grows with the number of kernels a process has run (a pytest worker
of the NKI Library's suite runs hundreds).  :class:`KernelCache` keeps the most recently used
entries while the kernels of *every* cache in the process hold at most ``DEFAULT_MAX_OPS`` ops
in all, and at most ``max_ops`` ops and ``max_entries`` entries in each cache; the entry just
put always stays.  When the process is short of memory (``nkikit.memory.short_of_memory``)
the caches give back everything else.
"""

from __future__ import annotations

import gc
import itertools
import os
import weakref
from collections import OrderedDict
from typing import Any

from ..memory import short_of_memory

# ops kept by all caches of the process together; NKIKIT_CACHE_OPS changes it (0 keeps only
# each cache's newest entry)
DEFAULT_MAX_OPS = int(os.environ.get("NKIKIT_CACHE_OPS", "400000"))

_CACHES: weakref.WeakSet[KernelCache] = weakref.WeakSet()  # every live cache
_CLOCK = itertools.count()  # when an entry was last put or got, across caches


def op_count(kernel: Any) -> int:
    """The number of ops in ``kernel`` (loop bodies counted once)."""
    return kernel.census().ops


class KernelCache:
    """An LRU map whose entries each weigh their kernel's op count, under a bound of its own
    and the process-wide one shared by every cache."""

    def __init__(self, max_ops: int | None = None, max_entries: int = 256) -> None:
        self.max_ops = DEFAULT_MAX_OPS if max_ops is None else max_ops
        self.max_entries = max_entries
        # key -> (value, ops, last use on _CLOCK); least recently used first
        self._entries: OrderedDict[Any, tuple[Any, int, int]] = OrderedDict()
        self.ops = 0  # the ops of every kernel held
        self.puts = 0  # entries ever added (a length does not tell once entries are dropped)
        _CACHES.add(self)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Any) -> Any:
        """The value cached under ``key`` (now the most recently used), or None."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries[key] = (hit[0], hit[1], next(_CLOCK))
        self._entries.move_to_end(key)
        return hit[0]

    def put(self, key: Any, value: Any, ops: int) -> None:
        """Cache ``value`` (derived from a kernel of ``ops`` ops) under ``key``, then drop the
        least recently used entries while the cache is over its bounds."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.ops -= old[1]
        self._entries[key] = (value, ops, next(_CLOCK))
        self.ops += ops
        self.puts += 1
        while len(self._entries) > 1 and (
            self.ops > self.max_ops or len(self._entries) > self.max_entries
        ):
            self.ops -= self._entries.popitem(last=False)[1][1]
        _evict_shared(DEFAULT_MAX_OPS, self)
        if short_of_memory():
            give_back(self)

    def clear(self) -> None:
        self._entries.clear()
        self.ops = 0


def give_back(keep: KernelCache | None = None) -> None:
    """Drop every cached entry (but the one ``keep`` has just put) and collect the garbage:
    the caches give their memory back when the process is short of it (``nkikit.memory``).
    Kernels hold reference cycles, so dropping them frees nothing until the cyclic collector
    runs, which a large heap makes rare.  What was dropped is traced again when called."""
    _evict_shared(0, keep)
    gc.collect()


def _evict_shared(max_ops: int, putter: KernelCache | None) -> None:
    """Drop the least recently used entries of all caches while they hold more than
    ``max_ops`` ops together, except the entry ``putter`` has just put (the kernel being run;
    the others' entries may all go: whoever runs a kernel holds on to what it got)."""
    caches = list(_CACHES)
    total = sum(c.ops for c in caches)
    while total > max_ops:
        oldest: tuple[int, KernelCache] | None = None
        for c in caches:
            # a cache's first entry is its least recently used
            if len(c._entries) > (1 if c is putter else 0):
                stamp = next(iter(c._entries.values()))[2]
                if oldest is None or stamp < oldest[0]:
                    oldest = (stamp, c)
        if oldest is None:
            return
        c = oldest[1]
        dropped = c._entries.popitem(last=False)[1][1]
        c.ops -= dropped
        total -= dropped
