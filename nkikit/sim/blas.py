"""One BLAS thread while a kernel runs: faster tile matmuls, and the same bits on every machine.

A simulated ``nc_matmul`` is one small ``np.matmul`` (at most 128 x 128 by 128 x 512 fp32, a
few tens of MFLOP), and an unrolled kernel runs thousands of them back to back.  OpenBLAS
splits each across its thread pool, which gains nothing at that size and, on a machine whose
cores are already busy (a test runner with one worker per core), makes each call wait for
threads that are not scheduled (one 128 x 128 by 128 x 512 tile matmul on a loaded 2-core
machine: 35 ms with two threads, 1.1 ms with one; benchmarks/firstrun).  It also changes the
result: OpenBLAS's single- and multi-threaded sgemm paths round differently for the same
operands (46 of 180 tile shapes in a sweep differ in some bit), so a simulation's fp32 PSUM
values would depend on the core count of the machine that ran it.

:func:`one_blas_thread` sets numpy's BLAS to one thread for the duration of a run.  Both
simulators (``interp.Interpreter.run`` and ``fast.runtime.Program.run``) run inside it, so
they stay bit-identical to each other and their results no longer depend on the machine's
core count.  The setting is process-wide, so entries are counted: the ranks of a multi-rank
run (threads, ``ranks.py``) and nested runs share one setting, restored when the last exits.
OpenBLAS ignores a *raise* of its thread count asked from a thread other than the one that
lowered it (measured with 0.3.31), so the thread that starts the ranks holds the setting
around them (``ranks.simulate_ranks``) and its exit is the last.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_saved: list[tuple[object, int]] = []  # (library controller, its thread count before)
_controllers: list | None = None  # numpy's BLAS libraries (threadpoolctl), found once


def _blas() -> list:
    """The BLAS libraries loaded in this process (found once: it scans the loaded libraries,
    some milliseconds)."""
    global _controllers
    if _controllers is None:
        from threadpoolctl import ThreadpoolController

        _controllers = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _controllers


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the body with every BLAS library of the process set to one thread; the first
    entry sets it, the last exit restores each library's previous count."""
    global _depth
    with _lock:
        if _depth == 0:
            for lib in _blas():
                n = lib.get_num_threads()
                if n != 1:
                    lib.set_num_threads(1)
                    _saved.append((lib, n))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for lib, n in _saved:
                    lib.set_num_threads(n)
                _saved.clear()
