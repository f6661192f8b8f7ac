"""Publish a kernel folder to a Hub: test, build, and make version N visible in one step.

Version N lives on branch `vN`. A version becomes visible only complete:
  - a new version is committed (one commit with every file) to a scratch branch
    `publish-vN-<random>` that no reader looks at, and branch `vN` is then created at that
    commit: the branch appears pointing at a finished build, or not at all;
  - an existing version is replaced by one commit on `vN` (stale build files deleted in the
    same commit), guarded by `parent_commit` so a concurrent publish is refused, not merged.
An interrupted publish leaves at most a scratch branch, which the next publish removes.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .build import BuildResult, build_kernel
from .errors import PublishError
from .manifest import load_manifest
from .names import REPO_TYPE, parse_repo_id, version_branch
from .testrun import TestReport, run_kernel_tests

SCRATCH_PREFIX = "publish-"


@dataclass
class PublishResult:
    """What was published: where, which version and commit, and what it holds."""

    repo_id: str
    version: int
    branch: str
    commit: str
    url: str
    variants: dict[str, str]  # variant -> build id
    tests: TestReport | None
    files: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.repo_id} v{self.version} -> {self.branch}@{self.commit[:12]}"


def _api(endpoint: str | None, token: str | None):  # noqa: ANN202 - HfApi imported lazily
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


def publish(
    path: str | Path,
    repo_id: str,
    *,
    endpoint: str | None = None,
    token: str | None = None,
    version: int | None = None,
    run_tests: bool = True,
    private: bool = False,
    neuron: bool = True,
    neuron_import: str = "neuronxcc.nki",
    log: Callable[[str], None] | None = None,
) -> PublishResult:
    """Test the kernel in `path`, build it and publish it as version N of `repo_id`.

    version: overrides kernel.toml's version. run_tests: run the folder's tests first (pytest,
    subprocess) and refuse to publish if any fails. private: create the repo private.
    neuron: also publish the torch-neuron build (imports rewritten to `neuron_import`).

    Raises ValueError (bad repo id), ManifestError, KernelTestsFailedError, BuildError, and
    PublishError (the Hub refused or failed: auth, network, a concurrent publish) - in which
    case no partial version is visible.
    """
    say = log or (lambda _msg: None)
    parse_repo_id(repo_id)
    manifest = load_manifest(path)
    if version is not None:
        manifest = manifest.with_version(version)
    say(f"checking {repo_id} on the Hub ...")
    check_hub(repo_id, endpoint, token)  # before minutes of tests, not after
    tests = None
    if run_tests:
        say(f"testing {manifest.name} on the simulator ...")
        tests = run_kernel_tests(path)
        say(f"tests: {tests.summary or f'{tests.passed} passed'}")
    with tempfile.TemporaryDirectory(prefix="nkikit-publish-") as tmp:
        built = build_kernel(
            path,
            tmp,
            repo_id,
            manifest=manifest,
            tests=tests,
            neuron=neuron,
            neuron_import=neuron_import,
        )
        say(f"built {', '.join(f'{v} ({b.id})' for v, b in built.variants.items())}")
        return _upload(built, repo_id, endpoint=endpoint, token=token, private=private, say=say)


def check_hub(repo_id: str, endpoint: str | None, token: str | None) -> None:
    """Raise PublishError unless the Hub answers and, when a token is given or saved, accepts
    it. Makes one or two requests and writes nothing."""
    from huggingface_hub.errors import RepositoryNotFoundError
    from huggingface_hub.utils import get_token

    api = _api(endpoint, token)
    if token or get_token():
        try:
            api.whoami()
        except Exception as e:
            raise _hub_error("check the token", repo_id, e) from e
    try:
        api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
    except RepositoryNotFoundError:
        pass  # a first publish creates it
    except Exception as e:
        raise _hub_error("reach the Hub", repo_id, e) from e


def _hub_error(action: str, repo_id: str, e: Exception) -> PublishError:
    from huggingface_hub.errors import HfHubHTTPError

    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, HfHubHTTPError) and status in (401, 403):
        hint = "the Hub refused the token (pass token=... / --token, or set HF_TOKEN)"
    elif isinstance(e, HfHubHTTPError) and status == 412:
        hint = "another publish changed the branch meanwhile; run publish again"
    elif isinstance(e, HfHubHTTPError):
        hint = f"the Hub answered HTTP {status}"
    else:
        hint = "the Hub could not be reached"
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    return PublishError(
        f"publishing {repo_id} failed while trying to {action}: {hint} ({msg}); no partial version was made visible"
    )


def _upload(
    built: BuildResult,
    repo_id: str,
    *,
    endpoint: str | None,
    token: str | None,
    private: bool,
    say: Callable[[str], None],
) -> PublishResult:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    api = _api(endpoint, token)
    branch = version_branch(built.manifest.version)
    files = built.files()
    say(f"uploading {len(files)} files to {repo_id} ({branch}) ...")
    try:
        api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
    except Exception as e:
        raise _hub_error("create the repo", repo_id, e) from e
    heads = {b.name: b.target_commit for b in refs.branches}
    _remove_scratch(api, repo_id, heads, branch)
    ops: list = [
        CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in files.items()
    ]
    message = f"{built.manifest.name} v{built.manifest.version}: " + ", ".join(
        f"{v} {b.id}" for v, b in built.variants.items()
    )
    try:
        if branch in heads:
            stale = [
                p for p in _files_under(api, repo_id, heads[branch], "build") if p not in files
            ]
            ops += [CommitOperationDelete(path_in_repo=p) for p in stale]
            info = api.create_commit(
                repo_id,
                ops,
                commit_message=message,
                repo_type=REPO_TYPE,
                revision=branch,
                parent_commit=heads[branch],
            )
            commit = info.oid
        else:
            scratch = f"{SCRATCH_PREFIX}{branch}-{uuid.uuid4().hex[:8]}"
            api.create_branch(
                repo_id, branch=scratch, revision=heads.get("main"), repo_type=REPO_TYPE
            )
            try:
                info = api.create_commit(
                    repo_id, ops, commit_message=message, repo_type=REPO_TYPE, revision=scratch
                )
                commit = info.oid
                # The version appears here, atomically, pointing at the finished commit.
                api.create_branch(repo_id, branch=branch, revision=commit, repo_type=REPO_TYPE)
            finally:
                _delete_branch_quietly(api, repo_id, scratch)
    except Exception as e:
        raise _hub_error(f"commit {branch}", repo_id, e) from e
    say(f"published {repo_id} {branch} at {commit[:12]}")
    base = (endpoint or api.endpoint).rstrip("/")
    return PublishResult(
        repo_id=repo_id,
        version=built.manifest.version,
        branch=branch,
        commit=commit,
        url=f"{base}/kernels/{repo_id}/tree/{branch}",
        variants={v: b.id for v, b in built.variants.items()},
        tests=built.tests,
        files=list(files),
    )


def _files_under(api, repo_id: str, revision: str, folder: str) -> list[str]:  # noqa: ANN001
    """Paths of the files under `folder` at `revision` ([] if there is no such folder)."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        entries = list(
            api.list_repo_tree(
                repo_id, path_in_repo=folder, recursive=True, revision=revision, repo_type=REPO_TYPE
            )
        )
    except EntryNotFoundError:
        return []
    return [e.path for e in entries if getattr(e, "blob_id", None) is not None]


def _remove_scratch(api, repo_id: str, heads: dict[str, str], branch: str) -> None:  # noqa: ANN001
    """Scratch branches left by interrupted publishes of this version: invisible to readers
    (not a `vN` name), removed when seen so they do not pile up."""
    for name in [n for n in heads if n.startswith(f"{SCRATCH_PREFIX}{branch}-")]:
        _delete_branch_quietly(api, repo_id, name)


def _delete_branch_quietly(api, repo_id: str, branch: str) -> None:  # noqa: ANN001
    try:
        api.delete_branch(repo_id, branch=branch, repo_type=REPO_TYPE)
    except Exception:  # cleanup only; a leftover scratch branch is harmless and retried later
        pass


def discover_kernels(root: str | Path) -> list[Path]:
    """Kernel folders (those with a kernel.toml) directly under `root`, sorted by name."""
    return sorted(p.parent for p in Path(root).glob("*/kernel.toml"))


def publish_all(root: str | Path, org: str, **kwargs) -> list[PublishResult]:  # noqa: ANN003
    """Publish every kernel folder under `root` as `<org>/<kernel name>` (Hub form, e.g.
    `tensor-add`). Stops at the first failure (raising its error); kwargs as for `publish`."""
    results = []
    for folder in discover_kernels(root):
        name = load_manifest(folder).hub_name
        results.append(publish(folder, f"{org}/{name}", **kwargs))
    return results
