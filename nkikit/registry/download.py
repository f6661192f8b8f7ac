"""Get one build variant of one commit into the HF cache (or find it there).

Downloads go through `huggingface_hub.snapshot_download`, so the cache is the standard HF cache
(`kernels--org--name/{blobs,snapshots,refs}`), shared with HF `kernels`, with its progress bars
and its crash safety: a file appears in a snapshot only once complete, and an interrupted
download is resumed by the next one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from .anchor import Tree, tree_files_present, tree_from_listing
from .digests import METADATA_FILE
from .errors import (
    DownloadError,
    KernelNotFoundError,
    NotInCacheError,
    RevisionNotFoundError,
    VariantNotFoundError,
)
from .hubclient import endpoint_url, list_tree, transport_errors
from .names import REPO_TYPE, RepoId
from .resolve import repo_cache_dir

BYTECODE_PATTERNS = ["*.pyc", "**/__pycache__/**"]


def cached_variant_dir(cache_dir: Path, repo: RepoId, sha: str, variant: str) -> Path:
    return repo_cache_dir(cache_dir, repo) / "snapshots" / sha / "build" / variant


def _complete(variant_dir: Path, expected: Mapping[str, str] | None = None) -> bool:
    """True when every file of the commit's tree (`expected`, when known) or else metadata.json
    and every file it lists are in the cache. Content is checked later, at load: a
    present-but-wrong file is tampering, not something to re-download."""
    if expected is not None:
        return tree_files_present(variant_dir, expected)
    try:
        meta = json.loads((variant_dir / METADATA_FILE).read_text(encoding="utf-8"))
        files = meta["digest"]["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((variant_dir / rel).is_file() for rel in files)


def fetch_variant(
    api,
    repo: RepoId,
    sha: str,
    variant: str,
    cache_dir: Path,
    *,
    offline: bool,
    expected: Mapping[str, str] | None = None,
) -> Path:  # noqa: ANN001
    """The folder of `build/<variant>/` at commit `sha` in the cache, downloading what is missing.

    expected: the variant's files per the commit's tree, when the Hub reported it (decides what
    "complete" means; otherwise metadata.json's listing does).

    Raises NotInCacheError (offline, not cached), KernelNotFoundError, RevisionNotFoundError,
    VariantNotFoundError (the commit has no such build), DownloadError (network failure part
    way: finished files stay cached, unfinished ones are resumed by the next pull).
    """
    variant_dir = cached_variant_dir(cache_dir, repo, sha, variant)
    if _complete(variant_dir, expected):
        return variant_dir
    if offline:
        raise NotInCacheError(
            f"offline (HF_HUB_OFFLINE=1) and {repo}@{sha[:12]} build {variant} is not in the cache "
            f"{cache_dir}; pull it once while online"
        )
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.errors import RevisionNotFoundError as HfRevisionNotFound

    try:
        api.snapshot_download(
            str(repo),
            repo_type=REPO_TYPE,
            revision=sha,
            allow_patterns=[f"build/{variant}/*"],
            ignore_patterns=BYTECODE_PATTERNS,
            cache_dir=cache_dir,
        )
    except RepositoryNotFoundError:
        raise KernelNotFoundError(f"kernel repo {repo} not found at {api.endpoint}") from None
    except HfRevisionNotFound:
        raise RevisionNotFoundError(f"{repo} has no revision {sha!r} at {api.endpoint}") from None
    except HfHubHTTPError as e:
        raise DownloadError(
            f"downloading {repo}@{sha[:12]} ({variant}) failed: {_first_line(e)}"
        ) from None
    except transport_errors() as e:
        raise DownloadError(
            f"downloading {repo}@{sha[:12]} ({variant}) was interrupted: {type(e).__name__}: "
            f"{_first_line(e)}. The cache is consistent (finished files kept, unfinished ones are "
            "resumed): pull again when the Hub is reachable."
        ) from None
    if not (variant_dir / METADATA_FILE).is_file():
        raise missing_variant(api, repo, sha, variant)
    return variant_dir


def fetch_tree(
    api,
    repo: RepoId,
    sha: str,
    variant: str,
    origin: str,
    *,
    endpoint: str | None,
    token: str | None,
) -> Tree | None:  # noqa: ANN001
    """The variant's tree at commit `sha` as the Hub reports it; None when the Hub cannot be
    reached (the caller falls back to what the cache recorded). One request, made without
    importing huggingface_hub's HfApi (`api` is used only to word a missing-variant error).

    Raises KernelNotFoundError, RevisionNotFoundError, VariantNotFoundError, DownloadError.
    """
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.errors import RevisionNotFoundError as HfRevisionNotFound

    where = endpoint_url(endpoint)
    folder = f"build/{variant}"
    try:
        entries = list_tree(endpoint, token, REPO_TYPE, str(repo), sha, folder)
        files = tree_from_listing(entries, folder)
    except RepositoryNotFoundError:
        raise KernelNotFoundError(f"kernel repo {repo} not found at {where}") from None
    except HfRevisionNotFound:
        raise RevisionNotFoundError(f"{repo} has no revision {sha!r} at {where}") from None
    except EntryNotFoundError:
        files = {}
    except HfHubHTTPError as e:
        raise DownloadError(
            f"listing the files of {repo}@{sha[:12]} ({variant}) failed: {_first_line(e)}"
        ) from None
    except transport_errors():
        return None
    if not files:
        raise missing_variant(api, repo, sha, variant)
    return Tree(files, origin, "hub")


def missing_variant(api, repo: RepoId, sha: str, variant: str) -> VariantNotFoundError:  # noqa: ANN001
    """The error for a commit without `build/<variant>/`, listing the builds it has."""
    builds = ", ".join(_remote_variants(api, repo, sha)) or "none"
    return VariantNotFoundError(f"{repo}@{sha[:12]} has no build {variant!r} (builds: {builds})")


def _remote_variants(api, repo: RepoId, sha: str) -> list[str]:  # noqa: ANN001
    try:
        return sorted(
            e.path.split("/", 1)[1]
            for e in api.list_repo_tree(
                str(repo), path_in_repo="build", revision=sha, repo_type=REPO_TYPE
            )
            if getattr(e, "blob_id", None) is None
        )
    except Exception:  # only used to word an error message
        return []


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
