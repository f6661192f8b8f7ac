"""NKI 0.x hardware loops whose trip count is a run-time value: ``nl.fori_loop`` and
``nl.dynamic_range`` with a register bound, and ``nl.while_loop`` [reference/nki-0x.md §5.2].

The body is traced once, into an IR ``Loop`` whose ``device`` record (``ir/core.py``
``DeviceLoop``) holds the bounds; the simulator reads them when the loop runs.  The body sees
the induction value as a register (a ``VirtualRegister``, usable as ``.ap(scalar_offset=)``),
never as a Python int.  Loops whose bounds are Python ints stay Python loops (unrolled at
trace time, as NKI 0.7 specializes them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ...errors import NkiError, SourceLoc
from ...ir.affine import LoopVar
from ...ir.core import DeviceLoop
from ...trace import instructions as E
from ...trace.builder import current
from ..isa.registers import VirtualRegister, new_register
from ..launch import in_lockstep, meet
from ..tensor import access_of


def is_register(x) -> bool:
    return isinstance(x, VirtualRegister)


def _bound(x, loc: SourceLoc, api: str):
    if isinstance(x, VirtualRegister):
        return access_of(x.value_tile(loc, f"{api} bound"), loc, api)
    if isinstance(x, int | np.integer) and not isinstance(x, bool):
        if -(2**31) <= x < 2**32:  # a 32-bit register holds it
            return int(x)
        why = f"a loop bound must fit a 32-bit register, got {x}"
    else:
        why = f"a loop bound must be an int or a register, got {type(x).__name__}"
    raise NkiError("err_invalid_argument", loc, op=api, why=why)


def _step(step, loc: SourceLoc, api: str) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step <= 0:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=api,
            why=f"step must be a positive int known when the kernel is traced, got {step!r}",
        )
    return int(step)


@contextmanager
def counting_loop(start, stop, step, loc: SourceLoc, api: str) -> Iterator[VirtualRegister]:
    """Open a device loop ``for i in range(start, stop, step)`` (bounds ints or registers);
    the block traces its body and receives ``i``'s register.

    The programs of an LNC launch, traced in lockstep into one body (``nki/launch.py``),
    enter the loop together and leave it together, at two meeting points: one IR loop holds
    every program's body, so that a ``core_barrier`` / ``sendrecv`` inside meets once per
    iteration (each program opening its own loop would nest one program's loop in the
    other's).  It runs program 0's bounds; the others' are checked to give the same
    iterations when it runs (``DeviceLoop.peers``), and each iteration starts by copying
    program 0's counter into theirs."""
    b = current(api)
    lo, hi, st = _bound(start, loc, api), _bound(stop, loc, api), _step(step, loc, api)
    counter = new_register(loc, "i")
    acc = access_of(counter.tile, loc, api)
    if not in_lockstep():
        with b.loop(_var(b, lo, hi, st), loc, DeviceLoop(lo, hi, st, acc, None)):
            yield counter
        return
    open_loops = b.__dict__.setdefault("_nki_device_loops", [])

    def enter(payloads: dict) -> None:
        (lo0, hi0, acc0), *rest = payloads.values()
        peers = tuple((p[0], p[1]) for p in rest)
        entered = b.loop(_var(b, lo0, hi0, st), loc, DeviceLoop(lo0, hi0, st, acc0, None, peers))
        entered.__enter__()
        open_loops.append(entered)
        for _, _, other in rest:
            E.emit_register_move(other, acc0, loc=loc)

    # the kinds name the meeting in the launch's divergence errors ("nisa.<kind>")
    meet(f"{api[3:]} (entering the loop)", (lo, hi, acc), enter, loc)
    yield counter
    leave_together(b, loc, api[3:])


def _var(b, lo, hi, st: int) -> LoopVar:
    trip = len(range(lo, hi, st)) if isinstance(lo, int) and isinstance(hi, int) else 1
    return LoopVar(b.unique("dyn"), max(trip, 1), "sequential")


def dynamic_range(start, stop, step, loc: SourceLoc) -> Iterator[VirtualRegister]:
    """``for i in nl.dynamic_range(start, stop, step)`` with a register bound."""
    with counting_loop(start, stop, step, loc, "nl.dynamic_range") as i:
        yield i


def fori_loop(lower, upper, body_fun: Callable, step, loc: SourceLoc) -> None:
    """``for i in range(lower, upper, step): body_fun(i)`` on the device."""
    with counting_loop(lower, upper, step, loc, "nl.fori_loop") as i:
        if body_fun(i) is not None:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nl.fori_loop",
                why="body_fun must return nothing (state goes through SBUF/HBM tensors)",
            )


def while_loop(init, body_fun: Callable, loc: SourceLoc) -> None:
    """``r = init; while r != 0: r = body_fun(r)`` on the device: ``init`` a register or an
    int, ``body_fun`` returns the register holding the next condition.

    In an LNC launch traced in lockstep the programs' loops are one IR loop, entered and left
    at two meeting points as ``counting_loop``'s: it tests program 0's condition register,
    and the others' (``DeviceLoop.peer_conds``) must agree before every iteration."""
    api = "nl.while_loop"
    b = current(api)
    cond = new_register(loc, "cond")
    cond_acc = access_of(cond.tile, loc, api)
    E.emit_register_move(cond_acc, _bound(init, loc, api), loc=loc)
    if not in_lockstep():
        var = LoopVar(b.unique("while"), 1, "sequential")
        with b.loop(var, loc, DeviceLoop(0, None, 1, None, cond_acc)):
            _while_body(cond, cond_acc, body_fun, loc)
        return
    enter_while_together(b, cond_acc, loc, "while_loop")
    _while_body(cond, cond_acc, body_fun, loc)
    leave_together(b, loc, "while_loop")


def enter_while_together(b, cond, loc: SourceLoc, kind: str) -> None:
    """In an LNC launch traced in lockstep: wait for every program to reach this while loop
    (``cond`` its condition register), then open one IR loop for all of them that tests
    program 0's condition and checks the others' (``DeviceLoop.peer_conds``) agree before
    every iteration.  ``kind`` names the loop in the launch's divergence errors."""
    open_loops = b.__dict__.setdefault("_nki_device_loops", [])

    def enter(payloads: dict) -> None:
        cond0, *rest = payloads.values()
        var = LoopVar(b.unique("while"), 1, "sequential")
        entered = b.loop(var, loc, DeviceLoop(0, None, 1, None, cond0, peer_conds=tuple(rest)))
        entered.__enter__()
        open_loops.append(entered)

    meet(f"{kind} (entering the loop)", cond, enter, loc)


def leave_together(b, loc: SourceLoc, kind: str) -> None:
    """Wait for every program to reach the end of the device loop opened together last, then
    close it."""
    open_loops = b.__dict__["_nki_device_loops"]
    meet(
        f"{kind} (leaving the loop)",
        None,
        lambda _: open_loops.pop().__exit__(None, None, None),
        loc,
    )


def _while_body(cond: VirtualRegister, cond_acc, body_fun: Callable, loc: SourceLoc) -> None:
    """Trace one iteration of a while loop: ``body_fun(cond)``, then its result into ``cond``."""
    nxt = body_fun(cond)
    if not isinstance(nxt, VirtualRegister):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.while_loop",
            why="body_fun must return the register holding the next condition, got "
            f"{type(nxt).__name__}",
        )
    if nxt is not cond:
        E.emit_register_move(cond_acc, access_of(nxt.tile, loc, "nl.while_loop"), loc=loc)
