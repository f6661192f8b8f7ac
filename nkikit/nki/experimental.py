"""``nki.experimental``: NKI 0.6's docstrings send tracer-frontend users to
``nki.experimental.while_loop`` [reference/nki-0x.md §2.1]; it is ``nl.while_loop``."""

from .language import while_loop

__all__ = ["while_loop"]
