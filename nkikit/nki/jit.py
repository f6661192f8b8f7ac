"""``@nki.jit`` for NKI 0.x: the Beta-1 jit machinery (specialization cache, verification,
simulation, torch/numpy conversion) with this dialect's argument proxies and return values.

A kernel is traced with Python (NKI 0.7 semantics): loops unroll, ``nl.program_id()`` is an
int, and a launch on ``n`` logical cores traces the function once per program into one IR
kernel (see ``nkikit.nki.launch``).
"""

from __future__ import annotations

import inspect
import math
import os

import numpy as np

from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.core import Alloc, Kernel, Loop, Op, Tensor
from ..targets import target_scope as _target_scope
from ..trace.builder import Builder, maybe_current, tracing
from ..trace.jit import JitKernel
from ..trace.reroll import reroll
from .isa.registers import check_closed
from .launch import trace_programs
from .tensor import NkiTensor, _layout_alias

_MAX_PROGRAMS = 1024


def precise_fp() -> bool:
    """``NKI_PRECISE_FP`` as AWS's simulator reads it [reference/nki-0x.md §6.1]: unset or
    ``1`` (the default since NKI 0.4) stores bf16 and fp8 tensors rounded to their dtype;
    ``0`` holds them as unrounded fp32 (outputs of those dtypes come back as float32).
    Read at every call; any other value is a ``ValueError`` naming the variable."""
    value = os.environ.get("NKI_PRECISE_FP", "").strip()
    if value in ("", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(
        f"NKI_PRECISE_FP={value!r}: expected 1 (the default: bf16 and fp8 tensors rounded "
        "to their dtype) or 0 (held as unrounded fp32)"
    )


class Kernel0x(JitKernel):
    """A kernel decorated with ``nkikit.nki.jit``: call it with numpy arrays or CPU torch
    tensors to run it on the simulator; ``kernel[n]`` launches it on ``n`` logical cores."""

    dialect = "nki-0.x"
    # AWS's 0.x simulator traces for the machine's Neuron chip, else for trn3 [reference/
    # nki-0x.md §6.4]: a kernel written for NC-v4 runs as written
    default_target_fallback = "trn3"

    def __getitem__(self, grid) -> Kernel0x:
        if not isinstance(grid, tuple):
            grid = (grid,)
        if not all(
            isinstance(g, int | np.integer) and not isinstance(g, bool) and g >= 1 for g in grid
        ):
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="kernel[grid]",
                why=f"the launch grid is positive ints, got {grid!r}",
            )
        grid = tuple(int(g) for g in grid)
        if math.prod(grid) > _MAX_PROGRAMS:
            # every program is traced in a thread of its own, in lockstep
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="kernel[grid]",
                why=f"a launch of {math.prod(grid)} programs; NKI launches 1 or 2 logical cores "
                f"and nkikit traces at most {_MAX_PROGRAMS}",
            )
        if len(grid) == 1 and grid[0] == 1:
            grid = ()
        k = Kernel0x(self.func, grid, self.options, self._cache)
        k.schedule = getattr(self, "schedule", ())
        return k

    def with_schedule(self, schedule) -> Kernel0x:
        """NKI's extra scheduling edges, ``[(after, before_or_list_of_befores), ...]`` between
        instructions labelled ``name=``: checked for form at the caller's line, kept on the
        returned kernel as ``schedule`` (pairs ``(after, before)``).  They change no result:
        the simulator already runs the instructions in program order, as ``depends_on``."""
        loc = caller_loc()
        edges: list[tuple[str, str]] = []
        items = list(schedule) if isinstance(schedule, list | tuple) else None
        for pair in items or ():
            ok = isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)
            before = pair[1] if ok else None
            befores = [before] if isinstance(before, str) else before
            if not (ok and isinstance(befores, list | tuple) and befores) or not all(
                isinstance(b, str) for b in befores
            ):
                items = None
                break
            edges += [(pair[0], b) for b in befores]
        if items is None:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="with_schedule",
                why=f"expected a list of (name, name or list of names) pairs, got {schedule!r}",
            )
        k = Kernel0x(self.func, self.grid, self.options, self._cache)
        k.schedule = (*getattr(self, "schedule", ()), *edges)
        return k

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        if maybe_current() is not None:
            # a jitted kernel called from inside another kernel is a sub-kernel: traced inline,
            # on the caller's program (NKI 0.7 specializes nested jit calls the same way)
            return self.func(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def _precise_fp(self) -> bool:
        return precise_fp()

    def verify(self, kernel: Kernel, target: str) -> None:
        """Verify; a kernel whose automatically placed PSUM tensors do not fit PSUM together
        first has them placed where the compiler would (:mod:`nkikit.language.eviction`, with
        finished accumulations evicted whole: the Neuron compiler spills what exceeds PSUM to
        the next tier [reference/nki.md §2.1], and AWS's simulator checks no capacity
        [reference/nki-0x.md §6.5]) and is verified again.  Kernels that fit pay nothing.
        A kernel whose steps were folded into loops (``trace/reroll.py``) keeps them folded
        when the verifier takes it so; otherwise it is verified (and evicted) as traced."""
        from ..language.eviction import evict_oversized_psum
        from ..targets import get_target

        as_traced = kernel.facts.pop(_AS_TRACED, None)
        if as_traced is not None:
            # steps folded into loops (``trace/reroll.py``): used when the verifier takes them
            # as they are; otherwise the steps as traced decide (and are evicted from PSUM if
            # need be), so folding never changes a verdict or its message
            try:
                super().verify(kernel, target)
                return
            except NkiError:
                kernel.body, kernel.tensors = as_traced
                kernel.facts.clear()
        try:
            super().verify(kernel, target)
        except NkiError as e:
            if e.name != "err_psum_total_capacity_exceeded":
                raise
            if not evict_oversized_psum(kernel, get_target(target), phased=True):
                raise
            super().verify(kernel, target)

    def _prepare_prefix(self, prefix: Kernel) -> None:
        # an input the prefix writes is written by the whole kernel too: mutable (as below)
        _mark_written_inputs(prefix.params, prefix.body)

    def _trace(self, bound: inspect.BoundArguments, target: str | None = None) -> Kernel:
        code = self.func.__code__
        loc = SourceLoc(code.co_filename, code.co_firstlineno, self.func.__name__)
        b = Builder(self.func.__name__, ())
        call_args, params = self._parameters(b, bound, loc, NkiTensor.whole)
        b.concrete = self._concrete(bound, params, target)
        with _target_scope(target):
            results = trace_programs(b, self.grid, lambda: self.call_with(call_args))
        check_closed(b)
        outputs: list[Tensor] = []
        _mark_written_inputs(params, b.body)

        def collect(r):
            if r is None:
                return None
            if isinstance(r, NkiTensor):
                t = r.tensor
                if not t.is_hbm or t.kind not in ("hbm", "output", "input"):
                    raise NkiError(
                        "err_invalid_argument",
                        loc,
                        op="return",
                        why=f"the kernel returns {t.name!r} ({t.buffer}); return HBM tensors created with nl.ndarray(..., buffer=nl.shared_hbm)",
                    )
                if t.root.buffer == "private_hbm" and len(results) > 1:
                    # each program of the launch has its own: no one tensor holds the result
                    raise NkiError(
                        "err_invalid_argument",
                        loc,
                        op="return",
                        why=f"the kernel returns {t.name!r}, private to each of its "
                        f"{len(results)} programs; return an nl.shared_hbm tensor",
                    )
                if t.kind == "input":
                    # a kernel that writes an input in place may return it (the NKI Library's
                    # in-place kernels do); it comes back as one of the results
                    t.mutable = True
                    if t not in outputs:
                        outputs.append(t)
                    return outputs.index(t)
                if r.shape != t.shape:
                    if not (r.offset == 0 and r.is_contiguous() and r.size == math.prod(t.shape)):
                        raise NkiError(
                            "err_invalid_argument",
                            loc,
                            op="return",
                            why="a returned tensor must be a whole nl.ndarray (or a reshape of one)",
                        )
                    t = _layout_alias(t, r.shape)
                t.kind = "output"
                if t.root is not t:
                    t.root.kind = "output"
                if t not in outputs:
                    outputs.append(t)
                return outputs.index(t)
            if isinstance(r, tuple | list):
                return type(r)(collect(x) for x in r)
            if isinstance(r, dict):
                return {k: collect(x) for k, x in r.items()}
            raise NkiError(
                "err_invalid_argument", loc, op="return", why=f"cannot return a {type(r).__name__}"
            )

        with tracing(b):  # a returned reshape becomes an IR tensor of this kernel
            structure = collect(results[0])
            for other in results[1:]:
                collect(other)  # every program returns the same shared tensors
        body, tensors = reroll(b.body, b.tensors)
        kernel = Kernel(
            self.func.__name__,
            params,
            outputs,
            body,
            (),
            loc,
            tensors,
            structure,
            "nki-0.x",
            tuple(sorted(b.unlaunched_program_ids)),
        )
        if body is not b.body:  # kept until verified: the verifier may want the steps
            kernel.facts[_AS_TRACED] = (b.body, b.tensors)
        return kernel


def _mark_written_inputs(params: list[Tensor], body: list) -> None:
    """NKI 0.x kernels may write their inputs in place (the simulator updates the caller's
    array): an input that ``body`` writes is mutable."""
    written = _written(body, set())
    for t in params:
        if t.uid in written:
            t.mutable = True


def _written(body: list, uids: set[int]) -> set[int]:
    """``uids`` plus the uids of the storage roots the ops of ``body`` (and of its loops)
    write."""
    for s in body:
        if type(s) is Op:
            for o in s.outs:
                t = o.tensor
                uids.add(t.uid if t.base is None else t.root.uid)
        elif type(s) is Alloc:
            continue
        elif isinstance(s, Loop):
            _written(s.body, uids)
        elif isinstance(s, Op):
            for o in s.outs:
                uids.add(o.tensor.root.uid)
    return uids


_AS_TRACED = "as_traced"  # Kernel.facts: the steps a folded kernel was traced as, until verified

_COMPILER_OPTIONS = (
    "platform_target",
    "debug_kernel",
    "show_compiler_tb",
    "additional_compile_opt",
    "experimental_flags",
    "enable_out_of_bound_check",
)


def jit(fn=None, *, mode=None, compile_config=None, specialization_config=None, **kwargs):
    """Decorate an NKI 0.x kernel: ``@nki.jit`` or ``@nki.jit(...)``.  ``mode`` and the 0.7
    configs are accepted and have no effect on simulation; ``platform_target=`` is ignored,
    as in NKI 0.2 (the target comes from ``NEURON_PLATFORM_TARGET_OVERRIDE``)."""
    # options of the Neuron compiler and its debugging aids: they change how a kernel is
    # compiled or reported, not what it computes.  NKI 0.3 rejects platform_target= (the NKI
    # Library of early 2026 still passes it); the target being traced for comes from
    # NEURON_PLATFORM_TARGET_OVERRIDE / NKI_NC_VERSION.
    for option in _COMPILER_OPTIONS:
        kwargs.pop(option, None)
    if kwargs:
        raise TypeError(f"nki.jit() got an unexpected keyword argument {next(iter(kwargs))!r}")
    if fn is None:
        return lambda f: jit(f, mode=mode)
    if isinstance(fn, Kernel0x):
        return fn
    if isinstance(fn, JitKernel):
        return Kernel0x(fn.func)
    return Kernel0x(fn)
