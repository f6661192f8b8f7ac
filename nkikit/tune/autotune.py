"""``nki.autotune``: pick a kernel's meta-parameters with the cost model, without hardware.

In the style of ``triton.autotune``: the decorator goes above ``@nki.jit`` (either dialect),
each config is a dict of meta-parameters passed to the kernel as keyword arguments, and ``key``
names the arguments whose shapes and dtypes (or values, for non-array arguments) the choice
depends on::

    @nki.autotune(configs=nki.tune.space(block_m=[1, 2, 4], block_n=[1, 2, 4]), key=["a", "b"])
    @nki.jit
    def matmul(a, b, block_m=2, block_n=2): ...

    out = matmul(a, b)          # tunes once per key, then runs the winner on the simulator
    print(matmul.report)        # every config: modeled time, or the rule that pruned it

A call with a key not seen yet runs the search:

1. each config is traced and verified for the target; one that breaks a hardware rule
   (a tile over the partition limit, SBUF or PSUM over capacity, ...) is pruned with the
   NKI error's name before anything is compiled or modeled;
2. the rest are compiled and modeled (``build_program(ir, target).profile().total_us``) and
   ranked, fastest first (ties: the earlier config);
3. with a ``reference``, candidates are simulated best-first and compared with it until one
   matches (``rtol``/``atol``, default: the output dtype's tolerance); those that do not are
   reported as ``wrong``;
4. the winner is cached in memory and on disk (``<cache>/autotune``, see
   :mod:`nkikit.tune.cache`) under the kernel's source (its module file), the key, the target,
   the configs and nkikit's version: a later process with the same kernel reuses it without
   searching.  Any change to one of these is a different entry.

If every config fails, the first config's error is raised (an ``NkiError`` names the rule and
the kernel's own line), with the other configs' outcomes as notes.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import as_numpy, spec_of
from ..compiler.build import build_program
from ..compiler.program import Program
from ..errors import NkiError, hide_internal_frames
from ..profiler.model import Profile
from ..targets import Target, get_target
from ..trace.jit import JitKernel, run
from .cache import JsonStore, cache_root, digest
from .report import Candidate, TuneReport


def space(**axes: Iterable[Any]) -> list[dict[str, Any]]:
    """Every combination of the given meta-parameter values, as configs (last axis fastest):
    ``space(bm=[1, 2], bn=[1, 2])`` is ``[{bm:1, bn:1}, {bm:1, bn:2}, {bm:2, bn:1}, ...]``."""
    names = list(axes)
    return [dict(zip(names, p)) for p in itertools.product(*(list(axes[n]) for n in names))]


def kernel_source_digest(kernel: JitKernel) -> str:
    """sha256 of the source the kernel's results depend on: its module file (so helpers it
    calls count), else its own source, else its bytecode."""
    func = inspect.unwrap(kernel.func)
    try:
        text = inspect.getsource(inspect.getmodule(func))  # type: ignore[arg-type]
    except (OSError, TypeError):
        try:
            text = inspect.getsource(func)
        except (OSError, TypeError):
            text = func.__code__.co_code.hex()
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _key_value(v: object) -> object:
    spec = spec_of(v)
    if spec is not None:
        from .. import dtypes

        return {"shape": list(spec[0]), "dtype": dtypes.name(dtypes.as_dtype(spec[1]))}
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    return repr(v)


def default_cache() -> JsonStore:
    """The on-disk autotuning cache: ``<nkikit cache>/autotune``."""
    return JsonStore(cache_root() / "autotune")


@dataclass
class _Settings:
    configs: list[dict[str, Any]]
    key: list[str] | None
    target: str | Target | None
    reference: Callable[..., Any] | None
    rtol: float | None
    atol: float | None
    prune: Callable[[list[dict[str, Any]], dict[str, Any]], list[dict[str, Any]]] | None
    cache: JsonStore | None


class Autotuner:
    """A jitted kernel whose meta-parameters are chosen per key by :func:`autotune`.

    Call it like the kernel (without the tuned meta-parameters) to run the winner on the
    simulator; index it with a grid like the kernel.  ``tune(*args)`` searches (or reads the
    cache) and returns the :class:`TuneReport`; ``best_config(*args)`` returns the winner;
    ``report`` is the report of the last search or cache hit."""

    def __init__(self, kernel: JitKernel, settings: _Settings, memo: dict | None = None) -> None:
        self.kernel = kernel
        self.settings = settings
        self._memo: dict[tuple, TuneReport] = {} if memo is None else memo
        self.report: TuneReport | None = None
        self.__name__ = getattr(kernel, "__name__", "kernel")
        self.__doc__ = getattr(kernel, "__doc__", None)
        self.__wrapped__ = kernel

    def __repr__(self) -> str:
        return f"<nki.autotune of {self.kernel!r}, {len(self.settings.configs)} configs>"

    def __getitem__(self, grid) -> Autotuner:
        return Autotuner(self.kernel[grid], self.settings, self._memo)

    @property
    def configs(self) -> list[dict[str, Any]]:
        return self.settings.configs

    # -- the key --------------------------------------------------------------------------------
    def _target(self) -> Target:
        t = self.settings.target
        return get_target(t if t is not None else self.kernel.default_target())

    def key_of(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The values a choice depends on: the ``key`` arguments' shapes and dtypes (or values),
        every argument when ``key`` is None, plus the launch grid and the target."""
        bound = self.kernel.bind(args, kwargs)
        names = self.settings.key if self.settings.key is not None else list(bound.arguments)
        missing = [n for n in names if n not in bound.arguments]
        if missing:
            raise TypeError(f"{self.__name__}: autotune key names unknown arguments {missing}")
        return {
            "args": {n: _key_value(bound.arguments[n]) for n in names},
            "grid": list(self.kernel.grid),
            "target": self._target().name,
        }

    def _disk_key(self, key: dict[str, Any]) -> str:
        from .. import __version__

        return digest(
            {
                "kernel": f"{self.kernel.func.__module__}.{self.kernel.func.__qualname__}",
                "dialect": self.kernel.dialect,
                "source": kernel_source_digest(self.kernel),
                "key": key,
                "configs": [{k: _key_value(v) for k, v in c.items()} for c in self.configs],
                "checked": self.settings.reference is not None,
                "nkikit": __version__,
            }
        )

    # -- the search -----------------------------------------------------------------------------
    def _check_kwargs(self, kwargs: dict[str, Any]) -> None:
        tuned = {k for c in self.configs for k in c}
        clash = sorted(tuned & set(kwargs))
        if clash:
            raise TypeError(
                f"{self.__name__}: {clash} are chosen by nki.autotune; do not pass them"
            )

    def tune(self, *args: Any, force: bool = False, **kwargs: Any) -> TuneReport:
        """The report for these arguments: from memory, else from the disk cache, else by a
        search (``force=True`` searches even when a result is cached, and re-caches it)."""
        self._check_kwargs(kwargs)
        key = self.key_of(*args, **kwargs)
        memo_key = json.dumps(key, sort_keys=True)
        if not force and memo_key in self._memo:
            self.report = self._memo[memo_key]
            return self.report
        disk = self.settings.cache
        dkey = self._disk_key(key)
        stored = disk.get(dkey) if disk is not None and not force else None
        report = (
            TuneReport.from_json(stored, self._winner_profile(args, kwargs)) if stored else None
        )
        if report is None:
            report = self._search(key, args, kwargs)
            if disk is not None:
                disk.put(dkey, report.to_json())
        self._memo[memo_key] = self.report = report
        return report

    def best_config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The winning config for these arguments (tuning if needed)."""
        return dict(self.tune(*args, **kwargs).best)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        config = self.best_config(*args, **kwargs)
        return self.kernel(*args, **kwargs, **config)

    def _winner_profile(self, args: tuple, kwargs: dict) -> Callable[[dict[str, Any]], Profile]:
        """A function modeling a config again: a report read from disk profiles its winner
        only when asked (``report.profile``)."""
        target = self._target()

        def profile(config: dict[str, Any]) -> Profile:
            ir, _ = self.kernel.specialize_for(target.name, *args, **kwargs, **config)
            return build_program(ir, target).profile()

        return profile

    def _search(self, key: dict[str, Any], args: tuple, kwargs: dict) -> TuneReport:
        target = self._target()
        configs = [dict(c) for c in self.configs]
        allowed = configs
        if self.settings.prune is not None:
            named = dict(self.kernel.bind(args, kwargs).arguments)
            allowed = list(self.settings.prune([dict(c) for c in configs], named))
        candidates: list[Candidate] = []
        programs: dict[int, Program] = {}
        errors: list[BaseException] = []
        for i, config in enumerate(configs):
            if config not in allowed:
                candidates.append(Candidate(i, config, "pruned", rule="prune_configs_by"))
                continue
            cand, program, error = evaluate(self.kernel, target, args, kwargs, i, config)
            candidates.append(cand)
            if program is not None:
                programs[i] = program
            if error is not None:
                errors.append(error)
        ranked = sorted(
            (c for c in candidates if c.status == "ok"), key=lambda c: (c.total_us, c.index)
        )
        winner = None
        if self.settings.reference is not None and ranked:
            winner = self._first_correct(ranked, target, args, kwargs)
        elif ranked:
            winner = ranked[0]
        if winner is None:
            self._fail(candidates, errors)
        report = TuneReport(
            kernel=self.__name__,
            key=key,
            candidates=candidates,
            best_index=winner.index,
            profile=programs[winner.index].profile(),
        )
        return report

    def _first_correct(
        self, ranked: list[Candidate], target: Target, args: tuple, kwargs: dict
    ) -> Candidate | None:
        from ..arrays import TensorSpec

        if any(isinstance(v, TensorSpec) for v in (*args, *kwargs.values())):
            raise TypeError(
                f"{self.__name__}: nki.autotune(reference=...) checks configs on the simulator, "
                "which needs arrays; call it with arrays, not nt.tensor specs"
            )
        expected = _flatten(self.settings.reference(*args, **kwargs))
        for cand in ranked:
            ir, bound = self.kernel.specialize_for(target.name, *args, **kwargs, **cand.config)
            # the kernel may write its arguments: each candidate runs on fresh copies
            for name, v in bound.arguments.items():
                if spec_of(v) is not None:
                    bound.arguments[name] = np.array(as_numpy(v, spec_of(v)[1]), copy=True)
            got = _flatten(run(ir, bound))
            worst = _mismatch(got, expected, self.settings.rtol, self.settings.atol)
            if worst is None:
                cand.checked = True
                return cand
            cand.status, cand.rule, cand.detail = "wrong", "numerics", worst
        return None

    def _fail(self, candidates: list[Candidate], errors: list[BaseException]) -> None:
        lines = [f"config {c.config}: {c.status} ({c.rule}: {c.detail})" for c in candidates]
        if errors:
            first = errors[0]
            first.add_note(f"nki.autotune of {self.__name__}: no config works:")
            for line in lines:
                first.add_note("  " + line)
            raise hide_internal_frames(first) from None
        raise ValueError(f"nki.autotune of {self.__name__}: no config works:\n" + "\n".join(lines))


def evaluate(
    kernel: JitKernel,
    target: Target,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    index: int,
    config: Mapping[str, Any],
) -> tuple[Candidate, Program | None, BaseException | None]:
    """Trace, verify, compile and model ``kernel`` with one config: the candidate, its
    program (None unless it ran) and the exception that stopped it (None if it ran).

    Trace and verify come first, so a config breaking a hardware rule costs no compile."""
    config = dict(config)
    stage = "verify"
    try:
        ir, _ = kernel.specialize_for(target.name, *args, **kwargs, **config)
        stage = "compile"
        program = build_program(ir, target)
        total_us = program.profile().total_us
    except NkiError as e:
        where = f"{e.loc.file}:{e.loc.line}" if e.loc.line else ""
        cand = Candidate(index, config, "pruned", rule=e.name, detail=where, stage=stage)
        return cand, None, e
    except Exception as e:  # noqa: BLE001 - e.g. an assert in the kernel on its meta-parameters
        cand = Candidate(index, config, "error", rule=type(e).__name__, detail=str(e), stage=stage)
        return cand, None, e
    return Candidate(index, config, "ok", total_us=total_us), program, None


def _flatten(x: Any) -> list[np.ndarray]:
    if isinstance(x, tuple | list):
        return [a for v in x for a in _flatten(v)]
    if isinstance(x, dict):
        return [a for v in x.values() for a in _flatten(v)]
    if x is None:
        return []
    spec = spec_of(x)
    return [as_numpy(x, spec[1]) if spec is not None else np.asarray(x)]


def _mismatch(
    got: list[np.ndarray], expected: list[np.ndarray], rtol: float | None, atol: float | None
) -> str | None:
    """None when every output is close to the reference's, else what is wrong."""
    from ..testing.tolerances import tolerance

    if len(got) != len(expected):
        return f"{len(got)} outputs, the reference returned {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        if g.shape != e.shape:
            return f"output {i} has shape {g.shape}, the reference {e.shape}"
        tol = tolerance(g.dtype, "matmul")
        rt = tol.rtol if rtol is None else rtol
        at = tol.atol if atol is None else atol
        g64, e64 = g.astype(np.float64), e.astype(np.float64)
        bad = ~np.isclose(g64, e64, rtol=rt, atol=at, equal_nan=True)
        if bad.any():
            err = np.abs(g64 - e64)[bad]
            return f"output {i}: {int(bad.sum())} elements off, max error {float(err.max()):.3g}"
    return None


def autotune(
    configs: Sequence[Mapping[str, Any]],
    key: Sequence[str] | None = None,
    *,
    target: str | Target | None = None,
    reference: Callable[..., Any] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    prune_configs_by: Callable[..., list[dict[str, Any]]] | None = None,
    cache: bool | str | JsonStore = True,
) -> Callable[[JitKernel], Autotuner]:
    """Decorate an ``@nki.jit`` kernel (of either dialect) to choose its meta-parameters.

    ``configs``: dicts of keyword arguments to try (``space(...)`` builds a grid); ``{}`` is
    the kernel's own defaults.  ``key``: names of the arguments the choice depends on (None:
    all of them).  ``target``: the target to model (default: ``NEURON_PLATFORM_TARGET_OVERRIDE``
    or trn2, read at each call).  ``reference``: a function of the kernel's arguments returning
    the expected output(s); the winner must match it on the simulator (``rtol``/``atol``,
    default: the output dtype's tolerance for matmul-like error).  ``prune_configs_by``:
    ``f(configs, named_args) -> configs`` drops configs before they are traced.  ``cache``:
    True (the default folder), False (memory only) or a folder.
    """
    configs = [dict(c) for c in configs]
    if not configs:
        raise ValueError("nki.autotune needs at least one config")
    if cache is True:
        store: JsonStore | None = default_cache()
    elif cache is False:
        store = None
    elif isinstance(cache, JsonStore):
        store = cache
    else:
        store = JsonStore(cache)
    settings = _Settings(
        configs,
        None if key is None else list(key),
        target,
        reference,
        rtol,
        atol,
        prune_configs_by,
        store,
    )

    def wrap(kernel: JitKernel) -> Autotuner:
        if not isinstance(kernel, JitKernel):
            raise TypeError(
                "nki.autotune decorates an @nki.jit kernel: put @nki.autotune(...) above @nki.jit"
            )
        return Autotuner(kernel, settings)

    return wrap
