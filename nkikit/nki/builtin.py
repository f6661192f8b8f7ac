"""``nki.builtin``: the module the NKI Library's simulation harness installs as the Python
builtin ``builtin``.  AWS does not document its contents; kernels reach the language and ISA
through it, so it re-exports them."""

from . import isa, language  # noqa: F401

__all__ = ["isa", "language"]
