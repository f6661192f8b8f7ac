"""Fixtures for the hub tests: a hub on loopback, the real huggingface_hub client, isolated caches.

Every test talks to the server over HTTP through `huggingface_hub` (HfApi, hf_hub_download,
snapshot_download, or its HTTP session for raw requests the high-level API refuses to make).
huggingface_hub reads its environment at import time, so the per-test isolation patches its
`constants` and passes `endpoint=` / `cache_dir=` explicitly everywhere.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants
from huggingface_hub.utils import disable_progress_bars

from nkikit.hub import running_hub

TOKEN = "nkikit-test-token"
disable_progress_bars()


@pytest.fixture(autouse=True)
def isolated_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HF_HOME per test, for this process (constants) and for subprocesses (env)."""
    home = tmp_path / "hf_home"
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "NKIKIT_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def hub_root(tmp_path: Path) -> Path:
    return tmp_path / "hub-root"


@pytest.fixture
def hub(hub_root: Path) -> Iterator[str]:
    """Base URL of an open hub (no token configured) serving `hub_root`."""
    with running_hub(hub_root) as url:
        yield url


@pytest.fixture
def api(hub: str) -> HfApi:
    return HfApi(endpoint=hub, token=TOKEN)


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[[dict[str, bytes | str]], Path]:
    """Write {relative path: content} into a fresh folder and return it."""
    counter = iter(range(1_000_000))

    def make(files: dict[str, bytes | str]) -> Path:
        folder = tmp_path / f"tree{next(counter)}"
        for rel, content in files.items():
            p = folder / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content.encode() if isinstance(content, str) else content)
        folder.mkdir(exist_ok=True)
        return folder

    return make


@pytest.fixture
def free_port() -> int:
    """A loopback port that was free a moment ago (for servers that must restart on one port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubProcess:
    """A hub server in its own process (for crash tests): `python -m nkikit.hub`."""

    def __init__(self, root: Path, log: Path, *, port: int = 0, env: dict[str, str] | None = None):
        cmd = [
            sys.executable,
            "-m",
            "nkikit.hub",
            "--root",
            str(root),
            "--port",
            str(port),
            "--verbose",
        ]
        self.log = log
        self._log_file = open(log, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env={**os.environ, **(env or {})},
        )
        self.url = self._read_url(timeout=30)

    def _read_url(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline().decode()
                if " at http" in line:
                    return line.rsplit(" at ", 1)[1].strip()
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"hub process did not start; log:\n{self.log.read_text()}")

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log_file.close()


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[Callable[..., HubProcess]]:
    """Factory starting hub subprocesses; all are killed at teardown."""
    started: list[HubProcess] = []

    def start(root: Path, *, port: int = 0, env: dict[str, str] | None = None) -> HubProcess:
        p = HubProcess(root, tmp_path / f"hub-process-{len(started)}.log", port=port, env=env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
