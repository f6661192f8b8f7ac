"""Several ranks running one kernel, meeting at its collectives.

A kernel with collectives (``prims.COLLECTIVES``) is one program that every rank of the
collective world runs on its own data: each rank has its own HBM, SBUF and PSUM (its own copy
of the arguments and every buffer) and its own ``rank_id``.  :func:`simulate_ranks` runs the
ranks concurrently, one thread each, on either simulator; a collective op is a rendezvous
(:class:`World`): each rank deposits its source tile and waits until every rank of its group
has, then computes its own result from all of them (``sim/collective_rules.py``).  Results are
deterministic: a rank's result depends on the deposited values in group order, never on the
order the threads arrive in.

The world's size is the highest rank any replica group of the kernel names, plus one; a kernel
without collectives is one rank (rank 0), so ``ncc.rank_id()`` reads 0 there.  Ranks meet at
an op by its identity and by how many times each has run it, so ranks whose control flow
diverges (a register-driven loop with rank-dependent trip counts around a collective) are
reported at the op's line instead of hanging.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import NkiError
from ..ir.core import Kernel, Op
from ..ir.prims import COLLECTIVES
from .blas import one_blas_thread
from .memory import reserve

Runner = Callable[..., list[np.ndarray]]


def world_size(kernel: Kernel) -> int:
    """How many ranks run ``kernel``: one more than the highest rank its collectives'
    replica groups (or permute pairs) name; 1 without collectives."""
    return kernel.derived("world_size", _world_size)


def _world_size(kernel: Kernel) -> int:
    if kernel.census().prims.isdisjoint(COLLECTIVES):
        return 1
    top = 0
    for op, _ in kernel.ops():
        if op.prim in COLLECTIVES:
            groups = op.attrs.get("groups") or op.attrs.get("pairs") or ()
            top = max([top, *(r for g in groups for r in g)])
    return top + 1


class _Abort(BaseException):  # noqa: N818 - a signal; past the simulators' `except Exception`
    """Another rank failed: this one stops."""


class World:
    """The rendezvous of ``size`` ranks.  ``exchange`` is called by a collective's rule."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.cv = threading.Condition()
        self.slots: dict[tuple, dict[int, np.ndarray]] = {}
        self.left: dict[tuple, int] = {}
        self.runs: list[dict[int, int]] = [{} for _ in range(size)]  # per rank: id(op) -> count
        self.finished: set[int] = set()
        self.waiting: dict[int, tuple[Op, int]] = {}  # rank -> (op, run) it waits at
        self.failed = False

    def exchange(
        self, rank: int, op: Op, value: np.ndarray, members: tuple[int, ...]
    ) -> dict[int, np.ndarray]:
        """Deposit ``value`` (copied: the rank goes on and may overwrite its memory) for this
        run of ``op`` and wait for every rank of ``members``; returns their values."""
        runs = self.runs[rank]
        n = runs.get(id(op), 0)
        runs[id(op)] = n + 1
        key = (id(op), n, members)
        with self.cv:
            slot = self.slots.setdefault(key, {})
            self.left.setdefault(key, len(members))
            slot[rank] = np.array(value)
            if len(slot) == len(members):
                for r in members:  # they are released, even if not yet awake
                    self.waiting.pop(r, None)
                self.cv.notify_all()
            while len(slot) < len(members):
                if self.failed:
                    raise _Abort()
                gone = [r for r in members if r not in slot and r in self.finished]
                if gone:
                    raise NkiError(
                        "err_invalid_argument",
                        op.loc,
                        op=f"ncc.{op.prim}",
                        why=f"rank {gone[0]} finished the kernel without reaching this "
                        f"collective (run {n + 1} of it on rank {rank}); every rank of "
                        f"group {list(members)} must run the same collectives",
                    )
                self.waiting[rank] = (op, n)
                if len(self.waiting) + len(self.finished) == self.size:
                    other = [w for w in self.waiting.values() if w != (op, n)]
                    raise NkiError(
                        "err_invalid_argument",
                        op.loc,
                        op=f"ncc.{op.prim}",
                        why=f"the ranks wait at different collectives (this one, and "
                        f"{other[0][0].prim} at line {other[0][0].loc.line}); every rank of "
                        f"group {list(members)} must run the same collectives in the same order"
                        if other
                        else f"group {list(members)} names ranks beyond the {self.size} "
                        "ranks being run",
                    )
                self.cv.wait()
            self.waiting.pop(rank, None)
            self.left[key] -= 1
            if not self.left[key]:
                del self.slots[key], self.left[key]
            return slot

    def finish(self, rank: int, failed: bool) -> None:
        with self.cv:
            self.finished.add(rank)
            self.failed = self.failed or failed
            self.cv.notify_all()


def simulate_ranks(
    kernel: Kernel,
    args_per_rank: Sequence[list[np.ndarray]],
    run: Runner,
    *,
    seed: int = 0,
) -> list[list[np.ndarray]]:
    """Run ``kernel`` as ranks ``0 .. len(args_per_rank) - 1``, rank ``r`` on
    ``args_per_rank[r]`` (written in place, as a single run writes its arguments), with
    ``run(kernel, args, seed=, rank=, world=)`` (a simulator's ``simulate``); returns every
    rank's outputs.  An error of any rank is raised (the lowest failing rank's)."""
    size = len(args_per_rank)
    if size < world_size(kernel):
        raise ValueError(
            f"{kernel.name}: its collectives name {world_size(kernel)} ranks; got inputs for {size}"
        )
    if size == 1:
        return [run(kernel, list(args_per_rank[0]), seed=seed, rank=0, world=None)]
    world = World(size)
    results: list[list[np.ndarray] | None] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(r: int) -> None:
        try:
            results[r] = run(kernel, list(args_per_rank[r]), seed=seed, rank=r, world=world)
        except _Abort:
            world.finish(r, False)
            return
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors[r] = e
            world.finish(r, True)
            return
        world.finish(r, False)

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(body, r), daemon=True)
        for r in range(size)
    ]
    # the caller's thread holds the one-BLAS-thread setting over the ranks' runs, so that
    # its exit, not a rank's, restores the count (see sim/blas.py)
    with one_blas_thread():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [r for r in results if r is not None]


def simulate_world(
    kernel: Kernel, args: list[np.ndarray], run: Runner, *, seed: int = 0
) -> list[np.ndarray]:
    """Every rank of ``kernel``'s world on the same arguments (the ranks other than 0 on
    copies of the ones the kernel writes); returns rank 0's outputs, rank 0 having written
    ``args`` in place.  This is how a call with one set of inputs runs a kernel with
    collectives: each rank holds the data the caller passed."""
    from . import written_params

    size = world_size(kernel)
    written = written_params(kernel)
    need = sum(a.nbytes for t, a in zip(kernel.params, args) if t.name in written)
    reserve(
        need * (size - 1), f"copies of the written arguments for {size - 1} more ranks", kernel.loc
    )
    copies = [
        [a.copy() if t.name in written else a for t, a in zip(kernel.params, args)]
        for _ in range(size - 1)
    ]
    return simulate_ranks(kernel, [args, *copies], run, seed=seed)[0]
