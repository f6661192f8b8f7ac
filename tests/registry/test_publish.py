"""Publishing: tests gate it, one version appears whole or not at all, writes need the token."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hubfixtures import REPO_ROOT, TINY, HubProcess, copy_fixture
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import RepositoryNotFoundError

from nkikit.hub import running_hub
from nkikit.registry.cli import main_publish
from nkikit.registry.errors import KernelTestsFailedError, PublishError, VersionNotFoundError
from nkikit.registry.publish import SCRATCH_PREFIX, publish, publish_all
from nkikit.registry.pull import pull


def _branches(url: str, repo_id: str) -> dict[str, str]:
    refs = HfApi(endpoint=url).list_repo_refs(repo_id, repo_type="kernel")
    return {b.name: b.target_commit for b in refs.branches}


def _tree(url: str, repo_id: str, revision: str) -> set[str]:
    api = HfApi(endpoint=url)
    return {
        e.path
        for e in api.list_repo_tree(repo_id, recursive=True, revision=revision, repo_type="kernel")
        if hasattr(e, "blob_id")
    }


def test_publish_runs_the_kernel_tests(hub_url: str, tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    result = publish(folder, "nkikit/tested", endpoint=hub_url)
    assert result.tests is not None and result.tests.passed == 5 and result.tests.failed == 0
    assert result.branch == "v1" and _branches(hub_url, "nkikit/tested")["v1"] == result.commit
    card = Path(
        hf_hub_download(
            "nkikit/tested",
            "README.md",
            repo_type="kernel",
            revision="v1",
            endpoint=hub_url,
            cache_dir=tmp_path / "c",
        )
    )
    assert "**5 passed**" in card.read_text()


def test_a_failing_kernel_is_not_published(hub_url: str, tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    (folder / "test_broken.py").write_text("def test_broken():\n    assert 1 + 1 == 3\n")
    with pytest.raises(
        KernelTestsFailedError, match=r"1 failed.*refusing to publish a failing kernel"
    ) as e:
        publish(folder, "nkikit/broken", endpoint=hub_url)
    assert "assert 1 + 1 == 3" in e.value.output
    with pytest.raises(RepositoryNotFoundError):  # nothing was created
        HfApi(endpoint=hub_url).list_repo_refs("nkikit/broken", repo_type="kernel")


def test_a_kernel_without_tests_is_not_published(hub_url: str, tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    (folder / "test_tiny_rmsnorm.py").unlink()
    with pytest.raises(KernelTestsFailedError, match="no tests ran"):
        publish(folder, "nkikit/untested", endpoint=hub_url)


def test_republishing_a_version_replaces_it_in_one_commit(hub_url: str, tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    (folder / "table.txt").write_text("1 2 3\n")
    first = publish(folder, "nkikit/re", endpoint=hub_url, run_tests=False)
    assert "build/torch-cpu/table.txt" in _tree(hub_url, "nkikit/re", "v1")
    (folder / "table.txt").unlink()
    second = publish(folder, "nkikit/re", endpoint=hub_url, run_tests=False)
    assert second.commit != first.commit and _branches(hub_url, "nkikit/re")["v1"] == second.commit
    files = _tree(hub_url, "nkikit/re", "v1")
    assert "build/torch-cpu/table.txt" not in files and "build/torch-neuron/table.txt" not in files
    assert "build/torch-cpu/kernel.py" in files


def test_publish_all(hub_url: str, tmp_path: Path) -> None:
    root = tmp_path / "lib"
    root.mkdir()
    copy_fixture(root)
    two = copy_fixture(root / "x").rename(root / "tiny_two")
    (two / "kernel.toml").write_text(
        (two / "kernel.toml").read_text().replace('name = "tiny_rmsnorm"', 'name = "tiny_two"')
    )
    results = publish_all(root, "acme", endpoint=hub_url, run_tests=False, neuron=False)
    assert [r.repo_id for r in results] == ["acme/tiny-rmsnorm", "acme/tiny-two"]
    assert all(list(r.variants) == ["torch-cpu"] for r in results)


def test_cli_publish(hub_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_fixture(tmp_path)
    assert (
        main_publish(
            [
                str(folder),
                "--repo",
                "nkikit/cli-k",
                "--endpoint",
                hub_url,
                "--no-tests",
                "--version",
                "3",
            ]
        )
        == 0
    )
    assert "nkikit/cli-k v3: v3 @" in capsys.readouterr().out
    (folder / "test_broken.py").write_text("def test_broken():\n    assert False\n")
    assert main_publish([str(folder), "--repo", "nkikit/cli-k", "--endpoint", hub_url]) == 1
    assert "error: the tests of tiny_rmsnorm failed" in capsys.readouterr().err
    assert main_publish([str(folder)]) == 2  # no --repo: a usage error, one line
    assert capsys.readouterr().err == (
        "nkikit publish: error: --repo org/name is required (or use --all --org ORG)\n"
    )


def test_writes_need_the_token(tmp_path: Path) -> None:
    with running_hub(tmp_path / "hub", token="s3cret") as url:
        with pytest.raises(PublishError, match="refused the token"):
            publish(TINY, "nkikit/guarded", endpoint=url, run_tests=False)
        with pytest.raises(PublishError, match="refused the token"):
            publish(TINY, "nkikit/guarded", endpoint=url, token="wrong", run_tests=False)
        done = publish(TINY, "nkikit/guarded", endpoint=url, token="s3cret", run_tests=False)
        # reading a public repo needs no token
        k = pull(
            "nkikit/guarded",
            version=1,
            endpoint=url,
            cache_dir=tmp_path / "c",
            trust_remote_code=True,
        )
        assert k.revision == done.commit


def test_client_interrupted_before_the_version_appears(
    hub_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the build is committed but before branch v1 exists: no v1, no scratch left."""
    real = HfApi.create_branch

    def interrupted(self, repo_id, *, branch, **kw):  # noqa: ANN001, ANN202
        if branch == "v1":
            raise KeyboardInterrupt
        return real(self, repo_id, branch=branch, **kw)

    monkeypatch.setattr(HfApi, "create_branch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        publish(TINY, "nkikit/ctrl-c", endpoint=hub_url, run_tests=False)
    assert list(_branches(hub_url, "nkikit/ctrl-c")) == ["main"]
    with pytest.raises(VersionNotFoundError):
        pull("nkikit/ctrl-c", version=1, endpoint=hub_url, cache_dir=tmp_path / "c")
    monkeypatch.setattr(HfApi, "create_branch", real)
    assert publish(TINY, "nkikit/ctrl-c", endpoint=hub_url, run_tests=False).branch == "v1"


def test_publisher_killed_mid_publish(hub_url: str, tmp_path: Path) -> None:
    """The publishing process dies (no cleanup) between its commit and the version branch: the
    version is not visible; the scratch branch is removed by the next publish, which succeeds."""
    script = textwrap.dedent(
        f"""
        import os
        from huggingface_hub import HfApi
        from huggingface_hub.utils import disable_progress_bars
        from nkikit.registry.publish import publish
        disable_progress_bars()
        real = HfApi.create_branch
        def die(self, repo_id, *, branch, **kw):
            if branch == "v1":
                os._exit(9)
            return real(self, repo_id, branch=branch, **kw)
        HfApi.create_branch = die
        publish({str(TINY)!r}, "nkikit/killed", endpoint={hub_url!r}, run_tests=False)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 9, proc.stderr
    branches = _branches(hub_url, "nkikit/killed")
    assert "v1" not in branches and any(b.startswith(SCRATCH_PREFIX) for b in branches)
    with pytest.raises(VersionNotFoundError):
        pull("nkikit/killed", endpoint=hub_url, cache_dir=tmp_path / "c")
    publish(TINY, "nkikit/killed", endpoint=hub_url, run_tests=False)
    assert sorted(_branches(hub_url, "nkikit/killed")) == ["main", "v1"]


def test_hub_crash_during_the_commit(tmp_path: Path) -> None:
    """The hub process dies after writing the commit but before moving the branch (its
    failpoint): publish fails clearly, and after a restart no partial version is visible."""
    root = tmp_path / "hub"
    hub = HubProcess(root, env={"NKIKIT_HUB_FAILPOINT": "before-ref-update:exit"})
    try:
        with pytest.raises(PublishError, match="no partial version was made visible"):
            publish(TINY, "nkikit/crash", endpoint=hub.url, run_tests=False)
        assert hub.wait_dead() == 75
    finally:
        hub.stop()
    hub = HubProcess(root)
    try:
        assert "v1" not in _branches(hub.url, "nkikit/crash")
        result = publish(TINY, "nkikit/crash", endpoint=hub.url, run_tests=False)
        assert sorted(_branches(hub.url, "nkikit/crash")) == ["main", "v1"]
        k = pull(
            "nkikit/crash",
            version=1,
            endpoint=hub.url,
            cache_dir=tmp_path / "c",
            trust_remote_code=True,
        )
        assert k.revision == result.commit
    finally:
        hub.stop()
