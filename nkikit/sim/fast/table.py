"""The table-driven mode of code generation, for large unrolled kernels.

CPython compiles a function in time that grows faster than its length, and unrolled code
would be one line of source per instruction.  Instead, in a kernel with more than
``TABLE_ABOVE`` statements, each statement's code becomes a *template* (its tensors,
constants and integers turned into parameters), equal templates are compiled once, and a
body is a loop over a table of (template, arguments).  The per-tensor setup (arena views,
forwarding buffers, shadows) is a loop over constant tables too.  Smaller kernels keep
every tensor in a local of one straight-line function.

An unrolled kernel repeats a few kinds of op with fresh tiles: an op whose *shape* (``key``:
everything code generation reads about it, its temporaries named by order of appearance)
was seen twice reuses the row those two taught (``_learn``: which argument is a constant,
which a temporary's uid, which the op itself) instead of being rendered and templated again.
``CHECK_MEMO`` renders every op anyway and asserts the rows agree, and makes the plans'
memos (poison, forwarding: ``plan.py``) decide afresh and assert the same (the tests turn
it on).
"""

from __future__ import annotations

import re
from typing import Any

from ...ir.core import Alloc, Op
from .keys import Unkeyable as _Unkeyable

TABLE_ABOVE = 2048  # kernels with more statements than this are table-driven
TABLE_BODY = 256  # bodies with more statements than this are table-driven as well
CHECK_MEMO = False  # render every op and assert the memo's rows equal the rendered ones


# what a template turns into parameters: tensor slots (m5, b5, s5), namespace constants
# (DT3, OP12, ...) and integer literals (not digits of a name or of a float literal); the
# word boundary first, so that most positions fail at once
_TEMPLATE_TOKEN = re.compile(r"\b(?:[mbs]\d+\b|[A-Z]+\d+\b|(?<![.])(?<![eE][-+])\d+(?![\w.]))")


class TableMode:
    """Mixed into the compiler: ``table`` emits a body as a loop over templates.  Uses the
    compiler's ``lines``, ``ns``, ``tensors``, ``const``, ``emit`` and ``statements``;
    ``templates``, ``chunks`` and ``bound`` are set up by ``Compiler.build``."""

    templates: dict[str, int]  # template text -> index
    chunks: list[str]  # the template functions' source
    bound: list[str]  # loop variables in scope, passed on to templates
    ints: dict[int, int]  # one object per integer in the argument tables
    _signatures: dict[tuple[int, int, int], tuple[list[str], str]]
    _memo: dict[tuple, tuple]  # op key -> (_FIRST, seen) | (_RECIPE, ...)
    _poison: dict[int, bool]  # id(Alloc) -> needs poison, decided by its memo key
    _bound_key: tuple[str, ...]  # the loop variables in scope, in every key
    _tflags: dict[int, int]  # uid of a temporary -> what the plans decided (``_tflag``)
    n_replayed: int  # ops whose row came from the memo

    def table(self, stmts: list, depth: int) -> None:
        """Emit ``stmts`` table-driven: each statement's code as a call of a template
        function with its arguments, the calls as a loop over a constant table.  A
        template's tensors come from ``mem`` (``V`` for reshaped views; ``B``, ``S`` for
        forwarding buffers and shadows), which every assignment to a tensor's local also
        updates, so each statement sees what the ones before it left."""
        rows = []
        memo = self._memo
        saved_bound = self._bound_key
        self._bound_key = tuple(self.bound)
        op_key, alloc_key, replay = self._op_key, self._alloc_key, self._replay
        replayed = fallbacks = 0  # added to the counters at the end
        for i in range(len(stmts)):
            s = stmts[i]
            ts = type(s)
            key = None
            predicted: Any = _MISS
            if ts is Op or ts is Alloc:
                try:
                    key, uids = op_key(s) if ts is Op else alloc_key(s, stmts, i)
                    entry = memo.get(key)
                except (_Unkeyable, TypeError):  # TypeError: an unhashable value
                    key = entry = None
                if entry is not None and entry[0] is _RECIPE:
                    predicted = replay(entry, s, uids)
                    if predicted is not _MISS:
                        replayed += 1
                        if not CHECK_MEMO:
                            fallbacks += entry[4]
                            if predicted is not None:
                                rows.append(predicted)
                            continue
            n_fallback = self.n_fallback
            saved, self.lines = self.lines, []
            self.statements(stmts, i, i + 1, 1)
            lines, self.lines = self.lines, saved
            row = self.template(lines) if lines else None
            if row is not None:
                rows.append(row)
            if predicted is not _MISS and not _same_row(predicted, row):
                raise AssertionError(f"table memo: {predicted!r} != {row!r} for {s!r}")
            if key is not None:
                seen = (row, s, uids, self.n_fallback - n_fallback)
                entry = memo.get(key)
                if entry is None:
                    memo[key] = (_FIRST, seen)
                elif entry[0] is _FIRST:
                    memo[key] = _learn(entry[1], seen)
                elif predicted is _MISS:
                    # the recipe holds for ops sharing its fixed temporaries (a matmul's PSUM
                    # tile across its K steps): one of another tile teaches the general one
                    memo[key] = _generalize(entry, seen)
        self.n_replayed += replayed
        self.n_fallback += fallbacks
        self._bound_key = saved_bound
        bound = "".join(f"{n}, " for n in self.bound)
        self.emit(f"for a in {self.const(rows, 'TABLE')}:", depth)
        self.emit(f"T[a[0]](mem, interp, env, V, B, S, {bound}*a)", depth + 1)

    def _op_key(self, op: Op) -> tuple[tuple, list[int]]:
        """(everything code generation reads about ``op``, with its temporaries named by
        order of appearance; their uids in that order): its structure's number
        (``op_shape``), what the plans decided about its temporaries, and the loop variables
        in scope.  (A table-driven kernel forwards no tile: ``Compiler.build``.)"""
        shape = self.op_shape(op)
        if shape is None:
            raise _Unkeyable
        no, uids = shape[0], shape[1]
        flags = self._tflags
        fl = tuple(map(flags.get, uids))  # every temporary's Alloc came first: all known
        if None in fl:
            fl = tuple([flags[u] if u in flags else self._tflag(u) for u in uids])
        return (no, fl, self._bound_key), uids

    def _tflag(self, u: int) -> int:
        """What the plans decided about temporary ``u``, as bits."""
        f = self._tflags[u] = (
            (u in self.shadow)
            | (u in self.forwarded) << 1
            | (u in self.aliased) << 2
            | (u in self.reads) << 3
            | (u in self.writes) << 4
        )
        return f

    def _alloc_key(self, s: Alloc, stmts: list, i: int) -> tuple[tuple, list[int]]:
        """``_op_key`` for an Alloc (``stmts[i]``): what its code depends on, the poison
        decision included (left in ``_poison`` for the rendering)."""
        t = s.tensor
        if t.kind != "temp" or t.base is not None:
            raise _Unkeyable
        poison = self.needs_poison_temp(t, stmts, i + 1)
        self._poison[id(s)] = poison
        u = t.uid
        flag = self._tflags[u] if u in self._tflags else self._tflag(u)
        return ("alloc", self.static_class(t), flag, poison, self._bound_key), [u]

    def _replay(self, entry: tuple, op: Op, uids: list[int]) -> Any:
        """The row ``entry``'s recipe gives for ``op`` (None: the op has no code), or
        ``_MISS`` when it does not apply: a temporary the two teaching ops shared is another
        one here, or a uid equals an integer constant (the template would merge them)."""
        _, row, fills, ops, _, const_ints, fixed, free, _ = entry
        for p, u in fixed:
            if uids[p] != u:
                return _MISS
        for p in free:
            if uids[p] in const_ints:
                return _MISS
        if row is None:
            return None
        out = row.copy()
        for r, p in fills:
            out[r] = uids[p]
        for r in ops:
            out[r] = op
        return tuple(out)

    def _signature(self, n_uids: int, n_args: int) -> str:
        """A template's parameters: the program's state, the loop variables in scope, the
        row's template index, its tensors' uids and its other arguments."""
        key = (len(self.bound), n_uids, n_args)
        sig = self._signatures.get(key)
        if sig is None or sig[0] != self.bound:
            text = ", ".join(
                [
                    "mem, interp, env, V, B, S",
                    *self.bound,
                    "_",
                    *(f"u{j}" for j in range(n_uids)),
                    *(f"a{j}" for j in range(n_args)),
                ]
            )
            sig = self._signatures[key] = (list(self.bound), text)
        return sig[1]

    def template(self, lines: list[str]) -> tuple:
        """(template index, *arguments) for the code ``lines`` of one statement."""
        # tokens in order of first appearance get their names: slots L0, L1, ...,
        # constants and integers a0, a1, ... (found and split out by the C regex engine;
        # only the distinct tokens are looked at in Python)
        text = "\n".join(lines)
        tokens = _TEMPLATE_TOKEN.findall(text)
        names: dict[str, str] = {}
        slots: dict[str, str] = {}
        args: list[Any] = []
        for tok in dict.fromkeys(tokens):
            if tok[0] in "mbs":  # a slot; constants start upper case, integers with a digit
                names[tok] = slots[tok] = f"L{len(slots)}"
            else:
                names[tok] = f"a{len(args)}"
                if tok[0].isupper():
                    args.append(self.ns[tok])
                else:
                    args.append(self.ints.setdefault(int(tok), int(tok)))
        pieces = _TEMPLATE_TOKEN.split(text)
        body = pieces[0] + "".join(map(str.__add__, map(names.__getitem__, tokens), pieces[1:]))
        head, uids = [], []
        for tok, name in slots.items():
            uid = int(tok[1:])
            if tok[0] == "m":
                store = "V" if self.tensors[uid].base is not None else "mem"
            else:
                store = "B" if tok[0] == "b" else "S"
            head.append(f"    {name} = {store}[u{len(uids)}]\n")
            uids.append(self.ints.setdefault(uid, uid))
        text = f"({self._signature(len(uids), len(args))}):\n{''.join(head)}{body}"
        k = self.templates.get(text)
        if k is None:
            k = self.templates[text] = len(self.chunks)
            self.chunks.append(f"def _t{k}{text}")
        return (k, *uids, *args)


_MISS = object()  # no prediction
_FIRST, _RECIPE = "first", "recipe"


def _same_row(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x is y or (type(x) is int and type(y) is int and x == y) for x, y in zip(a, b)
    )


def _learn(first: tuple, second: tuple) -> tuple:
    """A recipe from two ops of one key: each row element a constant (same in both), a
    temporary's uid (``fills``: row position, uid position) or the op (``ops``: row
    positions).  A temporary both ops share is *fixed*: the recipe holds only for ops that
    share it too.  When the two do not teach one (a uid equal to a constant merged two
    template parameters, an argument made per op), the second becomes the first of the next
    try.  A recipe is (_RECIPE, row with constants in place, fills, ops, fallbacks, integer
    constants, fixed, free, its first teacher)."""
    (r1, op1, u1, nf1), (r2, op2, u2, nf2) = first, second
    if nf1 != nf2:
        return (_FIRST, second)
    fixed = tuple((p, u1[p]) for p in range(len(u1)) if u1[p] == u2[p])
    free = tuple(p for p in range(len(u1)) if u1[p] != u2[p])
    if r1 is None or r2 is None:
        if r1 is r2:
            return (_RECIPE, None, (), (), nf1, frozenset(), fixed, free, first)
        return (_FIRST, second)
    if len(r1) != len(r2) or r1[0] != r2[0]:
        return (_FIRST, second)
    row = list(r1)
    fills: list[tuple[int, int]] = []
    ops: list[int] = []
    const_ints = set()
    for r in range(1, len(r1)):
        x, y = r1[r], r2[r]
        if type(x) is int and type(y) is int:
            p = next((p for p in free if u1[p] == x and u2[p] == y), None)
            if p is not None:
                fills.append((r, p))
                continue
            if x == y:
                const_ints.add(x)
                continue
            return (_FIRST, second)
        if x is op1 and y is op2:
            ops.append(r)
        elif x is not y:
            return (_FIRST, second)
    return (_RECIPE, row, tuple(fills), tuple(ops), nf1, frozenset(const_ints), fixed, free, first)


def _generalize(recipe: tuple, seen: tuple) -> tuple:
    """``recipe`` after an op of its key that it did not predict (``seen``): the recipe that
    op and the recipe's first teacher give, when it fixes no temporary ``recipe`` leaves
    free (it holds wherever ``recipe`` did, and for ``seen``); else ``recipe`` unchanged."""
    other = _learn(recipe[8], seen)
    if other[0] is not _RECIPE:
        return recipe
    was = {p for p, _ in recipe[6]}
    if all(p in was for p, _ in other[6]):
        return other
    return recipe
