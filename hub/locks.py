"""One writer at a time per repo, across threads and across server processes sharing a root.

A thread lock orders the writers inside one process (cheap, no polling); a file lock under
`<root>/locks/` orders processes. The file lock is taken only by the thread already holding the
thread lock, so at most one thread per process ever waits on the file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock


class RepoLocks:
    """Hands out the write lock of a repo, keyed by a filesystem-safe string."""

    def __init__(self, lock_dir: Path, timeout: float = 60.0):
        self._dir = lock_dir
        self._timeout = timeout
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def _thread_lock(self, key: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Block until this process and no other holds `key`; release on exit.

        Raises `TimeoutError` after `timeout` seconds so a wedged writer cannot hang every request.
        """
        lock = self._thread_lock(key)
        if not lock.acquire(timeout=self._timeout):
            raise TimeoutError(
                f"repo {key} is busy (another commit has held it for {self._timeout}s)"
            )
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self._dir / f"{key}.lock"), timeout=self._timeout):
                yield
        finally:
            lock.release()
