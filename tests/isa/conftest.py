"""Fixtures for the nisa tests: expect a kernel to be rejected at its ``# BAD`` line."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

import pytest

from nkikit.errors import NkiError


def bad_line(kernel) -> tuple[str, int]:
    """(file, line) of the one line of ``kernel`` marked ``# BAD``."""
    lines, start = inspect.getsourcelines(kernel.func)
    hits = [start + i for i, text in enumerate(lines) if "# BAD" in text]
    assert len(hits) == 1, f"{kernel.func.__name__} must mark exactly one line with # BAD"
    return os.path.abspath(inspect.getsourcefile(kernel.func)), hits[0]


@pytest.fixture
def rejects() -> Callable[..., NkiError]:
    """``rejects(kernel, name, *args)``: tracing ``kernel`` raises NKI error ``name`` (an
    instance of that entry's class) located at the kernel's ``# BAD`` line."""

    def check(kernel, name: str, *args, **kwargs) -> NkiError:
        with pytest.raises(NkiError) as info:
            kernel.ir(*args, **kwargs)
        err = info.value
        assert err.name == name, str(err)
        assert (os.path.abspath(err.loc.file), err.loc.line) == bad_line(kernel), str(err)
        return err

    return check


@pytest.fixture
def type_error_at_bad_line(monkeypatch: pytest.MonkeyPatch) -> Callable[..., TypeError]:
    """``type_error_at_bad_line(kernel, *args)``: calling ``kernel`` raises Python's own
    TypeError whose traceback ends at the ``# BAD`` line, through no nkikit frame but the
    one that re-raises it."""
    import nkikit

    monkeypatch.delenv("NKIKIT_FULL_TRACEBACK", raising=False)
    internal = os.path.dirname(os.path.abspath(nkikit.__file__)) + os.sep

    def check(kernel, *args) -> TypeError:
        with pytest.raises(TypeError) as info:
            kernel(*args)
        frames = []
        tb = info.value.__traceback__
        while tb is not None:
            frames.append((os.path.abspath(tb.tb_frame.f_code.co_filename), tb.tb_lineno))
            tb = tb.tb_next
        assert frames[-1] == bad_line(kernel), frames
        # nkikit's own frames are hidden, except the one that re-raises (as for an NkiError)
        inside = [f for f, _ in frames if f.startswith(internal)]
        assert [os.path.basename(f) for f in inside] == ["jit.py"], frames
        return info.value

    return check
