"""Loop capture for rolled loops (affine_range / sequential_range), and loop splitting.

A rolled loop becomes one IR ``Loop`` whose variable stays symbolic, so every index in its
body must be affine in that variable.  ``i % k`` and ``i // k`` of a loop variable ``i`` are
not, but they become affine once the loop is split the way a compiler strip-mines it:
``i = k*j + r`` with an outer loop over ``j`` (same kind, ``trip // k`` iterations) whose
body is traced ``k`` times, once for each ``r``, followed by ``trip % k`` unrolled remainder
iterations.  In every copy ``i % k`` is the constant ``r`` and ``i // k`` is ``j``.

The body of a Python ``for`` statement cannot be re-run from inside its iterator, so the
split is a re-trace: the index expression raises :class:`SplitLoops` naming the loops
(by the source line of their ``for``) and the factors they need; the kernel trace
(``JitKernel._trace``) catches it, records the factors in the builder's split plan and
traces the kernel again.  Every loop traced from the same ``for`` line is split alike, which
is always correct (splitting does not change what a loop computes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..errors import NkiError, SourceLoc
from ..ir.affine import Affine, LoopVar
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
    index (``start + step * i``) for each body the caller traces: one symbolic value, or, when
    the split plan asks for a factor ``k`` at this ``for`` line, ``k`` values of the split
    loop's variable followed by the constant values of the remainder iterations."""
    site: LoopSite = (loc.file, loc.line)
    k = b.splits.get(site, 1) if b.splits is not None else 1
    outer, rem = divmod(trip, k)
    if outer:
        var = LoopVar(b.unique(name if k == 1 else f"{name}_by{k}"), outer, kind)
        b.loop_sites[var] = (site, k)
        with b.loop(var, loc):
            j = Affine.of(var) * k
            for r in range(k):
                yield (j + r) * step + start
    for r in range(rem):
        yield Affine.of((outer * k + r) * step + start)


def request_split(b: Builder | None, affine: Affine, k: int, loc: SourceLoc, expr: str) -> None:
    """``affine % k`` or ``affine // k`` is not affine: raise :class:`SplitLoops` when splitting
    loops of ``b`` makes it affine (every symbol whose coefficient ``k`` does not divide is
    the variable of a loop that can be re-traced split); otherwise return."""
    if b is None or b.splits is None or k == 0:
        return
    factors: dict[LoopSite, int] = {}
    for sym, coef in affine.terms:
        if coef % k == 0:
            continue
        got = b.loop_sites.get(sym) if isinstance(sym, LoopVar) else None
        if got is None:  # an arange axis, a program id: no split makes this affine
            return
        site, already = got
        # the site is split by `already` (sym is its outer variable): split sym by f more
        f = abs(k) // math.gcd(coef, k)
        factors[site] = math.lcm(factors.get(site, 1), already * f)
    raise SplitLoops(factors, loc, expr)
