"""The launch being traced: grid, this program's id, HBM shared between programs, and the
points where programs meet (``sendrecv``, ``core_barrier``).

An NKI 0.x kernel launched on ``n`` logical cores (``kernel[n]``) is traced once per program,
with ``nl.program_id()`` a plain int, into one IR kernel.  The programs are traced in
lockstep: program 0 runs until it reaches a meeting point (or its end), then program 1, ...;
when every program waits at the same meeting point, its instructions are emitted (a
``sendrecv`` becomes each program's DMA from its peer's source) and program 0 goes on.  The
IR body is that interleaving, a serial order the hardware's cores could have run in, so the
simulator needs nothing special.  A device loop (a run-time trip count) is entered and left
by all programs together, as one IR loop (``device_loops.py``), so that meeting points inside
it interleave per iteration.  Programs must allocate the same ``shared_hbm`` tensors in
the same order and meet at the same points (the hardware requires identical control flow on
both cores); a program that ends while another waits is an error.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from collections.abc import Callable

import numpy as np

from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.core import Tensor
from ..trace.builder import Builder, tracing

_local = threading.local()


def launch() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(grid, program id) of the program being traced; ``((), ())`` outside a launch."""
    return getattr(_local, "launch", None) or ((), ())


def launched() -> bool:
    """Whether a kernel is being traced in this thread (its launch is then known)."""
    return getattr(_local, "launch", None) is not None


# HBM the programs of a launch share.  `nl.hbm` too: NKI 0.2 (the NKI Library of early 2026)
# compiled an `nl.hbm` tensor of an LNC=2 kernel as one tensor both cores write (its one
# `nl.hbm` kernel, experimental/conv/depthwise_conv1d.py, returns it from an LNC=2 launch);
# since 0.3 the name is an alias of `private_hbm` and returning it is an error [nki-0x.md,
# memory regions and kernel outputs].
# `private_hbm` is per program.
_SHARED = ("shared_hbm", "hbm")


def allocate_hbm(
    b: Builder, shape: tuple[int, ...], dtype: np.dtype, buffer: str, name: str, loc: SourceLoc
) -> Tensor:
    """A new HBM tensor, or (in a later program of the launch) program 0's matching one."""
    shared: list[Tensor] = b.__dict__.setdefault("_nki_shared_hbm", [])
    grid, pid = launch()
    if buffer in _SHARED and grid and any(pid):
        cursors = b.__dict__.setdefault("_nki_hbm_cursor", {})
        k = cursors.get(pid, 0)
        cursors[pid] = k + 1
        if k >= len(shared) or shared[k].shape != shape or shared[k].dtype != dtype:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nl.ndarray",
                why=(
                    "every program of a launch must allocate the same shared_hbm (and hbm) tensors in the "
                    "same order (cores run identical control flow)"
                ),
            )
        return shared[k]
    t = Tensor(
        b.unique(name) if name else b.name_for(loc, "hbm"),
        shape,
        dtype,
        buffer,
        kind="hbm",
        loc=loc,
    )
    b.tensors.append(t)
    if buffer in _SHARED:
        shared.append(t)
    return t


class _Lockstep:
    """Turn-taking between the programs' tracing threads: exactly one runs at a time."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cv = threading.Condition()
        self.turn = 0
        self.finished: set[int] = set()
        self.arrived: dict[int, tuple[str, object, SourceLoc]] = {}
        self.error: BaseException | None = None

    def _next(self, after: int) -> int | None:
        for k in list(range(after + 1, self.n)) + list(range(0, after + 1)):
            if k not in self.finished and k not in self.arrived:
                return k
        return None

    def wait_turn(self, k: int) -> None:
        while self.turn != k and self.error is None:
            self.cv.wait()
        if self.error is not None and self.turn != k:
            raise _Abort()

    def meet(self, k: int, kind: str, payload: object, loc: SourceLoc, complete) -> None:
        """Program ``k`` waits at a meeting point; the last to arrive emits it."""
        with self.cv:
            self.arrived[k] = (kind, payload, loc)
            alive = [j for j in range(self.n) if j not in self.finished]
            if all(j in self.arrived for j in alive):
                kinds = {a[0] for a in self.arrived.values()}
                if kinds != {kind} or len(alive) != self.n:
                    raise NkiError(
                        "err_invalid_argument",
                        loc,
                        op=f"nisa.{kind}",
                        why=(
                            "the programs of the launch meet at different instructions "
                            f"({', '.join(sorted(kinds))}); every core must run the same "
                            "sequence of sendrecv / core_barrier"
                        ),
                    )
                payloads = {j: a[1] for j, a in sorted(self.arrived.items())}
                self.arrived.clear()
                complete(payloads)
                self.turn = 0
            else:
                nxt = self._next(k)
                assert nxt is not None
                self.turn = nxt
            self.cv.notify_all()
            self.wait_turn(k)

    def finish(self, k: int) -> None:
        with self.cv:
            self.finished.add(k)
            if self.arrived and self.error is None:
                waiting = next(iter(self.arrived.values()))
                nxt = self._next(k)
                if nxt is None:
                    self.error = NkiError(
                        "err_invalid_argument",
                        waiting[2],
                        op=f"nisa.{waiting[0]}",
                        why=(
                            f"program {k} of the launch ended while another waits here; every "
                            "core must run the same sequence of sendrecv / core_barrier"
                        ),
                    )
                else:
                    self.turn = nxt
            else:
                nxt = self._next(k)
                if nxt is not None:
                    self.turn = nxt
            self.cv.notify_all()


class _Abort(Exception):
    """Another program failed: this one stops tracing."""


def programs(grid: tuple[int, ...]) -> list[tuple[int, ...]]:
    if not grid:
        return [()]
    return list(itertools.product(*(range(g) for g in grid)))


def trace_programs(b: Builder, grid: tuple[int, ...], fn: Callable[[], object]) -> list[object]:
    """Run ``fn`` once per program of the launch (in lockstep when there are several) with
    ``b`` collecting the IR; returns each program's result."""
    pids = programs(grid)
    if len(pids) == 1:
        _local.launch = (grid, pids[0])
        try:
            with tracing(b):
                return [fn()]
        finally:
            _local.launch = None
    step = _Lockstep(len(pids))
    results: list[object] = [None] * len(pids)
    errors: list[BaseException | None] = [None] * len(pids)

    def body(k: int) -> None:
        _local.launch = (grid, pids[k])
        _local.lockstep = (step, k)
        try:
            with step.cv:
                step.wait_turn(k)
            with tracing(b):
                results[k] = fn()
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors[k] = e
            with step.cv:
                if step.error is None:
                    step.error = e
                step.cv.notify_all()
        finally:
            step.finish(k)
            _local.launch = None
            _local.lockstep = None

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(body, k), daemon=True)
        for k in range(len(pids))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = step.error or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def in_lockstep() -> bool:
    """Whether the program being traced is one of several traced in lockstep."""
    return getattr(_local, "lockstep", None) is not None


def meet(kind: str, payload: object, complete, loc: SourceLoc | None = None) -> None:
    """Called by ``sendrecv`` / ``core_barrier``: wait for every program of the launch to
    reach this point; ``complete(payloads)`` (payload per program) emits its instructions."""
    loc = loc or caller_loc()
    state = getattr(_local, "lockstep", None)
    if state is None:
        grid, _ = launch()
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{kind}",
            why=f"needs a launch on 2 logical cores (kernel[2]); this launch has grid {grid or '()'}",
        )
    step, k = state
    step.meet(k, kind, payload, loc, complete)
