"""Structural keys of ops: what the plans and code generation read about an op, as a number.

An unrolled kernel repeats a few kinds of op on fresh tiles.  ``op_shape(op)`` names an op's
structure -- primitive, mask, attributes, and per access its tensor, shape and index -- with
the kernel's *temporaries* (on-chip tiles, by uid elsewhere) replaced by their order of first
appearance in the op and their static class (shape, dtype, buffer, ...), and numbers it:
two ops with one number differ only in which temporaries they touch.  Every decision a plan
or the code generator makes from an op's structure alone can then be remembered per number
(and the temporaries' own plan flags), and is computed once per kind of op instead of once
per op.  Each op's key is built once: accesses' indices are numbered by ``index_no``, so no
IR dataclass is hashed twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir.core import Access, Op, Tensor
from .access import Accesses

_PLAIN = (str, int, float, bool, type(None), np.generic)
_SEP = object()  # between an op's outputs and inputs
_UNSEEN = object()  # an op op_shape has not keyed yet (None is a key's "unkeyable")


class Unkeyable(Exception):
    """An op holds a value a key cannot compare safely: every decision about it is made
    afresh."""


def frozen(v: Any) -> Any:
    """A hashable stand-in for an attribute value that tells apart every two values whose
    generated code may differ (type and repr for scalars: 1 vs 1.0 vs True, 0.0 vs -0.0)."""
    if isinstance(v, _PLAIN):
        return (type(v), repr(v))
    if isinstance(v, tuple | list):
        return (type(v), tuple(frozen(x) for x in v))
    if isinstance(v, np.dtype):
        return ("dtype", v, v.metadata is None)
    if isinstance(v, np.ndarray | dict | set):
        raise Unkeyable
    hash(v)  # functions, enums: compared by identity or their own equality
    return (type(v), v)


class OpShapes(Accesses):
    """``op_shape`` and the temporaries' static classes, over :class:`Accesses`."""

    def __init__(self, kernel: Any) -> None:
        super().__init__(kernel)
        self._op_shapes: dict[int, tuple[int, list[int], bool] | None] = {}  # id(op) -> op_shape
        self._shape_nos: dict[tuple, int] = {}  # an op's structure -> its number
        self._static: dict[int, int] = {}  # uid of a temporary -> its static class number
        self._static_nos: dict[tuple, int] = {}

    def static_class(self, t: Tensor) -> int:
        """The number of what a temporary's code depends on before any plan: shape, dtype
        (and whether it carries metadata: ml_dtypes), buffer, partition axis, mutability."""
        c = self._static.get(t.uid)
        if c is None:
            nos = self._static_nos
            c = self._static[t.uid] = nos.setdefault(
                (t.shape, t.dtype, t.dtype.metadata is None, t.buffer, t.par_axis, t.mutable),
                len(nos),
            )
        return c

    def tensor_part(self, t: Tensor, uids: list[int]) -> Any:
        """A temporary: (its position in ``uids``, appended when new; its static class);
        any other tensor: its uid."""
        if t.kind != "temp" or t.base is not None:
            return t.uid
        u = t.uid
        for p in range(len(uids)):
            if uids[p] == u:
                return (p, self.static_class(t))
        uids.append(u)
        return (len(uids) - 1, self.static_class(t))

    def access_part(self, a: Access, uids: list[int]) -> tuple:
        """An access: its tensor's part, its shape, its index's number and its runtime index
        tile's part."""
        t = self.tensor_part(a.tensor, uids)
        ind = a.indirect
        if ind is None:
            return (t, a.shape, self.index_no(a))
        return (t, a.shape, self.index_no(a), self.access_part(ind, uids), a.indirect_dim)

    def op_shape(self, op: Op) -> tuple[int, list[int], bool] | None:
        """(the number of ``op``'s structure, the uids of its temporaries in order of first
        appearance, whether it touches no view), or None when ``op`` holds a value no key
        compares (an array attribute); the list is shared: copy it before extending it.
        A view is named by uid, so whose view it is does not show in keys."""
        i = id(op)
        # .get with a marker, not try/except KeyError: the first call per op would raise
        hit = self._op_shapes.get(i, _UNSEEN)
        if hit is not _UNSEEN:
            return hit
        uids: list[int] = []
        parts: list[Any] = [op.prim, op.mask]
        plain = True  # no view among the op's tensors
        static, index_of = self._static, self._index_of
        try:
            # access_part, inlined: this runs once per op of the kernel
            for x in (*op.outs, _SEP, *op.ins):
                if type(x) is not Access:
                    parts.append(None if x is _SEP else frozen(x))  # None: outputs | inputs
                    continue
                t = x.tensor
                u = t.uid
                if t.base is not None:
                    plain = False
                    tp: Any = u
                elif t.kind != "temp":
                    tp = u
                else:
                    c = static.get(u)
                    if c is None:
                        c = self.static_class(t)
                    if u in uids:
                        tp = (uids.index(u), c)
                    else:
                        tp = (len(uids), c)
                        uids.append(u)
                if x.indirect is not None:
                    plain = False  # (its index tile may be a view)
                    parts.append(self.access_part(x, uids))
                    continue
                hit = index_of.get(id(x.index))
                parts.append((tp, x.shape, hit[1] if hit is not None else self.index_no(x)))
            for k, v in op.attrs.items():
                t = type(v)
                # (type, value) tells 1, 1.0 and True apart; floats (-0.0) go by repr
                parts.append(
                    (k, t, v) if t is str or t is int or t is bool or v is None else (k, frozen(v))
                )
            key = tuple(parts)
            nos = self._shape_nos
            hit = (nos.setdefault(key, len(nos)), uids, plain)
        except (Unkeyable, TypeError):  # TypeError: an unhashable value
            hit = None
        self._op_shapes[i] = hit
        return hit
