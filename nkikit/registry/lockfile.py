"""`kernels.lock`: pin each kernel repo to a commit and each build variant to a content hash.

The file is the lock format of HF kernels >= 0.17 (`kernels._rust.KernelLocks`, what
`kernels lock` writes and `kernels.get_locked_kernel` reads), a JSON list of

    {"dependency": {"repo-id": "org/rmsnorm", "version": 1}, "lock": {"commit": "<commit>"}}

(`"revision": "<ref>"` in place of `"version"` for a pin that named a branch or tag). kernels
parses it strictly (unknown fields are an error), so the format has no place for per-build hashes:
the commit is the pin, and a pull checks the files against that commit's tree (anchor.py).

Reading also accepts the older form (kernels <= 0.11, reference/hub.md §1.4)

    {"repo_id": "org/rmsnorm", "sha": "<commit>",
     "variants": {"torch-cpu": {"hash": "sha256-<hex>", "hash_type": "git_lfs_concat"}, ...}}

whose per-build hashes are then checked on pull too.

Dependencies to lock come as repo ids (`org/name`, `org/name@1`, `org/name@v1`), a mapping
`{"org/name": 1}` (pyproject `[tool.kernels.dependencies]` style; None = latest), or the path
of a pyproject.toml (or of the folder holding it).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .anchor import remote_trees
from .digests import LOCK_HASH_TYPE, local_lock_hash, lock_hash
from .errors import LockMismatchError, RegistryError
from .names import is_commit_sha, parse_repo_id

DEFAULT_LOCKFILE = "kernels.lock"


@dataclass
class LockEntry:
    """One locked repo: the commit, what was asked for (a major version or a ref), and, when
    read from an old-format lockfile, per variant its `sha256-<hex>` hash."""

    repo_id: str
    sha: str
    variants: dict[str, str] = field(default_factory=dict)
    version: int | None = None
    revision: str | None = None

    def to_json(self) -> dict:
        """The kernels >= 0.17 entry. A dependency must name a version or a revision: with
        neither, the commit itself is the revision."""
        dep: dict[str, object] = {"repo-id": self.repo_id}
        if self.version is not None:
            dep["version"] = self.version
        else:
            dep["revision"] = self.revision or self.sha
        return {"dependency": dep, "lock": {"commit": self.sha}}


def read_lockfile(path: str | Path) -> dict[str, LockEntry]:
    """repo_id -> LockEntry. Raises FileNotFoundError, or RegistryError for a malformed file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RegistryError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise RegistryError(f"{path}: expected a JSON list of locked kernels")
    out: dict[str, LockEntry] = {}
    for i, item in enumerate(data):
        entry = _parse_entry(item)
        if entry is None:
            raise RegistryError(
                f"{path}: entry {i} is neither {{repo_id, sha, variants}} nor {{dependency, lock}}"
            )
        out[entry.repo_id] = entry
    return out


def _parse_entry(item: object) -> LockEntry | None:
    if not isinstance(item, dict):
        return None
    if "repo_id" in item and "sha" in item:
        variants = {}
        for name, v in (item.get("variants") or {}).items():
            if not isinstance(v, dict) or v.get("hash_type", LOCK_HASH_TYPE) != LOCK_HASH_TYPE:
                return None
            variants[name] = v.get("hash")
        repo_id, sha = item["repo_id"], item["sha"]
        version = revision = None
    elif isinstance(item.get("dependency"), dict) and isinstance(item.get("lock"), dict):
        dep = item["dependency"]
        repo_id, sha, variants = dep.get("repo-id"), item["lock"].get("commit"), {}
        version, revision = dep.get("version"), dep.get("revision")
        if (version is None) == (revision is None):
            return None  # kernels: "either `version` or `revision` must be specified"
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            return None
    else:
        return None
    if not isinstance(repo_id, str) or not isinstance(sha, str) or not is_commit_sha(sha):
        return None
    return LockEntry(repo_id, sha, variants, version, revision)


def write_lockfile(path: str | Path, entries: Iterable[LockEntry]) -> None:
    """Write `entries` (sorted by repo id) atomically: a crash leaves the old file or the new."""
    path = Path(path)
    body = (
        json.dumps([e.to_json() for e in sorted(entries, key=lambda e: e.repo_id)], indent=2) + "\n"
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, path)


def parse_dependencies(deps: object) -> dict[str, int | None]:
    """Normalize what `lock` accepts into {repo_id: major version or None (latest)}.

    Raises ValueError for an unusable spec, FileNotFoundError for a missing pyproject.
    """
    if isinstance(deps, str | os.PathLike) and (Path(deps).is_dir() or str(deps).endswith(".toml")):
        path = Path(deps)
        path = path / "pyproject.toml" if path.is_dir() else path
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        table = data.get("tool", {}).get("kernels", {}).get("dependencies")
        if not isinstance(table, Mapping):
            raise ValueError(f"{path}: no [tool.kernels.dependencies] table to lock")
        return parse_dependencies(dict(table))
    if isinstance(deps, str):
        deps = [deps]
    out: dict[str, int | None] = {}
    if isinstance(deps, Mapping):
        for repo_id, version in deps.items():
            parse_repo_id(repo_id)
            if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
                raise ValueError(
                    f"{repo_id}: the version to lock must be an int (major version), got {version!r}"
                )
            out[repo_id] = version
        return out
    for spec in deps:  # type: ignore[union-attr]
        repo_id, _, ver = str(spec).partition("@")
        parse_repo_id(repo_id)
        if ver:
            digits = ver[1:] if ver.startswith("v") else ver
            if not digits.isdigit():
                raise ValueError(f"{spec!r}: expected org/name@<major version>, e.g. org/name@1")
            out[repo_id] = int(digits)
        else:
            out[repo_id] = None
    return out


def remote_variant_hashes(
    endpoint: str | None, token: str | None, repo_id: str, sha: str
) -> dict[str, str]:
    """Per variant under `build/`, its lock hash computed from the Hub's tree listing at `sha`."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        trees = remote_trees(endpoint, token, repo_id, sha)
    except EntryNotFoundError:
        return {}
    return {v: lock_hash(files.items()) for v, files in trees.items()}


def verify_variant(entry: LockEntry, variant: str, variant_dir: Path) -> None:
    """Check a downloaded variant against its lock hash.

    Raises LockMismatchError when the lock has no hash for the variant, or the files differ.
    A lock without any hashes (the kernels >= 0.17 form) pins the commit only and passes: the
    commit's tree has already been checked.
    """
    if not entry.variants:
        return
    expected = entry.variants.get(variant)
    if expected is None:
        raise LockMismatchError(
            f"the lockfile pins {entry.repo_id} at {entry.sha[:12]} but has no hash for build "
            f"{variant!r} (it has {', '.join(sorted(entry.variants))}); re-run `nkikit lock`"
        )
    actual = local_lock_hash(variant_dir)
    if actual != expected:
        raise LockMismatchError(
            f"{entry.repo_id}@{entry.sha[:12]} build {variant}: files do not match the hash in the "
            f"lockfile ({expected} expected, {actual} found in {variant_dir}); the locked build "
            "changed. Refusing to load it; if the change is intended, re-run `nkikit lock`."
        )
