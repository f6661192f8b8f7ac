"""``nki.meta``: since NKI 0.2 ``nki.tensor`` lives here as ``nki.meta.tensor``
[reference/nki-0x.md §2.1]; it is the same module as ``nkikit.nki.tensor``."""

import sys

from .. import tensor

# ``import nki.meta.tensor`` (a submodule import) finds the same module object
sys.modules[f"{__name__}.tensor"] = tensor

__all__ = ["tensor"]
