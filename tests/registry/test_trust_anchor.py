"""Trust tied to an endpoint, and verification anchored to the commit's tree.

An organization's name is only trusted on the Hub it was trusted for (anyone can create any
namespace on an open hub), and the HF cache, shared by every endpoint, cannot carry trust from
one to another. A cached build is checked file by file against the git blob ids of its commit,
metadata.json included, online, offline and by exact commit: rewriting a file together with its
digest in metadata.json no longer gets it loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from huggingface_hub import constants

from nkikit.registry.digests import METADATA_FILE, digest_folder, git_blob_sha1
from nkikit.registry.errors import IntegrityError, LockMismatchError, UntrustedKernelError
from nkikit.registry.lockfile import remote_variant_hashes
from nkikit.registry.names import parse_repo_id
from nkikit.registry.pull import pull
from nkikit.registry.resolve import repo_cache_dir
from nkikit.registry.trust import DEFAULT_TRUSTED_ORGS, TRUSTED_ORGS_ENV, is_trusted

REPO = "nkikit/tiny-rmsnorm"
DEAD = "http://127.0.0.1:9"
PUBLIC_ENDPOINT = "https://huggingface.co"
TREES_DIR = "nkikit-trees"  # where a pull records the commit's tree (nkikit.registry.anchor)


# -- trust ---------------------------------------------------------------------------------


def test_default_trust_is_for_the_public_hub_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUSTED_ORGS_ENV)
    repo = parse_repo_id("nkikit/rmsnorm")
    assert DEFAULT_TRUSTED_ORGS == ("nkikit",)
    assert is_trusted(repo, PUBLIC_ENDPOINT) and is_trusted(repo, "https://HuggingFace.co:443/")
    assert not is_trusted(repo, "http://127.0.0.1:8000")
    assert not is_trusted(repo, "https://huggingface.co.evil.example")


@pytest.mark.parametrize(
    "entries, endpoint, trusted",
    [
        ("acme", PUBLIC_ENDPOINT, True),
        ("acme", "http://hub.internal:8000", False),  # a bare name is the public Hub's
        ("acme@http://hub.internal:8000", "http://hub.internal:8000/", True),
        ("acme@http://hub.internal:8000", "http://hub.internal:8001", False),
        ("acme@http://hub.internal:8000", PUBLIC_ENDPOINT, False),
        ("acme@*", "http://anywhere:1", True),
        ("acme/k@HTTP://Hub.Internal:8000", "http://hub.internal:8000", True),
        ("acme/other@*", "http://hub.internal:8000", False),
        ("*@http://127.0.0.1:5", "http://127.0.0.1:5", True),
        ("*", "http://127.0.0.1:5", False),
        ("", PUBLIC_ENDPOINT, False),
    ],
)
def test_trust_entries_name_an_endpoint(
    entries: str, endpoint: str, trusted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRUSTED_ORGS_ENV, entries)
    assert is_trusted(parse_repo_id("acme/k"), endpoint) is trusted


def test_a_bad_endpoint_in_an_entry_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRUSTED_ORGS_ENV, "acme@hub.internal")
    with pytest.raises(ValueError, match="acme@hub.internal"):
        is_trusted(parse_repo_id("acme/k"), PUBLIC_ENDPOINT)
    from nkikit.registry.trust import normalize_endpoint

    assert normalize_endpoint("HTTPS://[::1]:443/x/") == "https://[::1]/x"


def test_the_trusted_org_on_another_hub_needs_opt_in(
    tiny_repo, hub_url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """`nkikit` is trusted by default - on huggingface.co. A local hub's `nkikit/*` is anyone's."""
    monkeypatch.delenv(TRUSTED_ORGS_ENV)
    with pytest.raises(UntrustedKernelError, match=rf"not trusted at {hub_url}.*nkikit@{hub_url}"):
        pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)
    assert pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir, trust_remote_code=True)


def test_trust_does_not_travel_through_the_shared_cache(
    tiny_repo, hub_url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """A build pulled from hub A (opted in once) is not trusted later because the call names
    another endpoint, or none, and the cache happens to hold it."""
    pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)
    monkeypatch.setenv(TRUSTED_ORGS_ENV, f"nkikit@{DEAD}")
    with pytest.raises(UntrustedKernelError, match=f"not trusted at {hub_url}"):
        pull(REPO, revision=tiny_repo.commit, endpoint=DEAD, cache_dir=cache_dir)
    monkeypatch.delenv(TRUSTED_ORGS_ENV)  # the default: nkikit on the public Hub
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UntrustedKernelError, match=f"not trusted at {hub_url}"):
        pull(REPO, version=1, cache_dir=cache_dir)


# -- verification anchored to the commit ------------------------------------------------------


def _tamper_consistently(variant: Path) -> None:
    """Change the code and rewrite metadata.json's digests to match (what used to get it run)."""
    (variant / "kernel.py").write_text("raise SystemExit('tampered code ran')\n")
    meta = json.loads((variant / METADATA_FILE).read_text())
    meta["digest"]["files"] = digest_folder(variant)
    (variant / METADATA_FILE).write_text(json.dumps(meta))


def test_a_consistent_tamper_is_refused_everywhere(
    tiny_repo, hub_url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    k = pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)
    _tamper_consistently(k.path)
    refused = r"kernel\.py: content does not match the commit's tree"
    with pytest.raises(IntegrityError, match=refused + " as the Hub reports it") as e:
        pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)
    assert e.value.path == str(k.path / "kernel.py")
    with pytest.raises(IntegrityError, match=refused):  # by exact commit, online
        pull(REPO, revision=tiny_repo.commit, endpoint=hub_url, cache_dir=cache_dir)
    with pytest.raises(IntegrityError, match=refused + " recorded"):  # the Hub unreachable
        pull(REPO, revision=tiny_repo.commit, endpoint=DEAD, cache_dir=cache_dir)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(IntegrityError, match=refused + " recorded"):  # offline
        pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)


def test_metadata_json_itself_is_checked(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    k = pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)
    meta = json.loads((k.path / METADATA_FILE).read_text())
    meta["digest"]["files"]["planted.py"] = meta["digest"]["files"]["kernel.py"]
    (k.path / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(IntegrityError, match=r"metadata\.json: content does not match"):
        pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)


def test_without_a_tree_record_the_cache_links_are_the_anchor(
    tiny_repo, hub_url: str, cache_dir: Path
) -> None:  # noqa: ANN001
    """A cache filled by another client has no tree record: each snapshot file's link to
    blobs/<git blob id> (the HF cache's own record) is checked instead."""
    k = pull(REPO, version=1, endpoint=hub_url, cache_dir=cache_dir)
    records = repo_cache_dir(cache_dir, parse_repo_id(REPO)) / TREES_DIR
    for f in records.rglob("*.json"):
        f.unlink()
    # (where such a build came from is unknown: trust is asked of this call's endpoint)
    kw = dict(revision=tiny_repo.commit, endpoint=DEAD, cache_dir=cache_dir, trust_remote_code=True)
    assert pull(REPO, **kw)
    _tamper_consistently(k.path)
    with pytest.raises(IntegrityError, match=r"kernel\.py: .*blob id the HF cache recorded"):
        pull(REPO, **kw)


def test_a_tamper_that_rewrites_the_cache_records_too_is_caught_by_the_lock(
    tiny_repo, hub_url: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """Offline, someone who rewrites the blobs, the snapshot links and the tree record alike
    leaves nothing in the cache to contradict them: a lockfile in the old format (kernels <=
    0.11, the only one with a place for build hashes), kept with the project, pins the commit and
    the hash of its blob ids."""
    path = tmp_path / "kernels.lock"
    hashes = remote_variant_hashes(hub_url, None, REPO, tiny_repo.commit)
    variants = {v: {"hash": h, "hash_type": "git_lfs_concat"} for v, h in hashes.items()}
    path.write_text(json.dumps([{"repo_id": REPO, "sha": tiny_repo.commit, "variants": variants}]))
    k = pull(REPO, lockfile=path, endpoint=hub_url, cache_dir=cache_dir)
    variant = k.path
    _tamper_consistently(variant)
    ids = {}
    for name in ("kernel.py", METADATA_FILE):  # re-home both files under their new blob ids
        link = variant / name
        data = link.read_bytes()
        oid = git_blob_sha1(data)
        blob = Path(os.path.realpath(link)).parent / oid
        blob.write_bytes(data)
        link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
        ids[name] = oid
    records = repo_cache_dir(cache_dir, parse_repo_id(REPO)) / TREES_DIR / tiny_repo.commit
    record = records / f"{variant.name}.json"
    body = json.loads(record.read_text())
    body["files"].update(ids)
    record.write_text(json.dumps(body))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LockMismatchError, match="files do not match the hash in the lockfile"):
        pull(REPO, lockfile=path, endpoint=hub_url, cache_dir=cache_dir)
