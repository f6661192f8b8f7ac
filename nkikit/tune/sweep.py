"""Sweeps as data: a list of independent tasks, each a function named by its import path and
JSON inputs, run locally or on a Ray cluster (``nkikit.tune.ray_backend``) with the same results.

A :class:`Task` is ``fn`` (``"package.module:function"``) and ``inputs`` (a JSON object passed
as keyword arguments).  Its ``id`` is the sha256 of its canonical JSON: the same task always has
the same id, on every machine, so results can be stored, shared and reused by id.  An autotuning
search (one task per config), a benchmark grid (one per shape) and a test matrix (one per case)
are all sweeps.

A task's function returns a JSON-serializable value.  :func:`execute` runs one task and turns
its outcome into a :class:`Result`: the value (normalized through JSON, so a tuple comes back as
a list on every backend) or, after ``retries`` more attempts, the last exception's type and
message.  Retries are for failures that can pass on another try (a lost file system, a worker
out of memory); a deterministic failure fails every attempt and is reported once.

With a ``store`` folder every result is written as soon as it arrives (atomically, one file per
task id): a sweep whose driver dies loses nothing already finished, and running it again only
runs the tasks that have no result yet.
"""

from __future__ import annotations

import importlib
import json
import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .cache import JsonStore, canonical_json, digest

Runner = Callable[[list["Task"], int, Callable[["Result"], None]], None]


@dataclass(frozen=True)
class Task:
    """One unit of a sweep: call ``fn`` (``"module:qualname"``) with ``**inputs``."""

    fn: str
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        module, sep, name = self.fn.partition(":")
        if not sep or not module or not name:
            raise ValueError(f"a task's fn is 'package.module:function', got {self.fn!r}")
        # JSON round trip: the inputs a task runs with are exactly those its id hashes
        object.__setattr__(self, "inputs", json.loads(canonical_json(dict(self.inputs))))

    @property
    def id(self) -> str:
        """The task's content address: sha256 of ``{"fn": ..., "inputs": ...}`` (hex)."""
        return digest(self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {"fn": self.fn, "inputs": self.inputs}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Task:
        return cls(d["fn"], d.get("inputs", {}))

    def function(self) -> Callable[..., Any]:
        """The function ``fn`` names, imported."""
        return import_ref(self.fn)


def import_ref(ref: str) -> Any:
    """The object ``"package.module:name"`` (or ``module:Class.attr``) names, imported."""
    module, _, name = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Result:
    """What became of one task: ``status`` is ``"ok"`` (``value`` holds its return value) or
    ``"error"`` (``error`` holds ``"ExceptionType: message"`` of the last attempt)."""

    task_id: str
    fn: str
    status: str
    value: Any = None
    error: str | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Result:
        return cls(**{k: d[k] for k in ("task_id", "fn", "status", "value", "error", "attempts")})


def execute(task: Task, retries: int = 0) -> Result:
    """Run ``task`` in this process, trying up to ``1 + retries`` times; never raises for a
    failure of the task itself (an unimportable ``fn`` is a failure of the task too)."""
    error = ""
    for attempt in range(1, retries + 2):
        try:
            value = task.function()(**task.inputs)
            value = json.loads(canonical_json(value))
            return Result(task.id, task.fn, "ok", value, None, attempt)
        except Exception as e:  # noqa: BLE001 - the task's failure is its result
            last = traceback.extract_tb(e.__traceback__)[-1:] or None
            where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
            error = f"{type(e).__name__}: {e}{where}"
    return Result(task.id, task.fn, "error", None, error, retries + 1)


def execute_json(task: dict[str, Any], retries: int = 0) -> dict[str, Any]:
    """:func:`execute` on a task and a result as JSON objects: what a remote worker runs."""
    return execute(Task.from_json(task), retries).to_json()


class Results(Mapping[str, Result]):
    """The results of a sweep by task id, in the order of its tasks."""

    def __init__(self, tasks: list[Task], results: Mapping[str, Result]) -> None:
        self._order = [t.id for t in tasks if t.id in results]
        self._results = dict(results)

    def __getitem__(self, task_id: str) -> Result:
        return self._results[task_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def values_by_id(self) -> dict[str, Any]:
        """``{task id: value}`` of the tasks that succeeded: what two backends must agree on."""
        return {i: r.value for i, r in self.items() if r.ok}

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.values() if not r.ok]

    def to_json(self) -> list[dict[str, Any]]:
        return [self[i].to_json() for i in self]


class Sweep:
    """An ordered list of distinct tasks (a task given twice runs once)."""

    def __init__(self, tasks: Iterable[Task], name: str = "sweep") -> None:
        seen: dict[str, Task] = {}
        for t in tasks:
            seen.setdefault(t.id, t)
        self.tasks = list(seen.values())
        self.name = name

    def __len__(self) -> int:
        return len(self.tasks)

    @classmethod
    def grid(cls, fn: str, name: str = "sweep", **axes: Iterable[Any]) -> Sweep:
        """One task per point of the product of ``axes`` (each an iterable of input values)."""
        import itertools

        keys = list(axes)
        points = itertools.product(*(list(axes[k]) for k in keys))
        return cls((Task(fn, dict(zip(keys, p))) for p in points), name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "tasks": [t.to_json() for t in self.tasks]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Sweep:
        return cls((Task.from_json(t) for t in d["tasks"]), d.get("name", "sweep"))

    def run(
        self,
        backend: str = "local",
        *,
        retries: int = 1,
        store: str | os.PathLike | None = None,
        progress: bool = True,
        **options: Any,
    ) -> Results:
        """Run every task without a stored result and return all results.

        ``backend``: ``"local"`` (this process, one task after another) or ``"ray"`` (a Ray
        cluster: ``options`` go to :func:`nkikit.tune.ray_backend.run_ray`, e.g. ``address``,
        ``num_cpus``).  ``retries``: further attempts of a task that raised.  ``store``: a
        folder keeping one result file per task id; tasks already in it are not run again.
        ``progress``: a rich progress bar on the terminal."""
        runner = _runner(backend, options)
        kept = JsonStore(store) if store is not None else None
        done: dict[str, Result] = {}
        pending: list[Task] = []
        for t in self.tasks:
            stored = kept.get(t.id) if kept is not None else None
            if stored is not None and stored.get("status") == "ok":
                done[t.id] = Result.from_json(stored)
            else:
                pending.append(t)

        with _Progress(self.name, len(self.tasks), len(done), progress) as bar:

            def record(r: Result) -> None:
                done[r.task_id] = r
                if kept is not None:
                    kept.put(r.task_id, r.to_json())
                bar.advance(r)

            if pending:
                runner(pending, retries, record)
        return Results(self.tasks, done)


def run_local(tasks: list[Task], retries: int, record: Callable[[Result], None]) -> None:
    """The local backend: each task in this process, in order."""
    for t in tasks:
        record(execute(t, retries))


def _runner(backend: str, options: dict[str, Any]) -> Runner:
    if backend == "local":
        if options:
            raise TypeError(f"the local backend takes no options, got {sorted(options)}")
        return run_local
    if backend == "ray":
        from .ray_backend import run_ray

        return lambda tasks, retries, record: run_ray(tasks, retries, record, **options)
    raise ValueError(f"unknown sweep backend {backend!r}; expected 'local' or 'ray'")


class _Progress:
    """A rich progress bar (or nothing, when disabled): tasks done, failures so far."""

    def __init__(self, name: str, total: int, done: int, enabled: bool) -> None:
        self.enabled = enabled
        self.name, self.total, self.done, self.failed = name, total, done, 0

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[failed]} failed"),
                TimeElapsedColumn(),
            )
            self.bar.start()
            self.id = self.bar.add_task(self.name, total=self.total, completed=self.done, failed=0)
        return self

    def advance(self, r: Result) -> None:
        self.failed += not r.ok
        if self.enabled:
            self.bar.update(self.id, advance=1, failed=self.failed)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()
