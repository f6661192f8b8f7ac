"""The launch being traced: grid, this program's id, and HBM shared between programs.

An NKI 0.x kernel launched on ``n`` logical cores (``kernel[n]``) is traced once per program
with ``nl.program_id()`` a plain int, into one IR kernel whose body runs the programs one
after another.  Both programs must make the same ``shared_hbm`` allocations in the same
order (the hardware requires identical control flow on both cores), so the k-th
``shared_hbm`` tensor of every program is the same tensor.
"""

from __future__ import annotations

import numpy as np

from ..errors import NkiError, SourceLoc
from ..ir.core import Tensor
from ..trace.builder import Builder, maybe_current


def launch() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(grid, program id) of the kernel being traced; ``((), ())`` outside a launch."""
    b = maybe_current()
    state = getattr(b, "_nki_launch", None) if b is not None else None
    return state if state is not None else ((), ())


def set_program(b: Builder, grid: tuple[int, ...], pid: tuple[int, ...]) -> None:
    b._nki_launch = (grid, pid)  # type: ignore[attr-defined]
    b._nki_hbm_cursor = 0  # type: ignore[attr-defined]


def allocate_hbm(
    b: Builder, shape: tuple[int, ...], dtype: np.dtype, buffer: str, name: str, loc: SourceLoc
) -> Tensor:
    """A new HBM tensor, or (in a later program of the launch) program 0's matching one."""
    shared: list[Tensor] = b.__dict__.setdefault("_nki_shared_hbm", [])
    grid, pid = launch()
    if buffer == "shared_hbm" and grid and any(pid):
        k = b._nki_hbm_cursor  # type: ignore[attr-defined]
        b._nki_hbm_cursor = k + 1  # type: ignore[attr-defined]
        if k >= len(shared) or shared[k].shape != shape or shared[k].dtype != dtype:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nl.ndarray",
                why=(
                    "every program of a launch must allocate the same shared_hbm tensors in the "
                    "same order (cores run identical control flow)"
                ),
            )
        return shared[k]
    t = Tensor(
        b.unique(name) if name else b.name_for(loc, "hbm"),
        shape,
        dtype,
        buffer,
        kind="hbm",
        loc=loc,
    )
    b.tensors.append(t)
    if buffer == "shared_hbm":
        shared.append(t)
        if grid:
            b._nki_hbm_cursor = len(shared)  # type: ignore[attr-defined]
    return t
