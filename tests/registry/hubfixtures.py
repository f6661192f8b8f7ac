"""Shared fixtures for the registry and torch tests: a real hub on loopback, published kernels.

Everything goes through the real `huggingface_hub` client over HTTP to `nkikit.hub`; nothing is
mocked below the HTTP layer. Imported by tests/registry/conftest.py and tests/torch/conftest.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY = FIXTURES / "tiny_rmsnorm"
LIBRARY = REPO_ROOT / "kernels"

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from huggingface_hub import constants  # noqa: E402
from huggingface_hub.utils import disable_progress_bars  # noqa: E402

from nkikit.hub import running_hub  # noqa: E402
from nkikit.registry.publish import PublishResult, publish  # noqa: E402

disable_progress_bars()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, hub_url: str) -> None:
    """No stray token, offline flag or ./kernels.lock leaks into a test; the trust list is
    `nkikit` on the session's hub (trust is tied to an endpoint: the default trusts nkikit on
    the public Hub only)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("NKIKIT_TRUSTED_ORGS", f"nkikit@{hub_url}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="session", autouse=True)
def _trust_the_session_hub(hub_url: str) -> Iterator[None]:
    """The same trust list for session- and module-scoped fixtures, which pull before any
    function-scoped fixture has run."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NKIKIT_TRUSTED_ORGS", f"nkikit@{hub_url}")
    yield
    mp.undo()


@pytest.fixture(scope="session")
def hub_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An open (no token) hub on a free loopback port for the whole session, with `nkikit/*`
    writable (a served hub reserves it by default)."""
    with running_hub(tmp_path_factory.mktemp("hub"), reserved_namespaces=()) as url:
        yield url


@pytest.fixture(scope="session")
def tiny_repo(hub_url: str) -> PublishResult:
    """The fixture kernel (jitted entry + backward, tuple-returning function) as nkikit/tiny-rmsnorm v1."""
    return publish(TINY, "nkikit/tiny-rmsnorm", endpoint=hub_url, run_tests=False)


@pytest.fixture(scope="session")
def rmsnorm_repo(hub_url: str) -> PublishResult:
    """The library's rmsnorm as nkikit/rmsnorm v1."""
    return publish(LIBRARY / "rmsnorm", "nkikit/rmsnorm", endpoint=hub_url, run_tests=False)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache"


def copy_fixture(dest: Path, src: Path = TINY) -> Path:
    """A private copy of a kernel folder, to modify or to publish under test conditions."""
    target = dest / src.name
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


class HubProcess:
    """`python -m nkikit.hub` in a subprocess (killable), serving `root`."""

    def __init__(self, root: Path, *, env: dict[str, str] | None = None, token: str | None = None):
        cmd = [sys.executable, "-m", "nkikit.hub", "--root", str(root), "--port", "0"]
        cmd += ["--unreserve", "*"]  # the tests publish nkikit/* to it
        if token:
            cmd += ["--token", token]
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"(http://\S+)", line)
        if not m:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"hub subprocess did not start: {line!r} {err}")
        self.url = m.group(1)

    def wait_dead(self, timeout: float = 10) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.002) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False


@pytest.fixture(scope="session")
def library_repos(hub_url: str) -> dict[str, PublishResult]:
    """Every library kernel published as nkikit/<name> v1 (tests skipped: they run in CI)."""
    from nkikit.registry.publish import publish_all

    return {r.repo_id: r for r in publish_all(LIBRARY, "nkikit", endpoint=hub_url, run_tests=False)}
