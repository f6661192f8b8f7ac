"""Loop capture for rolled loops (affine_range / sequential_range), and loop splitting.

A rolled loop becomes one IR ``Loop`` whose variable stays symbolic, so every index in its
body must be affine in that variable.  ``i % k`` and ``i // k`` of a loop variable ``i`` are
not, but they become affine once the loop is split the way a compiler strip-mines it:
``i = k*j + r`` with an outer loop over ``j`` (same kind, ``trip // k`` iterations) whose
body is traced ``k`` times, once for each ``r``, followed by ``trip % k`` unrolled remainder
iterations.  In every copy ``i % k`` is the constant ``r`` and ``i // k`` is ``j``.

The split happens **in place** while the loop's body is traced for the first time: the
first copy is the one for ``r = 0``, so ``i % k`` there is already known (the constant of
``r = 0``) and ``i // k`` is ``j``.  When the body returns to the loop, the statements it
traced are rewritten with ``i = k*j`` (:meth:`Builder.resplit`) and the body runs again for
``r = 1 .. k-1`` and the remainder.  The kernel function therefore runs once, as on NKI,
and trace-time side effects (a module-level address allocator, say) happen once.

What cannot be split in place -- a loop whose variable is no longer in its first body copy
(``(i // 2) % 2`` after ``i // 2`` gave out ``j``, a loop already split for another factor)
-- is split by a re-trace: the index expression raises :class:`SplitLoops` naming the loops
(by the source line of their ``for``) and the factors they need; the kernel trace
(``JitKernel._trace``) catches it, records the factors in the builder's split plan and
traces the kernel again.  Every loop traced from the same ``for`` line is split alike, which
is always correct (splitting does not change what a loop computes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..errors import NkiError, SourceLoc
from ..ir.affine import Affine, LoopVar, Sym
from .builder import Builder, LoopSite


class SplitLoops(Exception):  # noqa: N818 - a signal, not an error a user sees
    """Signal to the kernel trace: trace again with the loops at ``factors``'s sites split
    by (a multiple of) those factors.  ``loc`` and ``expr`` describe the index expression
    that asked, for the error raised if the split cannot be done."""

    def __init__(self, factors: dict[LoopSite, int], loc: SourceLoc, expr: str) -> None:
        super().__init__(expr)
        self.factors = factors
        self.loc = loc
        self.expr = expr

    def error(self) -> NkiError:
        return NkiError("err_non_affine_index", self.loc, expr=self.expr)


def rolled_loop(
    b: Builder, kind: str, trip: int, start: int, step: int, name: str, loc: SourceLoc
) -> Iterator[Affine]:
    """Open a rolled loop of ``trip`` iterations in ``b`` and yield the value of the loop
    index (``start + step * i``) for each body the caller traces: one symbolic value; or,
    when the split plan asks for a factor ``k`` at this ``for`` line or the first body asked
    for an in-place split by ``k`` (:func:`request_split`), ``k`` values of the split loop's
    variable followed by the constant values of the remainder iterations."""
    site: LoopSite = (loc.file, loc.line)
    k = b.splits.get(site, 1) if b.splits is not None else 1
    outer, rem = divmod(trip, k)
    if outer:
        var = LoopVar(b.unique(name if k == 1 else f"{name}_by{k}"), outer, kind)
        b.loop_sites[var] = (site, k)
        with b.loop(var, loc):
            if k == 1 and b.splits is not None:
                # the first body copy may split the loop in place (see the module docstring)
                plan = b.first_pass[var] = InPlaceSplit(var, name)
                # what the first copy adds to these is all that can mention ``var``
                made = (len(b.tensors), len(b.aliases))
                yield Affine.of(var) * step + start
                del b.first_pass[var]
                if plan.factor > 1:
                    k = plan.factor
                    outer, rem = divmod(trip, k)
                    b.resplit(var, plan.new, k, made)
                    b.loop_sites[plan.new] = (site, k)
                    j = Affine.of(plan.new) * k
                    for r in range(1, k):
                        yield (j + r) * step + start
            else:
                j = Affine.of(var) * k
                for r in range(k):
                    yield (j + r) * step + start
    for r in range(rem):
        yield Affine.of((outer * k + r) * step + start)


class InPlaceSplit:
    """The in-place split of a loop whose first body copy is being traced: ``factor`` (1 while
    nothing asked), ``new`` (the split loop's variable ``j``, ``var = factor * j`` in this
    copy) and whether ``j`` was given out in an index (then the factor can no longer grow)."""

    __slots__ = ("var", "name", "factor", "new", "given_out")

    def __init__(self, var: LoopVar, name: str) -> None:
        self.var = var
        self.name = name
        self.factor = 1
        self.new: LoopVar | None = None
        self.given_out = False

    def grow(self, b: Builder, f: int) -> bool:
        """Split by a multiple of ``f``; False if this copy cannot be split so (``j`` given
        out for a smaller factor, or fewer iterations than the factor)."""
        new = math.lcm(self.factor, f)
        if new == self.factor:
            return True
        if self.given_out or self.var.trip // new == 0:
            return False
        self.factor = new
        self.new = LoopVar(b.unique(f"{self.name}_by{new}"), self.var.trip // new, self.var.kind)
        return True


def request_split(
    b: Builder | None, affine: Affine, k: int, loc: SourceLoc, expr: str
) -> dict[Sym, Affine] | None:
    """``affine % k`` or ``affine // k`` is not affine.  If splitting loops makes it affine
    (every symbol whose coefficient ``k`` does not divide is the variable of a rolled loop):
    split the loops in their first body copy in place and return the substitution that holds
    in this copy (``var -> factor * j``), or raise :class:`SplitLoops` for the loops that need
    a re-trace.  Otherwise (an arange axis, a program id, splitting off) return None."""
    if b is None or b.splits is None or k == 0:
        return None
    in_place: dict[InPlaceSplit, int] = {}
    factors: dict[LoopSite, int] = {}
    for sym, coef in affine.terms:
        if coef % k == 0:
            continue
        got = b.loop_sites.get(sym) if isinstance(sym, LoopVar) else None
        f = abs(k) // math.gcd(coef, k)
        if got is None:
            given = _given_out(b, sym)
            if given is None:  # an arange axis, a program id: no split makes this affine
                return None
            # ``j`` of an in-place split (``var = factor * j``) given out: split var further,
            # by a re-trace
            site = b.loop_sites[given.var][0]
            factors[site] = math.lcm(factors.get(site, 1), given.factor * f)
            continue
        site, already = got
        # the site is split by `already` (sym is its outer variable): split sym by f more
        plan = b.first_pass.get(sym)
        if plan is not None:
            in_place[plan] = f
        else:
            factors[site] = math.lcm(factors.get(site, 1), already * f)
    if not factors:
        for plan, f in in_place.items():
            if not plan.grow(b, f):
                factors[b.loop_sites[plan.var][0]] = math.lcm(plan.factor, f)
    if factors:
        for plan, f in in_place.items():
            site = b.loop_sites[plan.var][0]
            factors[site] = math.lcm(factors.get(site, 1), plan.factor, f)
        raise SplitLoops(factors, loc, expr)
    return {plan.var: Affine.of(plan.new) * plan.factor for plan in in_place}


def _given_out(b: Builder, sym: Sym) -> InPlaceSplit | None:
    """The in-place split whose new variable ``sym`` is, if any."""
    for plan in b.first_pass.values():
        if plan.new is sym:  # type: ignore[attr-defined]
            return plan  # type: ignore[return-value]
    return None


def split_value(b: Builder | None, affine: Affine, k: int, fn, loc: SourceLoc, expr: str):
    """``fn(affine, k)`` (``Affine.mod`` or ``Affine.floordiv``) with the loops it needs split
    (:func:`request_split`), or None when no split makes it affine."""
    mapping = request_split(b, affine, k, loc, expr)
    if mapping is None:
        return None
    out = fn(affine.substitute(mapping), k)
    news = {id(m.syms[0]) for m in mapping.values()}
    if any(id(s) in news for s in out.syms):
        for plan in b.first_pass.values():
            if plan.new is not None and id(plan.new) in news:
                plan.given_out = True
    return out
