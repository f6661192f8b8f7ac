"""Which kernels may run: remote code runs only from trusted organizations, or when asked for.

A pulled kernel is Python code that runs in the caller's process, so the default is no. The
trusted list is local configuration, never something a server says about itself:
  - `NKIKIT_TRUSTED_ORGS` (comma separated organizations or `org/name` repos) when set, which
    *replaces* the default so that an empty value trusts nothing;
  - otherwise DEFAULT_TRUSTED_ORGS.
`trust_remote_code=True` on a pull trusts that one call.
"""

from __future__ import annotations

import os

from .errors import UntrustedKernelError
from .names import RepoId

TRUSTED_ORGS_ENV = "NKIKIT_TRUSTED_ORGS"

#: Organizations trusted out of the box: the nkikit kernel library's own.
DEFAULT_TRUSTED_ORGS: tuple[str, ...] = ("nkikit",)


def trusted_entries() -> tuple[str, ...]:
    """The configured trusted organizations / repos (env NKIKIT_TRUSTED_ORGS or the default)."""
    raw = os.environ.get(TRUSTED_ORGS_ENV)
    if raw is None:
        return DEFAULT_TRUSTED_ORGS
    return tuple(e.strip() for e in raw.split(",") if e.strip())


def is_trusted(repo: RepoId) -> bool:
    """True if the repo or its organization is in the trusted list (`*` trusts everything)."""
    entries = trusted_entries()
    return "*" in entries or repo.org in entries or str(repo) in entries


def check_trust(repo: RepoId, trust_remote_code: bool) -> None:
    """Raises UntrustedKernelError, saying how to opt in, unless the repo may run here."""
    if trust_remote_code or is_trusted(repo):
        return
    listed = ", ".join(trusted_entries()) or "nothing"
    raise UntrustedKernelError(
        f"{repo} runs Python code from the Hub, and organization {repo.org!r} is not trusted "
        f"(trusted: {listed}). Read the kernel's files first, then either pass "
        f"trust_remote_code=True (CLI: --trust-remote-code) or add it to {TRUSTED_ORGS_ENV} "
        f"(e.g. {TRUSTED_ORGS_ENV}={repo.org})."
    )
