"""Task functions for the sweeps nkikit runs: JSON in, JSON out, importable by a worker.

* :func:`model_config`: one autotuning candidate (trace, verify, compile, model one config of
  a kernel on abstract arguments).  ``autotune_sweep`` builds the sweep of a whole search, so a
  search over many shapes x configs x targets can run on a cluster; ``report_from_results``
  turns its results back into a :class:`~nkikit.tune.report.TuneReport`.
* :func:`pytest_files`: one share of a test matrix, run by pytest in a fresh process;
  :func:`pytest_matrix` is a suite as a sweep (``nkikit test --ray``).

Array arguments travel as ``{"shape": [...], "dtype": "bfloat16"}`` (an abstract
``nt.tensor``: the cost model needs no data); any other JSON value is passed as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .sweep import Results, Sweep, Task, import_ref


def encode_arg(v: Any) -> Any:
    """A kernel argument as JSON: arrays and specs by shape and dtype, the rest as given."""
    from .. import dtypes
    from ..arrays import spec_of

    spec = spec_of(v)
    if spec is not None:
        return {"shape": list(spec[0]), "dtype": dtypes.name(dtypes.as_dtype(spec[1]))}
    return v


def decode_arg(v: Any) -> Any:
    """The inverse of :func:`encode_arg` (an array comes back as a ``TensorSpec``)."""
    from .. import dtypes
    from ..arrays import TensorSpec

    if isinstance(v, dict) and set(v) == {"shape", "dtype"}:
        return TensorSpec(tuple(v["shape"]), dtypes.as_dtype(v["dtype"]))
    return v


def _load_kernel(ref: str) -> Any:
    """The ``@nki.jit`` kernel ``ref`` names (the kernel of an autotuned one)."""
    from .autotune import Autotuner

    obj = import_ref(ref)
    return obj.kernel if isinstance(obj, Autotuner) else obj


def model_config(
    kernel: str,
    args: Sequence[Any],
    config: Mapping[str, Any],
    target: str = "trn2",
    kwargs: Mapping[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """Model ``kernel`` (``"module:name"`` of an ``@nki.jit`` kernel, or of an autotuned one)
    with ``config`` on ``target``: the candidate as JSON (status, modeled µs or the rule that
    pruned it)."""
    from ..targets import get_target
    from .autotune import evaluate

    jit_kernel = _load_kernel(kernel)
    call_args = [decode_arg(a) for a in args]
    call_kwargs = {k: decode_arg(v) for k, v in (kwargs or {}).items()}
    cand, _, _ = evaluate(jit_kernel, get_target(target), call_args, call_kwargs, index, config)
    return cand.to_json()


def autotune_sweep(
    kernel: str,
    args: Sequence[Any],
    configs: Sequence[Mapping[str, Any]],
    target: str = "trn2",
    kwargs: Mapping[str, Any] | None = None,
) -> Sweep:
    """The search of ``configs`` for one call of ``kernel`` as a sweep (one task per config)."""
    enc_args = [encode_arg(a) for a in args]
    enc_kwargs = {k: encode_arg(v) for k, v in (kwargs or {}).items()}
    tasks = [
        Task(
            "nkikit.tune.tasks:model_config",
            {
                "kernel": kernel,
                "args": enc_args,
                "config": dict(c),
                "target": target,
                "kwargs": enc_kwargs,
                "index": i,
            },
        )
        for i, c in enumerate(configs)
    ]
    return Sweep(tasks, name=f"autotune {kernel.rpartition(':')[2]}")


def report_from_results(sweep: Sweep, results: Results) -> Any:
    """The :class:`TuneReport` of an :func:`autotune_sweep` (the winner: the fastest config
    that ran; its profile is modeled again when asked for)."""
    from ..targets import get_target
    from .report import Candidate, TuneReport

    cands = []
    for t in sweep.tasks:
        r = results[t.id]
        if r.ok:
            cands.append(Candidate(**r.value))
        else:
            cands.append(Candidate(t.inputs["index"], t.inputs["config"], "error", detail=r.error))
    ok = [c for c in cands if c.status == "ok"]
    if not ok:
        raise ValueError("no config of the sweep ran: " + "; ".join(str(c.rule) for c in cands))
    best = min(ok, key=lambda c: (c.total_us, c.index))
    first = sweep.tasks[0].inputs
    target = get_target(first["target"])

    def modeler(config: dict[str, Any]):
        from ..compiler.build import build_program

        jit_kernel = _load_kernel(first["kernel"])
        args = [decode_arg(a) for a in first["args"]]
        kwargs = {k: decode_arg(v) for k, v in first["kwargs"].items()}
        ir, _ = jit_kernel.specialize_for(target.name, *args, **kwargs, **config)
        return build_program(ir, target).profile()

    key = {
        "args": {f"arg{i}": a for i, a in enumerate(first["args"])},
        "grid": [],
        "target": target.name,
    }
    name = first["kernel"].rpartition(":")[2]
    return TuneReport(name, key, cands, best.index, modeler)


def pytest_files(files: Sequence[str], rootdir: str, markexpr: str = "not slow") -> dict:
    """Run the tests in ``files`` (paths relative to ``rootdir``) with pytest in a fresh
    process (``-m markexpr``): the exit code and pytest's summary line."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markexpr]
    proc = subprocess.run(
        [*cmd, *files], cwd=rootdir, capture_output=True, text=True, env=dict(os.environ)
    )
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    return {
        "files": list(files),
        "exit_code": proc.returncode,
        "summary": lines[-1] if lines else "",
    }


def pytest_matrix(paths: Sequence[str], rootdir: str, markexpr: str = "not slow") -> Sweep:
    """A test suite as a sweep: one :func:`pytest_files` task per test file under ``paths``
    (files or folders, relative to ``rootdir`` or absolute)."""
    from pathlib import Path

    root = Path(rootdir).resolve()
    files: list[str] = []
    for p in paths:
        path = (root / p).resolve()
        found = sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
        # a file outside rootdir (the library, tested from any folder) keeps its absolute path
        files += [str(f.relative_to(root) if f.is_relative_to(root) else f) for f in found]
    tasks = [
        Task(
            "nkikit.tune.tasks:pytest_files",
            {"files": [f], "rootdir": str(root), "markexpr": markexpr},
        )
        for f in files
    ]
    return Sweep(tasks, name="tests")
