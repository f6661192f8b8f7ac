"""Refusals: the right huggingface_hub exception for each missing thing, conflicts, unsafe paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    BadRequestError,
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import get_session


@pytest.fixture
def repo(api: HfApi) -> str:
    api.create_repo("org/k")
    api.create_branch("org/k", branch="v1")
    api.upload_file(
        path_or_fileobj=b"data", path_in_repo="a/file.txt", repo_id="org/k", revision="v1"
    )
    return "org/k"


def test_missing_repo(api: HfApi, hub: str, cache_dir: Path):
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("org/nope")
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_refs("org/nope")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/nope", "x.txt", cache_dir=cache_dir, endpoint=hub)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("org/nope", cache_dir=cache_dir, endpoint=hub)
    with pytest.raises(RepositoryNotFoundError):
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="org/nope")
    with pytest.raises(RepositoryNotFoundError):
        api.delete_repo("org/nope")
    assert not api.repo_exists("org/nope")


def test_missing_revision(api: HfApi, hub: str, repo: str, cache_dir: Path):
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(repo, revision="v9")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(repo, revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo, "a/file.txt", revision="v9", cache_dir=cache_dir, endpoint=hub)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(repo, revision="v9", cache_dir=cache_dir, endpoint=hub)
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_files(repo, revision="v9")
    # Uploading to a branch that does not exist is refused, not auto-created.
    with pytest.raises(RevisionNotFoundError):
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id=repo, revision="v9")
    with pytest.raises(RevisionNotFoundError):
        api.delete_branch(repo, branch="v9")
    with pytest.raises(RevisionNotFoundError):
        api.create_branch(repo, branch="v2", revision="v9")
    assert not api.revision_exists(repo, "v9")
    assert api.revision_exists(repo, "v1")


def test_missing_file(api: HfApi, hub: str, repo: str, cache_dir: Path):
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo, "a/other.txt", revision="v1", cache_dir=cache_dir, endpoint=hub)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo, "a", revision="v1", cache_dir=cache_dir, endpoint=hub)  # a folder
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(repo, path_in_repo="nope", revision="v1"))
    with pytest.raises(EntryNotFoundError, match="doesn't exist"):
        api.delete_file("a/other.txt", repo_id=repo, revision="v1")


def test_conflicts(api: HfApi, repo: str):
    with pytest.raises(HfHubHTTPError) as e:
        api.create_repo(repo)
    assert e.value.response.status_code == 409
    with pytest.raises(HfHubHTTPError) as e:
        api.create_branch(repo, branch="v1")
    assert e.value.response.status_code == 409
    api.create_tag(repo, tag="t", revision="v1")
    with pytest.raises(HfHubHTTPError) as e:
        api.create_tag(repo, tag="t", revision="v1")
    assert e.value.response.status_code == 409
    with pytest.raises(HfHubHTTPError) as e:
        api.delete_branch(repo, branch="main")
    assert e.value.response.status_code == 403
    for bad in ("refs/heads/x", "a..b", "x.lock", "a b", "0" * 40):
        with pytest.raises(BadRequestError):
            api.create_branch(repo, branch=bad)
    # A file and a folder cannot share a name.
    with pytest.raises(BadRequestError, match="is a file"):
        api.upload_file(
            path_or_fileobj=b"x", path_in_repo="a/file.txt/y", repo_id=repo, revision="v1"
        )


def test_parent_commit_conflict_is_refused(api: HfApi, repo: str):
    head = api.repo_info(repo, revision="v1").sha
    newer = api.create_commit(
        repo,
        [CommitOperationAdd("b.txt", b"b")],
        commit_message="b",
        revision="v1",
        parent_commit=head,
    )
    with pytest.raises(HfHubHTTPError) as e:
        api.create_commit(
            repo,
            [CommitOperationAdd("c.txt", b"c")],
            commit_message="c",
            revision="v1",
            parent_commit=head,
        )
    assert e.value.response.status_code == 412
    assert "commit has happened since" in str(e.value)
    assert api.repo_info(repo, revision="v1").sha == newer.oid
    assert "c.txt" not in api.list_repo_files(repo, revision="v1")


@pytest.mark.parametrize(
    "bad_path", ["../escape.txt", "/etc/passwd", "a\\b.txt", "a//b.txt", "a/./b"]
)
def test_unsafe_paths_are_refused_on_commit(api: HfApi, repo: str, bad_path: str):
    head = api.repo_info(repo, revision="v1").sha
    add = CommitOperationAdd("placeholder.txt", b"evil")
    # The client refuses some of these itself; forcing the path tests the server's own check.
    add.path_in_repo = bad_path
    with pytest.raises(BadRequestError, match="Invalid path"):
        api.create_commit(repo, [add], commit_message="evil", revision="v1")
    delete = CommitOperationDelete("a/file.txt")
    delete.path_in_repo = bad_path
    with pytest.raises(BadRequestError, match="Invalid path"):
        api.create_commit(repo, [delete], commit_message="evil", revision="v1")
    assert api.repo_info(repo, revision="v1").sha == head


@pytest.mark.parametrize(
    "raw_path",
    ["%2E%2E/a/file.txt", "a/..%2Ffile.txt", "a%5Cfile.txt", "a//file.txt", "%2Fa/file.txt"],
)
def test_unsafe_paths_are_refused_on_resolve(hub: str, repo: str, raw_path: str):
    for method in ("HEAD", "GET"):
        r = get_session().request(method, f"{hub}/{repo}/resolve/v1/{raw_path}")
        assert r.status_code == 400, (method, raw_path)
        if method == "GET":
            assert "Invalid path" in r.json()["error"]


def test_unsafe_download_is_reported_by_client(hub: str, repo: str, cache_dir: Path):
    with pytest.raises(LocalEntryNotFoundError) as e:
        hf_hub_download(repo, "a\\file.txt", revision="v1", cache_dir=cache_dir, endpoint=hub)
    assert isinstance(e.value.__cause__, BadRequestError)


def test_errors_are_json_with_hub_headers(hub: str, repo: str):
    r = get_session().get(f"{hub}/api/models/{repo}/revision/v9")
    assert r.status_code == 404
    assert r.headers["X-Error-Code"] == "RevisionNotFound"
    assert r.json() == {"error": "Invalid rev id: v9"}
    r = get_session().head(f"{hub}/{repo}/resolve/v1/missing.txt")
    assert r.headers["X-Error-Code"] == "EntryNotFound"
    assert len(r.headers["X-Repo-Commit"]) == 40  # lets the client cache the miss
    r = get_session().get(f"{hub}/api/nothing-here")
    assert r.status_code == 404 and "error" in r.json()
