"""Verification anchored to the commit: every file of a variant against the commit's tree.

metadata.json's digests say what a build's files should be, but metadata.json sits in the same
cache folder as the code it describes: whoever can change one can change both. The anchor is the
commit. For every file of `build/<variant>/` at a commit the Hub reports a git blob id (or, for an
LFS file, its sha256); a file's content either hashes to that id or it is not the published file.

  - A pull that asks the Hub anyway (it resolves a version, branch or tag), or that finds no
    record, asks for the variant's tree at the resolved commit (one request, no HfApi import)
    and records it, with the endpoint it came from, beside the HF cache's own records
    (`<repo cache>/nkikit-trees/<commit>/<variant>.json`).
  - A pull by exact commit or lockfile (which makes no request by design), offline, or with the
    Hub unreachable, uses the recorded tree; without one (a cache filled by another client), the
    ids the HF cache itself recorded: each snapshot file links to `blobs/<etag>`, the etag being
    the git blob id or LFS sha256.
  - Every file is checked against its id at every load, metadata.json included; a file present
    but not in the tree, or in the tree but missing, is refused too.

What this cannot stop offline: someone who rewrites the cache *and* the recorded tree
consistently. A `kernels.lock` (kept with the project, not in the cache) pins the commit and the
hash of each variant's ids, and catches that too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .digests import METADATA_FILE, git_blob_sha1, variant_files
from .errors import IntegrityError
from .hubclient import list_tree
from .names import REPO_TYPE, RepoId
from .resolve import repo_cache_dir

TREES_DIR = "nkikit-trees"

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Tree:
    """The files of one variant at one commit: path relative to the variant -> oid (40-hex git
    blob id, or 64-hex LFS sha256); `origin` the endpoint that reported it (None: unknown)."""

    files: dict[str, str]
    origin: str | None
    source: str  # "hub", "record" or "cache links": how the ids were obtained


def remote_trees(
    endpoint: str | None, token: str | None, repo_id: str, sha: str
) -> dict[str, dict[str, str]]:
    """{variant: {path relative to the variant: oid}} for every variant under `build/` at commit
    `sha`, from the Hub's listing (one request per page).

    Raises what `hubclient.list_tree` raises (EntryNotFoundError when there is no `build/`).
    """
    entries = list(list_tree(endpoint, token, REPO_TYPE, repo_id, sha, "build"))
    variants = {
        e["path"].split("/")[1]
        for e in entries
        if e.get("type") == "file" and isinstance(e.get("path"), str) and e["path"].count("/") >= 2
    }
    trees = {v: tree_from_listing(entries, f"build/{v}") for v in sorted(variants)}
    return {v: files for v, files in trees.items() if files}


def tree_from_listing(entries: Iterable[Mapping[str, Any]], folder: str) -> dict[str, str]:
    """{path relative to `folder`: oid} from the Hub's JSON tree entries (files only; the LFS
    sha256 for an LFS file, the git blob id otherwise; bytecode skipped)."""
    files: dict[str, str] = {}
    prefix = folder.rstrip("/") + "/"
    for e in entries:
        path = e.get("path")
        if e.get("type") != "file" or not isinstance(path, str) or not path.startswith(prefix):
            continue
        rel = path[len(prefix) :]
        if rel.endswith(".pyc") or "__pycache__" in rel.split("/"):
            continue
        lfs = e.get("lfs")
        oid = (lfs.get("oid") or lfs.get("sha256")) if isinstance(lfs, dict) else e.get("oid")
        if isinstance(oid, str):
            files[rel] = oid.lower()
    return files


def _record_path(cache_dir: Path, repo: RepoId, sha: str, variant: str) -> Path:
    return repo_cache_dir(cache_dir, repo) / TREES_DIR / sha / f"{variant}.json"


def record_tree(cache_dir: Path, repo: RepoId, sha: str, variant: str, tree: Tree) -> None:
    """Remember the tree the Hub reported (atomically), for offline loads."""
    path = _record_path(cache_dir, repo, sha, variant)
    body = json.dumps({"endpoint": tree.origin, "files": tree.files}, sort_keys=True, indent=1)
    try:
        if path.read_text(encoding="utf-8") == body:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, path)


def recorded_tree(cache_dir: Path, repo: RepoId, sha: str, variant: str) -> Tree | None:
    """The tree recorded at the last online pull of this commit, or None."""
    path = _record_path(cache_dir, repo, sha, variant)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise IntegrityError(f"{path}: unreadable tree record ({e})", path=str(path)) from None
    files = raw.get("files") if isinstance(raw, dict) else None
    origin = raw.get("endpoint") if isinstance(raw, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise IntegrityError(f"{path}: malformed tree record", path=str(path))
    return Tree(dict(files), origin if isinstance(origin, str) else None, "record")


def cache_link_tree(variant_dir: Path) -> Tree | None:
    """The ids the HF cache recorded for a snapshot folder (each file a link to blobs/<etag>),
    or None when a file is not such a link (then there is nothing to check against)."""
    files: dict[str, str] = {}
    for rel in variant_files(variant_dir):
        path = variant_dir / rel
        if not path.is_symlink():
            return None
        target = os.path.realpath(path)
        name = os.path.basename(target)
        if os.path.basename(os.path.dirname(target)) != "blobs" or not _is_oid(name):
            return None
        files[rel] = name
    return Tree(files, None, "cache links")


def _is_oid(text: str) -> bool:
    return len(text) in (40, 64) and set(text) <= _HEX


def content_oid(data: bytes, oid: str) -> str:
    """The id of `data` in the form of `oid`: sha256 for a 64-hex (LFS) id, git blob sha1 else."""
    return hashlib.sha256(data).hexdigest() if len(oid) == 64 else git_blob_sha1(data)


def verify_tree(variant_dir: Path, tree: Tree, *, label: str) -> None:
    """Check every file of `variant_dir` against `tree`, metadata.json included.

    Raises IntegrityError naming the file: content whose id differs from the commit's, a file of
    the tree missing from the folder, or a file in the folder that the commit does not have.
    """
    where = {
        "hub": "the commit's tree as the Hub reports it",
        "record": "the commit's tree recorded at the last online pull",
        "cache links": "the blob id the HF cache recorded at download",
    }[tree.source]
    # metadata.json last: when code and metadata were changed together, name the code
    for rel, oid in sorted(tree.files.items(), key=lambda kv: (kv[0] == METADATA_FILE, kv[0])):
        path = variant_dir / rel
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise IntegrityError(
                f"{path}: missing from the downloaded build of {label} (it is in {where})",
                path=str(path),
            ) from None
        if not _is_oid(oid) or content_oid(data, oid) != oid:
            raise IntegrityError(
                f"{path}: content does not match {where} ({label}: blob {oid}); the file was "
                "modified after it was downloaded. Refusing to load it. Delete the cached "
                "snapshot folder and pull again.",
                path=str(path),
            )
    extra = [rel for rel in variant_files(variant_dir) if rel not in tree.files]
    if extra:
        path = variant_dir / extra[0]
        raise IntegrityError(
            f"{path}: not part of the published build of {label} (not in {where}); refusing "
            "to load. Delete the cached snapshot folder and pull again.",
            path=str(path),
        )


def tree_files_present(variant_dir: Path, files: Mapping[str, str]) -> bool:
    """True when every file of the tree is in the folder (content is checked by verify_tree)."""
    return bool(files) and all((variant_dir / rel).is_file() for rel in files)
