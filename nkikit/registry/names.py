"""Names the registry derives: repo ids, kernel names, version branches, variants, namespaces.

The rules follow the HF `kernels` contract (reference/hub.md §1.6-1.8): kernel names are
lowercase with dashes (`tensor-add`), their Python form uses underscores (`tensor_add`),
major version N lives on branch `vN`, noarch builds are `build/torch-<backend>/`, and every
build has an id, unique per content and backend, that names both its module and its torch op
namespace (`_tensor_add_cpu_1a2b3c4`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Repo type of kernel repositories on the Hub (huggingface_hub >= 1.10).
REPO_TYPE = "kernel"

#: Backend name (the `backend=` argument of `kernels.pull`) -> build variant folder.
VARIANTS = {"cpu": "torch-cpu", "neuron": "torch-neuron"}

_KERNEL_NAME_RE = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")
_REPO_PART_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_VERSION_BRANCH_RE = re.compile(r"^v(0|[1-9][0-9]*)$")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class RepoId:
    """A parsed `org/name` repository id."""

    org: str
    name: str

    def __str__(self) -> str:
        return f"{self.org}/{self.name}"


def parse_repo_id(repo_id: str) -> RepoId:
    """Split `org/name`. Raises ValueError naming the id if it is not of that form."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise ValueError(f"invalid kernel repo id {repo_id!r}: expected 'org/name'")
    org, name = repo_id.split("/")
    if not (_REPO_PART_RE.match(org) and _REPO_PART_RE.match(name)):
        raise ValueError(
            f"invalid kernel repo id {repo_id!r}: org and name may hold letters, digits, "
            "'-', '_' and '.', and must start and end with a letter or digit"
        )
    return RepoId(org, name)


def kernel_name(name: str) -> str:
    """The Hub form of a kernel name (`tensor_add` -> `tensor-add`).

    Raises ValueError if the result breaks the HF kernels rule `^[a-z][-a-z0-9]*[a-z0-9]$`.
    """
    hub = name.replace("_", "-")
    if not _KERNEL_NAME_RE.match(hub):
        raise ValueError(
            f"invalid kernel name {name!r}: use lowercase letters, digits, '-' or '_', starting "
            "with a letter and ending with a letter or digit (e.g. 'rmsnorm', 'tensor_add')"
        )
    return hub


def python_name(name: str) -> str:
    """The Python identifier form of a kernel name (`tensor-add` -> `tensor_add`)."""
    return name.replace("-", "_")


def version_branch(version: int) -> str:
    """The branch that holds major version `version` (`1` -> `v1`)."""
    return f"v{int(version)}"


def parse_version_branch(branch: str) -> int | None:
    """The major version a branch name holds (`v3` -> 3), or None for any other branch."""
    m = _VERSION_BRANCH_RE.match(branch)
    return int(m.group(1)) if m else None


def is_commit_sha(revision: str) -> bool:
    """True for a full 40-hex commit id."""
    return bool(_SHA_RE.match(revision))


def variant_for_backend(backend: str) -> str:
    """The build variant folder for a backend name. Raises ValueError for an unknown backend."""
    try:
        return VARIANTS[backend]
    except KeyError:
        raise ValueError(
            f"unknown backend {backend!r}: expected one of {', '.join(sorted(VARIANTS))}"
        ) from None


def build_id(name: str, backend: str, content_hash: str) -> str:
    """The module name and torch op namespace of one build, unique per content and backend.

    `content_hash` is a hex digest of the build's sources; 7 characters of it are kept, as git
    does for short ids (version numbers are deliberately not used: see hub.md §1.8).
    """
    return f"_{python_name(name)}_{backend}_{content_hash[:7]}"
