"""Validation of everything a client names: repo ids, file paths inside a repo, branch and tag names.

These checks are the hub's security boundary. Repo namespaces and names become directory names on
disk, so they are held to a strict character set. File paths never touch the filesystem (blobs are
stored by hash), but a path that could escape a checkout when a client writes it out ('..',
absolute, backslashes, empty segments) is refused anyway, on commit and on download alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import BadRequest

#: URL word for each repo type ("/api/models/...") and the prefix used in download URLs.
REPO_TYPES: dict[str, str] = {
    "model": "models",
    "dataset": "datasets",
    "space": "spaces",
    "kernel": "kernels",
}
URL_PREFIXES: dict[str, str] = {
    "model": "",
    "dataset": "datasets/",
    "space": "spaces/",
    "kernel": "kernels/",
}
TYPE_BY_PLURAL: dict[str, str] = {plural: t for t, plural in REPO_TYPES.items()}

# One path segment of a repo id: letters, digits, '.', '_', '-', not starting or ending with
# punctuation. The Hub also forbids '--' and '..' (the cache folder name uses '--' as separator).
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
# Namespaces that would make download URLs ambiguous with typed prefixes or the API.
_RESERVED_NAMESPACES = {"api", "models", "datasets", "spaces", "kernels", "resolve"}

_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_REF_CHARS_RE = re.compile(r"[A-Za-z0-9._/+-]+")


@dataclass(frozen=True)
class RepoRef:
    """A repo's identity: its type ('model', 'dataset', 'space', 'kernel') and 'namespace/name'."""

    type: str
    namespace: str
    name: str

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def plural(self) -> str:
        return REPO_TYPES[self.type]

    @property
    def url_path(self) -> str:
        """The repo's path in web and download URLs, e.g. 'kernels/org/name' or 'org/name'."""
        return f"{URL_PREFIXES[self.type]}{self.id}"


def is_valid_name(segment: str) -> bool:
    """True if `segment` is acceptable as a namespace or repo name."""
    # fullmatch, not match: '$' also matches before a trailing newline ("name\n").
    return (
        isinstance(segment, str)
        and bool(_NAME_RE.fullmatch(segment))
        and "--" not in segment
        and ".." not in segment
    )


def repo_ref(repo_type: str, namespace: str, name: str) -> RepoRef:
    """Build a RepoRef, refusing names that are not valid (BadRequest)."""
    if not isinstance(repo_type, str) or repo_type not in REPO_TYPES:
        raise BadRequest(f"Invalid repo type {repo_type!r}: expected one of {sorted(REPO_TYPES)}")
    for label, value in (("namespace", namespace), ("name", name)):
        if not is_valid_name(value):
            raise BadRequest(
                f"Invalid repo {label} {value!r}: use letters, digits, '-', '_' and '.', "
                "start and end with a letter or digit, no '--' or '..', at most 96 characters"
            )
    if namespace.lower() in _RESERVED_NAMESPACES:
        raise BadRequest(f"Invalid repo namespace {namespace!r}: the name is reserved")
    return RepoRef(repo_type, namespace, name)


def is_commit_sha(rev: str) -> bool:
    """True for a full 40-hex commit id (the only form of sha this hub resolves)."""
    return isinstance(rev, str) and bool(_COMMIT_RE.fullmatch(rev))


def check_repo_path(path: str) -> str:
    """Return `path` if it is a safe, relative, '/'-separated file path; else raise BadRequest.

    Refused: empty, absolute ('/x'), backslashes, empty segments ('a//b', trailing '/'), '.' or '..'
    segments, NUL or other control characters, and anything under a '.git' folder.
    """
    if not isinstance(path, str) or not path:
        raise BadRequest("Invalid path: empty path")
    if path.startswith("/"):
        raise BadRequest(f"Invalid path {path!r}: absolute paths are not allowed")
    if "\\" in path:
        raise BadRequest(f"Invalid path {path!r}: backslashes are not allowed")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise BadRequest(f"Invalid path {path!r}: control characters are not allowed")
    for segment in path.split("/"):
        if segment == "":
            raise BadRequest(f"Invalid path {path!r}: empty path segment")
        if segment in (".", ".."):
            raise BadRequest(f"Invalid path {path!r}: '.' and '..' segments are not allowed")
        if segment == ".git":
            raise BadRequest(f"Invalid path {path!r}: cannot write under a '.git' folder")
    if len(path.encode()) > 4096:
        raise BadRequest("Invalid path: longer than 4096 bytes")
    return path


def check_folder_path(path: str) -> str:
    """Like check_repo_path, for a folder: a trailing '/' is allowed and stripped."""
    if not isinstance(path, str):
        raise BadRequest("Invalid path: not a string")
    return check_repo_path(path[:-1] if path.endswith("/") else path)


def check_ref_name(name: str, kind: str = "branch") -> str:
    """Return `name` if it is a valid branch or tag name (git's rules, a safe subset); else BadRequest.

    Names may contain '/' (e.g. 'release/v1'). Refused: 'refs/...', 'HEAD', a 40-hex string (it would
    read as a commit id), '..', '//', a leading or trailing '/' or '.', '.lock' suffix, and characters
    outside [A-Za-z0-9._/+-].
    """
    bad = (
        not isinstance(name, str)
        or not name
        or len(name) > 255
        or not _REF_CHARS_RE.fullmatch(name)
        or name == "HEAD"
        or name.startswith(("refs/", "/", "."))
        or name.endswith(("/", ".", ".lock"))
        or ".." in name
        or "//" in name
        or "/." in name
        or is_commit_sha(name)
    )
    if bad:
        raise BadRequest(f"Invalid {kind} name {name!r}")
    return name
