"""How generated code reaches memory: accesses, bounds, masks and predicates.

:class:`Accesses` knows the kernel's symbols (loop variables and program ids, with their
ranges) and tensors.  Affine indices have known ranges, so it decides at compile time what
the reference decides per executed instruction: an access that provably stays in bounds
becomes a plain numpy slice with no check, one that may not gets a runtime condition (when
it fails, the reference runs the op and reports the error), and a mask clause that provably
holds is dropped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ... import dtypes
from ...ir.affine import Affine, Axis, ProgramId, Sym, axis_env
from ...ir.core import Access, Alloc, Kernel, Loop, Op, Tensor
from ...ir.prims import mask_ref, reads_dst
from ..interp import injective


def _cmp_always(lo: int, hi: int, op: str) -> bool:
    """Does ``x <op> 0`` hold for every integer x in [lo, hi]?"""
    if op == ">=":
        return lo >= 0
    if op == ">":
        return lo > 0
    if op == "<=":
        return hi <= 0
    if op == "<":
        return hi < 0
    if op == "==":
        return lo == hi == 0
    if op == "!=":
        return lo > 0 or hi < 0
    return False


def _contiguous(tshape: tuple[int, ...], acc: Access, dims: list) -> bool:
    """Is the basic view of ``acc`` C-contiguous (as numpy flags it)?"""
    strides = [math.prod(tshape[d + 1 :]) for d in range(len(tshape))]
    kept = [(acc.shape[ax[0]], strides[d] * ax[1]) for d, ax in enumerate(dims) if ax is not None]
    expect = 1
    for n, stride in reversed(kept):
        if n > 1 and stride != expect:
            return False
        expect *= n
    return True


class AccessCode:
    """How generated code reaches an access: ``expr`` is a numpy expression for its value
    (read) or its destination view (write)."""

    __slots__ = ("expr", "layout_exact", "wide", "region")

    def __init__(
        self, expr: str, layout_exact: bool, wide: str | None = None, region: str | None = None
    ) -> None:
        self.expr = expr
        # False when the expression has the reference's values but not its memory layout
        # (a transposed view where the reference fancy-indexes a fresh array)
        self.layout_exact = layout_exact
        # the same read from the tensor's fp32 shadow (see Planner.plan_shadows), when the
        # view is C-contiguous like the reference's widened copy
        self.wide = wide
        # "[...]" of the tensor elements a basic write touches
        self.region = region


class Accesses:
    """The kernel's symbols and tensors, the generated program's constants, and the code of
    each access.  ``conds`` collects the runtime conditions of the op being generated."""

    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.ns: dict[str, Any] = {}  # the generated program's globals
        self.names: dict[Sym, str] = {}
        self.ranges: dict[Sym, int] = {}
        self.n_const = 0
        self.const_names: dict[tuple, str] = {}
        self.conds: list[str] = []
        self.shadow: set[int] = set()
        self._access_memo: dict[tuple, tuple[AccessCode | None, list[str]]] = {}
        # the code of an access to any tensor of a shape, its uid left as "\0": unrolled
        # kernels make the same accesses to thousands of fresh tiles
        self._shape_memo: dict[tuple, tuple[AccessCode | None, list[str]]] = {}
        self._indices: dict[tuple, int] = {}  # an access's index -> its number
        self._index_of: dict[int, tuple] = {}  # id(index tuple) -> (it, its number)
        grid = kernel.grid or (1,)
        for i, g in enumerate(grid):
            self.names[ProgramId(i)] = f"p{i}"
            self.ranges[ProgramId(i)] = g
        self.tensors: dict[int, Tensor] = {}
        for t in kernel.params + kernel.tensors:
            self.tensors[t.uid] = t
        self.n_statements = 0
        # root uid -> the ops that read / write it, in program order, an op once per access
        # (and once more per output for an op that reads its destination)
        self.reads: dict[int, list[Op]] = {}
        self.writes: dict[int, list[Op]] = {}
        self._index(kernel.body)

    def _index(self, body: list) -> None:
        """One pass over ``body`` and its loops: statements, symbols, tensors and the read
        and write index (unrolled kernels have a statement per instruction: one walk)."""
        tensors, reads, writes = self.tensors, self.reads, self.writes
        self.n_statements += len(body)
        for s in body:
            ts = type(s)
            if ts is Op:
                rd = None
                for a in s.outs:
                    t = r = a.tensor
                    if t.uid not in tensors:
                        tensors[t.uid] = t
                    while r.base is not None:
                        r = r.base
                        if r.uid not in tensors:
                            tensors[r.uid] = r
                    ws = writes.get(r.uid)
                    if ws is None:
                        writes[r.uid] = [s]
                    else:
                        ws.append(s)
                    if rd is None:
                        rd = reads_dst(s)
                    if rd:
                        reads.setdefault(r.uid, []).append(s)
                for a in s.ins:
                    if type(a) is not Access:
                        continue
                    t = r = a.tensor
                    if t.uid not in tensors:
                        tensors[t.uid] = t
                    while r.base is not None:
                        r = r.base
                        if r.uid not in tensors:
                            tensors[r.uid] = r
                    rs = reads.get(r.uid)
                    if rs is None:
                        reads[r.uid] = [s]
                    else:
                        rs.append(s)
            elif ts is Alloc:
                if s.tensor.uid not in tensors:
                    tensors[s.tensor.uid] = s.tensor
            elif ts is Loop:
                self.names[s.var] = f"v{len(self.names)}"
                self.ranges[s.var] = s.trip
                self._index(s.body)

    # -- small helpers ------------------------------------------------------------------------
    def const(self, value: Any, prefix: str = "C") -> str:
        """The name of ``value`` in the generated program's globals."""
        # dtypes and scalars get one name each (an unrolled kernel asks for the same few
        # hundreds of thousands of times); anything else may be mutable: a name per use
        key = None
        if isinstance(value, np.dtype):
            key = (prefix, "dtype", value, value.metadata is None)
        elif isinstance(value, np.generic | float | int | bool):
            key = (prefix, type(value), repr(value))
        if key is not None:
            name = self.const_names.get(key)
            if name is not None:
                return name
        name = f"{prefix}{self.n_const}"
        self.n_const += 1
        self.ns[name] = value
        if key is not None:
            self.const_names[key] = name
        return name

    def slot(self, t: Tensor) -> str:
        return f"m{t.uid}"

    def aff(self, a: Affine, skip_axes: bool = True) -> str:
        parts = []
        for s, c in a.terms:
            if isinstance(s, Axis) and skip_axes:
                continue
            n = self.names[s]
            parts.append(n if c == 1 else f"{c}*{n}")
        if a.const or not parts:
            parts.append(str(a.const))
        return "+".join(parts).replace("+-", "-")

    def sym_range(self, a: Affine, axis_shape: tuple[int, ...] | None = None) -> tuple[int, int]:
        lo = hi = a.const
        for s, c in a.terms:
            if isinstance(s, Axis):
                if axis_shape is None:
                    continue
                n = axis_shape[s.k] if s.k < len(axis_shape) else 1
            else:
                n = self.ranges[s]
            top = c * (n - 1)
            lo += min(0, top)
            hi += max(0, top)
        return lo, hi

    # -- accesses -----------------------------------------------------------------------------
    def access(
        self, acc: Access, write: bool, raw_consumer: bool, dynamic: bool = True
    ) -> AccessCode | None:
        """Code for an access, or None when only the reference can do it.  Bounds that
        cannot be proved for every iteration become runtime conditions (appended to
        ``self.conds``; when one fails, the reference runs the op and reports the error),
        unless ``dynamic`` is False."""
        # each access is asked for several times (dead-code, forwarding and poison checks,
        # then the op's code): remembered until the shadows, which change reads, are planned
        # (a static access is the dynamic one when that needs no condition)
        key = (id(acc), write, raw_consumer or write)
        hit = self._access_memo.get(key)
        if hit is None:
            hit = self._access_memo[key] = self._access(acc, write, raw_consumer)
        if hit[1]:
            if not dynamic:
                return None
            self.conds.extend(hit[1])
        return hit[0]

    def _access(
        self, acc: Access, write: bool, raw_consumer: bool
    ) -> tuple[AccessCode | None, list[str]]:
        """``access``'s code and the conditions it adds."""
        hit = self.shape_access(acc, write, raw_consumer)
        code = hit[0]
        if code is None:
            return hit
        u = str(acc.tensor.uid)
        wide = code.wide
        return AccessCode(
            code.expr.replace("\0", u),
            code.layout_exact,
            None if wide is None else wide.replace("\0", u),
            code.region,
        ), hit[1]

    def shape_access(
        self, acc: Access, write: bool, raw_consumer: bool
    ) -> tuple[AccessCode | None, list[str]]:
        """``_access`` with the tensor's uid left as a NUL character: the same code for every
        access of its shape to every tensor of its shape (what the plans' checks read)."""
        if acc.indirect is not None:
            return None, []  # a gather/scatter: only the gather/scatter executor compiles those
        t = acc.tensor
        shadowed = t.uid in self.shadow
        key = (t.shape, shadowed, acc.shape, self.index_no(acc), write, raw_consumer)
        hit = self._shape_memo.get(key)
        if hit is None:
            hit = self._shape_memo[key] = self._access_code(acc, write, raw_consumer, shadowed)
        return hit

    def static_shape(self, acc: Access, write: bool) -> AccessCode | None:
        """``shape_access`` for a raw access that must be in bounds in every iteration:
        whether ``static_access`` compiles, and the layout of what it gives."""
        code, conds = self.shape_access(acc, write, True)
        return None if conds else code

    def index_no(self, acc: Access) -> int:
        """A number for ``acc.index`` (equal indices, equal numbers), remembered per index
        object: the tracer shares the index tuples of equal accesses, so an unrolled kernel's
        Affines are hashed a few times, not once per access (the IR keeps every index alive
        while the kernel compiles, so no id is reused)."""
        index = acc.index
        hit = self._index_of.get(id(index))
        if hit is None:
            indices = self._indices
            # the entry keeps the index alive: an access built while compiling may die
            hit = self._index_of[id(index)] = (index, indices.setdefault(index, len(indices)))
        return hit[1]

    def _access_code(
        self, acc: Access, write: bool, raw_consumer: bool, shadowed: bool
    ) -> tuple[AccessCode | None, list[str]]:
        """``_access`` with the tensor's uid written as a NUL character (the same code for
        every tensor of its shape); ``shadowed``: whether the tensor has an fp32 shadow."""
        t = acc.tensor
        tshape = t.shape
        names, ranges = self.names, self.ranges
        dims: list[tuple[int, int] | None] = []
        axes_seen: list[int] = []
        # per dimension: its tile axis, and the range and code of its loop-dependent part
        # (``sym_range`` and ``aff`` in one pass over the terms)
        spans: list[tuple[int, int, str]] = []
        for a in acc.index:
            ax = None
            lo = hi = a.const
            parts = []
            for s, c in a.terms:
                if isinstance(s, Axis):
                    if ax is not None or c <= 0:
                        # several tile axes in one dimension (an ``.ap`` pattern over a
                        # flattened free dimension), a reversed axis: no slice expresses it
                        return self._strided_code(acc, write, raw_consumer)
                    ax = (s.k, c)
                    continue
                top = c * (ranges[s] - 1)
                if top < 0:
                    lo += top
                else:
                    hi += top
                n = names[s]
                parts.append(n if c == 1 else f"{c}*{n}")
            if a.const or not parts:
                parts.append(str(a.const))
            if ax is not None:
                axes_seen.append(ax[0])
            dims.append(ax)
            spans.append((lo, hi, "+".join(parts).replace("+-", "-")))
        if len(set(axes_seen)) != len(axes_seen):
            return self._strided_code(acc, write, raw_consumer)
        shape = acc.shape
        idx = []
        conds: list[str] = []
        for d, (ax, (lo, hi, base)) in enumerate(zip(dims, spans)):
            if ax is None:
                if lo < 0 or hi >= tshape[d]:
                    conds.append(f"0 <= {base} < {tshape[d]}")
                idx.append(base)
            else:
                k, c = ax
                span = c * (shape[k] - 1)
                if lo < 0 or hi + span >= tshape[d]:
                    conds.append(f"0 <= {base} < {tshape[d] - span}")
                if base.isdigit():
                    b = int(base)
                    idx.append(f"{b}:{b + span + 1}" + (f":{c}" if c != 1 else ""))
                else:
                    idx.append(f"({base}):({base})+{span + 1}" + (f":{c}" if c != 1 else ""))
        if write and idx and not axes_seen:
            # every dimension indexed by a number: numpy would give a scalar, a copy, and the
            # write would be lost; a one-element slice of the last dimension keeps a view
            base = spans[-1][2]
            idx[-1] = f"{base}:{int(base) + 1}" if base.isdigit() else f"({base}):({base})+1"
        ix = ", ".join(idx) if idx else "()"
        if len(idx) == 1:
            ix += ","
        expr = f"m\0[{ix}]"  # self.slot(t), the uid filled in by _access
        bshape = tuple(s if k in axes_seen else 1 for k, s in enumerate(shape))
        bcast = bshape != tuple(shape)
        kept = tuple(shape[k] for k in axes_seen)
        basic = axes_seen == sorted(axes_seen)
        if write:
            if bcast:
                return None, conds
            if basic:
                if kept != bshape:
                    expr += f".reshape({shape!r})"
                return AccessCode(expr, True, region=f"[{ix}]"), conds
            perm = tuple(int(i) for i in np.argsort(axes_seen))
            return AccessCode(f"{expr}.transpose({perm!r})", False), conds
        if basic:
            wide = None
            if shadowed and not bcast and _contiguous(tshape, acc, dims):
                wide = f"s\0[{ix}]" + (f".reshape({bshape!r})" if kept != bshape else "")
            if kept != bshape:
                expr += f".reshape({bshape!r})"
            if bcast:
                expr = f"_bt({expr}, {shape!r})"
            return AccessCode(expr, True, wide=wide), conds
        # axes out of order: the reference fancy-indexes a fresh C-ordered array
        perm = tuple(int(i) for i in np.argsort(axes_seen))
        expr = f"{expr}.transpose({perm!r})"
        if tuple(sorted(axes_seen)) and bshape != tuple(shape[k] for k in sorted(axes_seen)):
            expr += f".reshape({bshape!r})"
        if bcast:
            expr = f"_bt({expr}, {shape!r})"
        if raw_consumer:
            return AccessCode(expr, False), conds
        return AccessCode(f"np.ascontiguousarray({expr})", True), conds

    def _strided_code(
        self, acc: Access, write: bool, raw_consumer: bool
    ) -> tuple[AccessCode | None, list[str]]:
        """``_access_code`` for an access no slice expresses: one strided view of the
        tensor's memory from the tile's first element, as the reference's ``_strided``
        builds it (a read copies it C-ordered, as the reference does; a write needs distinct
        elements, else only the reference's index arrays write it)."""
        shape = acc.shape
        strided = tuple(
            tuple((s.k, c) for s, c in a.terms if isinstance(s, Axis)) for a in acc.index
        )
        if any(k >= len(shape) for axes in strided for k, _ in axes):
            return None, []
        if write and not injective(strided, shape):
            return None, []
        tshape = acc.tensor.shape
        conds: list[str] = []
        firsts: list[str] = []
        spec: list[tuple[int, int, int]] = []  # (tile axis, tensor dimension, step)
        for d, (a, axes) in enumerate(zip(acc.index, strided)):
            spec.extend((k, d, c) for k, c in axes)
            base = self.aff(a)  # the tile's first element, per iteration
            lo, hi = self.sym_range(a, shape)  # every element, over every iteration
            if lo < 0 or hi >= tshape[d]:
                # how far the tile reaches below and above its first element
                base_lo, base_hi = self.sym_range(a)
                conds.append(f"{base_lo - lo} <= {base} < {tshape[d] - (hi - base_hi)}")
            firsts.append(f"{base}:" if base.isdigit() else f"({base}):")
        expr = f"_sv(m\0[{', '.join(firsts)}], {self.const(tuple(spec), 'SV')}, {shape!r})"
        if write or raw_consumer:
            return AccessCode(expr, False), conds
        return AccessCode(f"np.ascontiguousarray({expr})", True), conds

    def static_access(self, acc: Access, write: bool) -> AccessCode | None:
        """``access`` when the access must be in bounds in every iteration (no runtime
        condition); ``conds`` is left as it was."""
        saved = self.conds
        self.conds = []
        try:
            return self.access(acc, write, True, dynamic=False)
        finally:
            self.conds = saved

    def f32(self, x: Access, r: AccessCode) -> str:
        """Code for the reference's ``to_f32(read(x))``."""
        if dtypes.storage_dtype(x.tensor.dtype) == np.float32:
            return r.expr
        if r.wide is not None:
            return r.wide
        return f"_f32({r.expr})"

    # -- masks --------------------------------------------------------------------------------
    def mask_plan(self, op: Op) -> tuple[str, str | None] | None:
        """("none" | "static" | "dynamic", runtime all-true condition) or None when the
        reference's mask handling must run every time."""
        if op.mask is None:
            return ("none", None)
        ref = mask_ref(op)
        if ref is None:
            return None
        shape = ref.shape
        conds = []
        for a, cmp in op.mask.clauses:
            for s in a.syms:
                if isinstance(s, Axis) and s.k >= len(shape):
                    return None  # the reference raises err_unsupported_expression_in_mask
            lo, hi = self.sym_range(a, shape)
            if _cmp_always(lo, hi, cmp):
                continue
            # per iteration: the clause over the tile's axes spans [base + alo, base + ahi]
            alo, ahi = self.sym_range(
                Affine(tuple((s, c) for s, c in a.terms if isinstance(s, Axis)), 0), shape
            )
            base = self.aff(
                Affine(tuple((s, c) for s, c in a.terms if not isinstance(s, Axis)), a.const)
            )
            if cmp == ">=":
                conds.append(f"({base}){alo:+d} >= 0")
            elif cmp == ">":
                conds.append(f"({base}){alo:+d} > 0")
            elif cmp == "<=":
                conds.append(f"({base}){ahi:+d} <= 0")
            elif cmp == "<":
                conds.append(f"({base}){ahi:+d} < 0")
            else:
                return None
        if not conds:
            return ("static", None)
        return ("dynamic", " and ".join(conds))

    def valid_const(self, op: Op) -> str:
        """An all-true mask array with the strides the reference's would have."""
        if op.mask is None:
            return "None"
        shape = mask_ref(op).shape
        env: dict[Sym, Any] = {s: 0 for s in self.ranges}
        env.update(axis_env(shape))
        evshape = np.asarray(op.mask.evaluate(env), dtype=bool).shape
        return self.const(np.broadcast_to(np.ones(evshape, dtype=bool), shape), "VALID")

    def predicate_code(self, pred, shape) -> str | None:
        """Code for the reference's ``np.broadcast_to(pred.evaluate(env + axes), shape)``:
        integer arithmetic on the same axis aranges, so the same booleans."""
        for a, _ in pred.clauses:
            for s in a.syms:
                if isinstance(s, Axis) and s.k >= len(shape):
                    return None
        parts = []
        env = axis_env(shape)
        for a, cmp in pred.clauses:
            base = self.aff(
                Affine(tuple((s, c) for s, c in a.terms if not isinstance(s, Axis)), a.const)
            )
            axis_terms = [(s, c) for s, c in a.terms if isinstance(s, Axis)]
            if not axis_terms:
                parts.append(f"(({base}) {cmp} 0)")
                continue
            # the axis part of the clause is a constant integer array: compare it with the
            # loop-dependent rest moved to the other side (exact integers, same booleans)
            grid = sum(env[s] * c for s, c in axis_terms)
            parts.append(f"({self.const(grid, 'AXS')} {cmp} -({base}))")
        return f"np.broadcast_to(np.asarray({' & '.join(parts)}, dtype=bool), {tuple(shape)!r})"
