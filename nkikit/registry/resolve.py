"""From what the caller asked for (a version, a revision, or nothing) to one commit sha.

  - `version=N`   -> the head of branch `vN`;
  - `revision=R`  -> a commit sha as is, else the branch or tag named R;
  - neither       -> the head of the highest `v<N>` branch (the latest version).
Online this asks the Hub for the repo's refs (one request). Offline (HF_HUB_OFFLINE=1), or when
the Hub cannot be reached, it reads the refs the cache recorded at the last online pull, as
huggingface_hub does for its own downloads.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import (
    DownloadError,
    KernelNotFoundError,
    NotInCacheError,
    RevisionNotFoundError,
    VersionNotFoundError,
)
from .hubclient import transport_errors
from .names import REPO_TYPE, RepoId, is_commit_sha, parse_version_branch, version_branch


@dataclass(frozen=True)
class Resolved:
    """A resolved request: the commit, the ref it came from (if any) and its major version."""

    sha: str
    ref: str | None = None
    version: int | None = None


def repo_cache_dir(cache_dir: Path, repo: RepoId) -> Path:
    """The HF cache folder of a kernel repo: `<cache>/kernels--<org>--<name>` (the cache layout of
    huggingface_hub, hub.md §3.4; spelled out here so a cached pull needs no heavy import)."""
    return cache_dir / f"{REPO_TYPE}s--{repo.org}--{repo.name}"


def record_ref(cache_dir: Path, repo: RepoId, ref: str, sha: str) -> None:
    """Remember `ref -> sha` in the cache (what offline pulls read), atomically."""
    path = repo_cache_dir(cache_dir, repo) / "refs" / ref
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_text().strip() == sha:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(sha)
    os.replace(tmp, path)


def _versions(branches: dict[str, str]) -> dict[int, str]:
    return {v: b for b in branches if (v := parse_version_branch(b)) is not None}


def _pick(
    repo: RepoId,
    branches: dict[str, str],
    tags: dict[str, str],
    version: int | None,
    revision: str | None,
    where: str,
) -> Resolved:
    versions = _versions(branches)
    listed = ", ".join(f"v{v}" for v in sorted(versions)) or "none"
    if version is not None:
        branch = version_branch(version)
        if branch not in branches:
            raise VersionNotFoundError(
                f"{repo} has no version {version} {where}(no branch {branch!r}; versions: {listed})"
            )
        return Resolved(branches[branch], branch, version)
    if revision is not None:
        if revision in branches:
            return Resolved(branches[revision], revision, parse_version_branch(revision))
        if revision in tags:
            return Resolved(tags[revision], revision, None)
        raise RevisionNotFoundError(
            f"{repo} has no branch or tag {revision!r} {where}(branches: {', '.join(sorted(branches)) or 'none'}; "
            f"tags: {', '.join(sorted(tags)) or 'none'})"
        )
    if not versions:
        raise VersionNotFoundError(f"{repo} has no published version {where}(no v<N> branch)")
    latest = max(versions)
    return Resolved(branches[versions[latest]], versions[latest], latest)


def resolve_online(
    api, repo: RepoId, version: int | None, revision: str | None, cache_dir: Path
) -> Resolved:  # noqa: ANN001
    """Resolve against the Hub, recording the ref in the cache.

    Raises KernelNotFoundError, VersionNotFoundError, RevisionNotFoundError; on a connection
    failure falls back to the cache (with a warning) and raises DownloadError if it has nothing.
    """
    if version is None and revision is not None and is_commit_sha(revision):
        return Resolved(revision)
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        refs = api.list_repo_refs(str(repo), repo_type=REPO_TYPE)
    except RepositoryNotFoundError:
        raise KernelNotFoundError(
            f"kernel repo {repo} not found at {api.endpoint} (check the name, or pass a token if it is private)"
        ) from None
    except HfHubHTTPError as e:
        raise DownloadError(
            f"could not list the versions of {repo} at {api.endpoint}: {e}"
        ) from None
    except transport_errors() as e:  # server down, refused, reset
        try:
            found = resolve_offline(repo, version, revision, cache_dir)
        except NotInCacheError:
            raise DownloadError(
                f"cannot reach {api.endpoint} to resolve {repo} ({type(e).__name__}: {e}) and the "
                "cache has no copy; retry when the Hub is reachable"
            ) from None
        warnings.warn(
            f"cannot reach {api.endpoint} ({type(e).__name__}); using the cached {repo}@{found.sha[:12]}",
            stacklevel=3,
        )
        return found
    branches = {b.name: b.target_commit for b in refs.branches}
    tags = {t.name: t.target_commit for t in refs.tags}
    found = _pick(repo, branches, tags, version, revision, "")
    if found.ref is not None:
        record_ref(cache_dir, repo, found.ref, found.sha)
    return found


def resolve_offline(
    repo: RepoId, version: int | None, revision: str | None, cache_dir: Path
) -> Resolved:
    """Resolve from the refs a previous online pull recorded. Raises NotInCacheError."""
    if version is None and revision is not None and is_commit_sha(revision):
        return Resolved(revision)
    refs_dir = repo_cache_dir(cache_dir, repo) / "refs"
    cached: dict[str, str] = {}
    if refs_dir.is_dir():
        for p in refs_dir.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                cached[p.relative_to(refs_dir).as_posix()] = p.read_text().strip()
    try:
        # refs/ mixes branches and tags; both resolve the same way here
        return _pick(repo, cached, {}, version, revision, "in the local cache ")
    except (VersionNotFoundError, RevisionNotFoundError) as e:
        raise NotInCacheError(
            f"offline and not cached: {e}. Pull it once while online (HF_HUB_OFFLINE unset)."
        ) from None
