"""NKI 0.7 on-device integers: ``NkiScalar``, ``nisa.scalar_load``, ``nisa.scalar_store``
[reference/nki-0x.md §4.14, W-SCALAR].

An ``NkiScalar`` is one int32 value that exists only when the kernel runs.  nkikit models it
as a register is modeled (``registers.py``: a one-element int32 SBUF tile), so it is usable
wherever a register is: ``.ap(scalar_offset=s)`` and a ``nl.fori_loop`` bound.  Arithmetic
on it (``+ - *``, unary ``-``, with a Python int or another ``NkiScalar``) is traced, not
evaluated: each operation emits one ``scalar_arith`` op into a fresh tile, computed at run
time with 32-bit two's-complement wrap-around (``100000 * 100000`` gives ``1410065408``).
Comparisons trace too, but NKI says their results are unusable: one used as an offset, a
loop bound, a stored value or a truth value is rejected.

Not modeled: 64-bit scalars (``int64`` 1x1 tiles): nkikit has no int64 dtype (the reference
leaves ``nl.int64`` unconfirmed), so ``scalar_load`` takes int32 only.
"""

from __future__ import annotations

import numpy as np

from ... import dtypes
from ...errors import NkiError, SourceLoc, caller_loc
from ...trace import instructions as E
from ..tensor import NkiTensor, access_of, got_type
from .registers import VirtualRegister, new_register

_I32 = (-(2**31), 2**31 - 1)


class NkiScalar(VirtualRegister):
    """One on-device int32 (``nisa.scalar_load``, or arithmetic on NkiScalars).  ``state``:
    the one-element int32 tile holding its value; ``dtype``: ``nl.int32``."""

    __slots__ = ("dtype", "is_comparison")
    __hash__ = VirtualRegister.__hash__  # identity: __eq__ below traces a comparison

    def __init__(self, state: NkiTensor, dtype=None, is_comparison: bool = False) -> None:
        super().__init__(state)
        self.dtype = dtypes.int32 if dtype is None else np.dtype(dtype)
        self.is_comparison = is_comparison

    # -- traced arithmetic --------------------------------------------------------------------
    def _arith(self, op: str, other, reverse: bool = False, compare: bool = False) -> NkiScalar:
        loc = caller_loc()
        y = _operand(other, loc, op)
        x = access_of(self.tile, loc, "NkiScalar")
        if reverse:
            x, y = y, x
        reg = new_register(loc, "scalar")
        E.emit_scalar_arith(access_of(reg.tile, loc, "NkiScalar"), x, y, op=op, loc=loc)
        return NkiScalar(reg.tile, self.dtype, compare)

    def __add__(self, other) -> NkiScalar:
        return self._arith("add", other)

    def __radd__(self, other) -> NkiScalar:
        return self._arith("add", other, reverse=True)

    def __sub__(self, other) -> NkiScalar:
        return self._arith("subtract", other)

    def __rsub__(self, other) -> NkiScalar:
        return self._arith("subtract", other, reverse=True)

    def __mul__(self, other) -> NkiScalar:
        return self._arith("multiply", other)

    def __rmul__(self, other) -> NkiScalar:
        return self._arith("multiply", other, reverse=True)

    def __neg__(self) -> NkiScalar:
        return self._arith("subtract", 0, reverse=True)

    def __eq__(self, other) -> NkiScalar:  # type: ignore[override]
        return self._arith("equal", other, compare=True)

    def __ne__(self, other) -> NkiScalar:  # type: ignore[override]
        return self._arith("not_equal", other, compare=True)

    def __lt__(self, other) -> NkiScalar:
        return self._arith("less", other, compare=True)

    def __le__(self, other) -> NkiScalar:
        return self._arith("less_equal", other, compare=True)

    def __gt__(self, other) -> NkiScalar:
        return self._arith("greater", other, compare=True)

    def __ge__(self, other) -> NkiScalar:
        return self._arith("greater_equal", other, compare=True)

    # -- uses -----------------------------------------------------------------------------------
    def __bool__(self) -> bool:
        self._no_value("a truth test (if / while / and / or / not)")

    def value_tile(self, loc: SourceLoc, use: str) -> NkiTensor:
        """The tile holding the value, for ``use`` (an offset, a loop bound, a store); a
        comparison's result is rejected there [W-SCALAR]."""
        if self.is_comparison:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=use,
                why="the result of an NkiScalar comparison cannot be used (NKI traces "
                "comparisons of int32 scalars, but their results are unusable)",
            )
        return self.tile

    def __repr__(self) -> str:
        return f"NkiScalar({self.tile.tensor.name}, {dtypes.name(self.dtype)})"


def _operand(x, loc: SourceLoc, op: str):
    """A Python int in int32 range (an immediate) or another usable NkiScalar (its tile)."""
    if isinstance(x, NkiScalar):
        return access_of(x.value_tile(loc, f"NkiScalar {op}"), loc, "NkiScalar")
    if isinstance(x, int | np.integer) and not isinstance(x, bool):
        if not _I32[0] <= int(x) <= _I32[1]:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"NkiScalar {op}",
                why=f"{int(x)} does not fit the scalar's int32",
            )
        return int(x)
    raise NkiError(
        "err_invalid_argument",
        loc,
        op=f"NkiScalar {op}",
        why=f"the other operand must be a Python int or an NkiScalar, got {type(x).__name__}",
    )


def _one_int32(x, loc: SourceLoc, op: str, role: str) -> NkiTensor:
    """``x`` is a 1x1 int32 SBUF/HBM tensor."""
    if not isinstance(x, NkiTensor):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"{role} must be a 1x1 tensor, got {got_type(x)}",
        )
    if x.size != 1:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"{role} must be a 1x1 tensor, got shape {tuple(x.shape)}",
        )
    if x.dtype != dtypes.int32:
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op=f"nisa.{op}",
            dtype=dtypes.name(x.dtype),
            why=f"{role} must be int32 (unsigned and narrower integers are rejected; "
            "int64 is not modeled)",
        )
    return x


def scalar_load(src) -> NkiScalar:
    """A new ``NkiScalar`` holding the value of the 1x1 int32 SBUF/HBM tensor ``src``."""
    loc = caller_loc()
    s = _one_int32(src, loc, "scalar_load", "src")
    reg = new_register(loc, "scalar")
    E.emit_register_move(
        access_of(reg.tile, loc, "scalar_load"), access_of(s, loc, "scalar_load src"), loc=loc
    )
    return NkiScalar(reg.tile)


def scalar_store(dst, value) -> None:
    """Store the ``NkiScalar`` ``value`` into the 1x1 int32 SBUF/HBM tensor ``dst`` (a Python
    int is rejected: use ``nisa.memset`` for constants)."""
    loc = caller_loc()
    if not isinstance(value, NkiScalar):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.scalar_store",
            why=f"value must be an NkiScalar, got {type(value).__name__}"
            + ("; use nisa.memset to store a constant" if isinstance(value, int) else ""),
        )
    d = _one_int32(dst, loc, "scalar_store", "dst")
    tile = value.value_tile(loc, "nisa.scalar_store")
    E.emit_register_move(
        access_of(d, loc, "scalar_store dst"), access_of(tile, loc, "scalar_store"), loc=loc
    )
