"""Re-rolling: the repeated steps of an unrolled trace folded back into IR loops.

NKI 0.7 traces kernels with Python, so ``for i in range(n)`` (and ``nl.affine_range``, its
alias) unrolls: a kernel at production shapes is 10^5 - 10^6 statements, each one walked by
the verifier, the simulator's code generator and the compiler.  Most of them repeat a few
steps: the same instructions at the same source lines on fresh tiles, at offsets that grow by
a constant from one step to the next.  :func:`reroll` finds such runs and writes each as one
``Loop`` over its first step, the offsets affine in the loop variable, the step's tiles
allocated inside the loop (fresh, poisoned, at every iteration, as each step's own were).

The loop means exactly what the unrolled statements meant: its iterations run in order
(kind ``"unrolled"``: a sequential loop that the compiler places and pipelines as the unrolled
code it stands for), and a run is folded only when every step is the first with

* the same statements: primitive, source line, mask, attributes and immediates equal (by
  type and value; floats by their repr, so 0.0 is not -0.0), tensors of equal facts;
* the same tensors, where the first step reads or writes a tensor made before the run; its
  own tiles where the first step uses a tile it allocated (never another step's);
* every index constant the first step's plus the step number times one fixed stride.

A run ends before the first step whose tile (or a view of it) a statement after the run uses:
once the loop ends, its tile holds the last iteration's data only.  Views and indirect
accesses of a step's own tiles are compared as their tiles are.  Nothing else changes: the
ops keep their source lines, so every message names the user's line.  The folded kernel is
new (its loops' tiles are copies of the first steps'): the trace is left as it was, which
``nkikit.nki.jit`` verifies instead when the verifier refuses the folded kernel.

The search is linear: a number per statement from its source line, runs of equal numbers
found with numpy, each candidate step compared with the first through a plan of the first made
once; periods that cannot start at a position are skipped, and the comparisons are bounded
(``_WORK_PER_STATEMENT``), so a trace whose steps almost agree costs a bounded amount.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from ..ir.affine import Affine, LoopVar
from ..ir.core import Access, Alloc, Loop, Op, Tensor
from ..ir.unrolled import UNROLLED, copy_tensor

ROLL_ABOVE = 2048  # bodies with more statements than this are re-rolled
MIN_STEPS = 4  # a run of fewer steps stays unrolled
_MAX_PERIODS = 3  # periods tried per position (successive repeats of its statement)
_WORK_PER_STATEMENT = 4  # statement comparisons the search may spend per statement
_PLAIN = (int, bool, str, type(None))


class _Fail(Exception):
    """A step differs from the first: the run ends before it.  ``at``: the position in the
    step of the statement that differs."""

    at = 0


class _TensorFail(_Fail):
    """A step's statement differs from the first's only in a tensor: a run starting later
    may see that tensor made before it and agree."""


def reroll(body: list, tensors: list[Tensor]) -> tuple[list, list[Tensor]]:
    """``body`` with its repeated runs as loops, and ``tensors`` with the loops' tiles in place
    of the steps'.  New lists, statements and tiles: ``body``, ``tensors`` and what they hold
    are left as they are.  A body of ``ROLL_ABOVE`` statements or fewer is returned as is,
    as is one with no run to fold."""
    if len(body) <= ROLL_ABOVE:
        return body, tensors
    runs = _Finder(body).find()
    if not runs:
        return body, tensors
    out, gone, loop_tiles = _materialize(body, runs)
    if len(out) == len(body):  # every run was cut short by a later use of its tiles
        return body, tensors
    kept = []
    for t in tensors:
        if t.uid in loop_tiles:  # a tile (or view) of a first step: the loop's own copy
            kept.append(loop_tiles[t.uid])
        elif t.uid not in gone and (t.base is None or t.root.uid not in gone):
            kept.append(t)
    return out, kept


# -- finding runs ----------------------------------------------------------------------------
def _signatures(body: list) -> np.ndarray:
    """A number per statement; two statements of one number may be steps of one run: an
    op's source line (one object per line), an allocation's (negated), a loop's position
    (never another's)."""
    out = [
        id(s.loc) if type(s) is Op else -id(s.tensor.loc) if type(s) is Alloc else ~k
        for k, s in enumerate(body)
    ]
    return np.asarray(out, dtype=np.int64)


def _next_same(sig: np.ndarray) -> np.ndarray:
    """For each position, the next position of the same signature (-1: none)."""
    order = np.argsort(sig, kind="stable")
    nxt = np.full(len(sig), -1, dtype=np.int64)
    same = sig[order[1:]] == sig[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


class _Run:
    """Steps ``[start + k * period, start + (k + 1) * period)`` for ``k < steps``."""

    __slots__ = ("start", "period", "steps", "tiles")

    def __init__(self, start: int, period: int, steps: int, tiles: dict[int, int]) -> None:
        self.start = start
        self.period = period
        self.steps = steps
        self.tiles = tiles  # uid of each tile a step allocates -> the step's number


class _Finder:
    def __init__(self, body: list) -> None:
        self.body = body
        self.sig = _signatures(body)
        self._match: dict[int, np.ndarray] = {}  # period -> run length of equal signatures
        self._dead: dict[int, int] = {}  # period -> last position no run of it starts from
        # statements compared so far, and at most: a trace whose steps almost agree everywhere
        # would otherwise be compared over and over, once per position and period
        self._work = 0
        self._budget = _WORK_PER_STATEMENT * len(body)

    def _equal_run(self, p: int) -> np.ndarray:
        """For each position i: how many positions from i on have the signature of the one
        ``p`` later (consecutively)."""
        hit = self._match.get(p)
        if hit is None:
            sig = self.sig
            eq = np.zeros(len(sig) + 1, dtype=np.int64)
            eq[: len(sig) - p] = sig[:-p] == sig[p:]
            # run lengths of ones, read from each position: a reverse cumulative count reset
            # at every zero
            n = len(eq)
            idx = np.arange(n)
            zeros = np.where(eq == 0, idx, n)
            next_zero = np.minimum.accumulate(zeros[::-1])[::-1]
            hit = self._match[p] = next_zero - idx
        return hit

    def _best(self, i: int, j: int, nxt: np.ndarray) -> tuple[int, int, dict[int, int]] | None:
        """The run from ``i`` that covers the most statements: (steps, period, the tiles its
        steps allocate), or None.  The periods tried are the distances to the next few
        repeats of statement ``i``; a run cut short by offsets that stop growing (``i % k``)
        is tried again with its agreeing steps as one step."""
        best: tuple[int, int, dict[int, int]] | None = None
        bound = 0  # the most statements any run from i can cover
        for _ in range(_MAX_PERIODS):
            if j <= i:
                break
            p = j - i
            j = int(nxt[j])
            steps = int(self._equal_run(p)[i]) // p + 1
            bound = max(bound, steps * p)
            if best is not None and best[0] * best[1] + best[1] >= bound:
                break  # nothing can do better
            got = self._fold(i, p, steps)
            if got is None:
                continue
            if best is None or got[0] * p > best[0] * best[1]:
                best = (got[0], p, got[1])
            if 2 <= got[0] < steps:
                q = got[0] * p
                more = self._fold(i, q, int(self._equal_run(q)[i]) // q + 1)
                if more is not None and more[0] * q > best[0] * best[1]:
                    best = (more[0], q, more[1])
        if best is None or best[0] < MIN_STEPS:
            return None
        return best

    def _fold(self, i: int, p: int, steps: int) -> tuple[int, dict[int, int]] | None:
        """``_fold`` from ``i`` with period ``p``, unless no run of that period can start
        at ``i`` (or the search has spent its budget): (steps, tiles) or None."""
        if steps < MIN_STEPS or i <= self._dead.get(p, -1) or self._work > self._budget:
            return None
        ok, tiles, work, dead = _fold(self.body, i, p, steps)
        self._work += work
        if dead >= 0:
            self._dead[p] = dead
        return ok, tiles

    def find(self) -> list[_Run]:
        n = len(self.body)
        nxt = _next_same(self.sig)
        runs: list[_Run] = []
        i = 0
        while i < n:
            best = self._best(i, int(nxt[i]), nxt)
            if best is not None:
                steps, p, tiles = best
                runs.append(_Run(i, p, steps, tiles))
                i += steps * p
            else:
                i += 1
        return runs


# -- comparing steps -------------------------------------------------------------------------
def _fold(body: list, start: int, p: int, steps: int) -> tuple[int, dict[int, int], int, int]:
    """How many steps from ``start`` (at most ``steps``, period ``p``) agree with the first;
    the tiles the agreeing steps allocate (uid -> step number); how many statements were
    looked at; and the last position from which no run of period ``p`` can start (-1: none
    known).  A step 1 that differs from step 0 other than in a tensor differs at a pair of
    statements ``p`` apart that every run of period ``p`` starting up to there compares."""
    first = body[start : start + p]
    own: set[int] = set()  # uids of the first step's tiles
    for at, s in enumerate(first):
        if type(s) is Loop:
            return 1, {}, at + 1, -1
        if type(s) is Alloc:
            own.add(s.tensor.uid)
    tiles = dict.fromkeys(own, 0)
    ok = 1
    try:
        plan = _plan(first, body[start + p : start + 2 * p], own)
        for k in range(1, steps):
            at = start + k * p
            tiles.update(dict.fromkeys(_check(plan, body[at : at + p], k), k))
            ok += 1
    except _Fail as e:
        work = p + (ok - 1) * p + e.at + 1
        dead = start + e.at if ok == 1 and type(e) is _Fail else -1
        return ok, tiles, work, dead
    return ok, tiles, ok * p, -1


# what ``_check`` compares a statement of a step with: per position of the first step,
# (_ALLOC, its tile) or (_OP, the op, attribute check, operand plans); an operand plan is
# (_VALUE, immediate) or (_ACCESS, access, whose (``_operand``), strides or None, indirect's
# plan or None)
_ALLOC, _OP, _VALUE, _ACCESS = range(4)
# attribute values whose == with a value of the same type is exact (no 0.0 == -0.0, no nan)
_EXACT = frozenset({int, bool, str, type(None), np.dtype})


def _plan(first: list, second: list, own: set[int]) -> list[tuple]:
    """The plan of a run's first step (``second``: the step after it, which gives the
    strides); ``_Fail`` when the two differ in the kinds of their statements or operands."""
    plan: list[tuple] = []
    try:
        for s0, s1 in zip(first, second):
            plan.append(_plan_statement(s0, s1, own))
    except _Fail as e:
        e.at = len(plan)
        raise
    return plan


def _plan_statement(s0: Any, s1: Any, own: set[int]) -> tuple:
    """The plan entry of the first step's statement ``s0`` (``s1``: the next step's)."""
    if type(s0) is Alloc:
        return (_ALLOC, s0.tensor)
    if type(s1) is not Op or len(s1.outs) != len(s0.outs) or len(s1.ins) != len(s0.ins):
        raise _Fail
    types = tuple(map(type, s0.attrs.values()))
    # equal dicts of values of these types are equal attributes when their types agree
    exact = all(t in _EXACT or issubclass(t, enum.Enum) for t in types)
    operands = [_operand(a0, a1, own) for a0, a1 in zip(s0.outs, s1.outs)]
    operands += [_operand(a0, a1, own) for a0, a1 in zip(s0.ins, s1.ins)]
    return (_OP, s0, types if exact else None, operands)


def _operand(a0: Any, a1: Any, own: set[int]) -> tuple:
    if type(a0) is not Access:
        return (_VALUE, a0)
    if type(a1) is not Access:
        raise _Fail
    t0 = a0.tensor
    # 0: a tensor made before the run; 1: a tile of the step; 2: a view of one (each step
    # reshapes its own tile: its views are the step's too)
    mine = 0 if _root(t0).uid not in own else 1 if t0.base is None else 2
    strides = None
    if a1.index is not a0.index:
        if len(a1.index) != len(a0.index):
            raise _Fail
        strides = tuple(
            (x0.terms, x0.const, x1.const - x0.const) for x0, x1 in zip(a0.index, a1.index)
        )
    ind = None
    if a0.indirect is not None:
        if a1.indirect is None:
            raise _Fail
        ind = _operand(a0.indirect, a1.indirect, own)
    return (_ACCESS, a0, mine, strides, ind)


def _check(plan: list, step: list, k: int) -> list[int]:
    """Check that ``step`` (the ``k``-th) is the first step of ``plan`` with its own tiles
    and its offsets moved ``k`` strides; the uids of its tiles."""
    local: dict[int, Tensor] = {}  # a tile of this step -> the first step's
    at = 0
    try:
        for entry, sk in zip(plan, step):
            _check_statement(entry, sk, k, local)
            at += 1
    except _Fail as e:
        e.at = at
        raise
    return list(local)


def _check_statement(entry: tuple, sk: Any, k: int, local: dict[int, Tensor]) -> None:
    """Check one statement of a step against its plan entry (see ``_check``)."""
    if entry[0] is _ALLOC:
        if type(sk) is not Alloc or not _same_tile(entry[1], sk.tensor):
            raise _Fail
        local[sk.tensor.uid] = entry[1]
        return
    _, s0, types, operands = entry
    if type(sk) is not Op or sk.loc is not s0.loc or sk.prim != s0.prim:
        raise _Fail
    if (sk.mask is not None or s0.mask is not None) and sk.mask != s0.mask:
        raise _Fail
    a, b = s0.attrs, sk.attrs
    if a is not b:
        if types is not None:
            if a != b or tuple(map(type, b.values())) != types:
                raise _Fail
        elif not _same_attrs(a, b):
            raise _Fail
    outs, ins = sk.outs, sk.ins
    if len(outs) + len(ins) != len(operands) or len(outs) != len(s0.outs):
        raise _Fail
    for op_plan, x in zip(operands, (*outs, *ins)):
        if op_plan[0] is _VALUE:
            if not _same_value(op_plan[1], x):
                raise _Fail
        else:
            _check_access(op_plan, x, k, local)


def _check_access(plan: tuple, ak: Any, k: int, local: dict[int, Tensor]) -> None:
    """Raise ``_Fail`` unless ``ak`` is the plan's access moved ``k`` strides, on its tensor
    or (for a tile of the first step) this step's own."""
    _, a0, mine, strides, ind = plan
    if type(ak) is not Access:
        raise _Fail
    tk = ak.tensor
    if mine == 0:
        if tk is not a0.tensor:
            raise _TensorFail
    elif local.get(tk.uid) is not a0.tensor and (mine == 1 or not _same_view(a0.tensor, tk, local)):
        raise _TensorFail
    if ak.shape != a0.shape:
        raise _Fail
    ik = ak.index
    if strides is None:
        if ik is not a0.index and ik != a0.index:
            raise _Fail
    else:
        if len(ik) != len(strides):
            raise _Fail
        for xk, (terms, const, stride) in zip(ik, strides):
            if xk.const != const + k * stride or (xk.terms is not terms and xk.terms != terms):
                raise _Fail
    if ind is None:
        if ak.indirect is not None:
            raise _Fail
    else:
        if (ak.indirect_dim, ak.indirect_extent) != (a0.indirect_dim, a0.indirect_extent):
            raise _Fail
        _check_access(ind, ak.indirect, k, local)


def _same_view(t0: Tensor, tk: Tensor, local: dict[int, Tensor]) -> bool:
    """Whether ``tk`` views this step's tile as ``t0`` views the first step's (base by base);
    if so, ``local`` maps each of its views to the first step's."""
    views = []
    while t0.base is not None:
        if (
            tk.base is None
            or tk.shape != t0.shape
            or tk.dtype is not t0.dtype
            or tk.buffer != t0.buffer
            or tk.kind != t0.kind
            or tk.par_axis != t0.par_axis
        ):
            return False
        views.append((tk, t0))
        t0, tk = t0.base, tk.base
    if tk.base is not None or local.get(tk.uid) is not t0:
        return False
    for v, v0 in views:
        local[v.uid] = v0
    return True


def _same_tile(t0: Tensor, tk: Tensor) -> bool:
    return (
        t0.shape == tk.shape
        and t0.dtype is tk.dtype
        and t0.buffer == tk.buffer
        and t0.kind == tk.kind == "temp"
        and t0.base is None
        and tk.base is None
        and t0.par_axis == tk.par_axis
        and t0.scope == tk.scope
        and t0.mutable == tk.mutable
        and t0.const_value is None
        and tk.const_value is None
        and t0.user_span == tk.user_span
        and t0.address == tk.address
        and t0.loc is tk.loc
    )


def _same_value(a: Any, b: Any) -> bool:
    """Whether two attribute values or immediates are one value of one type (floats and
    numpy scalars by repr: 0.0 is not -0.0; containers item by item; anything else by
    identity)."""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta in _PLAIN:
        return a == b
    if ta is float or isinstance(a, np.generic):
        return repr(a) == repr(b)
    if ta is tuple or ta is list:
        return len(a) == len(b) and all(map(_same_value, a, b))
    return False


def _same_attrs(a: dict, b: dict) -> bool:
    if len(a) != len(b):
        return False
    for key, v in a.items():
        w = b.get(key, _Fail)
        if v is not w and not _same_value(v, w):
            return False
    return True


def _root(t: Tensor) -> Tensor:
    return t if t.base is None else t.root


# -- writing loops -----------------------------------------------------------------------------
def _materialize(body: list, runs: list[_Run]) -> tuple[list, set[int], dict[int, Tensor]]:
    """The body with ``runs`` as loops, the uids of the steps' tiles, and the loops' tiles
    by the uid of the first step's tile (or view) each copies.  A run whose step's
    tile a later statement uses ends before that step (a tile of its first step: the run is
    not folded), since the loop's tile holds the last iteration's data once it ends."""
    owner: dict[int, _Run] = {}
    for r in runs:
        for u in r.tiles:
            owner[u] = r
    pos = 0
    for r in [*runs, None]:
        end = len(body) if r is None else r.start
        _check_uses(body[pos:end], owner, None)
        if r is not None:
            _check_uses(body[r.start : r.start + r.period], owner, r)
            pos = r.start + r.steps * r.period
    out: list = []
    gone: set[int] = set()
    loop_tiles: dict[int, Tensor] = {}
    pos = 0
    for n, r in enumerate(runs):
        if r.steps < MIN_STEPS:
            continue
        out.extend(body[pos : r.start])
        out.append(_loop(body, r, n, loop_tiles))
        gone.update(u for u, k in r.tiles.items() if k < r.steps)
        pos = r.start + r.steps * r.period
    out.extend(body[pos:])
    return out, gone, loop_tiles


def _check_uses(stmts: list, owner: dict[int, _Run], current: _Run | None) -> None:
    """End each run (but ``current``, whose first step ``stmts`` is) whose step's tile
    ``stmts`` uses before that step."""
    for s in stmts:
        if type(s) is Op:
            for a in (*s.outs, *s.ins):
                while type(a) is Access:
                    t = a.tensor
                    for u in (t.uid, _root(t).uid):
                        r = owner.get(u)
                        if r is not None and r is not current and r.tiles[u] < r.steps:
                            r.steps = r.tiles[u]
                    a = a.indirect
        elif type(s) is Loop:
            _check_uses(s.body, owner, current)


def _loop(body: list, r: _Run, n: int, loop_tiles: dict[int, Tensor]) -> Loop:
    """The loop of run ``r``: its first step, offsets affine in the loop variable, on copies
    of its tiles that live in the loop (added to ``loop_tiles``)."""
    first = body[r.start : r.start + r.period]
    second = body[r.start + r.period : r.start + 2 * r.period]
    var = LoopVar(f"step{n}", r.steps, UNROLLED)
    out: list = []
    loc = None
    for s0, s1 in zip(first, second):
        if type(s0) is Alloc:
            t = s0.tensor
            loop_tiles[t.uid] = copy_tensor(t, scope=(*t.scope, var))
            out.append(Alloc(loop_tiles[t.uid]))
            continue
        loc = loc or s0.loc
        made: dict[int, Access] = {}
        outs = [_moved(a0, a1, var, made, loop_tiles) for a0, a1 in zip(s0.outs, s1.outs)]
        ins = [
            _moved(a0, a1, var, made, loop_tiles) if type(a0) is Access else a0
            for a0, a1 in zip(s0.ins, s1.ins)
        ]
        out.append(Op(s0.prim, outs, ins, s0.attrs, s0.loc, s0.mask))
    return Loop(var, out, loc or first[0].tensor.loc)


def _moved(
    a0: Access, a1: Access, var: LoopVar, made: dict[int, Access], loop_tiles: dict[int, Tensor]
) -> Access:
    """``a0`` with each index constant growing by its stride (``a1 - a0``) per iteration, on
    the loop's copy of its tile."""
    hit = made.get(id(a0))
    if hit is not None:
        return hit
    index = a0.index
    if a1.index is not index:
        index = tuple(
            x0
            if x1.const == x0.const
            else Affine((*x0.terms, (var, x1.const - x0.const)), x0.const)
            for x0, x1 in zip(a0.index, a1.index)
        )
    ind = a0.indirect
    if ind is not None:
        ind = _moved(ind, a1.indirect, var, made, loop_tiles)
    t = _loop_tile(a0.tensor, loop_tiles)
    if t is a0.tensor and index is a0.index and ind is a0.indirect:
        made[id(a0)] = a0
        return a0
    moved = Access(t, a0.shape, index, ind, a0.indirect_dim, a0.indirect_extent)
    made[id(a0)] = moved
    return moved


def _loop_tile(t: Tensor, loop_tiles: dict[int, Tensor]) -> Tensor:
    """The loop's copy of ``t`` when it is a tile of the first step or a view of one, else
    ``t`` (a view's copy is made here, viewing the copy of its base)."""
    hit = loop_tiles.get(t.uid)
    if hit is not None or t.base is None:
        return hit or t
    base = _loop_tile(t.base, loop_tiles)
    if base is t.base:
        return t
    view = loop_tiles[t.uid] = copy_tensor(t, base=base, scope=base.scope)
    return view
