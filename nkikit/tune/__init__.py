"""Autotuning with the cost model, and sweeps of independent tasks run locally or on Ray.

* :func:`autotune` (``nki.autotune`` in both dialects): choose a kernel's meta-parameters per
  argument shape by modeling every config on the target (``nkikit.tune.autotune``), with
  pruning by the verifier, an optional numeric check, a disk cache and a report.
* :class:`Sweep` of :class:`Task` (``nkikit.tune.sweep``): an autotuning grid, a benchmark grid
  or a test matrix as JSON data, content-addressed, run by ``Sweep.run(backend="local" |
  "ray")`` with the same results, retries and a result store (``nkikit.tune.ray_backend``).
* Task functions for the sweeps nkikit itself runs: ``nkikit.tune.tasks``.
* Where results are cached on disk: ``nkikit.tune.cache``.
"""

from .autotune import Autotuner, autotune, space
from .report import Candidate, TuneReport
from .sweep import Result, Results, Sweep, Task, execute

__all__ = [
    "Autotuner",
    "Candidate",
    "Result",
    "Results",
    "Sweep",
    "Task",
    "TuneReport",
    "autotune",
    "execute",
    "space",
]
