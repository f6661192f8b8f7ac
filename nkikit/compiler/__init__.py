"""The compiler: allocate SBUF/PSUM, lower IR ops to per-engine instructions, and schedule
them with a target's cost model.

Pipeline (one module per step): :mod:`.targets` (hardware tables) -> :mod:`.allocate`
(addresses, multi-buffering) -> :mod:`.lower` (the per-primitive table: engine, opcode,
cost, FLOPs) -> :mod:`.schedule` (dependencies and timing) -> :mod:`.program` (the result,
JSON, and the profiler's Profile).  :mod:`.api` holds the user-facing functions.

``import nkikit as nki`` makes this package NKI Beta-1's ``nki.compiler`` too: its names
(``sbuf``/``psum`` direct allocation, ``skip_middle_end_transformations``, ``no_reorder``, ...)
are defined with the Beta-1 dialect in :mod:`nkikit.language.compiler` and re-exported here.
"""

from ..language.compiler import (
    enable_stack_allocator,
    force_auto_alloc,
    multi_buffer,
    no_reorder,
    psum,
    sbuf,
    skip_middle_end_transformations,
)
from ..targets import TARGETS, Target, UnknownTargetError, default_target_name, get_target
from .api import BenchmarkResult, benchmark, compile, profile, profile_kernel
from .build import build_program
from .program import Program

__all__ = [
    # NKI Beta-1's nki.compiler (direct allocation, kernel decorators, loop directives)
    "enable_stack_allocator",
    "force_auto_alloc",
    "multi_buffer",
    "no_reorder",
    "psum",
    "sbuf",
    "skip_middle_end_transformations",
    # nkikit's compiler
    "TARGETS",
    "BenchmarkResult",
    "Program",
    "Target",
    "UnknownTargetError",
    "benchmark",
    "build_program",
    "compile",
    "default_target_name",
    "get_target",
    "profile",
    "profile_kernel",
]
