"""The numpy simulator of the IR.

Two executors with the same contract and bit-identical results: ``interp`` (the reference
interpreter, one instruction at a time) and ``fast`` (the kernel compiled once to a
straight-line numpy program).  ``simulate`` picks one by the ``NKIKIT_SIM`` environment
variable: ``reference`` (the default) or ``fast``.
"""

from __future__ import annotations

import os

import numpy as np

SIMULATORS = ("reference", "fast")


def simulate(kernel, args: list[np.ndarray], *, seed: int = 0) -> list[np.ndarray]:
    """Run ``kernel`` on ``args`` with the simulator ``NKIKIT_SIM`` names."""
    mode = os.environ.get("NKIKIT_SIM", "reference") or "reference"
    if mode == "fast":
        from .fast import simulate as run
    elif mode == "reference":
        from .interp import simulate as run
    else:
        raise ValueError(f"NKIKIT_SIM={mode!r}: expected one of {', '.join(SIMULATORS)}")
    return run(kernel, args, seed=seed)
