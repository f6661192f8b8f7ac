"""A Python error raised in a kernel's own code shows the user's frames (nkikit's behind
NKIKIT_FULL_TRACEBACK=1, as for NkiErrors); the testing helpers hide their frames from pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl

PACKAGE = str(Path(nki.__file__).resolve().parent)


@nki.jit
def misspelled(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.exponential(nl.load(x)))  # nl.exp
    return out


def _nkikit_frames(e: BaseException) -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(PACKAGE)]


def test_a_python_error_in_a_kernel_shows_the_users_frames(monkeypatch):
    monkeypatch.delenv("NKIKIT_FULL_TRACEBACK", raising=False)
    with pytest.raises(AttributeError, match="exponential") as info:
        misspelled(np.ones((128, 4), np.float32))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename == __file__ and "nl.exponential" in frames[-1].line
    # only the frame that re-raises it (the call itself) is nkikit's
    assert [f.name for f in _nkikit_frames(info.value)] == ["__call__"]


def test_full_traceback_on_request(monkeypatch):
    monkeypatch.setenv("NKIKIT_FULL_TRACEBACK", "1")
    with pytest.raises(AttributeError) as info:
        misspelled(np.ones((128, 8), np.float32))  # a new specialization: traced again
    assert len(_nkikit_frames(info.value)) > 1


def test_a_failing_check_kernel_hides_its_frames_from_pytest(tmp_path: Path):
    (tmp_path / "test_wrong.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            import nkikit as nki
            import nkikit.language as nl
            from nkikit.testing import check_kernel

            @nki.jit
            def double(x):
                out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
                nl.store(out, value=nl.multiply(nl.load(x), 2.0))
                return out

            def test_wrong_reference():
                check_kernel(double, lambda x: 3 * x, np.ones((128, 4), np.float32))
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(Path(PACKAGE).parent)}
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1
    assert "check_kernel(double, lambda x: 3 * x" in p.stdout  # the user's line
    assert "nkikit/testing" not in p.stdout  # none of the helper's source
    assert "1 failed" in p.stdout
