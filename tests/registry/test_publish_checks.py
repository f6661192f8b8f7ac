"""Publish checks what it can before running tests: the whole manifest (every problem at once,
each with file, table and key, entry names included) and the Hub (reachable, token accepted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hubfixtures import REPO_ROOT, copy_fixture

from nkikit.hub import running_hub
from nkikit.registry.errors import ManifestError, PublishError
from nkikit.registry.publish import publish

SENTINEL = "import pathlib\n\ndef test_sentinel():\n    pathlib.Path({path!r}).touch()\n"


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    folder = copy_fixture(tmp_path)
    ran = tmp_path / "tests-ran"
    (folder / "test_sentinel.py").write_text(SENTINEL.format(path=str(ran)))
    return folder, ran


def test_every_manifest_problem_is_reported_at_once_before_the_tests(hub_url, tmp_path):
    folder, ran = _folder(tmp_path)
    toml = folder / "kernel.toml"
    text = toml.read_text()
    text = text.replace('entry = "kernel:rmsnorm"', 'entry = "kernel:rmsnrm"')
    text = text.replace('reference = "reference:add_sub"', 'reference = "refs:add_sub"')
    text = text.replace('dtypes = ["float32"]', 'dtypes = ["float33"]')
    text = text.replace('license = "Apache-2.0"', 'license = ""')
    toml.write_text(text)
    with pytest.raises(ManifestError) as info:
        publish(folder, "nkikit/checked", endpoint=hub_url)
    problems = info.value.problems
    assert len(problems) == 4 and str(info.value).startswith("4 problems in the manifest:")
    assert all(p.startswith(str(toml)) for p in problems)
    joined = "\n".join(problems)
    assert "[kernel] license is required" in joined
    assert "[functions.add_sub]: unknown dtype(s) ['float33']" in joined
    assert (
        "[functions.rmsnorm] entry = 'kernel:rmsnrm': kernel.py defines no 'rmsnrm'; "
        "did you mean 'rmsnorm'?" in joined
    )
    assert "[functions.add_sub] reference = 'refs:add_sub' refers to module 'refs'" in joined
    assert not ran.exists()


def test_an_unreachable_hub_is_reported_before_the_tests(tmp_path):
    folder, ran = _folder(tmp_path)
    with pytest.raises(PublishError, match="reach the Hub: the Hub could not be reached"):
        publish(folder, "nkikit/checked", endpoint="http://127.0.0.1:9")
    assert not ran.exists()


def test_a_refused_token_is_reported_before_the_tests(tmp_path):
    folder, ran = _folder(tmp_path)
    with running_hub(tmp_path / "hub", token="s3cret") as url:
        with pytest.raises(PublishError, match="check the token: the Hub refused the token"):
            publish(folder, "nkikit/checked", endpoint=url, token="wrong")
    assert not ran.exists()


def test_cli_publish_shows_each_step(hub_url, tmp_path):
    folder, ran = _folder(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "nkikit.cli", "publish", str(folder), "--repo", "nkikit/steps",
         "--endpoint", hub_url],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    steps = ["checking nkikit/steps", "testing tiny_rmsnorm", "tests: ", "built ", "uploading "]
    at = [p.stdout.find(s) for s in [*steps, "published nkikit/steps v1"]]
    assert -1 not in at and at == sorted(at), p.stdout
    assert ran.exists()
