"""`lock`: resolve kernel dependencies to commits and write kernels.lock (the HF kernels format)."""

from __future__ import annotations

from pathlib import Path

from .errors import KernelNotFoundError
from .hubclient import default_cache_dir, hf_api
from .lockfile import (
    DEFAULT_LOCKFILE,
    LockEntry,
    parse_dependencies,
    remote_variant_hashes,
    write_lockfile,
)
from .names import parse_repo_id
from .resolve import resolve_online


def lock(
    dependencies: object,
    path: str | Path | None = DEFAULT_LOCKFILE,
    *,
    endpoint: str | None = None,
    token: str | None = None,
) -> list[LockEntry]:
    """Pin each dependency to its current commit; write `path` in the kernels >= 0.17 format.

    dependencies: repo ids (`org/name`, `org/name@1`), a {repo_id: version or None} mapping, or a
    pyproject.toml (or its folder) with [tool.kernels.dependencies]. path: the lockfile to write
    (None: do not write). Returns the entries.

    Raises ValueError (bad spec), KernelNotFoundError, VersionNotFoundError,
    RevisionNotFoundError, DownloadError (Hub unreachable).
    """
    deps = parse_dependencies(dependencies)
    if not deps:
        raise ValueError("nothing to lock: no kernel dependencies given")
    api = hf_api(endpoint, token)
    cache = default_cache_dir()
    entries = []
    for repo_id, version in deps.items():
        repo = parse_repo_id(repo_id)
        found = resolve_online(api, repo, version, None, cache)
        # the hashes are not written (the format has no place for them), but listing them
        # proves the commit has builds: a lock on an empty repo would only fail at pull time
        if not remote_variant_hashes(endpoint, token, repo_id, found.sha):
            raise KernelNotFoundError(
                f"{repo_id}@{found.sha[:12]} has no builds (no build/<variant>/ folder) to lock"
            )
        pinned = version if version is not None else found.version
        entries.append(LockEntry(repo_id, found.sha, version=pinned, revision=found.ref))
    if path is not None:
        write_lockfile(path, entries)
    return entries
