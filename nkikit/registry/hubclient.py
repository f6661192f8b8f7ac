"""The few things the registry needs from `huggingface_hub`, in one place.

huggingface_hub is imported lazily (here and only here for the registry's client side), so
`import nkikit` and loading a cached kernel for numpy use do not pay for it when it is not needed.
Its settings are read at *its* import time (HF_ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE): use the
`endpoint=` / `cache_dir=` arguments to point one call elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote


def hf_api(endpoint: str | None, token: str | None) -> Any:
    """An `HfApi` for `endpoint` (default: HF_ENDPOINT / huggingface.co)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


class LazyHfApi:
    """An `HfApi` created on first use: a pull served entirely from the cache (by commit or
    lockfile) never imports `huggingface_hub.hf_api`, which alone costs ~0.5 s of start-up."""

    def __init__(self, endpoint: str | None, token: str | None):
        self._args = (endpoint, token)
        self._api: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._api is None:
            self._api = hf_api(*self._args)
        return getattr(self._api, name)


def transport_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'the Hub could not be reached or went away mid-transfer'."""
    errors: list[type[BaseException]] = [OSError, ConnectionError, TimeoutError]
    try:
        from huggingface_hub.utils import httpx  # huggingface_hub >= 1.30 (httpx or httpx2)
    except ImportError:  # pragma: no cover - older huggingface_hub
        try:
            import httpx  # type: ignore[no-redef]
        except ImportError:
            httpx = None  # type: ignore[assignment]
    if httpx is not None:
        errors.append(httpx.TransportError)
    return tuple(errors)


def is_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub sees it (read per call, so tests may patch it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def default_cache_dir() -> Path:
    """The HF hub cache (HF_HUB_CACHE, default ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def endpoint_url(endpoint: str | None) -> str:
    """`endpoint`, or HF_ENDPOINT as huggingface_hub read it, without a trailing '/'."""
    if endpoint is None:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    return endpoint.rstrip("/")


def list_tree(
    endpoint: str | None, token: str | None, repo_type: str, repo_id: str, revision: str, path: str
) -> Iterator[dict[str, Any]]:
    """The Hub's recursive listing of folder `path` at `revision`: its JSON entries, page by page.

    The same request `HfApi.list_repo_tree` makes, through huggingface_hub's HTTP session,
    headers and error mapping, but without importing `huggingface_hub.hf_api` (~0.5 s), so a
    pull that needs nothing else from the Hub stays cheap. Raises what `hf_raise_for_status`
    raises (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError, ...) and
    transport errors.
    """
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url: str | None = (
        f"{endpoint_url(endpoint)}/api/{repo_type}s/{repo_id}/tree/"
        f"{quote(revision, safe='')}/{quote(path)}"
    )
    params: dict[str, str] | None = {"recursive": "true"}
    headers = build_hf_headers(token=token)
    while url is not None:
        response = get_session().get(url, params=params, headers=headers)
        hf_raise_for_status(response)
        yield from response.json()
        url = response.links.get("next", {}).get("url")
        params = None  # the next link carries the query
