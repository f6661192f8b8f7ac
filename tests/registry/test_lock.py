"""kernels.lock: pins commits (the HF kernels >= 0.17 format; old-format build hashes are still
checked); a pull never moves silently past a pin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hubfixtures import TINY, copy_fixture

from nkikit.registry.cli import main_lock
from nkikit.registry.digests import METADATA_FILE, digest_folder, local_lock_hash
from nkikit.registry.errors import IntegrityError, LockMismatchError
from nkikit.registry.lock import lock
from nkikit.registry.lockfile import read_lockfile, remote_variant_hashes
from nkikit.registry.publish import publish
from nkikit.registry.pull import pull


def test_lockfile_format(tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path) -> None:  # noqa: ANN001
    path = tmp_path / "kernels.lock"
    lock(["nkikit/tiny-rmsnorm@1"], path, endpoint=hub_url)
    data = json.loads(path.read_text())
    assert data == [
        {
            "dependency": {"repo-id": "nkikit/tiny-rmsnorm", "version": 1},
            "lock": {"commit": tiny_repo.commit},
        }
    ]
    k = pull("nkikit/tiny-rmsnorm", lockfile=path, endpoint=hub_url, cache_dir=cache_dir)
    assert k.revision == tiny_repo.commit
    # latest (no version asked) is pinned as the major version it resolved to
    lock(["nkikit/tiny-rmsnorm"], path, endpoint=hub_url)
    assert json.loads(path.read_text())[0]["dependency"] == {
        "repo-id": "nkikit/tiny-rmsnorm",
        "version": 1,
    }


def test_the_hash_in_an_old_format_lockfile_is_the_hash_of_the_pulled_files(
    tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path
) -> None:  # noqa: ANN001
    hashes = remote_variant_hashes(hub_url, None, "nkikit/tiny-rmsnorm", tiny_repo.commit)
    path = tmp_path / "kernels.lock"
    _write_old_format(path, "nkikit/tiny-rmsnorm", tiny_repo.commit, hashes)
    k = pull("nkikit/tiny-rmsnorm", lockfile=path, endpoint=hub_url, cache_dir=cache_dir)
    assert hashes["torch-cpu"] == local_lock_hash(k.path)


def _write_old_format(path: Path, repo_id: str, sha: str, hashes: dict[str, str]) -> None:
    """The kernels <= 0.11 form, with per-build hashes."""
    variants = {v: {"hash": h, "hash_type": "git_lfs_concat"} for v, h in hashes.items()}
    path.write_text(json.dumps([{"repo_id": repo_id, "sha": sha, "variants": variants}]))


def test_a_moved_branch_is_an_error_not_an_upgrade(
    hub_url: str, tmp_path: Path, cache_dir: Path
) -> None:
    folder = copy_fixture(tmp_path)
    first = publish(folder, "nkikit/locked", endpoint=hub_url, run_tests=False)
    path = tmp_path / "kernels.lock"
    lock({"nkikit/locked": 1}, path, endpoint=hub_url)
    (folder / "reference.py").write_text(
        (folder / "reference.py").read_text() + "\n# v1, second build\n"
    )
    second = publish(folder, "nkikit/locked", endpoint=hub_url, run_tests=False)
    assert second.commit != first.commit
    with pytest.raises(
        LockMismatchError,
        match=r"version 1 \(branch v1\) now points to commit .* but the lockfile pins",
    ):
        pull("nkikit/locked", version=1, lockfile=path, endpoint=hub_url, cache_dir=cache_dir)
    assert (
        pull("nkikit/locked", lockfile=path, endpoint=hub_url, cache_dir=cache_dir).revision
        == first.commit
    )
    assert (
        pull(
            "nkikit/locked", version=1, lockfile=False, endpoint=hub_url, cache_dir=cache_dir
        ).revision
        == second.commit
    )
    with pytest.raises(LockMismatchError, match="asked for commit"):
        pull(
            "nkikit/locked",
            revision=second.commit,
            lockfile=path,
            endpoint=hub_url,
            cache_dir=cache_dir,
        )


def test_kernels_lock_in_the_working_directory_is_honoured(
    tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    assert main_lock(["nkikit/tiny-rmsnorm", "--endpoint", hub_url]) == 0
    entries = read_lockfile(tmp_path / "kernels.lock")
    assert entries["nkikit/tiny-rmsnorm"].sha == tiny_repo.commit
    bad = {"torch-cpu": "sha256-" + "0" * 64}
    _write_old_format(tmp_path / "kernels.lock", "nkikit/tiny-rmsnorm", tiny_repo.commit, bad)
    with pytest.raises(LockMismatchError, match="files do not match the hash in the lockfile"):
        pull("nkikit/tiny-rmsnorm", endpoint=hub_url, cache_dir=cache_dir)


def test_consistent_tampering_is_caught_without_the_lock(
    tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path
) -> None:  # noqa: ANN001
    """Edit a file *and* its digest in metadata.json: the per-file digests agree, but the
    commit's tree (git blob ids) does not, so the build is refused, lock or no lock."""
    path = tmp_path / "kernels.lock"
    lock(["nkikit/tiny-rmsnorm"], path, endpoint=hub_url)
    k = pull("nkikit/tiny-rmsnorm", lockfile=path, endpoint=hub_url, cache_dir=cache_dir)
    (k.path / "reference.py").write_text("def rmsnorm(*a, **k):\n    return 0\n")
    meta = json.loads((k.path / METADATA_FILE).read_text())
    meta["digest"]["files"] = digest_folder(k.path)
    (k.path / METADATA_FILE).write_text(json.dumps(meta))
    for lockfile in (False, path):
        with pytest.raises(IntegrityError, match=r"reference\.py: content does not match"):
            pull("nkikit/tiny-rmsnorm", lockfile=lockfile, endpoint=hub_url, cache_dir=cache_dir)


def test_explicit_lockfile_must_list_the_repo(
    tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path
) -> None:  # noqa: ANN001
    path = tmp_path / "kernels.lock"
    path.write_text("[]")
    with pytest.raises(LockMismatchError, match="nkikit/tiny-rmsnorm is not locked in"):
        pull("nkikit/tiny-rmsnorm", lockfile=path, endpoint=hub_url, cache_dir=cache_dir)


def test_lock_from_pyproject(
    tiny_repo, hub_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # noqa: ANN001
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kernels.dependencies]\n"nkikit/tiny-rmsnorm" = 1\n'
    )
    assert main_lock([str(tmp_path), "--endpoint", hub_url]) == 0
    assert read_lockfile(tmp_path / "kernels.lock")["nkikit/tiny-rmsnorm"].sha == tiny_repo.commit
    assert "wrote" in capsys.readouterr().out
    assert (
        main_lock(["nkikit/tiny-rmsnorm@9", "-o", str(tmp_path / "x.lock"), "--endpoint", hub_url])
        == 1
    )
    assert "no version 9" in capsys.readouterr().err


def test_reads_the_kernels_017_lock_form(
    tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path
) -> None:  # noqa: ANN001
    """kernels >= 0.17 writes {dependency, lock: {commit}}: a commit pin without hashes."""
    path = tmp_path / "kernels.lock"
    path.write_text(
        json.dumps(
            [
                {
                    "dependency": {"repo-id": "nkikit/tiny-rmsnorm", "version": 1},
                    "lock": {"commit": tiny_repo.commit},
                }
            ]
        )
    )
    entry = read_lockfile(path)["nkikit/tiny-rmsnorm"]
    assert entry.sha == tiny_repo.commit and entry.variants == {}
    assert (
        pull("nkikit/tiny-rmsnorm", lockfile=path, endpoint=hub_url, cache_dir=cache_dir).revision
        == tiny_repo.commit
    )


def test_lock_spec_errors() -> None:
    with pytest.raises(ValueError, match="expected org/name@<major version>"):
        lock(["nkikit/x@latest"], None, endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="must be an int"):
        lock({"nkikit/x": "1"}, None, endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="nothing to lock"):
        lock([], None, endpoint="http://127.0.0.1:9")
    assert TINY.is_dir()
