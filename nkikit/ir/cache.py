"""A cache of what is derived from traced kernels, bounded by the kernels' size.

An unrolled NKI 0.x kernel at production shapes is 10^5 - 10^6 ops, and its IR (with the
program compiled from it) takes hundreds of megabytes.  A test suite specializes the same
``@nki.jit`` kernel for hundreds of shapes, so a cache bounded by its number of entries grows
until the process runs out of memory.  :class:`KernelCache` keeps the most recently used
entries while their kernels hold at most ``max_ops`` ops in all (the newest entry always
stays), and at most ``max_entries`` of them.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

# ops kept per cache; NKIKIT_CACHE_OPS changes it (0 keeps only the newest entry)
DEFAULT_MAX_OPS = int(os.environ.get("NKIKIT_CACHE_OPS", "400000"))


def op_count(kernel: Any) -> int:
    """The number of ops in ``kernel`` (loop bodies counted once)."""
    return sum(1 for _ in kernel.ops())


class KernelCache:
    """An LRU map whose entries each weigh their kernel's op count."""

    def __init__(self, max_ops: int | None = None, max_entries: int = 256) -> None:
        self.max_ops = DEFAULT_MAX_OPS if max_ops is None else max_ops
        self.max_entries = max_entries
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.ops = 0  # the ops of every kernel held
        self.puts = 0  # entries ever added (a length does not tell once entries are dropped)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Any) -> Any:
        """The value cached under ``key`` (now the most recently used), or None."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def put(self, key: Any, value: Any, ops: int) -> None:
        """Cache ``value`` (derived from a kernel of ``ops`` ops) under ``key``, then drop the
        least recently used entries while the cache is over its bounds."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.ops -= old[1]
        self._entries[key] = (value, ops)
        self.ops += ops
        self.puts += 1
        while len(self._entries) > 1 and (
            self.ops > self.max_ops or len(self._entries) > self.max_entries
        ):
            _, (_, dropped) = self._entries.popitem(last=False)
            self.ops -= dropped

    def clear(self) -> None:
        self._entries.clear()
        self.ops = 0
