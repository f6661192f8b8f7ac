"""Public entry points: ``compile``, ``profile_kernel``, NKI's ``benchmark`` / ``profile``
decorators answered from the cost model, and the ``nkikit profile`` command line.

Arguments may be numpy arrays (or CPU torch tensors) or abstract ``nt.tensor[shape, dtype]``
specs; only the shapes and dtypes matter to the compiler.  Decorated kernels called with
real arrays also run the simulator and return its outputs (like ``nki.baremetal``); called
with abstract specs they return None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import NkiError, hide_internal_frames
from ..language.jit import jit
from ..profiler.model import Profile
from ..targets import Target, get_target
from ..trace.jit import JitKernel, run
from ..typing import TensorSpec
from .build import build_program
from .program import Program

__all__ = ["compile", "profile_kernel", "benchmark", "profile", "BenchmarkResult"]

PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)


def _jit(kernel: Any) -> JitKernel:
    if isinstance(kernel, JitKernel):
        return kernel
    if isinstance(kernel, _Decorated):
        return kernel.kernel
    if callable(kernel) and hasattr(kernel, "__code__"):  # a Python function: traced as one
        return jit(kernel)
    raise TypeError(f"expected an @nki.jit kernel or a function, got {type(kernel).__name__}")


def compile(kernel: Any, *args: Any, target: str | Target | None = None, **kwargs: Any) -> Program:  # noqa: A001
    """Trace ``kernel`` for these arguments (arrays or ``nt.tensor`` specs), allocate, lower and
    schedule it for ``target`` (default: ``NEURON_PLATFORM_TARGET_OVERRIDE``, else the
    kernel's dialect's: trn2 for Beta 1, trn3 for NKI 0.x)."""
    try:
        jk = _jit(kernel)
        tgt = get_target(target if target is not None else jk.default_target())
        ir, _ = jk.specialize_for(tgt.name, *args, **kwargs)
        return build_program(ir, tgt)
    except NkiError as e:
        raise hide_internal_frames(e) from None


def profile_kernel(
    kernel: Any, *args: Any, target: str | Target | None = None, **kwargs: Any
) -> Profile:
    """``compile(...).profile()``: the modeled timeline and summary metrics of one call."""
    return compile(kernel, *args, target=target, **kwargs).profile()


# ---------------------------------------------------------------------------------------------
# NKI decorators


class LatencyResult:
    """``nc_latency`` of a benchmark: every percentile is the modeled latency in µs (the model
    is deterministic, so there is no spread)."""

    def __init__(self, latency_us: float) -> None:
        self.latency_us = float(latency_us)

    def get_latency_percentile(self, percentile: float) -> float:
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        return self.latency_us

    def __repr__(self) -> str:
        return f"LatencyResult({self.latency_us:.3f} us)"


class BenchmarkResult:
    """What ``fn.benchmark_result`` holds after a call: ``nc_latency`` (µs), plus the
    :class:`Program` and :class:`~nkikit.profiler.Profile` it came from."""

    def __init__(self, program: Program, warmup: int, iters: int) -> None:
        self.program = program
        self.nc_latency = LatencyResult(program.total_us)
        self.warmup = warmup
        self.iters = iters

    @property
    def total_us(self) -> float:
        return self.nc_latency.latency_us

    def __repr__(self) -> str:
        return f"BenchmarkResult(kernel={self.program.kernel!r}, target={self.program.target.name!r}, latency_us={self.total_us:.3f})"


class _Decorated:
    """A kernel wrapped by ``nki.benchmark`` or ``nki.profile``."""

    def __init__(self, kernel: Any, target: str | Target | None) -> None:
        self.kernel = _jit(kernel)
        self.target = target
        self.program: Program | None = None
        self.__name__ = getattr(self.kernel, "__name__", "kernel")
        self.__doc__ = getattr(self.kernel, "__doc__", None)

    def __getitem__(self, grid) -> _Decorated:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.kernel = self.kernel[grid]
        return clone

    def _compile_and_maybe_run(self, args: tuple, kwargs: dict) -> Any:
        try:
            tgt = get_target(
                self.target if self.target is not None else self.kernel.default_target()
            )
            ir, bound = self.kernel.specialize_for(tgt.name, *args, **kwargs)
            self.program = build_program(ir, tgt)
            self._after_compile()
            if any(isinstance(v, TensorSpec) for v in bound.arguments.values()):
                return None
            return run(ir, bound)
        except NkiError as e:
            raise hide_internal_frames(e) from None

    def _after_compile(self) -> None:
        """Hook for subclasses: record what they report from ``self.program``."""


class BenchmarkKernel(_Decorated):
    """``nki.benchmark(...)(kernel)``: calling it models the kernel and sets
    ``benchmark_result.nc_latency.get_latency_percentile(p)`` (µs)."""

    def __init__(
        self,
        kernel: Any,
        *,
        warmup: int,
        iters: int,
        save_neff_name: str | None,
        save_trace_name: str | None,
        additional_compile_opt: str | None,
        target: str | Target | None,
    ) -> None:
        super().__init__(kernel, target)
        self.warmup, self.iters = int(warmup), int(iters)
        self.save_neff_name = save_neff_name
        self.save_trace_name = save_trace_name
        self.additional_compile_opt = additional_compile_opt
        self.benchmark_result: BenchmarkResult | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return self._compile_and_maybe_run(args, kwargs)

    def _after_compile(self) -> None:
        assert self.program is not None
        self.benchmark_result = BenchmarkResult(self.program, self.warmup, self.iters)
        # There is no NEFF or NTFF: the Program JSON stands in for the NEFF, a Perfetto
        # trace for the NTFF.
        if self.save_neff_name:
            self.program.to_json(self.save_neff_name)
        if self.save_trace_name:
            self.program.profile().to_perfetto(self.save_trace_name)


class ProfileKernel(_Decorated):
    """``nki.profile(working_directory=...)(kernel)``: calling it writes the Perfetto trace,
    the HTML report, a JSON summary and the Program JSON into ``working_directory``."""

    def __init__(
        self,
        kernel: Any,
        *,
        working_directory: str | os.PathLike,
        save_neff_name: str,
        save_trace_name: str,
        overwrite: bool,
        profile_nth: int,
        target: str | Target | None,
        options: dict[str, Any],
    ) -> None:
        super().__init__(kernel, target)
        self.working_directory = Path(working_directory)
        self.save_neff_name = save_neff_name
        self.save_trace_name = save_trace_name
        self.overwrite = overwrite
        self.profile_nth = profile_nth
        self.options = options
        self.profile_result: Profile | None = None
        self.output_files: dict[str, Path] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return self._compile_and_maybe_run(args, kwargs)

    def _after_compile(self) -> None:
        assert self.program is not None
        self.profile_result = self.program.profile()
        self.output_files = write_profile_artifacts(
            self.program,
            self.profile_result,
            self.working_directory,
            trace_name=self.save_trace_name,
            neff_name=self.save_neff_name,
            overwrite=self.overwrite,
        )


def benchmark(
    func: Callable | None = None,
    *,
    warmup: int = 10,
    iters: int = 100,
    save_neff_name: str | None = None,
    save_trace_name: str | None = None,
    additional_compile_opt: str | None = None,
    target: str | Target | None = None,
):
    """NKI's ``nki.benchmark``: ``nki.benchmark(warmup=5, iters=10)(kernel)`` or
    ``nki.benchmark(kernel, ...)``.  ``warmup``/``iters`` are accepted and recorded; the
    modeled latency has no run-to-run variation."""

    def wrap(f: Callable) -> BenchmarkKernel:
        return BenchmarkKernel(
            f,
            warmup=warmup,
            iters=iters,
            save_neff_name=save_neff_name,
            save_trace_name=save_trace_name,
            additional_compile_opt=additional_compile_opt,
            target=target,
        )

    return wrap(func) if func is not None else wrap


def profile(
    func: Callable | None = None,
    *,
    working_directory: str | os.PathLike | None = None,
    save_neff_name: str = "file.neff",
    save_trace_name: str = "profile.ntff",
    additional_compile_opt: str | None = None,
    overwrite: bool = False,
    profile_nth: int = 1,
    target: str | Target | None = None,
    **kw: Any,
):
    """NKI's ``nki.profile``: writes the profile of each call into ``working_directory``
    (required): ``<trace stem>.json`` (Perfetto), ``<trace stem>.html`` (report),
    ``<trace stem>_summary.json`` and ``<neff stem>.program.json``."""
    if working_directory is None:
        raise TypeError(
            "nki.profile() needs working_directory=, the folder to write the profile into"
        )

    def wrap(f: Callable) -> ProfileKernel:
        return ProfileKernel(
            f,
            working_directory=working_directory,
            save_neff_name=save_neff_name,
            save_trace_name=save_trace_name,
            overwrite=overwrite,
            profile_nth=profile_nth,
            target=target,
            options={"additional_compile_opt": additional_compile_opt, **kw},
        )

    return wrap(func) if func is not None else wrap


def _json_default(x: Any) -> Any:
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def write_profile_artifacts(
    program: Program,
    prof: Profile,
    directory: Path,
    *,
    trace_name: str = "profile.ntff",
    neff_name: str = "file.neff",
    overwrite: bool = True,
    html: bool = True,
) -> dict[str, Path]:
    """Write the Perfetto trace, HTML report, JSON summary, the profile itself (for ``nkikit
    compare``) and Program JSON into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = Path(trace_name).stem or "profile"
    files = {
        "perfetto": directory / f"{stem}.json",
        "profile": directory / f"{stem}.nkikit.json",  # for `nkikit compare`
        "summary": directory / f"{stem}_summary.json",
        "program": directory / f"{Path(neff_name).stem or 'kernel'}.program.json",
    }
    if html:
        files["html"] = directory / f"{stem}.html"
    if not overwrite:
        existing = [str(p) for p in files.values() if p.exists()]
        if existing:
            raise FileExistsError(
                f"profile artifacts already exist (pass overwrite=True to replace): {', '.join(existing)}"
            )
    prof.to_perfetto(files["perfetto"])
    prof.to_json(files["profile"])
    if html:
        prof.to_html(files["html"])
    files["summary"].write_text(
        json.dumps(prof.summary, indent=1, default=_json_default), encoding="utf-8"
    )
    program.to_json(files["program"])
    return files
