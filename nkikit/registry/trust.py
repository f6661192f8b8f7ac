"""Which kernels may run: remote code runs only from trusted publishers, or when asked for.

A pulled kernel is Python code that runs in the caller's process, so the default is no. Trust is
local configuration, never something a server says about itself, and it is tied to an endpoint:
an organization's name means nothing on its own, since anyone who can write to a Hub can create
that organization there (a token-less `nkikit hub serve` lets anyone create any namespace).

The trusted list:
  - `NKIKIT_TRUSTED_ORGS` (comma separated entries) when set, which *replaces* the default so
    that an empty value trusts nothing;
  - otherwise DEFAULT_TRUSTED_ORGS: the nkikit organization on the public Hub only.

An entry is `org`, `org/name` or `*` (every publisher), optionally followed by `@<endpoint>`:
  - `acme`                          acme on the public Hub (https://huggingface.co) only;
  - `acme@http://hub.internal:8000` acme on that Hub only;
  - `acme@*`                        acme on every endpoint (for a mirror you control);
  - `*@http://127.0.0.1:8000`       everything that Hub serves.
Endpoints compare after normalization (scheme and host lower-cased, default port and trailing
'/' dropped). `trust_remote_code=True` on a pull trusts that one call.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from .errors import UntrustedKernelError
from .names import RepoId

TRUSTED_ORGS_ENV = "NKIKIT_TRUSTED_ORGS"

#: The public Hub: bare entries (no `@endpoint`) trust publishers there and nowhere else.
PUBLIC_ENDPOINT = "https://huggingface.co"

#: Trusted out of the box: the nkikit kernel library's own organization, on the public Hub.
DEFAULT_TRUSTED_ORGS: tuple[str, ...] = ("nkikit",)

_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_endpoint(url: str) -> str:
    """`url` as compared for trust: lower-case scheme and host, no default port, no trailing '/'.

    Raises ValueError for something that is not an http(s) URL.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"not an http(s) endpoint URL: {url!r}")
    host = parts.hostname.lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    port = parts.port
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def effective_endpoint(endpoint: str | None) -> str:
    """The endpoint a call talks to: `endpoint`, else HF_ENDPOINT as huggingface_hub read it."""
    if endpoint is None:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    return normalize_endpoint(endpoint)


def trusted_entries() -> tuple[str, ...]:
    """The configured entries (env NKIKIT_TRUSTED_ORGS, or the default), as written."""
    raw = os.environ.get(TRUSTED_ORGS_ENV)
    if raw is None:
        return DEFAULT_TRUSTED_ORGS
    return tuple(e.strip() for e in raw.split(",") if e.strip())


def _split_entry(entry: str) -> tuple[str, str | None]:
    """(publisher, normalized endpoint or None for any endpoint) of one entry.

    Raises ValueError for an entry whose endpoint is not a URL (a typo must not trust silently
    elsewhere, nor be ignored without a word).
    """
    who, at, where = entry.partition("@")
    if not at:
        return who, normalize_endpoint(PUBLIC_ENDPOINT)
    if where.strip() == "*":
        return who.strip(), None
    try:
        return who.strip(), normalize_endpoint(where)
    except ValueError:
        raise ValueError(
            f"{TRUSTED_ORGS_ENV}: entry {entry!r} names no usable endpoint after '@' "
            "(expected e.g. acme@http://127.0.0.1:8000 or acme@*)"
        ) from None


def is_trusted(repo: RepoId, endpoint: str | None = None) -> bool:
    """True if an entry names the repo, its organization or `*` for `endpoint` (None: the
    endpoint huggingface_hub is configured for)."""
    here = effective_endpoint(endpoint)
    for entry in trusted_entries():
        who, where = _split_entry(entry)
        if where is not None and where != here:
            continue
        if who in ("*", repo.org, str(repo)):
            return True
    return False


def trusted_somewhere(repo: RepoId) -> bool:
    """True if some entry names the repo, its organization or `*`, for any endpoint: a pull of
    it may go ahead, to learn where its build comes from (`check_trust` then decides)."""
    return any(_split_entry(e)[0] in ("*", repo.org, str(repo)) for e in trusted_entries())


def check_trust(repo: RepoId, trust_remote_code: bool, endpoint: str | None = None) -> None:
    """Raises UntrustedKernelError, saying how to opt in, unless the repo may run here."""
    if trust_remote_code or is_trusted(repo, endpoint):
        return
    here = effective_endpoint(endpoint)
    listed = ", ".join(trusted_entries()) or "nothing"
    entry = repo.org if here == normalize_endpoint(PUBLIC_ENDPOINT) else f"{repo.org}@{here}"
    raise UntrustedKernelError(
        f"{repo} runs Python code from the Hub, and organization {repo.org!r} is not trusted "
        f"at {here} (trusted: {listed}; an entry without '@endpoint' applies to {PUBLIC_ENDPOINT} "
        "only). Read the kernel's files first, then either pass trust_remote_code=True "
        f"(CLI: --trust-remote-code) or add it to {TRUSTED_ORGS_ENV} "
        f"(e.g. {TRUSTED_ORGS_ENV}={entry})."
    )
