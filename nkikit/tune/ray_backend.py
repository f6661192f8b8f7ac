"""The Ray backend of a sweep: each task runs as a Ray task on a cluster's workers.

Ray is an optional extra (``pip install 'nkikit[ray]'``).  ``run_ray`` uses the Ray runtime this
process is already connected to, or connects with ``ray.init(address=...)``: ``None`` starts a
local cluster on this machine (``num_cpus`` workers), ``"auto"`` or ``"ray://head:10001"`` joins
an existing one.  A runtime it started it shuts down again when the sweep ends.

Failures, and why nothing is lost:

* a task that raises is retried in the worker (:func:`nkikit.tune.sweep.execute`), exactly as
  the local backend retries it, so both backends give the same results;
* a worker process that dies (killed, out of memory, its node lost) takes its task with it:
  Ray runs the task again on another worker, up to ``worker_retries`` times (Ray's
  ``max_retries`` counts system failures only, never exceptions of the task), and after that
  the task's result says so instead of the sweep failing;
* every result is handed to the sweep as soon as it arrives (``ray.wait``), so a store folder
  keeps what finished even if the driver dies.

A local cluster's workers see this process's ``sys.path`` (passed as ``PYTHONPATH``), so a
task function importable here is importable there; on a real cluster, ship the code with a
``runtime_env`` (``{"working_dir": ".", "pip": [...]}``: see Ray's docs).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from .sweep import Result, Task, execute_json

RAY_MISSING = "the Ray backend needs ray: pip install 'nkikit[ray]' (or pip install ray)"


def ray_available() -> bool:
    """Whether ``import ray`` works here."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _local_runtime_env() -> dict[str, Any]:
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}


def run_ray(
    tasks: list[Task],
    retries: int,
    record: Callable[[Result], None],
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    object_store_memory: int | None = 200 * 1024**2,
    runtime_env: dict[str, Any] | None = None,
    worker_retries: int = 3,
    cpus_per_task: float = 1,
) -> None:
    """Run ``tasks`` on Ray and ``record`` each result as it arrives (in completion order).

    ``address``, ``num_cpus``, ``object_store_memory`` and ``runtime_env`` go to ``ray.init``
    when this process is not connected yet (``object_store_memory`` and ``num_cpus`` only for a
    local cluster; a local cluster's default ``runtime_env`` puts this process's ``sys.path``
    on its workers').  ``worker_retries``: runs of a task after its worker died.
    ``cpus_per_task``: the CPUs Ray reserves per task (how many run at once per node)."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None

    started = False
    if not ray.is_initialized():
        init: dict[str, Any] = {"address": address, "log_to_driver": False}
        if address is None:  # a local cluster: size it, and give its workers our imports
            init.update(
                num_cpus=num_cpus,
                object_store_memory=object_store_memory,
                include_dashboard=False,
                runtime_env=runtime_env if runtime_env is not None else _local_runtime_env(),
            )
        elif runtime_env is not None:
            init["runtime_env"] = runtime_env
        ray.init(**init)
        started = True
    try:
        remote = ray.remote(execute_json).options(
            max_retries=worker_retries, retry_exceptions=False, num_cpus=cpus_per_task
        )
        # keep the cluster busy without queuing the whole sweep in the driver's object store
        window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1) / cpus_per_task))
        queue = list(reversed(tasks))
        running: dict[Any, Task] = {}
        while queue or running:
            while queue and len(running) < window:
                t = queue.pop()
                running[remote.remote(t.to_json(), retries)] = t
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                t = running.pop(ref)
                try:
                    record(Result.from_json(ray.get(ref)))
                except ray.exceptions.RayError as e:  # the worker died more often than allowed
                    why = f"{type(e).__name__}: worker lost {worker_retries + 1} times"
                    record(Result(t.id, t.fn, "error", None, why, worker_retries + 1))
    finally:
        if started:
            ray.shutdown()
