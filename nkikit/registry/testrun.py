"""Run a kernel folder's own tests (pytest, in a subprocess) before it may be published.

A subprocess, because the tests import the kernel and register whatever they register; the
publishing process must stay clean, and a crash of the simulator must not take it down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import KernelTestsFailedError

_TAIL_LINES = 40


@dataclass(frozen=True)
class TestReport:
    """What the kernel's test run found: counts per outcome, duration and the summary line."""

    __test__ = False  # not a pytest test class, despite the name

    passed: int
    failed: int
    skipped: int
    errors: int
    duration_s: float
    summary: str
    command: str

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0 and self.passed > 0


def _read_junit(path: Path) -> dict[str, int] | None:
    """Outcome counts from pytest's JUnit XML report (independent of -q/-v and of plugins that
    change the terminal summary). None if pytest wrote no report."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in total:
            total[key] += int(suite.get(key, 0))
    return {
        "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
        "failed": total["failures"],
        "skipped": total["skipped"],
        "errors": total["errors"],
    }


def _summary(counts: dict[str, int]) -> str:
    parts = [f"{counts[k]} {k}" for k in ("failed", "passed", "skipped", "errors") if counts[k]]
    return ", ".join(parts) or "no tests"


def run_kernel_tests(
    folder: str | Path, *, timeout: float = 1800, extra_args: tuple[str, ...] = ()
) -> TestReport:
    """Run `pytest <folder>` on the simulator in a fresh interpreter and return the report.

    Raises KernelTestsFailedError when a test fails or errors, when no test ran, or when the run
    times out; the error carries the tail of pytest's output.
    """
    folder = Path(folder).resolve()
    with tempfile.TemporaryDirectory(prefix="nkikit-tests-") as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            str(folder),
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *extra_args,
        ]
        env = dict(os.environ)
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=folder.parent, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            out = (
                e.stdout.decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else (e.stdout or "")
            )
            raise KernelTestsFailedError(
                f"the tests of {folder.name} did not finish within {timeout:.0f} s; not publishing",
                output=_tail(out),
            ) from None
        duration = time.perf_counter() - start
        counts = _read_junit(report)
    output = proc.stdout + proc.stderr
    if counts is None:
        raise KernelTestsFailedError(
            f"the tests of {folder.name} could not run (pytest exited with status {proc.returncode}); "
            f"not publishing.\n--- last lines of the test output ---\n{_tail(output)}",
            output=_tail(output),
            returncode=proc.returncode,
        )
    report_ = TestReport(
        **counts,
        duration_s=duration,
        summary=_summary(counts),
        command=" ".join(["pytest", folder.name, *extra_args]),
    )
    return _judge(folder, report_, proc.returncode, output)


def _judge(folder: Path, report: TestReport, returncode: int, output: str) -> TestReport:
    """The report if the run may gate a publish; raises KernelTestsFailedError otherwise."""
    if returncode == 5 or (returncode == 0 and report.passed == 0):
        raise KernelTestsFailedError(
            f"no tests ran for {folder.name} (pytest found none); a kernel needs passing tests "
            "to be published (or publish with run_tests=False / --no-tests)",
            output=_tail(output),
            returncode=returncode,
        )
    if returncode != 0 or not report.ok:
        raise KernelTestsFailedError(
            f"the tests of {folder.name} failed ({report.summary}); refusing to publish a failing "
            f"kernel. Run `pytest {folder}` to see why.\n--- last lines of the test output ---\n"
            f"{_tail(output)}",
            output=_tail(output),
            returncode=returncode,
        )
    return report


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_TAIL_LINES:])
