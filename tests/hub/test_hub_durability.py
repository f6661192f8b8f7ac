"""Concurrency and crash safety: serialized commits, and crashes that leave no partial state."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.errors import HfHubHTTPError

from nkikit.hub import HubServer, running_hub
from nkikit.hub.storage import FAILPOINT_ENV


def _commit_from_threads(apis: list[HfApi], repo: str, n: int) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def work(i: int) -> None:
        try:
            barrier.wait()
            apis[i % len(apis)].create_commit(
                repo,
                [CommitOperationAdd(f"files/{i:02d}.txt", str(i).encode())],
                commit_message=f"commit {i}",
                revision="v1",
            )
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


def test_concurrent_commits_are_serialized_and_none_is_lost(api: HfApi):
    api.create_repo("org/k")
    api.create_branch("org/k", branch="v1")
    n = 12
    assert _commit_from_threads([api], "org/k", n) == []
    files = api.list_repo_files("org/k", revision="v1")
    assert sorted(files) == [f"files/{i:02d}.txt" for i in range(n)]
    history = api.list_repo_commits("org/k", revision="v1")
    # One commit each, in a single line of history (each built on the previous head).
    assert len(history) == n + 1
    assert sorted(c.title for c in history[:-1]) == sorted(f"commit {i}" for i in range(n))


def test_concurrent_commits_with_same_parent_one_wins(api: HfApi):
    api.create_repo("org/k")
    head = api.repo_info("org/k").sha
    results: list[object] = []
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        try:
            results.append(
                api.create_commit(
                    "org/k",
                    [CommitOperationAdd(f"{i}.txt", b"x")],
                    commit_message=str(i),
                    parent_commit=head,
                )
            )
        except HfHubHTTPError as e:
            results.append(e.response.status_code)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r for r in results if isinstance(r, int)) == [412, 412, 412]
    assert len(api.list_repo_files("org/k")) == 1


def test_failure_before_ref_update_leaves_previous_commit(hub_root: Path):
    with running_hub(hub_root) as url:
        api = HfApi(endpoint=url, token=False)
        api.create_repo("org/k")
        good = api.upload_file(path_or_fileobj=b"good", path_in_repo="a.txt", repo_id="org/k")
    with running_hub(hub_root, failpoint="before-ref-update") as url:
        api = HfApi(endpoint=url, token=False)
        with pytest.raises(HfHubHTTPError) as e:
            api.upload_file(path_or_fileobj=b"bad", path_in_repo="b.txt", repo_id="org/k")
        assert e.value.response.status_code == 500
        assert api.repo_info("org/k").sha == good.oid
        assert api.list_repo_files("org/k") == ["a.txt"]


def test_killed_mid_commit_leaves_previous_commit(hub_root: Path, hub_process):
    with running_hub(hub_root) as url:
        api = HfApi(endpoint=url, token=False)
        api.create_repo("org/k")
        api.create_branch("org/k", branch="v1")
        good = api.upload_file(
            path_or_fileobj=b"good", path_in_repo="a.txt", repo_id="org/k", revision="v1"
        )

    doomed = hub_process(hub_root, env={FAILPOINT_ENV: "before-ref-update:exit"})
    api = HfApi(endpoint=doomed.url, token=False)
    with pytest.raises(Exception):  # noqa: B017 (the connection drops: any transport error)
        api.upload_file(
            path_or_fileobj=b"x" * 100_000, path_in_repo="big.bin", repo_id="org/k", revision="v1"
        )
    assert doomed.wait() == 75  # died at the failpoint, after writing blobs and the commit

    revived = hub_process(hub_root)
    api = HfApi(endpoint=revived.url, token=False)
    assert api.repo_info("org/k", revision="v1").sha == good.oid
    assert api.list_repo_files("org/k", revision="v1") == ["a.txt"]
    assert [c.commit_id for c in api.list_repo_commits("org/k", revision="v1")][0] == good.oid
    # The repo is fully usable: the lock is free and the next commit builds on the good one.
    after = api.upload_file(
        path_or_fileobj=b"c", path_in_repo="c.txt", repo_id="org/k", revision="v1"
    )
    assert api.list_repo_commits("org/k", revision="v1")[1].commit_id == good.oid
    assert api.repo_info("org/k", revision="v1").sha == after.oid


def test_two_server_processes_on_one_root_serialize_commits(hub_root: Path, hub_process):
    with running_hub(hub_root) as url:
        HfApi(endpoint=url, token=False).create_repo("org/k")
        HfApi(endpoint=url, token=False).create_branch("org/k", branch="v1")
    servers = [hub_process(hub_root), HubServer(hub_root)]
    servers[1].start()
    try:
        apis = [
            HfApi(endpoint=servers[0].url, token=False),
            HfApi(endpoint=servers[1].url, token=False),
        ]
        n = 8
        assert _commit_from_threads(apis, "org/k", n) == []
        files = apis[0].list_repo_files("org/k", revision="v1")
        assert sorted(files) == [f"files/{i:02d}.txt" for i in range(n)]
        assert len(apis[1].list_repo_commits("org/k", revision="v1")) == n + 1
    finally:
        servers[1].stop()
