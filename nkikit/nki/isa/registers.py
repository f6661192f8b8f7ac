"""NKI 0.x registers: ``nisa.register_alloc / register_move / register_load / register_store``
and the ``VirtualRegister`` they work on [reference/nki-0x.md §4.14].

A register holds one 32-bit integer at run time.  nkikit models it as a one-element int32 SBUF
tile (an IR tensor named ``reg...``), so its value lives in simulated memory and a register
can be used wherever the reference allows a runtime value that nkikit models: as
``.ap(scalar_offset=reg)`` on an HBM, SBUF or PSUM tensor (an indirect access whose runtime
index is the register).  Its value is unknown while the kernel is traced, so Python cannot branch or loop
on it: ``if reg`` / ``int(reg)`` / ``range(reg)`` raise ``err_unsupported_api``
(NKI 0.7's tracer raises ``TypeError`` there), except the NKI 0.1 - 0.6 device loop
``while reg:`` (removed in 0.7, still in the NKI Library), which ``__bool__`` traces.
"""

from __future__ import annotations

import linecache
from contextlib import ExitStack

import numpy as np

from ... import dtypes
from ...errors import NkiError, SourceLoc, caller_loc
from ...ir.affine import LoopVar
from ...ir.core import DeviceLoop
from ...trace import instructions as E
from ...trace.builder import current
from ..launch import in_lockstep
from ..tensor import NkiTensor, access_of, got_type


class VirtualRegister:
    """One 32-bit register (``nisa.register_alloc()``, ``ncc.rank_id()``).  ``tile`` is the
    one-element int32 SBUF tensor that holds its value in the simulator."""

    __slots__ = ("tile", "_while")

    def __init__(self, tile: NkiTensor) -> None:
        self.tile = tile
        self._while = None  # an open ``while reg:`` loop: (its exit, body depth, source line)

    def _no_value(self, what: str):
        raise NkiError(
            "err_unsupported_api",
            caller_loc(),
            api=f"{what} on a register",
            why="a register's value exists only when the kernel runs; use it as "
            ".ap(scalar_offset=...) or store it with nisa.register_store",
        )

    def __bool__(self) -> bool:
        """``while reg:`` (NKI 0.1 - 0.6): a device loop that runs while the register is not 0.
        Python asks at the loop's head before the first iteration, which opens the loop and
        traces the body once, and again at the end of that body, which closes it.  Any other
        test of a register's truth (``if reg``, ``and``, ``not``) needs its run-time value."""
        loc = caller_loc()
        b = current("while reg")
        if self._while is not None:
            stack, depth, line = self._while
            if loc.line == line and len(b.bodies) == depth:
                self._while = None
                stack.close()
                return False
        if not linecache.getline(loc.file, loc.line).lstrip().startswith("while"):
            self._no_value("`if reg` (or and / or / not)")
        cond = access_of(self.tile, loc, "while reg")
        stack = ExitStack()
        if in_lockstep():
            # the programs of an LNC launch share one loop, as for nl.while_loop
            from ..language.device_loops import enter_while_together, leave_together

            enter_while_together(b, cond, loc, "while reg")
            stack.callback(leave_together, b, loc, "while reg")
        else:
            var = LoopVar(b.unique("while"), 1, "sequential")
            stack.enter_context(b.loop(var, loc, DeviceLoop(0, None, 1, None, cond)))
        self._while = (stack, len(b.bodies), loc.line)
        b.__dict__.setdefault("_nki_open_whiles", []).append((self, loc))
        return True

    def value_tile(self, loc: SourceLoc, use: str) -> NkiTensor:
        """The tile that holds the value, for ``use`` (an offset, a loop bound, a move)."""
        return self.tile

    def __int__(self) -> int:
        self._no_value("int()")

    def __index__(self) -> int:
        self._no_value("an integer use (range(), indexing)")

    def __repr__(self) -> str:
        return f"VirtualRegister({self.tile.tensor.name})"


def new_register(loc: SourceLoc, name: str = "reg") -> VirtualRegister:
    """A fresh register (its tile poisoned until written)."""
    b = current("nisa.register_alloc")
    t = b.new_tensor((1, 1), dtypes.int32, "sbuf", name=None, loc=loc, fallback=name)
    return VirtualRegister(NkiTensor.whole(t))


def _value(x, loc: SourceLoc, what: str):
    """The IR operand of a register, a one-element tensor or an int."""
    if isinstance(x, VirtualRegister):
        return access_of(x.value_tile(loc, what), loc, what)
    if isinstance(x, NkiTensor):
        return access_of(x, loc, what)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, bool) or not isinstance(x, int):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=what,
            why=f"expected a register, a one-element tensor or an int, got {got_type(x)}",
        )
    return x


def _register(x, loc: SourceLoc, what: str) -> VirtualRegister:
    if not isinstance(x, VirtualRegister):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=what,
            why=f"expected a register (nisa.register_alloc()), got {type(x).__name__}",
        )
    return x


def register_alloc(x=None) -> VirtualRegister:
    """A new register, set to ``x`` when given (an int, or a one-element HBM/SBUF tensor whose
    value is loaded, NKI 0.2's pre-fill)."""
    loc = caller_loc()
    reg = new_register(loc)
    if x is not None:
        E.emit_register_move(
            access_of(reg.tile, loc, "register_alloc"),
            _value(x, loc, "nisa.register_alloc"),
            loc=loc,
        )
    return reg


def register_move(dst, src) -> None:
    """``dst = src``: copy a register (or set it to a compile-time int)."""
    loc = caller_loc()
    d = _register(dst, loc, "nisa.register_move")
    E.emit_register_move(
        access_of(d.tile, loc, "register"), _value(src, loc, "nisa.register_move"), loc=loc
    )


def register_load(dst, src) -> None:
    """Load a one-element (``[1]`` or ``[1, 1]``) HBM/SBUF tensor of at most 32 bits into the
    register ``dst`` (converted to int32)."""
    loc = caller_loc()
    d = _register(dst, loc, "nisa.register_load")
    if not isinstance(src, NkiTensor):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.register_load",
            why=f"src must be a one-element tensor, got {got_type(src)}",
        )
    E.emit_register_move(
        access_of(d.tile, loc, "register"), access_of(src, loc, "register_load"), loc=loc
    )


def register_store(dst, src) -> None:
    """Store the register ``src`` into the one-element HBM/SBUF tensor ``dst``."""
    loc = caller_loc()
    s = _register(src, loc, "nisa.register_store")
    if not isinstance(dst, NkiTensor):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.register_store",
            why=f"dst must be a one-element tensor, got {got_type(dst)}",
        )
    E.emit_register_move(
        access_of(dst, loc, "register_store"), access_of(s.tile, loc, "register"), loc=loc
    )


def check_closed(b) -> None:
    """At the end of a trace: every ``while reg:`` loop ended at its head (a ``break`` or
    ``return`` inside one leaves it open, and the rest of the kernel would land in it)."""
    for reg, loc in b.__dict__.get("_nki_open_whiles", ()):
        if reg._while is not None:
            raise NkiError(
                "err_unsupported_api",
                loc,
                api="break / return inside `while reg:`",
                why="a device loop ends when its register is 0; let the body run to its end",
            )
