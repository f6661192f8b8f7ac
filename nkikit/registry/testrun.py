"""Run a kernel folder's own tests (pytest, in a subprocess) before it may be published.

A subprocess, because the tests import the kernel and register whatever they register; the
publishing process must stay clean, and a crash of the simulator must not take it down.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import KernelTestsFailedError

_COUNT_RE = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
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


def _parse_counts(output: str) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for line in reversed(output.splitlines()):
        found = _COUNT_RE.findall(line)
        if found and ("passed" in line or "failed" in line or "error" in line or "skipped" in line):
            for n, kind in found:
                key = "errors" if kind.startswith("error") else kind
                if key in counts:
                    counts[key] = int(n)
            return counts
    return counts


def _summary_line(output: str) -> str:
    for line in reversed(output.splitlines()):
        if _COUNT_RE.search(line):
            return line.strip("= ").strip()
    return ""


def run_kernel_tests(
    folder: str | Path, *, timeout: float = 1800, extra_args: tuple[str, ...] = ()
) -> TestReport:
    """Run `pytest <folder>` on the simulator in a fresh interpreter and return the report.

    Raises KernelTestsFailedError when a test fails or errors, when no test ran, or when the run
    times out; the error carries the tail of pytest's output.
    """
    folder = Path(folder).resolve()
    cmd = [sys.executable, "-m", "pytest", str(folder), "-q", "-p", "no:cacheprovider", *extra_args]
    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=folder.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = (
            (e.stdout or "")
            if isinstance(e.stdout, str)
            else (e.stdout or b"").decode(errors="replace")
        )
        raise KernelTestsFailedError(
            f"the tests of {folder.name} did not finish within {timeout:.0f} s; not publishing",
            output=_tail(out),
        ) from None
    duration = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    counts = _parse_counts(proc.stdout)
    report = TestReport(
        **counts,
        duration_s=duration,
        summary=_summary_line(proc.stdout),
        command=" ".join(["pytest", folder.name, *extra_args]),
    )
    if proc.returncode == 5 or (proc.returncode == 0 and report.passed == 0):
        raise KernelTestsFailedError(
            f"no tests ran for {folder.name} (pytest found none); a kernel needs passing tests "
            "to be published (or publish with run_tests=False / --no-tests)",
            output=_tail(output),
            returncode=proc.returncode,
        )
    if proc.returncode != 0 or not report.ok:
        what = report.summary or f"pytest exited with status {proc.returncode}"
        raise KernelTestsFailedError(
            f"the tests of {folder.name} failed ({what}); refusing to publish a failing kernel. "
            f"Run `pytest {folder}` to see why.\n--- last lines of the test output ---\n{_tail(output)}",
            output=_tail(output),
            returncode=proc.returncode,
        )
    return report


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_TAIL_LINES:])
