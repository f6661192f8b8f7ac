"""``nkikit.library``: the kernel library, one publishable package per kernel
(``nkikit.library.rmsnorm``, ...).

The kernels live in the repository's top-level ``kernels/`` folder, which is deliberately not a
regular package: from the repository root, ``import kernels`` must find Hugging Face's
``kernels`` package, not this folder. This module makes itself the package of the folder
(``__path__``): ``nkikit/library/`` of an installed wheel (where setuptools puts ``kernels/``,
see pyproject's ``package-dir``), else ``kernels/`` next to this checkout's ``nkikit/``.
"""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
__path__ = [
    p
    for p in (os.path.join(_HERE, "library"), os.path.join(os.path.dirname(_HERE), "kernels"))
    if os.path.isdir(p)
][:1]
