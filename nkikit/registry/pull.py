"""`pull`: resolve, download (or find in the cache), verify, import - one kernel build.

trust check (before anything is fetched)
  -> resolve version / revision / lock to a commit      (resolve.py, lockfile.py)
  -> the variant's tree at that commit (git blob ids)   (download.py; recorded for offline use)
  -> build/<variant>/ of that commit in the HF cache     (download.py)
  -> every file against the commit's tree               (anchor.py; at every pull)
  -> every file against metadata.json's digests         (digests.py; at every pull)
  -> the variant against the lock's hash, if locked     (lockfile.py)
  -> import as package <build id>, sources re-verified as they are read  (importer.py)
  -> KernelModule
"""

from __future__ import annotations

import json
import sys
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .anchor import Tree, cache_link_tree, record_tree, recorded_tree, verify_tree
from .digests import ALGORITHMS, METADATA_FILE, verify_folder
from .download import fetch_tree, fetch_variant
from .errors import BackendUnavailableError, IntegrityError, LockMismatchError, RegistryError
from .hubclient import LazyHfApi, default_cache_dir, is_offline
from .importer import import_build, loaded_root
from .lockfile import DEFAULT_LOCKFILE, LockEntry, read_lockfile, verify_variant
from .module import KernelModule
from .names import RepoId, is_commit_sha, parse_repo_id, variant_for_backend
from .resolve import Resolved, resolve_offline, resolve_online
from .trust import check_trust, effective_endpoint, trusted_somewhere

_loaded: dict[str, dict[str, str]] = {}  # build id -> digests of its code, for builds we imported


def _code_digests(files: dict[str, str]) -> dict[str, str]:
    """The digests that decide what a build does: everything but its documentation (the card
    names the repo, so one build published to two repos differs only there)."""
    return {rel: d for rel, d in files.items() if not rel.endswith(".md")}


_import_lock = threading.Lock()


def find_lock_entry(lockfile: str | Path | bool | None, repo_id: str) -> LockEntry | None:
    """The lock entry for `repo_id`.

    lockfile: None = ./kernels.lock when it exists (repos it does not list are not locked);
    False = ignore lockfiles; a path = that file, which must exist and list the repo.
    Raises FileNotFoundError, LockMismatchError (an explicit lockfile without the repo).
    """
    if lockfile is False:
        return None
    if lockfile is None or lockfile is True:
        path = Path(DEFAULT_LOCKFILE)
        if not path.is_file():
            if lockfile is True:
                raise FileNotFoundError(f"no {DEFAULT_LOCKFILE} in {Path.cwd()}")
            return None
        return read_lockfile(path).get(repo_id)
    path = Path(lockfile)
    entries = read_lockfile(path)
    if repo_id not in entries:
        raise LockMismatchError(
            f"{repo_id} is not locked in {path}; add it with `nkikit lock {repo_id}`"
        )
    return entries[repo_id]


def _resolve(
    api,
    repo: RepoId,
    version: int | None,
    revision: str | None,
    lock: LockEntry | None,
    cache_dir: Path,
    offline: bool,
) -> Resolved:  # noqa: ANN001
    if lock is None:
        if offline:
            return resolve_offline(repo, version, revision, cache_dir)
        return resolve_online(api, repo, version, revision, cache_dir)
    if revision is not None and is_commit_sha(revision) and revision != lock.sha:
        raise LockMismatchError(
            f"{repo}: asked for commit {revision[:12]}, but the lockfile pins {lock.sha[:12]}"
        )
    if (version is not None or revision is not None) and not offline:
        found = resolve_online(api, repo, version, revision, cache_dir)
        if found.sha != lock.sha:
            what = (
                f"version {version} (branch {found.ref})" if version is not None else repr(revision)
            )
            raise LockMismatchError(
                f"{repo} {what} now points to commit {found.sha[:12]}, but the lockfile pins "
                f"{lock.sha[:12]}. Refusing to switch silently: run `nkikit lock` to move the pin, "
                "or pull without a version to use the locked build."
            )
        return found
    return Resolved(lock.sha, None, version)


def read_metadata(variant_dir: Path) -> dict[str, Any]:
    """The variant's metadata.json. Raises IntegrityError if it is missing or unusable."""
    path = variant_dir / METADATA_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise IntegrityError(
            f"{path}: cannot read the build's metadata ({e})", path=str(path)
        ) from None
    bid = meta.get("id") if isinstance(meta, dict) else None
    if not isinstance(bid, str) or not bid.isidentifier():
        raise IntegrityError(
            f"{path}: 'id' must be a Python identifier, got {bid!r}", path=str(path)
        )
    digest = meta.get("digest")
    if not isinstance(digest, dict) or digest.get("algorithm") not in ALGORITHMS:
        raise IntegrityError(
            f"{path}: no usable 'digest'; refusing to load an unverifiable build", path=str(path)
        )
    return meta


def _import_variant(variant_dir: Path, meta: dict[str, Any]) -> Any:
    bid: str = meta["id"]
    files: dict[str, str] = meta["digest"]["files"]
    with _import_lock:
        module = sys.modules.get(bid)
        if module is not None:
            if loaded_root(bid) == variant_dir or _loaded.get(bid) == _code_digests(files):
                return module  # this very build (or the same content from another cache)
            raise RegistryError(
                f"a different module named {bid!r} is already imported (from "
                f"{getattr(module, '__file__', '?')}); restart Python to load {variant_dir}"
            )
        module = import_build(
            bid, variant_dir, digests=files, algorithm=meta["digest"]["algorithm"]
        )
        _loaded[bid] = _code_digests(files)
        return module


def _neuron_sdk(name: str) -> bool:
    """Whether the AWS Neuron SDK's module ``name`` is importable: nkikit's own ``nki`` alias
    (``nkikit.nki.install_alias``) is not it."""
    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and not spec.name.startswith("nkikit")


def _check_backend(variant: str, variant_dir: Path) -> None:
    if variant == "torch-neuron" and not (_neuron_sdk("neuronxcc") or _neuron_sdk("nki")):
        raise BackendUnavailableError(
            f"the torch-neuron build is downloaded and verified at {variant_dir}, but it runs only "
            "with the AWS Neuron SDK (neuronxcc / nki), which is not installed here. Use "
            "backend='cpu' to run the kernel on the nkikit simulator."
        )


def _anchor_tree(
    api,
    repo: RepoId,
    found: Resolved,
    variant: str,
    cache: Path,
    offline: bool,
    origin: str,
    endpoint: str | None,
    token: str | None,
) -> Tree | None:  # noqa: ANN001
    """The commit's tree to check the variant against (None: nothing recorded, offline).

    A pull that resolved a version, branch or tag has just asked the Hub, so it asks for the
    tree too (one more request) and records it. A pull by exact commit or lockfile makes no
    request by design: it uses the tree recorded at the pull that downloaded the build, and asks
    the Hub only when there is none. Offline, or with the Hub unreachable: the record.
    """
    recorded = recorded_tree(cache, repo, found.sha, variant)
    if offline or (found.ref is None and recorded is not None):
        return recorded
    tree = fetch_tree(api, repo, found.sha, variant, origin, endpoint=endpoint, token=token)
    if tree is None:
        return recorded
    record_tree(cache, repo, found.sha, variant, tree)
    return tree


def _locate(
    repo_id: str,
    version: int | None,
    revision: str | None,
    *,
    endpoint: str | None,
    token: str | None,
    backend: str,
    lockfile: str | Path | bool | None,
    cache_dir: str | Path | None,
) -> tuple[Path, Resolved, dict[str, Any], str | None]:
    """`locate`, also returning the endpoint the verified tree came from (None: unknown)."""
    repo = parse_repo_id(repo_id)
    if version is not None and revision is not None:
        raise ValueError("pass either version= or revision=, not both")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 0
    ):
        raise ValueError(f"version must be a non-negative int (the major version), got {version!r}")
    variant = variant_for_backend(backend)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    offline = is_offline()
    lock = find_lock_entry(lockfile, repo_id)
    api = LazyHfApi(endpoint, token)
    found = _resolve(api, repo, version, revision, lock, cache, offline)
    here = effective_endpoint(endpoint)
    tree = _anchor_tree(api, repo, found, variant, cache, offline, here, endpoint, token)
    variant_dir = fetch_variant(
        api,
        repo,
        found.sha,
        variant,
        cache,
        offline=offline,
        expected=tree.files if tree is not None else None,
    )
    label = f"{repo}@{found.sha[:12]}"
    if tree is None:
        tree = cache_link_tree(variant_dir)
    if tree is None:
        raise IntegrityError(
            f"{variant_dir}: nothing to verify this build against (no record of commit "
            f"{found.sha[:12]}'s tree, and the folder is not an HF cache snapshot). Refusing to "
            "load it; pull it once while the Hub is reachable.",
            path=str(variant_dir),
        )
    verify_tree(variant_dir, tree, label=label)
    meta = read_metadata(variant_dir)
    verify_folder(variant_dir, meta["digest"], label=label)
    if lock is not None:
        verify_variant(lock, variant, variant_dir)
    return variant_dir, found, meta, tree.origin


def locate(
    repo_id: str,
    version: int | None = None,
    revision: str | None = None,
    *,
    endpoint: str | None = None,
    token: str | None = None,
    backend: str = "cpu",
    lockfile: str | Path | bool | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[Path, Resolved, dict[str, Any]]:
    """Resolve, fetch and verify one build variant without importing it.

    Every file, metadata.json included, is checked against the commit's tree (git blob ids as
    the Hub reports them, or as recorded at the last online pull: see anchor.py), then against
    metadata.json's digests, then against the lockfile's hash when locked.
    Returns (variant folder, resolution, metadata). Raises as `pull` does, except for trust and
    import errors (nothing is executed).
    """
    variant_dir, found, meta, _ = _locate(
        repo_id,
        version,
        revision,
        endpoint=endpoint,
        token=token,
        backend=backend,
        lockfile=lockfile,
        cache_dir=cache_dir,
    )
    return variant_dir, found, meta


def pull(
    repo_id: str,
    version: int | None = None,
    revision: str | None = None,
    *,
    endpoint: str | None = None,
    token: str | None = None,
    trust_remote_code: bool = False,
    backend: str = "cpu",
    lockfile: str | Path | bool | None = None,
    cache_dir: str | Path | None = None,
) -> KernelModule:
    """Load a published kernel: `kernels.pull("org/rmsnorm", version=1)`.

    version: major version N (branch vN); revision: a branch, tag or commit sha; neither: the
    latest version (or the lockfile's pin). backend: 'cpu' (the simulator) or 'neuron'.
    lockfile: see find_lock_entry. cache_dir: the HF cache to use (default HF_HUB_CACHE).
    HF_HUB_OFFLINE=1 works from the cache after one online pull.

    Raises ValueError (bad arguments), UntrustedKernelError, KernelNotFoundError,
    VersionNotFoundError, RevisionNotFoundError, VariantNotFoundError, NotInCacheError,
    DownloadError, IntegrityError (a file differs from its published digest: never loaded),
    LockMismatchError, BackendUnavailableError.
    """
    repo = parse_repo_id(repo_id)
    variant_for_backend(backend)
    if not trust_remote_code and not trusted_somewhere(repo):
        check_trust(repo, False, endpoint)  # refused before anything is downloaded
    variant_dir, found, meta, origin = _locate(
        repo_id,
        version,
        revision,
        endpoint=endpoint,
        token=token,
        backend=backend,
        lockfile=lockfile,
        cache_dir=cache_dir,
    )
    # Trust is decided for the endpoint the verified build came from: the HF cache is shared by
    # every endpoint, so a build another Hub put there needs that Hub's trust, whatever the
    # endpoint of this call (None: a cache another client filled; this call's endpoint).
    check_trust(repo, trust_remote_code, origin or endpoint)
    variant = variant_dir.name
    _check_backend(variant, variant_dir)
    module = _import_variant(variant_dir, meta)
    return KernelModule(
        module,
        repo_id=repo_id,
        revision=found.sha,
        version=found.version if found.version is not None else meta.get("version"),
        variant=variant,
        path=variant_dir,
        metadata=meta,
    )
