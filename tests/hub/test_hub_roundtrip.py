"""Publishing and pulling through the real huggingface_hub client: branches, tags, shas, listings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.hf_api import RepoFile, RepoFolder

from nkikit.hub import running_hub

KERNEL_FILES = {
    "build/torch-cpu/__init__.py": "from ._ops import add\n__all__ = ['add']\n",
    "build/torch-cpu/_ops.py": "def add(a, b):\n    return a + b\n",
    "build/torch-cpu/metadata.json": '{"name": "add", "version": 1, "python-depends": []}\n',
    "README.md": "---\nlicense: apache-2.0\ntags: [kernel, nki]\n---\n# add\n",
}


def _read_tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in folder.rglob("*")
        if p.is_file() and ".cache" not in p.parts
    }


def test_folder_round_trip_on_branch_v1(api: HfApi, hub: str, make_tree, cache_dir: Path):
    url = api.create_repo("org/add")
    assert url.repo_id == "org/add" and url.endpoint == hub
    api.create_branch("org/add", branch="v1")
    info = api.upload_folder(repo_id="org/add", folder_path=make_tree(KERNEL_FILES), revision="v1")

    refs = api.list_repo_refs("org/add")
    assert {b.name: b.target_commit for b in refs.branches}["v1"] == info.oid
    assert refs.converts == [] and refs.tags == []
    # main is untouched: publishing goes to the version branch only.
    assert api.list_repo_files("org/add") == []
    assert sorted(api.list_repo_files("org/add", revision="v1")) == sorted(KERNEL_FILES)

    folder = snapshot_download("org/add", revision="v1", cache_dir=cache_dir, endpoint=hub)
    assert Path(folder).name == info.oid
    assert _read_tree(Path(folder)) == KERNEL_FILES

    one = hf_hub_download(
        "org/add", "build/torch-cpu/_ops.py", revision="v1", cache_dir=cache_dir, endpoint=hub
    )
    assert Path(one).read_text() == KERNEL_FILES["build/torch-cpu/_ops.py"]


def test_kernel_repo_type(api: HfApi, hub: str, make_tree, cache_dir: Path):
    api.create_repo("org/relu", repo_type="kernel")
    api.create_branch("org/relu", branch="v1", repo_type="kernel")
    api.upload_folder(
        repo_id="org/relu", repo_type="kernel", folder_path=make_tree(KERNEL_FILES), revision="v1"
    )
    assert api.kernel_info("org/relu", revision="v1").sha is not None
    folder = snapshot_download(
        "org/relu", repo_type="kernel", revision="v1", cache_dir=cache_dir, endpoint=hub
    )
    assert "kernels--org--relu" in folder
    assert _read_tree(Path(folder)) == KERNEL_FILES
    # A model repo of the same name is a different repo.
    assert not api.repo_exists("org/relu")


def test_tags_and_revision_by_sha(api: HfApi, hub: str, cache_dir: Path):
    api.create_repo("org/k")
    api.create_branch("org/k", branch="v1")
    first = api.upload_file(
        path_or_fileobj=b"one", path_in_repo="x.txt", repo_id="org/k", revision="v1"
    )
    api.create_tag("org/k", tag="v1.0.0", revision="v1", tag_message="first release")
    second = api.upload_file(
        path_or_fileobj=b"two", path_in_repo="x.txt", repo_id="org/k", revision="v1"
    )

    tags = {t.name: t.target_commit for t in api.list_repo_refs("org/k").tags}
    assert tags == {"v1.0.0": first.oid}
    assert api.repo_info("org/k", revision="v1.0.0").sha == first.oid
    assert api.repo_info("org/k", revision="v1").sha == second.oid
    assert api.repo_info("org/k", revision=first.oid).sha == first.oid

    for rev, want in (
        ("v1.0.0", b"one"),
        (first.oid, b"one"),
        ("v1", b"two"),
        (second.oid, b"two"),
    ):
        path = hf_hub_download(
            "org/k", "x.txt", revision=rev, cache_dir=cache_dir, endpoint=hub, force_download=True
        )
        assert Path(path).read_bytes() == want

    # A tag can point at a sha; deleting it frees the name.
    api.create_tag("org/k", tag="pinned", revision=second.oid)
    api.create_tag("org/k", tag="pinned", revision=first.oid, exist_ok=True)  # 409 swallowed
    api.delete_tag("org/k", tag="pinned")
    assert [t.name for t in api.list_repo_refs("org/k").tags] == ["v1.0.0"]


def test_branches_with_slashes_and_from_revision(api: HfApi, hub: str, cache_dir: Path):
    api.create_repo("org/k")
    base = api.upload_file(path_or_fileobj=b"base", path_in_repo="f.txt", repo_id="org/k")
    api.create_branch("org/k", branch="release/v1", revision=base.oid)
    api.create_branch("org/k", branch="release/v1", exist_ok=True)
    api.upload_file(
        path_or_fileobj=b"rel", path_in_repo="sub/g.txt", repo_id="org/k", revision="release/v1"
    )
    assert sorted(api.list_repo_files("org/k", revision="release/v1")) == ["f.txt", "sub/g.txt"]
    assert api.list_repo_files("org/k") == ["f.txt"]
    path = hf_hub_download(
        "org/k", "sub/g.txt", revision="release/v1", cache_dir=cache_dir, endpoint=hub
    )
    assert Path(path).read_bytes() == b"rel"
    # A branch named like the prefix is distinct from 'release/v1'.
    api.create_branch("org/k", branch="release")
    assert api.list_repo_files("org/k", revision="release") == ["f.txt"]

    api.delete_branch("org/k", branch="release/v1")
    names = {b.name for b in api.list_repo_refs("org/k").branches}
    assert names == {"main", "release"}


def test_commit_operations_and_history(api: HfApi):
    api.create_repo("org/k")
    api.create_commit(
        "org/k",
        [
            CommitOperationAdd("a/1.txt", b"1"),
            CommitOperationAdd("a/b/2.txt", b"2"),
            CommitOperationAdd("c.txt", b"c"),
        ],
        commit_message="add files",
        commit_description="three of them",
    )
    api.create_commit(
        "org/k",
        [CommitOperationDelete("a/"), CommitOperationDelete("c.txt"), CommitOperationAdd("d", b"")],
        commit_message="prune",
    )
    assert api.list_repo_files("org/k") == ["d"]
    commits = api.list_repo_commits("org/k")
    assert [c.title for c in commits] == ["prune", "add files", "initial commit"]
    assert commits[1].message == "three of them"


def test_unchanged_files_are_not_recommitted(api: HfApi, make_tree):
    api.create_repo("org/k")
    folder = make_tree(KERNEL_FILES)
    first = api.upload_folder(repo_id="org/k", folder_path=folder)
    # preupload reports each file's oid (git blob sha1), so the client skips the no-op commit.
    again = api.upload_folder(repo_id="org/k", folder_path=folder)
    assert again.oid == first.oid
    assert len(api.list_repo_commits("org/k")) == 2


def test_tree_listing_paginates_with_link_headers(hub_root: Path, make_tree):
    files = {f"dir{i % 3}/file{i:02d}.txt": str(i) for i in range(12)}
    with running_hub(hub_root, page_size=4) as url:
        api = HfApi(endpoint=url, token=False)
        api.create_repo("org/many")
        api.upload_folder(repo_id="org/many", folder_path=make_tree(files))
        entries = list(api.list_repo_tree("org/many", recursive=True))
        assert sorted(e.path for e in entries if isinstance(e, RepoFile)) == sorted(files)
        assert sorted(e.path for e in entries if isinstance(e, RepoFolder)) == [
            "dir0",
            "dir1",
            "dir2",
        ]
        assert len(entries) == len({e.path for e in entries})  # no page overlap
        top = list(api.list_repo_tree("org/many"))
        assert [e.path for e in top] == ["dir0", "dir1", "dir2"]
        sub = list(api.list_repo_tree("org/many", path_in_repo="dir1", expand=True))
        assert [e.path for e in sub] == sorted(p for p in files if p.startswith("dir1/"))
        assert all(e.last_commit is not None and e.last_commit.title for e in sub)
        files_only = api.list_repo_files("org/many")
        assert sorted(files_only) == sorted(files)
        for i in range(5):
            api.upload_file(
                path_or_fileobj=str(i).encode(), path_in_repo="n.txt", repo_id="org/many"
            )
        titles = [c.title for c in api.list_repo_commits("org/many")]
        assert len(titles) == 7 and titles[-1] == "initial commit"  # paginated 4 + 3


def test_paths_info_and_file_metadata(api: HfApi, make_tree):
    api.create_repo("org/k")
    api.upload_folder(repo_id="org/k", folder_path=make_tree(KERNEL_FILES))
    infos = api.get_paths_info("org/k", ["build", "README.md", "missing.txt"])
    by_path = {i.path: i for i in infos}
    assert isinstance(by_path["build"], RepoFolder)
    readme = by_path["README.md"]
    assert isinstance(readme, RepoFile) and readme.size == len(KERNEL_FILES["README.md"])
    assert "missing.txt" not in by_path
    info = api.model_info("org/k", files_metadata=True)
    assert {s.rfilename for s in info.siblings} == set(KERNEL_FILES)
    assert info.card_data is not None and info.card_data.license == "apache-2.0"
    assert info.tags == ["kernel", "nki"]
    assert api.file_exists("org/k", "README.md")
    assert not api.file_exists("org/k", "nope.md")


def test_repo_lifecycle_and_org_overview(hub_root: Path):
    # an advertised publisher is reserved by default (see test_hub_hardening); opened here
    with running_hub(hub_root, trusted_orgs=["org"], reserved_namespaces=()) as url:
        api = HfApi(endpoint=url, token="anything")
        api.create_repo("org/k")
        again = api.create_repo("org/k", exist_ok=True)
        assert again.repo_id == "org/k"
        mine = api.create_repo("solo")  # no namespace: the hub's user
        assert mine.repo_id == f"{api.whoami()['name']}/solo"
        org = api.get_organization_overview("org")
        assert org.num_models == 1 and org.trustedKernelPublisher is True
        assert [m.id for m in api.list_models(author="org")] == ["org/k"]
        api.delete_repo("org/k")
        assert not api.repo_exists("org/k")
        api.delete_repo("org/k", missing_ok=True)
        api.create_repo("org/k")  # the name is free again, with a fresh history
        assert len(api.list_repo_commits("org/k")) == 1


def test_served_by_module_cli(hub_process, hub_root: Path, cache_dir: Path):
    """`python -m nkikit.hub --root DIR --port N` serves the same protocol from another process;
    the token comes from NKIKIT_HUB_TOKEN."""
    proc = hub_process(hub_root, env={"NKIKIT_HUB_TOKEN": "cli-token"})
    with pytest.raises(HfHubHTTPError) as e:
        HfApi(endpoint=proc.url, token=False).create_repo("org/k")
    assert e.value.response.status_code == 401
    api = HfApi(endpoint=proc.url, token="cli-token")
    api.create_repo("org/k")
    api.upload_file(path_or_fileobj=b"hi", path_in_repo="hi.txt", repo_id="org/k")
    path = hf_hub_download("org/k", "hi.txt", cache_dir=cache_dir, endpoint=proc.url, token=False)
    assert Path(path).read_bytes() == b"hi"
    assert os.path.isdir(hub_root / "repos" / "models" / "org" / "k")


def test_validate_yaml_rejects_broken_card(api: HfApi):
    api.create_repo("org/k")
    with pytest.raises(ValueError, match="Invalid metadata"):
        api.upload_file(
            path_or_fileobj=b"---\nlicense: [unclosed\n---\n",
            path_in_repo="README.md",
            repo_id="org/k",
        )
    assert api.list_repo_files("org/k") == []


def test_non_ascii_and_spaced_paths(api: HfApi, hub: str, cache_dir: Path):
    api.create_repo("org/k")
    names = ["données/été.txt", "with space/a+b#c?.txt", "日本/語.bin"]
    api.create_commit(
        "org/k", [CommitOperationAdd(n, n.encode()) for n in names], commit_message="unicode"
    )
    assert sorted(api.list_repo_files("org/k")) == sorted(names)
    for n in names:
        path = hf_hub_download("org/k", n, cache_dir=cache_dir, endpoint=hub)
        assert Path(path).read_bytes() == n.encode()
    assert {e.path for e in api.list_repo_tree("org/k", path_in_repo="données")} == {
        "données/été.txt"
    }
