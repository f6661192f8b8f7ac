"""Errors the hub answers with, shaped the way the Hugging Face Hub shapes them.

Every failure a client can cause is a `HubError` carrying the HTTP status, a message a person can
act on and, where the Hub has one, the `X-Error-Code` that `huggingface_hub` maps to a named
exception (`RepositoryNotFoundError`, `RevisionNotFoundError`, `EntryNotFoundError`). The app turns
a `HubError` into `{"error": message}` plus those headers; storage code raises them directly so a
rule lives in one place.
"""

from __future__ import annotations


class HubError(Exception):
    """A request the hub refuses; `status` and `code` decide how the client reports it."""

    status: int = 400
    code: str | None = None

    def __init__(self, message: str, *, status: int | None = None, extra: dict | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        # Extra JSON keys the client reads from an error body (e.g. `url` on a 409 from create).
        self.extra = dict(extra or {})
        # The commit an EntryNotFound was resolved against: the client caches the miss under it.
        self.repo_commit: str | None = None


class BadRequest(HubError):
    """Malformed input: bad path, bad ref name, bad JSON (400 -> BadRequestError)."""

    status = 400


class Unauthorized(HubError):
    """A write (or whoami) without a valid token when the hub has one configured."""

    status = 401


class Forbidden(HubError):
    """An operation the hub never allows, e.g. deleting the default branch."""

    status = 403


class RepoNotFound(HubError):
    """No such repo, or a private repo the caller may not see (the two look the same)."""

    status = 404
    code = "RepoNotFound"


class RevisionNotFound(HubError):
    """The repo exists but the branch, tag or commit does not."""

    status = 404
    code = "RevisionNotFound"


class EntryNotFound(HubError):
    """The revision exists but the file or folder does not."""

    status = 404
    code = "EntryNotFound"


class Conflict(HubError):
    """The thing being created already exists (repo, branch, tag)."""

    status = 409


class PreconditionFailed(HubError):
    """`parentCommit` is not the branch head: someone committed in between."""

    status = 412


class NotFound(HubError):
    """A route or organization this hub does not have (no X-Error-Code)."""

    status = 404


class CorruptBlob(HubError):
    """A stored file no longer matches what its commit recorded (size or sha256): the hub
    refuses to serve it rather than send bytes the commit never held."""

    status = 500
