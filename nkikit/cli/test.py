"""``nkikit test [PATH ...] [PYTEST OPTIONS]``: run kernel tests with pytest.

Everything after ``test`` goes to pytest as written (``-k``, ``-x``, ``--lf``, paths, ...),
so the command parses nothing itself. Without a path it tests the kernel folder in the current
directory (one with a kernel.toml), else ``./kernels``, else the library in this checkout.
The run always ends with pytest's summary line ("3 passed in 1.2s"), even under ``-qq``.
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


def cmd_test(ns: argparse.Namespace) -> int:
    import pytest

    args = list(ns.rest)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return int(pytest.main([*default_paths(args), *args], plugins=[_SummaryLine()]))
