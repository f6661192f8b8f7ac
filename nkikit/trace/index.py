"""User-facing index values (``nl.arange``, ``nl.mgrid``, loop variables, program ids) and the
translation of a Python index tuple into an IR ``Access``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import NkiError, caller_loc
from ..ir.affine import Affine, Axis, LoopVar, NonAffineError, Predicate, ProgramId, Sym
from ..ir.core import Access
from .builder import maybe_current
from .loops import split_value


def _broadcast_sizes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a:
        return b
    if not b:
        return a
    if len(a) != len(b):
        raise NkiError("err_1d_arange_not_supported", caller_loc())
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="index",
                why=f"index shapes {a} and {b} differ",
            )
        out.append(y if x == 1 else x)
    return tuple(out)


class Index:
    """An affine index value: an arange (with axis positions), a loop variable, a program id
    or arithmetic on them.  ``sizes`` is its broadcast shape (``()`` for a scalar)."""

    __slots__ = ("affine", "sizes")
    __array_priority__ = 1000  # numpy scalars defer to our operators

    def __init__(self, affine: Affine, sizes: tuple[int, ...] = ()) -> None:
        self.affine = affine
        self.sizes = sizes

    # -- arithmetic ---------------------------------------------------------------------
    def _binary(self, other: object, fn) -> Index:
        if isinstance(other, Index):
            sizes = _broadcast_sizes(self.sizes, other.sizes)
            return Index(fn(self.affine, other.affine), sizes)
        if isinstance(other, int | np.integer) and not isinstance(other, bool):
            return Index(fn(self.affine, Affine.of(int(other))), self.sizes)
        return NotImplemented

    def __add__(self, o):
        return self._binary(o, lambda a, b: a + b)

    def __radd__(self, o):
        return self._binary(o, lambda a, b: b + a)

    def __sub__(self, o):
        return self._binary(o, lambda a, b: a - b)

    def __rsub__(self, o):
        return self._binary(o, lambda a, b: b - a)

    def __mul__(self, o):
        try:
            return self._binary(o, lambda a, b: a * b)
        except NonAffineError:
            raise NkiError(
                "err_non_affine_index", caller_loc(), expr=f"{_paren(self)} * {_paren(o)}"
            ) from None

    __rmul__ = __mul__

    def __neg__(self):
        return Index(-self.affine, self.sizes)

    def __pos__(self):
        return self

    def __floordiv__(self, o):
        return self._by_const(o, "//", Affine.floordiv)

    def __mod__(self, o):
        return self._by_const(o, "%", Affine.mod)

    def _by_const(self, o: object, op: str, fn) -> Index:
        """``self // o`` or ``self % o``: affine when every coefficient is a multiple of the
        constant ``o``; otherwise, when the symbols in the way are variables of rolled loops,
        those loops are split (``nkikit.trace.loops``)."""
        expr = f"{_paren(self)} {op} {_paren(o)}"
        if isinstance(o, Index):
            if not o.affine.is_const or o.sizes:
                raise NkiError("err_non_affine_index", caller_loc(), expr=expr)
            o = o.affine.const
        if not isinstance(o, int | np.integer) or isinstance(o, bool):
            return NotImplemented
        if o <= 0:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op=f"index {op}",
                why=f"{expr}: the divisor must be a positive int",
            )
        try:
            return Index(fn(self.affine, int(o)), self.sizes)
        except NonAffineError:
            loc = caller_loc()
            got = split_value(maybe_current(), self.affine, int(o), fn, loc, expr)
            if got is not None:
                return Index(got, self.sizes)
            raise NkiError("err_non_affine_index", loc, expr=expr) from None

    # -- comparisons build predicates (masks) ----------------------------------------------
    def _cmp(self, other: object, op: str) -> Pred:
        o = (
            other
            if isinstance(other, Index)
            else Index(Affine.of(int_arg(other, "mask", "a bound")))
        )
        sizes = _broadcast_sizes(self.sizes, o.sizes)
        return Pred(Predicate(((self.affine - o.affine, op),)), sizes)

    def __lt__(self, o):
        return self._cmp(o, "<")

    def __le__(self, o):
        return self._cmp(o, "<=")

    def __gt__(self, o):
        return self._cmp(o, ">")

    def __ge__(self, o):
        return self._cmp(o, ">=")

    def __eq__(self, o):  # type: ignore[override]
        if not isinstance(o, Index | int | np.integer):
            return NotImplemented
        return self._cmp(o, "==")

    def __ne__(self, o):  # type: ignore[override]
        if not isinstance(o, Index | int | np.integer):
            return NotImplemented
        return self._cmp(o, "!=")

    def __hash__(self) -> int:
        return hash((self.affine, self.sizes))

    # -- things that cannot be known while tracing ----------------------------------------
    def __bool__(self) -> bool:
        raise _control_flow_error(self.affine.syms, repr(self))

    def __index__(self) -> int:
        if self.affine.is_const and not self.sizes:
            return self.affine.const
        raise _control_flow_error(self.affine.syms, repr(self))

    __int__ = __index__

    # -- arange axis placement: nl.arange(n)[:, None] ----------------------------------------
    def __getitem__(self, key) -> Index:
        if not isinstance(key, tuple):
            key = (key,)
        mapping: dict[Sym, Affine] = {}
        sizes: list[int] = []
        old = 0
        for item in key:
            if item is None:
                sizes.append(1)
            elif isinstance(item, slice) and item == slice(None):
                if old >= len(self.sizes):
                    raise _placement_error(self, key)
                mapping[Axis(old)] = Affine.of(Axis(len(sizes)))
                sizes.append(self.sizes[old])
                old += 1
            else:
                raise NkiError(
                    "err_invalid_argument",
                    caller_loc(),
                    op="arange indexing",
                    why="only ':' and None may index an arange, e.g. nl.arange(n)[:, None]",
                )
        if old != len(self.sizes):
            raise _placement_error(self, key)
        return Index(self.affine.substitute(mapping), tuple(sizes))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.sizes

    def __repr__(self) -> str:
        return repr(self.affine)


class Pred:
    """A mask / predicate under construction (comparisons of Index values joined by ``&``)."""

    __slots__ = ("predicate", "sizes")

    def __init__(self, predicate: Predicate, sizes: tuple[int, ...]) -> None:
        self.predicate = predicate
        self.sizes = sizes

    def __and__(self, other: Pred) -> Pred:
        if not isinstance(other, Pred):
            return NotImplemented
        return Pred(self.predicate & other.predicate, _broadcast_sizes(self.sizes, other.sizes))

    def __bool__(self) -> bool:
        raise _control_flow_error(self.predicate.syms, repr(self.predicate))

    def __or__(self, other):
        raise NkiError("err_unsupported_expression_in_mask", caller_loc(), got="'|' (use '&' only)")

    def __repr__(self) -> str:
        return repr(self.predicate)


def _paren(x: object) -> str:
    """``x`` as an operand of ``*``, ``//`` or ``%`` in a message: a sum in parentheses."""
    if isinstance(x, Index):
        a = x.affine
        return f"({a!r})" if len(a.terms) + (a.const != 0) > 1 else repr(a)
    return repr(x) if isinstance(x, Pred) else str(x)


def _placement_error(index: Index, key: tuple) -> NkiError:
    """``nl.arange(n)[key]`` with a ':' count other than the arange's number of axes."""
    return NkiError(
        "err_invalid_argument",
        caller_loc(),
        op="arange indexing",
        why=f"an index of {len(index.sizes)} axes needs exactly {len(index.sizes)} ':' "
        f"(and any number of None) to place its axes, got {len(key)} items",
    )


def _control_flow_error(syms, expr: str) -> NkiError:
    if any(isinstance(s, Axis) for s in syms):
        return NkiError("err_control_flow_condition_depending_on_arange", caller_loc(), expr=expr)
    return NkiError("err_dynamic_control_flow_not_supported", caller_loc(), expr=expr)


def int_arg(x: object, api: str, arg: str) -> int:
    """``x`` as a Python int: an int, a numpy integer or a constant index; anything else
    (a float, a string, a tile, a loop variable) is ``err_invalid_argument`` naming ``arg``."""
    if isinstance(x, int | np.integer) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, Index) and not x.sizes and x.affine.is_const:
        return x.affine.const
    raise NkiError(
        "err_invalid_argument",
        caller_loc(),
        op=api,
        why=f"{arg} must be a Python int known while tracing, got {type(x).__name__} {x!r}",
    )


def _range(start: int, stop: int, step: int, api: str) -> range:
    """``range(start, stop, step)`` with a nonzero step.  It may be empty: an empty arange
    can be made (a kernel may build one it never uses) but not index anything."""
    if step == 0:
        raise NkiError("err_invalid_argument", caller_loc(), op=api, why="step must not be 0")
    return range(start, stop, step)


def arange(start: int, stop: int | None = None, step: int = 1) -> Index:
    """``nl.arange``: a 1-D index; place it with ``[:, None]`` (partition) or ``[None, :]``.
    Its arguments are ints.  An empty arange may be made, but indexing with it is
    ``err_invalid_argument`` (a tile has no zero-sized dimension)."""
    start = int_arg(start, "nl.arange", "start")
    if stop is None:
        start, stop = 0, start
    else:
        stop = int_arg(stop, "nl.arange", "stop")
    step = int_arg(step, "nl.arange", "step")
    n = len(_range(start, stop, step, "nl.arange"))
    return Index(Affine.of(Axis(0)) * step + start, (n,))


class MgridResult(tuple):
    """``nl.mgrid[...]``: a tuple of indices with ``.p`` (partition) and ``.x, .y, .z`` (free)."""

    @property
    def p(self) -> Index:
        return self[0]

    @property
    def x(self) -> Index:
        return self[1]

    @property
    def y(self) -> Index:
        return self[2]

    @property
    def z(self) -> Index:
        return self[3]


class _Mgrid:
    def __getitem__(self, key) -> MgridResult:
        if not isinstance(key, tuple):
            key = (key,)
        ranges = []
        for s in key:
            if not isinstance(s, slice) or s.stop is None:
                raise NkiError(
                    "err_invalid_argument",
                    caller_loc(),
                    op="nl.mgrid",
                    why=f"nl.mgrid takes slices with a stop, e.g. nl.mgrid[0:128, 0:512]; "
                    f"got {s!r}",
                )
            start = 0 if s.start is None else int_arg(s.start, "nl.mgrid", "a slice start")
            step = 1 if s.step is None else int_arg(s.step, "nl.mgrid", "a slice step")
            stop = int_arg(s.stop, "nl.mgrid", "a slice stop")
            ranges.append(_range(start, stop, step, "nl.mgrid"))
        sizes = tuple(len(r) for r in ranges)
        return MgridResult(
            Index(
                Affine.of(Axis(k)) * r.step + r.start,
                tuple(1 if j != k else sizes[k] for j in range(len(sizes))),
            )
            for k, r in enumerate(ranges)
        )


mgrid = _Mgrid()


@dataclass(frozen=True)
class DynSlice:
    """``nl.ds(start, size)``: a slice whose start may be a loop variable."""

    start: object
    size: int


def ds(start: object, size: int) -> DynSlice:
    """``nl.ds(start, size)``: ``size`` elements from ``start`` (an int or a loop index
    expression); ``size`` is a positive int."""
    n = int_arg(size, "nl.ds", "size")
    if n <= 0:
        raise NkiError(
            "err_invalid_argument", caller_loc(), op="nl.ds", why=f"size must be positive, got {n}"
        )
    if not isinstance(start, Index):
        start = int_arg(start, "nl.ds", "start")
    return DynSlice(start, n)


class RuntimeIndex:
    """A tile of integers used inside an index tuple (``t[idx_tile, i_f]``): an indirect
    (runtime) index, one value per partition.  ``Tile.__getitem__`` wraps tile keys in it."""

    __slots__ = ("access",)

    def __init__(self, access: Access) -> None:
        self.access = access

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.access.shape


def loop_index(var: LoopVar) -> Index:
    return Index(Affine.of(var))


def program_index(axis: int) -> Index:
    return Index(Affine.of(ProgramId(axis)))


# --------------------------------------------------------------------------------------------
# index tuple -> Access


def _scalar_affine(x: object) -> Affine:
    if isinstance(x, Index):
        if x.sizes and any(s != 1 for s in x.sizes):
            raise NkiError("err_unsupported_mixing_basic_advanced_tensor_indexing", caller_loc())
        return x.affine
    if isinstance(x, int | np.integer) and not isinstance(x, bool):
        return Affine.of(int(x))
    raise NkiError(
        "err_invalid_argument", caller_loc(), op="indexing", why=f"cannot index with {x!r}"
    )


def index_access(base: Access, key: object) -> Access:
    """The access ``base[key]`` with numpy semantics (basic slicing or arange indexing)."""
    if not isinstance(key, tuple):
        key = (key,)
    ndim = len(base.shape)
    if any(k is Ellipsis for k in key):
        pos = next(i for i, k in enumerate(key) if k is Ellipsis)
        fill = ndim - (len(key) - 1 - sum(1 for k in key if k is None))
        key = key[:pos] + (slice(None),) * fill + key[pos + 1 :]
    n_real = sum(1 for k in key if k is not None)
    if n_real > ndim:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="indexing",
            why=f"{n_real} indices for a tensor of {ndim} dimensions",
        )
    for k in key:
        if isinstance(k, Index) and 0 in k.sizes:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="indexing",
                why=f"an index of shape {list(k.sizes)} selects no elements (an empty "
                "nl.arange); a tile needs at least one element along every axis",
            )
    advanced = any((isinstance(k, Index) and k.sizes) or isinstance(k, RuntimeIndex) for k in key)
    if advanced:
        return _advanced(base, key)
    return _basic(base, key)


def _advanced(base: Access, key: tuple) -> Access:
    if any(isinstance(k, slice | DynSlice) for k in key) or any(k is None for k in key):
        raise NkiError("err_unsupported_mixing_basic_advanced_tensor_indexing", caller_loc())
    if len(key) != len(base.shape):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="indexing",
            why=f"arange indexing needs one index per dimension ({len(base.shape)}), got {len(key)}",
        )
    runtime = [d for d, k in enumerate(key) if isinstance(k, RuntimeIndex)]
    # a runtime index tile's axes line up with the aranges' from the left: (P, 1) is P on the
    # partition axis, padded with unit axes to the rank of the aranges
    rank = max((len(k.sizes) for k in key if isinstance(k, Index) and k.sizes), default=0)
    sizes: tuple[int, ...] = ()
    for k in key:
        if isinstance(k, Index) and k.sizes:
            if len(k.sizes) == 1 and len(key) > 1:
                raise NkiError("err_1d_arange_not_supported", caller_loc())
            sizes = _broadcast_sizes(sizes, k.sizes)
        elif isinstance(k, RuntimeIndex):
            ks = k.sizes
            sizes = _broadcast_sizes(sizes, ks + (1,) * (rank - len(ks)))
    new = [
        Affine()
        if isinstance(k, RuntimeIndex)
        else k.affine
        if isinstance(k, Index)
        else _scalar_affine(k)
        for k in key
    ]
    if not runtime:
        return _compose(base, new, sizes)
    return _indirect(base, key, runtime, new, sizes)


def _indirect(
    base: Access, key: tuple, runtime: list[int], new: list[Affine], sizes: tuple[int, ...]
) -> Access:
    """``base[key]`` where ``key[runtime[0]]`` is an index tile: the tensor dimension that key
    position walks takes the tile's values at run time (an indirect DMA access)."""
    loc = caller_loc()
    name = base.tensor.name
    if len(runtime) > 1:
        raise NkiError(
            "err_indirect_indices_free_dim",
            loc,
            tensor=name,
            why=f"index tiles on dimensions {runtime}; only one dimension can be indexed "
            "at run time, and a second one would be a free dimension",
        )
    if base.indirect is not None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="indexing",
            why=f"{name} is already indexed by an index tile; index it once, with one tile",
        )
    d = runtime[0]
    # the tensor dimension key position d walks (base may be a view: t[b][idx, i_f])
    dims = [(n, x.coef(Axis(d))) for n, x in enumerate(base.index) if x.coef(Axis(d)) != 0]
    if len(dims) != 1 or dims[0][1] != 1:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="indexing",
            why=f"an index tile must index one dimension of {name} with stride 1",
        )
    tile = key[d].access
    if tile.indirect is not None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="indexing",
            why="an index tile must be a tile in SBUF, not an indirectly indexed tensor",
        )
    padded = tile.shape + (1,) * (len(sizes) - len(tile.shape))
    # unit axes of the index tile broadcast: they read its element 0
    bcast = {Axis(k): Affine() for k, n in enumerate(padded) if n == 1}
    ind = Access(tile.tensor, padded, tuple(a.substitute(bcast) for a in tile.index))
    acc = _compose(base, new, sizes)
    # remap with no change: sets the index tile's extents along this access's tile axes
    return Access(acc.tensor, acc.shape, acc.index, ind, dims[0][0]).remap(acc.shape, {})


def _out_of_bound(base: Access, dim: int, index: int) -> NkiError:
    extent = base.shape[dim]
    return NkiError(
        "err_tensor_access_out_of_bound",
        caller_loc(),
        tensor=base.tensor.name,
        dim=dim,
        index=f"{index} (valid indices are 0 to {extent - 1}, or -{extent} to -1)",
        size=extent,
    )


def _bound(x: object, what: str) -> int | Index | None:
    """A slice bound as the user wrote it: None, an int, or a loop index expression."""
    if x is None or isinstance(x, Index):
        return x
    return int_arg(x, "slicing", f"a slice {what}")


def _const_slice(base: Access, dim: int, start, stop, step: int) -> tuple[int, int]:
    """``(first index, element count)`` of the constant slice ``start:stop:step`` of
    dimension ``dim``: negative bounds count from the end (as in numpy), but a bound outside
    the dimension is ``err_tensor_access_out_of_bound`` and an empty slice
    ``err_invalid_argument`` -- never clamped, as numpy would, into another shape
    [nki.md §1.5: out-of-bounds is a compile-time error for static indices]."""
    extent = base.shape[dim]
    lo = 0 if start is None else start
    hi = extent if stop is None else stop
    lo_n = lo + extent if lo < 0 else lo
    hi_n = hi + extent if hi < 0 else hi
    if not 0 <= lo_n < extent:
        raise _out_of_bound(base, dim, lo)
    if not 0 <= hi_n <= extent:
        raise _out_of_bound(base, dim, hi - 1 if hi > 0 else hi)
    size = len(range(lo_n, hi_n, step))
    if size == 0:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="slicing",
            why=f"the slice {lo}:{hi} of dimension {dim} (size {extent}) selects no elements",
        )
    return lo_n, size


def _basic(base: Access, key: tuple) -> Access:
    new: list[Affine] = []
    sizes: list[int] = []
    dim = 0
    for k in key:
        if k is None:
            sizes.append(1)
            continue
        extent = base.shape[dim]
        if isinstance(k, slice):
            start, stop = _bound(k.start, "start"), _bound(k.stop, "stop")
            step = 1 if k.step is None else int_arg(k.step, "slicing", "a slice step")
            if step <= 0:
                raise NkiError(
                    "err_invalid_argument",
                    caller_loc(),
                    op="slicing",
                    why="slice step must be positive",
                )
            if isinstance(start, Index) or isinstance(stop, Index):
                a0 = _scalar_affine(start if start is not None else 0)
                a1 = _scalar_affine(stop if stop is not None else extent)
                span = a1 - a0
                if not span.is_const:
                    raise NkiError(
                        "err_invalid_argument",
                        caller_loc(),
                        op="slicing",
                        why=f"slice size {span} must not depend on a loop variable",
                    )
                size = len(range(0, span.const, step))
                if size == 0:
                    raise NkiError(
                        "err_invalid_argument",
                        caller_loc(),
                        op="slicing",
                        why=f"the slice {a0}:{a1} of dimension {dim} selects no elements",
                    )
                # a start that depends on a loop index is bounded by the verifier
            else:
                first, size = _const_slice(base, dim, start, stop, step)
                a0 = Affine.of(first)
            new.append(a0 + Affine.of(Axis(len(sizes))) * step)
            sizes.append(size)
        elif isinstance(k, DynSlice):
            new.append(_scalar_affine(k.start) + Axis(len(sizes)))
            sizes.append(k.size)
        else:
            a = _scalar_affine(k)
            if a.is_const:
                if not -extent <= a.const < extent:
                    raise _out_of_bound(base, dim, a.const)
                if a.const < 0:
                    a = Affine.of(a.const + extent)
            new.append(a)
        dim += 1
    while dim < len(base.shape):
        new.append(Affine.of(Axis(len(sizes))))
        sizes.append(base.shape[dim])
        dim += 1
    return _compose(base, new, tuple(sizes))


def _compose(base: Access, new: list[Affine], sizes: tuple[int, ...]) -> Access:
    mapping = {Axis(d): a for d, a in enumerate(new)}
    return base.remap(tuple(sizes), mapping)
