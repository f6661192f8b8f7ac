"""``nkikit test [PATH ...] [PYTEST OPTIONS]``: run kernel tests with pytest.

Everything after ``test`` goes to pytest as written (``-k``, ``-x``, ``--lf``, paths, ...),
so the command parses nothing itself. Without a path it tests the kernel folder in the current
directory (one with a kernel.toml), else ``./kernels``, else the library in this checkout.
The run always ends with pytest's summary line ("3 passed in 1.2s"), even under ``-qq``.

``--ray`` (a Ray cluster: ``--address``, else a local one of ``--num-cpus`` workers) or
``--sweep`` (here, one after another) run one pytest process per test file as the tasks of a
sweep (``nkikit.tune``); ``-m EXPR`` then selects the tests (default ``not slow``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "kernels"


def add_test(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "test",
        help="run kernel tests with pytest (pytest options pass through)",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="nkikit test [PATH ...] [PYTEST OPTIONS]",
    )
    p.set_defaults(fn=cmd_test, passthrough=1)


def default_paths(args: list[str]) -> list[str]:
    """The paths to test when ``args`` names none that exists."""
    if any(not a.startswith("-") and Path(a.split("::")[0]).exists() for a in args):
        return []
    if Path("kernel.toml").is_file():
        return ["."]
    if Path("kernels").is_dir():
        return ["kernels"]
    return [str(LIBRARY)] if LIBRARY.is_dir() else []


class _SummaryLine:
    """A pytest plugin that keeps the final summary line: it is printed at verbosity -1 and
    above, so ``-qq`` (or ``-q`` on top of a project's ``addopts = -q``) stops at -1."""

    def pytest_configure(self, config) -> None:  # noqa: ANN001
        if config.option.verbose < -1:
            config.option.verbose = -1


def _sweep_options(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """nkikit's own ``--ray``/``--sweep`` options, and the rest of the line for pytest."""
    p = argparse.ArgumentParser(prog="nkikit test", add_help=False)
    p.add_argument("--ray", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--address", default=None)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("-m", dest="markexpr", default="")
    return p.parse_known_args(args)


def _test_sweep(ns: argparse.Namespace, paths: list[str]) -> int:
    """One task per test file, each run by pytest in a fresh process, on Ray or here."""
    from ..tune.tasks import pytest_matrix

    sweep = pytest_matrix(paths, str(Path.cwd()), ns.markexpr or "not slow")
    options = {}
    if ns.ray:
        options = {"address": ns.address, "num_cpus": None if ns.address else ns.num_cpus}
    results = sweep.run("ray" if ns.ray else "local", retries=0, **options)
    failed = 0
    for r in results.values():
        ok = r.ok and r.value["exit_code"] in (0, 5)  # 5: nothing collected (all deselected)
        failed += not ok
        what = r.value["summary"] if r.ok else r.error
        files = ", ".join(r.value["files"]) if r.ok else r.task_id[:12]
        print(f"{'ok  ' if ok else 'FAIL'} {files}: {what}")
    print(f"{len(results) - failed} of {len(results)} test files passed")
    return 1 if failed else 0


def cmd_test(ns: argparse.Namespace) -> int:
    import pytest

    args = list(ns.rest)
    if "--ray" in args or "--sweep" in args:
        sweep, rest = _sweep_options(args)
        return _test_sweep(sweep, [a for a in rest if not a.startswith("-")] or default_paths(rest))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return int(pytest.main([*default_paths(args), *args], plugins=[_SummaryLine()]))
