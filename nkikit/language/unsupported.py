"""Names of the Beta-1 API that nkikit does not implement: each is a :class:`NotSupported`
object that raises ``err_unsupported_api`` (with the caller's file:line and what to write
instead) when called, so that nothing of the Beta-1 API is missing without a word."""

from __future__ import annotations

from typing import NoReturn

from ..errors import NkiError, caller_loc


class NotSupported:
    """A Beta-1 API name nkikit does not implement: calling it raises ``err_unsupported_api``.

    ``api`` is the name as users write it (``nl.rand``), ``why`` what to do instead."""

    def __init__(self, api: str, why: str) -> None:
        self.api = api
        self.why = why
        self.__doc__ = f"Not supported by nkikit: {why}"

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise NkiError("err_unsupported_api", caller_loc(), api=self.api, why=self.why)

    def __repr__(self) -> str:
        return f"<{self.api}: not supported>"
