"""NeuronCore-v4 tensor indirection, resolved when its instruction is emitted.

An NKI 0.x indirect view (``t.indirect(index, num_elem)``) reads or writes one column of the
on-chip tensor ``t`` at each of ``num_elem`` free-dimension offsets, the same offsets for every
partition.  Offset ``i`` is the index tile's element ``[i % G, i // G]`` ("snake" order over
partition groups), G the snake group of the engine that runs the instruction: 16 on the
Vector, Scalar and GpSimd engines, 32 on the Tensor engine (``ir/prims.SNAKE_GROUP``)
[nki-0x.md §3.8].  So one view means other offsets on another engine, and only the emit layer
knows the engine: the front end (``nkikit/nki/indirection.py``) hands it a *pending* access
(:func:`pending_access`, its runtime index a :class:`PendingSnake`), and :func:`resolve` turns
every pending access of an instruction into an IR indirect access before anything checks or
records the instruction.

In the IR the snake order is an access of the index tile, so that the runtime-index machinery
of indirect DMA (``Access.indirect``: the simulators' gather and scatter, the verifier's and the
scheduler's reads of the index tile) does the rest.  ``i % G`` and ``i // G`` are affine once
the instruction's tile splits its ``num_elem`` free elements into ``(num_elem / G, G)`` tile
axes: an indirect access of ``(P, num_elem)`` becomes ``(P, J, G)``, element ``(p, j, r)`` at
column ``offset + index[r, j]`` of ``t``, and every operand the instruction combines with it
element by element (those of the same tile shape; per-partition scalars get the new rank) is
re-expressed in the same tile axes, row-major order kept, as is a reduction's ``axes``.  With
``num_elem <= G`` one column of the index is read and no axis splits.

Where the reference is silent nkikit refuses rather than guesses (named errors at the user's
line): ``num_elem`` above G that is not a multiple of it (the snake's last group would be
partial, which no tile of axes expresses), an index too small for the snake (``index[i % G,
i // G]`` past its rows or columns: with P above 16, ``num_elem`` defaults to more offsets
than one partition group's columns hold), an engine without tensor indirection (DMA).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import NkiError, SourceLoc
from ..ir.affine import Affine, Axis, Predicate
from ..ir.core import Access, Op, Operand
from ..ir.prims import PRIMS, SNAKE_GROUP, engines_of

pending = 0
"""How many pending accesses the front end made that no instruction resolved yet (the emit
layer asks before every instruction: a number, not a look at every operand).  Not a flag
reset by every instruction: a front end may emit another instruction between making an
operand's access and emitting the instruction that uses it (the ScalarE accumulator reset
before an ``activation``)."""


@dataclass(frozen=True, slots=True)
class PendingSnake:
    """The runtime index of a pending indirect access: the index view's access (its own
    ``(P, K)`` tile axes) and the number of offsets it gives, in snake order once the engine,
    hence G, is known.  Never in the IR: :func:`resolve` replaces it."""

    index: Access
    num_elem: int

    @property
    def tensor(self):
        return self.index.tensor

    @property
    def syms(self):
        return self.index.syms


def pending_access(
    layout, shape: tuple[int, ...], index: tuple[Affine, ...], snake: PendingSnake, extent: int
) -> Access:
    """The access of an indirect view before its engine is known: tensor ``layout`` (the
    storage as ``(partitions, free)``), tile ``shape``, static ``index`` (the view's first
    partition and first column), the offsets ``snake`` gives along dimension 1, each to lie in
    ``[0, extent)`` (the view's free size)."""
    global pending
    pending += 1
    return Access(layout, tuple(shape), tuple(index), snake, 1, extent)  # type: ignore[arg-type]


def _is_pending(x: object) -> bool:
    return type(x) is Access and type(x.indirect) is PendingSnake


def _fail(prim: str, loc: SourceLoc, operand: str, why: str) -> NkiError:
    return NkiError(
        "err_indirect_operand_not_supported", loc, op=f"nisa.{prim}", operand=operand, why=why
    )


def group_of(prim: str, attrs: dict, loc: SourceLoc, operand: str) -> tuple[int, str]:
    """(G, engine) of an instruction of ``prim`` with ``attrs``: every engine it may run on
    (the compiler's candidates for an unassigned copy) must take indirect views with one G."""
    engines = engines_of(Op(prim, [], [], attrs, loc))
    groups = {e: SNAKE_GROUP.get(e) for e in engines}
    bad = [e for e, g in groups.items() if g is None]
    if not engines or bad:
        where = f"the {bad[0]} engine" if bad else "no engine"
        raise _fail(prim, loc, operand, f"it runs on {where}, which has no tensor indirection")
    if len(set(groups.values())) > 1:
        raise _fail(
            prim,
            loc,
            operand,
            f"its engine is not fixed ({', '.join(engines)}) and their snake groups differ; "
            "pass engine=",
        )
    return groups[engines[0]], engines[0]


def _chain(free: Sequence[int], g: int, n: int) -> tuple[int, ...] | None:
    """The coarsest free shape that refines both ``free`` (its non-unit sizes) and
    ``(n // g, g)``, outermost first, or None when none does."""
    bounds = {g, n}
    acc = 1
    for d in reversed(free):
        acc *= d
        bounds.add(acc)
    chain = sorted(b for b in bounds if b > 1)
    if any(b % a for a, b in zip(chain, chain[1:])):
        return None
    dims = [chain[0]] + [b // a for a, b in zip(chain, chain[1:])]
    return tuple(reversed(dims))


def _suffixes(dims: Sequence[int]) -> list[int]:
    """Row-major strides of ``dims`` (the product of the sizes after each)."""
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return out[::-1]


class _Split:
    """One tile shape of an instruction re-expressed with more free axes: the new shape, the
    mapping from the old tile axes to the new ones, and the old axes each new axis refines."""

    def __init__(self, old: tuple[int, ...], new_free: tuple[int, ...]) -> None:
        self.old = old
        self.new = (old[0], *new_free)
        new_strides = _suffixes(new_free)
        self.mapping: dict = {Axis(0): Affine.of(Axis(0))}
        self.parts: dict[int, list[int]] = {0: [0]}
        old_strides = _suffixes(old[1:])
        for k, (n, s) in enumerate(zip(old[1:], old_strides), start=1):
            if n == 1:
                self.mapping[Axis(k)] = Affine()
                self.parts[k] = []
                continue
            js = [j for j, t in enumerate(new_strides) if s <= t < s * n]
            self.parts[k] = [j + 1 for j in js]
            self.mapping[Axis(k)] = sum(
                (Affine.of(Axis(j + 1)) * (new_strides[j] // s) for j in js), Affine()
            )

    def access(self, a: Access) -> Access:
        return a if self.new == self.old else a.remap(self.new, self.mapping)

    def axes(self, axes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(j for k in axes for j in self.parts[k])


def _position(shape: tuple[int, ...]) -> Affine:
    """The free position of a tile element (its row-major number within its partition)."""
    out = Affine()
    for k, s in enumerate(_suffixes(shape[1:]), start=1):
        if shape[k] > 1:
            out = out + Affine.of(Axis(k)) * s
    return out


def resolve(
    prim: str,
    outs: list[Access],
    ins: list[Operand],
    attrs: dict,
    mask: Predicate | None,
    loc: SourceLoc,
) -> tuple[list[Access], list[Operand], dict, Predicate | None]:
    """The instruction with every pending access of its operands made an IR indirect access
    for the engine that runs it (see the module docstring); unchanged when it has none."""
    global pending
    found = [a for a in (*outs, *ins) if _is_pending(a)]
    if not found:
        return outs, ins, attrs, mask
    pending = max(0, pending - len({id(a) for a in found}))
    first = found[0]
    rec = PRIMS[prim]
    role = next(
        (rec.out_role(i) for i, o in enumerate(outs) if o is first),
        next((rec.in_role(i) for i, x in enumerate(ins) if x is first), "an operand"),
    )
    g, engine = group_of(prim, attrs, loc, f"{role} {first.tensor.root.name!r}")
    splits: dict[tuple[int, ...], _Split] = {}
    for a in found:
        n = a.indirect.num_elem
        if n <= g or a.shape in splits:
            continue
        if n % g:
            raise NkiError(
                "err_unsupported_api",
                loc,
                api=f"an indirect view of {n} offsets on the {engine} engine",
                why=f"offsets come in snake groups of {g} there; use num_elem <= {g} or a "
                f"multiple of {g} (nkikit does not model a partial last group)",
            )
        new = _chain([d for d in a.shape[1:] if d > 1], g, n)
        if new is None:
            raise NkiError(
                "err_unsupported_api",
                loc,
                api=f"nisa.{prim} of free shapes {a.shape[1:]} with an indirect view",
                why=f"the {n} offsets go in groups of {g}, which the free shape does not "
                "split into; give the operands a (P, n) shape",
            )
        splits[a.shape] = _Split(a.shape, new)
    if splits and mask is not None:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"a masked nisa.{prim} with an indirect view",
            why="NKI 0.x instructions take no mask",
        )
    ranks = {len(s.old): len(s.new) for s in splits.values()}

    def fit(x: Operand) -> Operand:
        if not isinstance(x, Access):
            return x
        if _is_pending(x):
            return _snake(x, splits.get(x.shape), g, engine, prim, loc)
        s = splits.get(x.shape)
        if s is not None:
            return s.access(x)
        r = ranks.get(len(x.shape))
        if r is not None and r != len(x.shape) and math.prod(x.shape[1:]) == 1:
            # a per-partition scalar broadcast along the free axes: the new rank
            return x.remap((x.shape[0],) + (1,) * (r - 1), {})
        return x

    done: dict[int, Operand] = {}  # one access used twice (dst as an input) stays one

    def once(x: Operand) -> Operand:
        got = done.get(id(x))
        if got is None:
            got = done[id(x)] = fit(x)
        return got

    new_outs = [once(o) for o in outs]
    new_ins = [once(x) for x in ins]
    if "axes" in attrs and ins and isinstance(ins[0], Access) and ins[0].shape in splits:
        # a reduction's axes name tile axes of its data: the axes they became
        attrs = {**attrs, "axes": splits[ins[0].shape].axes(tuple(attrs["axes"]))}
    return new_outs, new_ins, attrs, mask  # type: ignore[return-value]


def _snake(
    a: Access, split: _Split | None, g: int, engine: str, prim: str, loc: SourceLoc
) -> Access:
    """Pending access ``a`` as the IR's indirect access: offset ``i`` (the element's free
    position) read from the index at ``[i % g, i // g]``."""
    snake: PendingSnake = a.indirect  # type: ignore[assignment]
    n = snake.num_elem
    shape = split.new if split is not None else a.shape
    pos = _position(shape)
    if n <= g:
        row, col = pos, Affine()
    else:
        row, col = Affine(), Affine()
        for s, c in pos.terms:
            if c < g:
                row = row + Affine.of(s) * c
            else:
                col = col + Affine.of(s) * (c // g)
    ind = snake.index
    rows, cols = ind.shape[0], math.prod(ind.shape[1:])
    need = (min(n, g), -(-n // g))
    if need[0] > rows or need[1] > cols:
        most = rows if rows < g else g * cols
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{prim}",
            why=f"the indirect view of {a.tensor.root.name} takes {n} offsets in snake order "
            f"index[i % {g}, i // {g}] (G = {g} on the {engine} engine), which reads an index "
            f"of at least {need[0]} x {need[1]}; the index is {rows} x {cols}, enough for "
            f"num_elem <= {most}",
        )
    sub = {Axis(0): row, Axis(1): col}
    index = tuple(e.substitute(sub) for e in ind.index)
    ind_shape = tuple(
        m if any(e.coef(Axis(k)) != 0 for e in index) else 1 for k, m in enumerate(shape)
    )
    ind_acc = Access(ind.tensor, ind_shape, index)
    return Access(a.tensor, shape, a.index, ind_acc, a.indirect_dim, a.indirect_extent)
