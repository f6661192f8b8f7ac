"""Affine index expressions: the language of tile indices, masks and loop bounds.

An index into a tensor is, per dimension, ``const + sum(coef * symbol)`` where a symbol is
a loop variable, a program id, or an axis of the tile being accessed (``Axis(k)``: what
``nl.arange(n)[:, None]`` and slices stand for).  Keeping indices affine is what lets the
verifier prove bounds and write-distinctness and lets the simulator turn an access into a
numpy slice.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

import numpy as np


class Sym:
    """A symbol an index may depend on."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Axis(Sym):
    """Axis ``k`` of the tile being accessed (an arange or a slice)."""

    k: int

    def __repr__(self) -> str:
        return f"a{self.k}"


@dataclass(frozen=True, slots=True)
class ProgramId(Sym):
    """``nl.program_id(axis)`` of an SPMD launch."""

    axis: int

    def __repr__(self) -> str:
        return f"pid{self.axis}"


_loop_ids = itertools.count()


@dataclass(frozen=True, eq=False, slots=True)
class LoopVar(Sym):
    """The induction variable of a rolled loop (affine_range / sequential_range)."""

    name: str
    trip: int
    kind: str  # "affine" | "sequential"
    uid: int = field(default_factory=lambda: next(_loop_ids))

    def __repr__(self) -> str:
        return self.name

    def __hash__(self) -> int:
        return self.uid


class NonAffineError(ValueError):
    """An operation would make an index non-affine (e.g. ``i // 2``, ``i * j``)."""


@dataclass(frozen=True, slots=True)
class Affine:
    """``const + sum(coef * sym)``: immutable, hashable, with exact integer arithmetic."""

    terms: tuple[tuple[Sym, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(value: Affine | Sym | int) -> Affine:
        if isinstance(value, Affine):
            return value
        if isinstance(value, Sym):
            return Affine(((value, 1),), 0)
        if isinstance(value, int | np.integer):
            return Affine((), int(value))
        raise NonAffineError(f"{value!r} is not an integer index")

    @staticmethod
    def _make(coefs: dict[Sym, int], const: int) -> Affine:
        return Affine(tuple((s, c) for s, c in coefs.items() if c != 0), const)

    def coef(self, sym: Sym) -> int:
        for s, c in self.terms:
            if s == sym:
                return c
        return 0

    @property
    def syms(self) -> tuple[Sym, ...]:
        return tuple(s for s, _ in self.terms)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def __add__(self, other: Affine | int) -> Affine:
        other = Affine.of(other)
        coefs = dict(self.terms)
        for s, c in other.terms:
            coefs[s] = coefs.get(s, 0) + c
        return Affine._make(coefs, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(tuple((s, -c) for s, c in self.terms), -self.const)

    def __sub__(self, other: Affine | int) -> Affine:
        return self + (-Affine.of(other))

    def __rsub__(self, other: Affine | int) -> Affine:
        return Affine.of(other) - self

    def __mul__(self, other: Affine | int) -> Affine:
        other = Affine.of(other)
        if other.is_const:
            k = other.const
            return Affine._make({s: c * k for s, c in self.terms}, self.const * k)
        if self.is_const:
            return other * self.const
        raise NonAffineError("product of two index variables")

    __rmul__ = __mul__

    def floordiv(self, k: int) -> Affine:
        """``self // k`` (floor): affine when ``k`` divides every coefficient, since
        ``(k*x + c) // k == x + c // k`` for integer ``x``."""
        if all(c % k == 0 for _, c in self.terms):
            return Affine._make({s: c // k for s, c in self.terms}, self.const // k)
        raise NonAffineError("floor division of an index variable")

    def mod(self, k: int) -> Affine:
        """``self % k``: the constant ``const % k`` when ``k`` divides every coefficient."""
        if all(c % k == 0 for _, c in self.terms):
            return Affine((), self.const % k)
        raise NonAffineError("modulo of an index variable")

    def substitute(self, mapping: dict[Sym, Affine]) -> Affine:
        """Replace symbols simultaneously (replacements are not substituted again)."""
        out = Affine((), self.const)
        for s, c in self.terms:
            out = out + (mapping[s] * c if s in mapping else Affine(((s, c),), 0))
        return out

    def bounds(self, ranges: dict[Sym, int]) -> tuple[int, int]:
        """Inclusive min and max over symbols ranging in ``[0, ranges[sym])``."""
        lo = hi = self.const
        for s, c in self.terms:
            top = c * (ranges[s] - 1)
            lo += min(0, top)
            hi += max(0, top)
        return lo, hi

    def evaluate(self, env: dict[Sym, object]) -> object:
        """Value with symbols bound to ints or broadcastable int arrays."""
        out: object = self.const
        for s, c in self.terms:
            v = env[s]
            out = out + (v * c if c != 1 else v)  # type: ignore[operator]
        return out

    def __repr__(self) -> str:
        parts = []
        for s, c in self.terms:
            parts.append(f"{s!r}" if c == 1 else f"{c}*{s!r}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


_CMP = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True, slots=True)
class Predicate:
    """A conjunction of ``lhs <op> 0`` clauses over affine expressions (masks, affine_select)."""

    clauses: tuple[tuple[Affine, str], ...]

    def __and__(self, other: Predicate) -> Predicate:
        if not isinstance(other, Predicate):
            return NotImplemented
        return Predicate(self.clauses + other.clauses)

    def substitute(self, mapping: dict[Sym, Affine]) -> Predicate:
        return Predicate(tuple((a.substitute(mapping), op) for a, op in self.clauses))

    @property
    def syms(self) -> tuple[Sym, ...]:
        return tuple(dict.fromkeys(s for a, _ in self.clauses for s in a.syms))

    def evaluate(self, env: dict[Sym, object]) -> object:
        result: object = True
        for a, op in self.clauses:
            result = result & _CMP[op](a.evaluate(env), 0)  # type: ignore[operator]
        return result

    def __repr__(self) -> str:
        return " & ".join(f"({a!r} {op} 0)" for a, op in self.clauses)


def axis_env(shape: tuple[int, ...]) -> dict[Sym, np.ndarray]:
    """Bind Axis(k) to a broadcastable arange over ``shape``."""
    n = len(shape)
    env: dict[Sym, np.ndarray] = {}
    for k, size in enumerate(shape):
        view = [1] * n
        view[k] = size
        env[Axis(k)] = np.arange(size).reshape(view)
    return env
