"""Pausing Python's cyclic garbage collector around work that builds big object graphs.

Tracing, verifying, generating simulator code and compiling create objects that all stay
alive while the work runs (the IR of an unrolled kernel holds 10^5 - 10^6 ops, the compiler
a record per tensor); each full collection walks all of them again, which makes the work
grow quadratically.  The library's entry points (a kernel call, ``specialize_for``,
``build_program``) and the direct ones (``nkikit.ir.verify.verify``,
``nkikit.sim.fast.compile_kernel``) run under :func:`gc_paused`.  Code that runs paused must
not leave reference cycles holding big data: they are freed only once the collector runs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (nested uses pause it once)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
