"""Run `nkikit` as a user types it: a subprocess of this checkout's `nkikit.cli`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def nkikit(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    """`nkikit ARGS` in a subprocess; returns the CompletedProcess (text, captured)."""
    full = {k: v for k, v in os.environ.items() if k != "NKIKIT_FULL_TRACEBACK"}
    full.update(env or {})
    # this checkout's nkikit first, then what the caller asked for
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "nkikit.cli", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )
