"""The fast simulator: the reference interpreter's semantics, compiled once per kernel.

``simulate(kernel, args)`` returns exactly (bit for bit, NaN for NaN) what
``nkikit.sim.interp.simulate`` returns, and raises the same errors, but does most of the work
once per specialized kernel instead of once per executed instruction:

* **One straight-line Python program per kernel.**  The IR is translated to Python source
  (loops stay ``for`` loops over ``range``) and compiled with ``compile()``.  Every access
  becomes an inline numpy slice whose start is an integer expression of the loop variables;
  nothing is looked up or re-derived while the kernel runs.
* **Bounds and masks are decided at compile time.**  Affine indices have known ranges, so an
  access that provably stays in bounds needs no check, and a mask clause that provably holds
  is dropped.  A mask that may cut a ragged tile is tested with one integer comparison per
  iteration; only when it really masks something does that instruction go to the reference
  interpreter, which shares this program's memory.
* **Buffers are allocated once per call and reused.**  Poisoning (NaN fill) is kept only
  where a read could observe it: a buffer whose first touch is a write of every element
  (proved by enumerating the writes' tiles) is not filled.
* **No per-instruction temporaries where numpy can write in place.**  Copies, memsets and
  elementwise ALU/activation instructions with an fp32 destination compute straight into
  the destination's memory (``out=``), which gives the same bits as computing and copying.

Everything else -- the order of rounding, which numpy call computes each value, the layout of
every array handed to BLAS or to a reduction -- is kept identical to the reference, because
bit-identical results depend on it (e.g. ``np.matmul`` takes another code path for a
non-BLAS-able layout, and a reduction's summation order follows the memory layout).
Instructions this package has no compiled form for run through the reference interpreter's
``exec_op``; that is always correct, only slower.

The modules, in the order a kernel goes through them: ``access`` (symbols, bounds, masks:
how code reaches memory), ``keys`` (numbered op structures, by which the plans and the
table remember decisions per kind of op), ``plan`` (poisoning, arena, forwarding, shadows),
``executors`` (the per-primitive table: generic, special code or the reference), ``codegen``
(the program's source), ``table`` (its table-driven form for large unrolled kernels) and
``runtime`` (what the program calls, and :class:`Program`).

``explain(kernel)`` returns the generated source, for debugging and for the curious.
"""

from __future__ import annotations

import threading

import numpy as np

from ... import dtypes
from ...collector import gc_paused
from ...ir.cache import KernelCache, op_count
from ...ir.core import Kernel
from .codegen import Compiler
from .runtime import Program

__all__ = ["simulate", "explain", "compile_kernel", "Program"]

# Compiled programs, keyed by id(kernel); the kernel is kept alive by its entry so the id
# cannot be reused while cached.  Bounded by the kernels' ops (``nkikit/ir/cache.py``): an
# unrolled kernel's program is hundreds of megabytes, and a test suite compiles hundreds.
_CACHE = KernelCache()
_LOCK = threading.Lock()
_BUILDING: dict[int, threading.Lock] = {}  # id(kernel) -> held while its program is built


def simulate(
    kernel: Kernel, args: list[np.ndarray], *, seed: int = 0, rank: int = 0, world=None
) -> list[np.ndarray]:
    """Run ``kernel`` on ``args`` (numpy arrays in the kernel's parameter dtypes) and return
    the output arrays; same contract and results as ``nkikit.sim.interp.simulate``."""
    prog = _cached(kernel)
    if prog is None and _has_device_loops(kernel):
        # run-time trip counts defeat the compile-time proofs (a loop may run 0 times):
        # the reference interpreter runs these kernels, which is bit-identical by definition
        from ..interp import Interpreter

        return Interpreter(kernel, seed=seed, rank=rank, world=world).run(args)
    return (prog or compile_kernel(kernel)).run(args, seed, rank, world)


def _has_device_loops(kernel: Kernel) -> bool:
    """Whether ``kernel`` has a loop with a run-time trip count (``Loop.device``)."""
    return kernel.census().device_loops


def _key(kernel: Kernel) -> tuple[int, bool]:
    # a program bakes in how each dtype is stored: one per storage mode (NKI_PRECISE_FP)
    return (id(kernel), dtypes.is_wide())


def _cached(kernel: Kernel) -> Program | None:
    with _LOCK:
        hit = _CACHE.get(_key(kernel))
    return hit[1] if hit is not None and hit[0] is kernel else None


def compile_kernel(kernel: Kernel) -> Program:
    """The compiled program for ``kernel`` (built on first use, then cached).  Programs are
    re-entrant (each run has its own memory), so threads may share them.  A program holds
    the storage of the moment (``dtypes.wide_storage``): it runs under the same one."""
    key = _key(kernel)
    prog = _cached(kernel)
    if prog is not None:
        return prog
    with _LOCK:
        building = _BUILDING.setdefault(key, threading.Lock())
    # the ranks of a multi-rank run (``sim/ranks.py``) ask at once: one builds, the rest wait
    with building:
        prog = _cached(kernel)
        if prog is not None:
            return prog
        try:
            with gc_paused():  # see nkikit/collector.py
                compiler = Compiler(kernel)
                prog = compiler.build()
                # its memos refer back to it (bound methods, closures): emptied, it and what it
                # holds (the kernel, per-op tables) are freed as soon as the program is dropped,
                # not when the cyclic collector next runs, which a large heap makes rare
                compiler.__dict__.clear()
            ops = op_count(kernel)
            with _LOCK:
                _CACHE.put(key, (kernel, prog), ops)
        finally:
            with _LOCK:
                _BUILDING.pop(key, None)
    return prog


def explain(kernel: Kernel) -> str:
    """The Python source the fast path runs for ``kernel``."""
    return compile_kernel(kernel).source
