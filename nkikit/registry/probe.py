"""Run a kernel's functions once on their example shapes, as publishing needs to.

From one run per function, publishing learns what the manifest does not say (how many arrays
come back, single or tuple) and which `@nki.jit` kernels were launched with which arguments,
so the model card can show their modeled performance on each target (`nkikit.compiler`, when
installed). The probe imports a private copy of the built package, so recording the launches
(by swapping the module's jitted kernels for recording proxies) touches nothing anyone else uses.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BuildError
from .importer import forget, import_build
from .manifest import FunctionSpec, Manifest

PROFILE_TARGETS = ("trn1", "trn2")


@dataclass
class Launch:
    """One launch of an @nki.jit kernel during a probe."""

    kernel: Any
    args: tuple
    kwargs: dict


@dataclass
class FunctionProbe:
    """What running one function on its example showed."""

    outputs: int
    returns_tuple: bool
    launches: list[Launch] = field(default_factory=list)
    perf: list[dict[str, Any]] = field(default_factory=list)  # one row per target


class _Recorder:
    """Stands in for a jitted kernel in the probed module: records each launch, then runs it."""

    def __init__(self, kernel: Any, launches: list[Launch]):
        self._kernel = kernel
        self._launches = launches

    def __getitem__(self, grid: Any) -> _Recorder:
        return _Recorder(self._kernel[grid], self._launches)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._launches.append(Launch(self._kernel, args, kwargs))
        return self._kernel(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


def example_inputs(spec: FunctionSpec, dtype: str | None = None, seed: int = 0) -> list[np.ndarray]:
    """Random arrays of the manifest's example shapes for the variant `dtype` (default: the
    first listed), each input in its declared dtype and value range
    (`nkikit.testing.example_inputs`, at half scale)."""
    from ..testing.inputs import example_inputs as draw

    return draw(spec, dtype, seed, scale=0.5)


def _is_jit(obj: object) -> bool:
    return hasattr(obj, "specialize") and hasattr(obj, "func") and callable(obj)


def probe_build(
    root: Path, manifest: Manifest, *, profile: bool = True
) -> dict[str, FunctionProbe]:
    """Import the build folder `root` privately and run every function on its example.

    Raises BuildError naming the function when an entry cannot be imported or fails to run.
    """
    name = f"_nkikit_probe_{uuid.uuid4().hex[:12]}"
    package = import_build(name, root, digests=None, run_init=False)
    try:
        return {
            fname: _probe_function(package.__name__, spec, profile)
            for fname, spec in manifest.functions.items()
        }
    finally:
        forget(name)


def _probe_function(package: str, spec: FunctionSpec, profile: bool) -> FunctionProbe:
    import importlib

    try:
        module = importlib.import_module(f"{package}.{spec.entry.module}")
        entry: Callable[..., Any] = getattr(module, spec.entry.attr)
    except Exception as e:  # the author's module failing to import: report, don't crash
        raise BuildError(
            f"cannot import {spec.entry} of function {spec.name}: {type(e).__name__}: {e}"
        ) from e
    launches: list[Launch] = []
    if _is_jit(entry):
        entry = _Recorder(entry, launches)
    else:
        for attr, value in list(vars(module).items()):
            if _is_jit(value):
                setattr(module, attr, _Recorder(value, launches))
    try:
        result = entry(*example_inputs(spec), **spec.attrs)
    except Exception as e:
        raise BuildError(
            f"running {spec.name} on its example {dict(spec.example)} ({spec.dtypes[0]}) failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    if isinstance(result, tuple | list):
        probe = FunctionProbe(len(result), True, launches)
    else:
        probe = FunctionProbe(1, False, launches)
    if profile and launches:
        probe.perf = modeled_performance(launches)
    return probe


def modeled_performance(launches: list[Launch]) -> list[dict[str, Any]]:
    """Per target: modeled time (µs, summed over the launches) and the first launch's
    utilisation figures, from `nkikit.compiler.api.profile_kernel`. Empty when the compiler is
    not installed or cannot model these kernels (the card then says so)."""
    try:
        from nkikit.compiler.api import profile_kernel  # type: ignore[import-not-found]
    except Exception:  # the compiler is optional (and may be mid-development)
        return []
    rows = []
    for target in PROFILE_TARGETS:
        try:
            total = 0.0
            summary: dict[str, Any] = {}
            for i, launch in enumerate(launches):
                prof = profile_kernel(launch.kernel, *launch.args, target=target, **launch.kwargs)
                total += float(prof.total_us)
                if i == 0:
                    summary = dict(getattr(prof, "summary", {}) or {})
            rows.append(
                {
                    "target": target,
                    "total_us": total,
                    "mfu": summary.get("mfu"),
                    "mbu": summary.get("mbu"),
                    "launches": len(launches),
                }
            )
        except Exception:  # a target the model cannot handle: leave it out of the card
            continue
    return rows
