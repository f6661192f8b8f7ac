"""A tensor's values in the middle of a trace, for debugging a kernel as it is written.

A kernel is traced before it runs, so while its Python executes a tile has a shape and no
values.  ``np.asarray(tile)`` inside a kernel (a ``print`` of it, or a look from
``breakpoint()``) still answers, the way AWS's eager simulator does: the instructions traced
so far form a kernel of their own, which is verified, run on the reference simulator with
copies of the call's arguments, and the tile is read where the trace stands.  Each look runs
that prefix again (a debugging aid, not a fast path); the call's own run is unchanged.

Only where "so far" means one thing: the call has arrays (not ``nt.tensor`` shapes), one
program (no SPMD grid or LNC launch) and the trace is outside every rolled or device loop.
Elsewhere the look is ``err_invalid_argument`` at the user's line, naming ``nl.device_print``,
which prints a tensor's values when the kernel runs, wherever it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import as_numpy
from ..errors import NkiError, SourceLoc
from ..ir.core import Access, Kernel, Op, Tensor
from .builder import Builder


@dataclass
class Concrete:
    """What a look needs of the call being traced: its array arguments (with the parameter
    tensors they bind to), the target and how low-precision dtypes are stored."""

    params: list[tuple[Tensor, Any]]
    target: str
    precise_fp: bool
    dialect: str
    prepare: Callable[[Kernel], None]  # the dialect's finishing touches (written inputs)
    programs: int  # the programs the launch traces (an SPMD grid, LNC)


def _refuse(loc: SourceLoc, why: str) -> NkiError:
    return NkiError(
        "err_invalid_argument",
        loc,
        op="numpy conversion",
        why=f"{why}; nl.device_print(prefix, tensor) prints its values when the kernel runs",
    )


def look(access: Callable[[SourceLoc], Access], loc: SourceLoc, dtype: Any = None) -> np.ndarray:
    """``np.asarray`` of a front end's tensor at ``loc``: the values its access (``access(loc)``)
    reads where the trace stands, as ``dtype`` if given (see the module docstring)."""
    from .builder import maybe_current

    b = maybe_current()
    if b is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="numpy conversion",
            why="a tensor has values only while its kernel is traced or runs",
        )
    values = values_so_far(b, access(loc), loc)
    return values if dtype is None else values.astype(dtype)


def values_so_far(b: Builder, access: Access, loc: SourceLoc) -> np.ndarray:
    """The values ``access`` reads after the instructions traced so far (see the module
    docstring); raises ``err_invalid_argument`` at ``loc`` where no single answer exists."""
    from ..ir.verify import verify
    from ..sim import low_precision_storage
    from ..sim.interp import Interpreter

    concrete: Concrete | None = getattr(b, "concrete", None)
    if concrete is None:
        raise _refuse(loc, "a tensor has no values while a kernel is traced for shapes alone")
    if concrete.programs > 1 or b.grid or len(b.bodies) > 1 or b.loops:
        raise _refuse(
            loc,
            "a tensor inside a loop or an SPMD launch has no one value while the kernel is traced",
        )
    params = [t for t, _ in concrete.params]
    prefix = Kernel(
        b.name, params, [], list(b.body), (), loc, list(b.tensors), None, concrete.dialect
    )
    concrete.prepare(prefix)
    verify(prefix, concrete.target)  # the prefix breaks no rule the whole kernel would not
    # copies: the prefix may write the caller's arrays, which the call itself writes later
    arrays = [np.array(as_numpy(v, t.dtype)) for t, v in concrete.params]
    with low_precision_storage(prefix, precise=concrete.precise_fp) as store:
        interp = Interpreter(prefix)
        interp.run(store(arrays))
        return np.array(interp.read(access, {}, Op("tensor_copy", [], [], {}, loc)))
