"""``nki.builtin``: the names an NKI kernel may use without importing them.

AWS's simulator package ships this module and the NKI Library's harness installs it as the
Python builtin ``builtin``.  The NKI compiler resolves ``math`` inside kernels without an
import, and the NKI Library relies on it (``core/mlp/mlp_parameters.py`` calls ``math.ceil``
with no ``import math``), so importing this module makes ``math`` a Python builtin when it is
not one already.  Nothing else is changed.
"""

import builtins as _builtins
import math

from . import isa, language  # noqa: F401

if not hasattr(_builtins, "math"):
    _builtins.math = math

__all__ = ["isa", "language", "math"]
