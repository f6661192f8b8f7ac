"""``nki.typing``: parameter annotations (``nt.tensor[shape]``), as in NKI 0.3+."""

from ..typing import mutable_tensor, tensor  # noqa: F401

__all__ = ["tensor", "mutable_tensor"]
