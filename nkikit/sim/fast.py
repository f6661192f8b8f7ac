"""The fast simulator: the reference interpreter's semantics, compiled once per kernel.

``simulate(kernel, args)`` returns exactly (bit for bit, NaN for NaN) what
``nkikit.sim.interp.simulate`` returns, and raises the same errors, but does most of the work
once per specialized kernel instead of once per executed instruction:

* **One straight-line Python program per kernel.**  The IR is translated to Python source
  (loops stay ``for`` loops over ``range``) and compiled with ``compile()``.  Every access
  becomes an inline numpy slice whose start is an integer expression of the loop variables;
  nothing is looked up or re-derived while the kernel runs.
* **Bounds and masks are decided at compile time.**  Affine indices have known ranges, so an
  access that provably stays in bounds needs no check, and a mask clause that provably holds
  is dropped.  A mask that may cut a ragged tile is tested with one integer comparison per
  iteration; only when it really masks something does that instruction go to the reference
  interpreter, which shares this program's memory.
* **Buffers are allocated once per call and reused.**  Poisoning (NaN fill) is kept only
  where a read could observe it: a buffer whose first touch is a write of every element
  (proved by enumerating the writes' tiles) is not filled.
* **No per-instruction temporaries where numpy can write in place.**  Copies, memsets and
  elementwise ALU/activation instructions with an fp32 destination compute straight into
  the destination's memory (``out=``), which gives the same bits as computing and copying.

Everything else -- the order of rounding, which numpy call computes each value, the layout of
every array handed to BLAS or to a reduction -- is kept identical to the reference, because
bit-identical results depend on it (e.g. ``np.matmul`` takes another code path for a
non-BLAS-able layout, and a reduction's summation order follows the memory layout).
Instructions this module has no compiled form for run through the reference interpreter's
``exec_op``; that is always correct, only slower.

``explain(kernel)`` returns the generated source, for debugging and for the curious.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import dtypes
from ..ir.affine import Affine, Axis, ProgramId, Sym, axis_env
from ..ir.core import Access, Alloc, Kernel, Loop, Op, Tensor
from ..ir.prims import MASK_ON_INPUT as _MASK_ON_INPUT
from ..ir.prims import PrimError, names_where, reads_dst
from .interp import Interpreter, scatter
from .rules import RAW, RULES

__all__ = ["simulate", "explain", "compile_kernel"]

# Compiled programs, keyed by id(kernel); the kernel is kept alive by its entry so the id
# cannot be reused while cached.  Bounded, because property tests trace thousands of kernels.
_CACHE: OrderedDict[int, tuple[Kernel, _Program]] = OrderedDict()
_CACHE_SIZE = 256
_LOCK = threading.Lock()

# Largest buffer (elements) and number of loop iterations the coverage proof enumerates;
# beyond them the buffer is simply poisoned, as the reference does.
_COVER_MAX_ELEMS = 1 << 26
_COVER_MAX_ITERS = 1 << 16

# Kernels with more statements than this (unrolled code) are generated table-driven:
# CPython compiles a function in time that grows faster than its length, and unrolled code
# would be one line of source per instruction.  Instead each statement's code becomes a
# *template* (its tensors, constants and integers turned into parameters), equal templates
# are compiled once, and a body is a loop over a table of (template, arguments).  The
# per-tensor setup (arena views, forwarding buffers, shadows) is a loop over constant tables
# too.  Smaller kernels keep every tensor in a local of one straight-line function.
_TABLE_ABOVE = 2048
_TABLE_BODY = 256  # bodies with more statements than this are table-driven as well
# what a template turns into parameters: tensor slots (m5, b5, s5), namespace constants
# (DT3, OP12, ...) and integer literals (not digits of a name or of a float literal)
_TEMPLATE_TOKEN = re.compile(r"\b[mbs]\d+\b|\b[A-Z]+\d+\b|(?<![\w.])(?<![eE][-+])\d+(?![\w.])")

# prims whose executor needs more than the op's rule (env-dependent, stateful or printing)
_ALWAYS_REFERENCE = {"nc_stream_shuffle", "dropout", "device_print", "iota"}

# prims whose rule returns one array per output (so an unmasked op writes all of each)
_WRITES_ALL = names_where(lambda p: bool(p.outs) and not p.partial_write)

# reductions whose reference is one ufunc.reduce on fp32 input giving fp32
_REDUCE_FAST = {
    "add": np.add.reduce,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
    "multiply": np.multiply.reduce,
}

# ALU ops that are plain ufuncs (same function the reference's table calls), for ``out=``
_UFUNC_ALU = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
# activation functions that are one ufunc applied to the fp32 argument
_UFUNC_ACT = {
    "exp": np.exp,
    "tanh": np.tanh,
    "square": np.square,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "negative": np.negative,
    "sin": np.sin,
    "cos": np.cos,
    "log": np.log,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
}


def simulate(kernel: Kernel, args: list[np.ndarray], *, seed: int = 0) -> list[np.ndarray]:
    """Run ``kernel`` on ``args`` (numpy arrays in the kernel's parameter dtypes) and return
    the output arrays; same contract and results as ``nkikit.sim.interp.simulate``."""
    return compile_kernel(kernel).run(args, seed)


def compile_kernel(kernel: Kernel) -> _Program:
    """The compiled program for ``kernel`` (built on first use, then cached).  Programs are
    re-entrant (each run has its own memory), so threads may share them."""
    key = id(kernel)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is kernel:
            _CACHE.move_to_end(key)
            return hit[1]
    prog = _Compiler(kernel).build()
    with _LOCK:
        _CACHE[key] = (kernel, prog)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return prog


def explain(kernel: Kernel) -> str:
    """The Python source the fast path runs for ``kernel``."""
    return compile_kernel(kernel).source


# ---------------------------------------------------------------------------------------------
# runtime helpers (called from generated code)


def _f32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _prep(value: Any, shape: tuple[int, ...], size: int, dt: np.dtype) -> np.ndarray:
    """The value ``Interpreter.write`` stores: shaped like the access, rounded to ``dt``."""
    value = np.asarray(value)
    if value.shape != shape:
        if value.size != size:  # the reference's write raises too: a bug, not a broadcast
            raise PrimError(f"a rule produced {value.shape} for a {shape} destination")
        value = value.reshape(shape)
    value = dtypes.cast(value, dt)
    if dtypes.is_tf32(dt):
        value = value.astype(np.float32)
    return value


def _write(view: np.ndarray, value: Any, shape: tuple[int, ...], size: int, dt: np.dtype) -> None:
    """The reference's ``Interpreter.write`` for an unmasked, in-bounds, precomputed view."""
    view[...] = _prep(value, shape, size, dt)


def _ind(axes: tuple, bases: tuple, d: int, rt: np.ndarray, shape: tuple[int, ...]) -> tuple:
    """The reference's ``indirect_index`` without a mask or bounds checks: per dimension the
    tile-axis part (a constant int array) plus the loop-dependent part, and along dimension
    ``d`` the index tile's values ``rt``."""
    idx = []
    for k, (ax, b) in enumerate(zip(axes, bases)):
        v = np.broadcast_to(np.asarray(ax + b, dtype=np.int64), shape)
        if k == d:
            v = v + np.broadcast_to(rt.astype(np.int64), shape)
        idx.append(v)
    return tuple(idx)


def _copy(view: np.ndarray, value: np.ndarray, dt: np.dtype) -> None:
    """``_write`` for a value already of the destination's shape: same-dtype and plain
    float-to-float casts go straight into the destination (numpy's cast loop is the one
    ``astype`` uses, so the bits are the same)."""
    if value.shape != view.shape and value.size == view.size:
        # the result has the destination's elements in order, with unit dimensions elsewhere
        # (a keepdims reduction into a view that drops them): the verifier checked the count
        value = value.reshape(view.shape)
    if dt.metadata is None and (
        value.dtype == dt or (value.dtype == np.float32 and dt in _DIRECT_CAST)
    ):
        np.copyto(view, value, casting="unsafe")
    else:
        _write(view, value, view.shape, view.size, dt)


def _bn_stats_all(x: np.ndarray) -> np.ndarray:
    """The reference's bn_stats rule with every element valid, without its mask copies:
    the same float64 operations on the same values in the same order."""
    x = x.reshape(x.shape[0], -1).astype(np.float64)
    p = x.shape[0]
    out = np.empty((p, 6), dtype=np.float64)
    for half in (0, 1):
        xs = x[:, half::2]
        n = np.full(p, xs.shape[1], dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = xs.sum(axis=1) / np.maximum(n, 1)
            m2 = ((xs - mean[:, None]) ** 2).sum(axis=1)
        out[:, 3 * half] = n
        out[:, 3 * half + 1] = mean
        out[:, 3 * half + 2] = m2
    return out


_DIRECT_CAST = {dtypes.float32, dtypes.bfloat16, dtypes.float16}


class _Program:
    """A compiled kernel: ``run(args, seed)`` executes it.  ``source`` is the generated
    Python, ``n_fallback`` counts instructions left to the reference interpreter, and
    ``written_params`` names the parameters the kernel writes (arguments not named there are
    only read, so a caller need not copy them)."""

    def __init__(
        self,
        kernel: Kernel,
        source: str,
        namespace: dict,
        poison_at_start: dict[int, bool],
        n_fallback: int,
    ) -> None:
        self.kernel = kernel
        self.source = source
        self.poison_at_start = poison_at_start
        self.n_fallback = n_fallback
        # parameters some instruction writes: the only ones a caller must copy to protect
        written = set()
        for op, _ in kernel.ops():
            for o in op.outs:
                written.add(o.tensor.root.uid)
        self.written_params = frozenset(t.name for t in kernel.params if t.uid in written)
        code = compile(source, f"<nkikit.sim.fast {kernel.name}>", "exec")
        exec(code, namespace)  # noqa: S102 - our own generated source
        self._fn = namespace["_kernel"]
        # what run() does before the program starts, precomputed: HBM buffers to create
        # (poisoned unless every element is written before any read) and constants
        self._param_uids = [t.uid for t in kernel.params]
        self._fresh = []
        self._consts = []
        for t in kernel.tensors:
            if t.base is None and t.kind in ("hbm", "output"):
                poison = poison_at_start.get(t.uid, True)
                fill = dtypes.poison_value(t.dtype) if poison else None
                self._fresh.append((t.uid, t.shape, dtypes.storage_dtype(t.dtype), fill))
            elif t.kind == "const":
                self._consts.append((t.uid, t.const_value))
        self._outputs = list(kernel.outputs)

    def run(self, args: list[np.ndarray], seed: int = 0) -> list[np.ndarray]:
        mem: dict[int, np.ndarray] = dict(zip(self._param_uids, args))
        for uid, shape, dt, fill in self._fresh:
            mem[uid] = np.empty(shape, dt) if fill is None else np.full(shape, fill, dt)
        for uid, value in self._consts:
            mem[uid] = value
        interp = Interpreter(self.kernel, seed=seed)
        interp.mem = mem
        self._fn(mem, interp)
        # storage() follows reshapes: a kernel may return a reshaped view of a buffer
        return [interp.storage(t) for t in self._outputs]


# ---------------------------------------------------------------------------------------------
# compile-time analysis


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


class _AccessCode:
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
        # the same read from the tensor's fp32 shadow (see _Compiler.plan_shadows), when the
        # view is C-contiguous like the reference's widened copy
        self.wide = wide
        # "[...]" of the tensor elements a basic write touches
        self.region = region


class _Compiler:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {
            "np": np,
            "_f32": _f32,
            "_write": _write,
            "_copy": _copy,
            "_bt": np.broadcast_to,
            "_cast": dtypes.cast,
            "_where": np.where,
            "_bn_stats_all": _bn_stats_all,
            "_prep": _prep,
            "_ind": _ind,
            "_scatter": scatter,
        }
        self.names: dict[Sym, str] = {}
        self.ranges: dict[Sym, int] = {}
        self.n_fallback = 0
        self.n_const = 0
        self.const_names: dict[tuple, str] = {}
        self.ints: dict[int, int] = {}  # one object per integer in the argument tables
        self.conds: list[str] = []
        self.shadow: set[int] = set()
        self.forwarded: set[int] = set()
        grid = kernel.grid or (1,)
        for i, g in enumerate(grid):
            self.names[ProgramId(i)] = f"p{i}"
            self.ranges[ProgramId(i)] = g
        self.tensors: dict[int, Tensor] = {}
        for t in kernel.params + kernel.tensors:
            self.tensors[t.uid] = t
        for s, _ in kernel.walk():
            if isinstance(s, Op):
                for a in list(s.outs) + [x for x in s.ins if isinstance(x, Access)]:
                    self.tensors.setdefault(a.tensor.uid, a.tensor)
                    r = a.tensor
                    while r.base is not None:
                        r = r.base
                        self.tensors.setdefault(r.uid, r)
            elif isinstance(s, Alloc):
                self.tensors.setdefault(s.tensor.uid, s.tensor)
            elif isinstance(s, Loop):
                self.names[s.var] = f"v{len(self.names)}"
                self.ranges[s.var] = s.trip

    # -- small helpers ------------------------------------------------------------------------
    def const(self, value: Any, prefix: str = "C") -> str:
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
    ) -> _AccessCode | None:
        """Code for an access, or None when only the reference can do it.  Bounds that
        cannot be proved for every iteration become runtime conditions (appended to
        ``self.conds``; when one fails, the reference runs the op and reports the error),
        unless ``dynamic`` is False."""
        if acc.indirect is not None:
            return None  # a gather/scatter: only ``indirect_lines`` compiles those
        t = acc.tensor
        tshape = t.shape
        dims: list[tuple[int, int] | None] = []
        axes_seen: list[int] = []
        for a in acc.index:
            ax = [(s.k, c) for s, c in a.terms if isinstance(s, Axis)]
            if len(ax) > 1 or (ax and ax[0][1] <= 0):
                return None
            if ax:
                axes_seen.append(ax[0][0])
            dims.append(ax[0] if ax else None)
        if len(set(axes_seen)) != len(axes_seen):
            return None
        shape = acc.shape
        idx = []
        conds: list[str] = []
        for d, (a, ax) in enumerate(zip(acc.index, dims)):
            lo, hi = self.sym_range(a)
            base = self.aff(a)
            if ax is None:
                if lo < 0 or hi >= tshape[d]:
                    if not dynamic:
                        return None
                    conds.append(f"0 <= {base} < {tshape[d]}")
                idx.append(base)
            else:
                k, c = ax
                span = c * (shape[k] - 1)
                if lo < 0 or hi + span >= tshape[d]:
                    if not dynamic:
                        return None
                    conds.append(f"0 <= {base} < {tshape[d] - span}")
                if base.isdigit():
                    b = int(base)
                    idx.append(f"{b}:{b + span + 1}" + (f":{c}" if c != 1 else ""))
                else:
                    idx.append(f"({base}):({base})+{span + 1}" + (f":{c}" if c != 1 else ""))
        ix = ", ".join(idx) if idx else "()"
        if len(idx) == 1:
            ix += ","
        expr = f"{self.slot(t)}[{ix}]"
        self.conds.extend(conds)
        bshape = tuple(s if k in axes_seen else 1 for k, s in enumerate(shape))
        bcast = bshape != tuple(shape)
        kept = tuple(shape[k] for k in axes_seen)
        basic = axes_seen == sorted(axes_seen)
        if write:
            if bcast:
                return None
            if basic:
                if kept != bshape:
                    expr += f".reshape({shape!r})"
                return _AccessCode(expr, True, region=f"[{ix}]")
            perm = tuple(int(i) for i in np.argsort(axes_seen))
            return _AccessCode(f"{expr}.transpose({perm!r})", False)
        if basic:
            wide = None
            if t.uid in self.shadow and not bcast and _contiguous(tshape, acc, dims):
                wide = f"s{t.uid}[{ix}]" + (f".reshape({bshape!r})" if kept != bshape else "")
            if kept != bshape:
                expr += f".reshape({bshape!r})"
            if bcast:
                expr = f"_bt({expr}, {shape!r})"
            return _AccessCode(expr, True, wide=wide)
        # axes out of order: the reference fancy-indexes a fresh C-ordered array
        perm = tuple(int(i) for i in np.argsort(axes_seen))
        expr = f"{expr}.transpose({perm!r})"
        if tuple(sorted(axes_seen)) and bshape != tuple(shape[k] for k in sorted(axes_seen)):
            expr += f".reshape({bshape!r})"
        if bcast:
            expr = f"_bt({expr}, {shape!r})"
        if raw_consumer:
            return _AccessCode(expr, False)
        return _AccessCode(f"np.ascontiguousarray({expr})", True)

    # -- masks --------------------------------------------------------------------------------
    def mask_plan(self, op: Op) -> tuple[str, str | None] | None:
        """("static" | "dynamic", runtime all-true condition) or None when the reference's
        mask handling must run every time."""
        if op.mask is None:
            return ("none", None)
        ref = op.ins[0] if op.prim in _MASK_ON_INPUT and op.ins else op.outs[0]
        if not isinstance(ref, Access):
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
        ref = op.ins[0] if op.prim in _MASK_ON_INPUT and op.ins else op.outs[0]
        shape = ref.shape
        env: dict[Sym, Any] = {s: 0 for s in self.ranges}
        env.update(axis_env(shape))
        evshape = np.asarray(op.mask.evaluate(env), dtype=bool).shape
        return self.const(np.broadcast_to(np.ones(evshape, dtype=bool), shape), "VALID")

    # -- poisoning ------------------------------------------------------------------------------
    def _cover(self, t: Tensor, writes: list[Access], free: set[Sym]) -> bool:
        """Do ``writes`` (unmasked, in bounds), over every value of the symbols in ``free``,
        write every element of ``t``?"""
        n = int(np.prod(t.shape)) if t.shape else 1
        if n > _COVER_MAX_ELEMS:
            return False
        cov = np.zeros(t.shape, dtype=bool)
        return self._mark(cov, t, writes, free) and bool(cov.all())

    def _mark(self, cov: np.ndarray, t: Tensor, writes: list[Access], free: set[Sym]) -> bool:
        """Set ``cov`` where ``writes`` write; False when that cannot be enumerated."""
        for acc in writes:
            syms = [s for s in acc.syms if not isinstance(s, Axis)]
            if any(s not in free for s in syms):
                return False
            trips = [self.ranges[s] for s in syms]
            if math.prod(trips) > _COVER_MAX_ITERS:
                return False
            target = cov
            if acc.tensor is not t:
                target = cov.reshape(acc.tensor.shape)
            for vals in itertools.product(*(range(x) for x in trips)):
                env = dict(zip(syms, vals))
                idx = []
                for a in acc.index:
                    ax = [(s.k, c) for s, c in a.terms if isinstance(s, Axis)]
                    base = a.const + sum(c * env[s] for s, c in a.terms if not isinstance(s, Axis))
                    if ax:
                        k, c = ax[0]
                        idx.append(slice(base, base + c * (acc.shape[k] - 1) + 1, c))
                    else:
                        idx.append(base)
                target[tuple(idx)] = True
        return True

    def _touches(self, stmts: list, t_root: Tensor) -> tuple[bool, list[tuple[Op, Access]], bool]:
        """(reads, writes, all writes compilable-unmasked) of tensor ``t_root`` in ``stmts``."""
        reads = False
        writes: list[tuple[Op, Access]] = []
        clean = True
        stack = list(stmts)
        while stack:
            s = stack.pop()
            if isinstance(s, Loop):
                stack.extend(s.body)
                continue
            if not isinstance(s, Op):
                continue
            for x in s.ins:
                if isinstance(x, Access) and x.tensor.root is t_root:
                    reads = True
            for o in s.outs:
                if o.tensor.root is t_root:
                    if reads_dst(s):
                        reads = True
                    mp = self.mask_plan(s)
                    if mp is None or mp[0] == "dynamic":
                        clean = False
                    if s.prim in ("dma_copy",) and s.attrs.get("rmw_op"):
                        clean = False
                    if (
                        s.prim not in _WRITES_ALL
                        or self.access(o, True, True, dynamic=False) is None
                    ):
                        clean = False
                    writes.append((s, o))
        return reads, writes, clean

    def needs_poison_hbm(self, t: Tensor) -> bool:
        reads, writes, clean = self._touches(self.k.body, t)
        if reads or not clean or not writes:
            return True
        free = set(self.ranges)
        return not self._cover(t, [w for _, w in writes], free)

    def needs_poison_temp(self, t: Tensor, rest: Iterable) -> bool:
        """``rest``: the statements after the Alloc in its body.  Poison is needed unless
        the write-only statements before the first read write every element."""
        cov = None
        for s in rest:
            reads, writes, clean = self._touches([s], t)
            if not reads and not writes:
                continue
            if reads or not clean:
                return True
            if cov is None:
                if math.prod(t.shape) > _COVER_MAX_ELEMS:
                    return True
                cov = np.zeros(t.shape, dtype=bool)
            free = {x.var for x, _ in _loops_in(s)} if isinstance(s, Loop) else set()
            if not self._mark(cov, t, [w for _, w in writes], free):
                return True
            if cov.all():
                return False
        return cov is not None and not cov.all()

    # -- code generation ------------------------------------------------------------------------
    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def build(self) -> _Program:
        k = self.k
        self.chunked = sum(1 for _ in k.walk()) > _TABLE_ABOVE
        self.templates: dict[str, int] = {}  # template text -> index (table-driven mode)
        self.chunks: list[str] = []  # the template functions' source
        self.bound: list[str] = []  # loop variables in scope, passed on to templates
        self.emit("def _kernel(mem, interp):", 0)
        self.emit("env = {}", 1)
        # storage: parameters, HBM tensors and constants come from mem; temporaries are
        # allocated once per call; reshaped HBM tensors are views of their base.
        temps = []
        for t in self.tensors.values():
            if t.base is None and t.kind == "temp":
                temps.append(t)
        if not self.chunked:
            for t in self.tensors.values():
                if t.base is None and t.kind != "temp":
                    self.emit(f"{self.slot(t)} = mem[{t.uid}]", 1)
        offsets, total = self.plan_arena(temps)
        if temps:
            self.emit(f"arena = np.empty({total}, np.uint8)", 1)
        table = []
        for t in temps:
            dt = self.const(dtypes.storage_dtype(t.dtype), "DT")
            off = offsets[t.uid]
            nbytes = math.prod(t.shape) * dtypes.storage_dtype(t.dtype).itemsize
            if self.chunked:
                table.append((t.uid, off, off + nbytes, self.ns[dt], t.shape))
                continue
            self.emit(
                f"{self.slot(t)} = mem[{t.uid}] = arena[{off}:{off + nbytes}].view({dt}).reshape({t.shape!r})",
                1,
            )
        if table:
            self.emit(f"for uid, lo, hi, dt, shape in {self.const(table, 'TEMPS')}:", 1)
            self.emit("mem[uid] = arena[lo:hi].view(dt).reshape(shape)", 2)
        # reshapes, outermost base first
        done: set[int] = set()
        views = []

        def view(t: Tensor) -> None:
            if t.base is None or t.uid in done:
                return
            view(t.base)
            done.add(t.uid)
            if self.chunked:
                views.append((t.uid, t.base.uid, t.base.base is not None, t.shape))
            else:
                self.emit(f"{self.slot(t)} = {self.slot(t.base)}.reshape({t.shape!r})", 1)

        for t in self.tensors.values():
            view(t)
        poison_start = {}
        for t in self.tensors.values():
            if t.base is None and t.kind in ("hbm", "output"):
                poison_start[t.uid] = self.needs_poison_hbm(t)
        self.plan_forwarding()
        self.plan_shadows()
        if self.chunked:
            # V: reshaped views, B: the own buffers of forwarded tiles, S: fp32 shadows
            self.emit("V = {}", 1)
            if views:
                self.emit(f"for uid, base, of_view, shape in {self.const(views, 'VIEWS')}:", 1)
                self.emit("V[uid] = (V[base] if of_view else mem[base]).reshape(shape)", 2)
            fwd = self.const(sorted(self.forwarded), "FWD")
            self.emit(f"B = {{uid: mem[uid] for uid in {fwd}}}", 1)
            shadows = [(uid, self.tensors[uid].shape) for uid in sorted(self.shadow)]
            self.emit(
                "S = {uid: np.empty(shape, np.float32) for uid, shape in "
                f"{self.const(shadows, 'SHADOWS')}}}",
                1,
            )
        else:
            for uid in sorted(self.shadow):
                self.emit(f"s{uid} = np.empty({self.tensors[uid].shape!r}, np.float32)", 1)
            for uid in sorted(self.forwarded):
                self.emit(f"b{uid} = m{uid}", 1)
        depth = 1
        grid = k.grid or (1,)
        for i, g in enumerate(grid):
            self.emit(f"for p{i} in range({g}):", depth)
            depth += 1
            self.emit(f"env[PID{i}] = p{i}", depth)
            self.ns[f"PID{i}"] = ProgramId(i)
            self.bound.append(f"p{i}")
        self.body(k.body, depth, top=True)
        self.emit("return None", 1)
        if self.chunks:
            self.chunks.append(f"T = [{', '.join(f'_t{i}' for i in range(len(self.chunks)))}]")
        source = "\n".join([*self.chunks, *self.lines]) + "\n"
        return _Program(k, source, self.ns, poison_start, self.n_fallback)

    def table(self, stmts: list, depth: int) -> None:
        """Emit ``stmts`` table-driven: each statement's code as a call of a template
        function with its arguments, the calls as a loop over a constant table.  A
        template's tensors come from ``mem`` (``V`` for reshaped views; ``B``, ``S`` for
        forwarding buffers and shadows), which every assignment to a tensor's local also
        updates, so each statement sees what the ones before it left."""
        rows = []
        for i in range(len(stmts)):
            saved, self.lines = self.lines, []
            self.statements(stmts, i, i + 1, 1)
            lines, self.lines = self.lines, saved
            lines = [ln for ln in lines if not ln.lstrip().startswith("#")]
            if lines:
                rows.append(self.template(lines))
        bound = "".join(f"{n}, " for n in self.bound)
        self.emit(f"for a in {self.const(rows, 'TABLE')}:", depth)
        self.emit(f"T[a[0]](mem, interp, env, V, B, S, {bound}*a)", depth + 1)

    def template(self, lines: list[str]) -> tuple:
        """(template index, *arguments) for the code ``lines`` of one statement."""
        slots: dict[str, str] = {}
        params: dict[str, str] = {}
        args: list[Any] = []

        def sub(m: re.Match) -> str:
            tok = m.group(0)
            if tok[0] in "mbs":  # a slot; constants start upper case, integers with a digit
                name = slots.get(tok)
                if name is None:
                    name = slots[tok] = f"L{len(slots)}"
                return name
            name = params.get(tok)
            if name is None:
                name = params[tok] = f"a{len(params)}"
                if tok[0].isupper():
                    args.append(self.ns[tok])
                else:
                    args.append(self.ints.setdefault(int(tok), int(tok)))
            return name

        body = _TEMPLATE_TOKEN.sub(sub, "\n".join(lines)).split("\n")
        head, uids = [], []
        for tok, name in slots.items():
            uid = int(tok[1:])
            t = self.tensors[uid]
            store = {"b": "B", "s": "S"}.get(tok[0]) or ("V" if t.base is not None else "mem")
            head.append(f"    {name} = {store}[u{len(uids)}]")
            uids.append(self.ints.setdefault(uid, uid))
        sig = ", ".join(
            [
                "mem, interp, env, V, B, S",
                *self.bound,
                "_",  # the row's template index
                *(f"u{j}" for j in range(len(uids))),
                *params.values(),
            ]
        )
        text = "\n".join([f"({sig}):", *head, *body])
        k = self.templates.get(text)
        if k is None:
            k = self.templates[text] = len(self.chunks)
            self.chunks.append(f"def _t{k}{text}")
        return (k, *uids, *args)

    # -- memory -------------------------------------------------------------------------------
    def plan_arena(self, temps: list[Tensor]) -> tuple[dict[int, int], int]:
        """Byte offsets of the temporaries in one arena, sharing memory between tiles whose
        lifetimes do not overlap (the reference allocates a fresh buffer at every Alloc and
        lets the last one die; a fixed buffer per tile would hold every unrolled tile's
        memory at once).

        A tile lives from its Alloc to its last use; a use inside a loop that does not
        contain the Alloc keeps it alive to the end of that loop (the next iteration comes
        back to it).  Tiles never share while both live, so no tile sees another's data
        except where the reference would see poison -- and poison is filled explicitly.
        """
        uids = {t.uid for t in temps}
        start: dict[int, int] = {}
        depth: dict[int, int] = {}
        uses: dict[int, list[tuple[int, Loop | None]]] = {}
        loop_end: dict[int, int] = {}
        pos = 0

        def walk(stmts: list, loops: list[Loop]) -> None:
            nonlocal pos
            for st in stmts:
                p = pos
                pos += 1
                if isinstance(st, Alloc):
                    if st.tensor.uid in uids:
                        start[st.tensor.uid] = p
                        depth[st.tensor.uid] = len(loops)
                elif isinstance(st, Loop):
                    walk(st.body, loops + [st])
                    loop_end[id(st)] = pos - 1
                elif isinstance(st, Op):
                    accs = list(st.outs) + [x for x in st.ins if isinstance(x, Access)]
                    for a in accs:
                        uid = a.tensor.root.uid
                        if uid in uids:
                            d = depth.get(uid, 0)
                            uses.setdefault(uid, []).append(
                                (p, loops[d] if len(loops) > d else None)
                            )

        walk(self.k.body, [])
        live: list[tuple[int, int, int, int, int]] = []  # (start, end, offset, size, uid)
        for t in temps:
            b = start.get(t.uid, 0)
            e = b
            for p, lp in uses.get(t.uid, []):
                e = max(e, loop_end[id(lp)] if lp is not None else p)
            size = -(-math.prod(t.shape) * dtypes.storage_dtype(t.dtype).itemsize // 64) * 64
            live.append((b, e, 0, max(size, 64), t.uid))
        live.sort()
        # first fit against the tiles still live when each one starts (tiles are taken in
        # order of their start, so those are the placed ones that end at or after it): a
        # heap by end keeps the live set, and unrolled code with a tile per step stays
        # linear instead of comparing every tile with every placed one
        active: list[tuple[int, int, int]] = []  # (end, offset, size)
        offsets: dict[int, int] = {}
        total = 0
        for b, e, _, size, uid in live:
            while active and active[0][0] < b:
                heapq.heappop(active)
            off = 0
            for lo, hi in sorted((o, o + sz) for _, o, sz in active):
                if off + size <= lo:
                    break
                off = max(off, hi)
            heapq.heappush(active, (e, off, size))
            offsets[uid] = off
            total = max(total, off + size)
        return offsets, total

    # -- forwarding ---------------------------------------------------------------------------
    def plan_forwarding(self) -> None:
        """Find tiles that can live in HBM memory instead of their own buffer.

        *Load forwarding*: a tile whose only write is a same-dtype copy of a whole region of
        an HBM tensor that nothing in the kernel writes becomes a view of that region.
        *Store forwarding*: a tile written once and then only stored (whole, same dtype) to
        HBM is computed straight into the destination.  Either way the data and (checked at
        run time: C-contiguous) the layout are those of the reference's own buffer; the
        copy is what disappears.  Dead writes (temporaries nobody reads) are dropped too.
        """
        reads: dict[int, list[Op]] = {}
        writes: dict[int, list[Op]] = {}
        for s, _ in self.k.walk():
            if not isinstance(s, Op):
                continue
            for x in s.ins:
                if isinstance(x, Access):
                    reads.setdefault(x.tensor.root.uid, []).append(s)
            for o in s.outs:
                writes.setdefault(o.tensor.root.uid, []).append(s)
                if reads_dst(s):
                    reads.setdefault(o.tensor.root.uid, []).append(s)
        self.reads, self.writes = reads, writes
        # tensors viewed through a reshape (NKI 0.x views of on-chip tiles): their accesses
        # name the reshape, so forwarding and shadow copies, which follow the tile's own
        # accesses, do not apply
        self.aliased = {t.root.uid for t in self.tensors.values() if t.base is not None}
        self.forwarded: set[int] = set()
        self.load_fwd: dict[int, Tensor] = {}  # id(op) -> tile
        self.store_fwd: dict[int, tuple[Tensor, Op]] = {}  # id(writer op) -> (tile, store op)
        self.store_skip: dict[int, Tensor] = {}  # id(store op) -> tile
        self._scan_forwarding(self.k.body)

    def _plain_copy(self, op: Op) -> bool:
        if (
            op.prim not in ("dma_copy", "tensor_copy")
            or op.attrs.get("rmw_op")
            or len(op.outs) != 1
        ):
            return False
        mp = self.mask_plan(op)
        return mp is not None and mp[0] in ("none", "static") and isinstance(op.ins[0], Access)

    def _scan_forwarding(self, stmts: list) -> None:
        for i, s in enumerate(stmts):
            if isinstance(s, Loop):
                self._scan_forwarding(s.body)
            if not isinstance(s, Alloc):
                continue
            t = s.tensor
            ws = self.writes.get(t.uid, [])
            rs = self.reads.get(t.uid, [])
            if len(ws) != 1 or dtypes.is_tf32(t.dtype) or t.base is not None:
                continue
            if t.uid in self.aliased:  # read or written through a reshape: keep its buffer
                continue
            w = ws[0]
            # the writer must be a plain statement of this body, after the Alloc, with no
            # read of t in between (that read would see the poison)
            pos = next((j for j in range(i + 1, len(stmts)) if stmts[j] is w), None)
            if pos is None or any(self._touches([x], t)[0] for x in stmts[i + 1 : pos]):
                continue
            out = w.outs[0] if len(w.outs) == 1 else None
            if self._plain_copy(w) and out is not None and out.tensor is t and out.is_whole:
                src = w.ins[0]
                root = src.tensor.root
                if (
                    root.is_hbm
                    and root.uid not in self.writes
                    and src.shape == t.shape
                    and src.tensor.dtype == t.dtype
                    and t not in [x.tensor for x in w.ins[1:]]
                ):
                    code = self._static_access(src, False)
                    if code is not None and code.layout_exact and "_bt(" not in code.expr:
                        self.load_fwd[id(w)] = t
                        self.forwarded.add(t.uid)
                        continue
            # store forwarding: t written whole by w, then read only by one plain store
            if len(rs) != 1 or not any(o.tensor is t and o.is_whole for o in w.outs):
                continue
            st_op = rs[0]
            spos = next((j for j in range(pos + 1, len(stmts)) if stmts[j] is st_op), None)
            if spos is None or not self._plain_copy(st_op) or st_op.ins[0].tensor is not t:
                continue
            src, dst = st_op.ins[0], st_op.outs[0]
            droot = dst.tensor.root
            if (
                not src.is_whole
                or not droot.is_hbm
                or dst.shape != t.shape
                or dst.tensor.dtype != t.dtype
                or any(isinstance(x, Access) and x.tensor.root is droot for x in w.ins)
            ):
                continue
            # the writer must write every element of t unconditionally (else the reference
            # would leave poison where this would leave the destination's old data)
            if (
                w.prim not in _WRITES_ALL
                or self.mask_plan(w) not in (("none", None), ("static", None))
                or any(
                    self._static_access(x, False) is None for x in w.ins if isinstance(x, Access)
                )
                or any(self._static_access(o, True) is None for o in w.outs)
                or w.prim in _ALWAYS_REFERENCE
            ):
                continue
            between = stmts[pos + 1 : spos]
            if any(self._touches([x], droot)[0] or self._touches([x], droot)[1] for x in between):
                continue
            code = self._static_access(dst, True)
            if code is None or not code.layout_exact:
                continue
            self.store_fwd[id(w)] = (t, st_op)
            self.store_skip[id(st_op)] = t
            self.forwarded.add(t.uid)

    def f32(self, x: Access, r: _AccessCode) -> str:
        """Code for the reference's ``to_f32(read(x))``."""
        if dtypes.storage_dtype(x.tensor.dtype) == np.float32:
            return r.expr
        if r.wide is not None:
            return r.wide
        return f"_f32({r.expr})"

    def plan_shadows(self) -> None:
        """Choose the bf16/fp16/fp8 tiles that keep an fp32 copy of themselves.

        The reference widens a narrow tile to fp32 every time an instruction reads it.  A
        tile read (much) more often than it is written -- a matmul operand block reused for
        every row block, K^T in attention -- keeps a widened shadow instead, refreshed after
        each write over the written region, and read wherever the reference's widened copy
        would have the same (C-contiguous) layout.
        """
        self.shadow: set[int] = set()
        execs: dict[int, int] = {}
        grid = math.prod(self.k.grid or (1,))
        for st, loops in self.k.walk():
            if isinstance(st, Op):
                execs[id(st)] = grid * math.prod(lp.trip for lp in loops)
        for t in self.tensors.values():
            if (
                t.kind != "temp"
                or t.base is not None
                or t.uid in self.forwarded
                or t.uid in self.aliased
                or dtypes.is_tf32(t.dtype)
                or not dtypes.is_float(t.dtype)
                or dtypes.storage_dtype(t.dtype) == np.float32
            ):
                continue
            r = sum(execs[id(op)] for op in self.reads.get(t.uid, []) if op.prim not in RAW)
            w = sum(execs[id(op)] for op in self.writes.get(t.uid, []))
            if r > 2 * w:
                self.shadow.add(t.uid)

    def refresh_shadow(self, op: Op, depth: int, outs: list[_AccessCode] | None) -> None:
        """After ``op`` ran: bring the shadows of the tiles it wrote up to date."""
        for j, o in enumerate(op.outs):
            uid = o.tensor.uid
            if uid not in self.shadow:
                continue
            region = outs[j].region if outs is not None and j < len(outs) else None
            if region is None:
                self.emit(f"np.copyto(s{uid}, m{uid}, casting='unsafe')", depth)
            else:
                self.emit(f"np.copyto(s{uid}{region}, m{uid}{region}, casting='unsafe')", depth)

    def _static_access(self, acc: Access, write: bool) -> _AccessCode | None:
        saved = self.conds
        self.conds = []
        try:
            return self.access(acc, write, True, dynamic=False)
        finally:
            self.conds = saved

    def dead(self, t: Tensor) -> bool:
        """A temporary no instruction ever reads."""
        return t.kind == "temp" and t.base is None and t.uid not in self.reads

    def body(self, stmts: list, depth: int, top: bool = False) -> None:
        if not stmts:
            self.emit("pass", depth)
            return
        if self.chunked and (top or len(stmts) > _TABLE_BODY):
            # the kernel's own body always (its driver holds no tensor locals), and any
            # body too long to be one function
            self.table(stmts, depth)
            return
        self.statements(stmts, 0, len(stmts), depth)

    def statements(self, stmts: list, lo: int, hi: int, depth: int) -> None:
        for i in range(lo, hi):
            s = stmts[i]
            if isinstance(s, Alloc):
                t = s.tensor
                if t.uid in self.forwarded:
                    self.emit(f"m{t.uid} = mem[{t.uid}] = b{t.uid}", depth)
                if self.needs_poison_temp(t, (stmts[j] for j in range(i + 1, len(stmts)))):
                    pv = self.const(dtypes.poison_value(t.dtype), "POISON")
                    self.emit(f"{self.slot(t)}.fill({pv})", depth)
                    if t.uid in self.shadow:
                        self.emit(f"np.copyto(s{t.uid}, m{t.uid}, casting='unsafe')", depth)
            elif isinstance(s, Loop):
                n = self.names[s.var]
                lv = self.const(s.var, "LV")
                self.emit(f"for {n} in range({s.trip}):", depth)
                self.emit(f"env[{lv}] = {n}", depth + 1)
                self.bound.append(n)
                self.body(s.body, depth + 1)
                self.bound.pop()
                self.emit(f"env.pop({lv}, None)", depth)
            else:
                self.op(s, depth)

    def fallback(self, op: Op, depth: int) -> None:
        self.n_fallback += 1
        name = self.const(op, "OP")
        self.emit(f"interp.exec_op({name}, env)", depth)

    def op(self, op: Op, depth: int) -> None:
        self.emit(f"# {op.prim} {op.loc}", depth)
        t = self.load_fwd.get(id(op))
        if t is not None:
            src = self._static_access(op.ins[0], False)
            self.emit(f"v = {src.expr}", depth)
            self.emit("if v.flags.c_contiguous:", depth)
            self.emit(f"    m{t.uid} = mem[{t.uid}] = v", depth)
            self.emit("else:", depth)
            self.emit(f"    m{t.uid} = mem[{t.uid}] = b{t.uid}", depth)
            self.emit(f"    np.copyto(b{t.uid}, v)", depth)
            return
        t = self.store_skip.get(id(op))
        if t is not None:
            self.emit(f"if m{t.uid} is b{t.uid}:", depth)
            self.op_body(op, depth + 1)
            return
        fwd = self.store_fwd.get(id(op))
        if fwd is not None:
            t, st_op = fwd
            dst = self._static_access(st_op.outs[0], True)
            self.emit(f"v = {dst.expr}", depth)
            self.emit(f"m{t.uid} = mem[{t.uid}] = v if v.flags.c_contiguous else b{t.uid}", depth)
        if (
            op.outs
            and all(self.dead(o.tensor) for o in op.outs)
            and op.prim in _WRITES_ALL
            and self.mask_plan(op) in (("none", None), ("static", None))
        ):
            saved = self.conds
            self.conds = []
            ok = all(
                self.access(x, False, True, dynamic=False) is not None
                for x in op.ins
                if isinstance(x, Access)
            )
            ok = ok and all(self.access(o, True, True, dynamic=False) is not None for o in op.outs)
            self.conds = saved
            if ok:  # no one reads the result and it cannot fail: nothing to do
                self.emit("pass  # dead: the result is never read", depth)
                return
        self.op_body(op, depth)

    def op_body(self, op: Op, depth: int) -> None:
        mp = self.mask_plan(op)
        if op.prim in _ALWAYS_REFERENCE or mp is None:
            self.fallback(op, depth)
            self.refresh_shadow(op, depth, None)
            return
        self.conds = [] if mp[1] is None else [mp[1]]
        self.last_outs: list[_AccessCode] | None = None
        lines = self.op_lines(op, mp[0] != "none")
        if lines is None:
            self.fallback(op, depth)
            self.refresh_shadow(op, depth, None)
            return
        if self.conds:
            self.emit(f"if {' and '.join(dict.fromkeys(self.conds))}:", depth)
            for ln in lines:
                self.emit(ln, depth + 1)
            self.refresh_shadow(op, depth + 1, self.last_outs)
            self.emit("else:", depth)
            self.fallback(op, depth + 1)
            self.refresh_shadow(op, depth + 1, None)
        else:
            for ln in lines:
                self.emit(ln, depth)
            self.refresh_shadow(op, depth, self.last_outs)

    def op_lines(self, op: Op, masked: bool) -> list[str] | None:
        """Generated lines for an op that runs unmasked (its mask, if any, holds)."""
        if any(isinstance(a, Access) and a.indirect is not None for a in (*op.outs, *op.ins)):
            return self.indirect_lines(op)
        prim = op.prim
        raw = prim in RAW
        outs = []
        for o in op.outs:
            w = self.access(o, True, raw)
            if w is None:
                return None
            outs.append(w)
        self.last_outs = outs
        special = self.special(op, outs, masked)
        if special is not None:
            return special
        lines = []
        ins = []
        for j, x in enumerate(op.ins):
            if isinstance(x, Access):
                r = self.access(x, False, False)
                if r is None:
                    return None
                e = r.expr if raw else self.f32(x, r)
                lines.append(f"x{j} = {e}")
                ins.append(f"x{j}")
            else:
                ins.append(repr(float(x)) if isinstance(x, float) else repr(x))
        valid = self.valid_const(op) if masked else "None"
        opn = self.const(op, "OP")
        if prim == "affine_select":
            shape = op.outs[0].shape
            keep = self.predicate_code(op.attrs["pred"], shape)
            if keep is None:
                return None
            lines.append(
                f"R = [_where({keep}, {ins[0]}, {self.const(np.float32(op.attrs['on_false']), 'F')})]"
            )
        else:
            # the reference's rule and context: a destination it reads (accumulate, rmw) is
            # read through the interpreter, which shares this program's memory
            rule = self.const(RULES[prim], "RULE")
            ctx = f"interp.context({opn}, env, {valid})"
            lines.append(f"R = {rule}({opn}, [{', '.join(ins)}], {ctx})")
        for j, (o, w) in enumerate(zip(op.outs, outs)):
            dt = self.const(o.tensor.dtype, "DT")
            size = int(np.prod(o.shape))
            lines.append(
                f"if R[{j}] is not None: _write({w.expr}, R[{j}], {tuple(o.shape)!r}, {size}, {dt})"
            )
        return lines

    def indirect_lines(self, op: Op) -> list[str] | None:
        """A gather (``nl.load(t[idx, i_f])``) or scatter (``nl.store(t[idx, i_f], v)``):
        the reference's fancy index built from precomputed tile-axis grids and the index
        tile, the runtime index checked against the tensor (else the reference runs the op
        and raises its error), the same numpy gather or the same ``scatter`` function.
        Read-modify-write DMAs (``nl.atomic_rmw``) stay with the reference."""
        if op.prim != "dma_copy" or op.attrs.get("rmw_op") or len(op.outs) != 1:
            return None
        src, dst = op.ins[0], op.outs[0]
        if not isinstance(src, Access) or src.shape != dst.shape:
            return None
        if (src.indirect is None) == (dst.indirect is None):
            return None
        ind_acc = src if src.indirect is not None else dst
        ind = ind_acc.indirect
        assert ind is not None
        rt = self.access(ind, False, True)
        if rt is None:
            return None
        shape = ind_acc.shape
        tshape = ind_acc.tensor.shape
        grid = axis_env(shape)
        axes, bases = [], []
        for d, a in enumerate(ind_acc.index):
            if d != ind_acc.indirect_dim:
                lo, hi = self.sym_range(a, shape)
                if lo < 0 or hi >= tshape[d]:
                    return None  # the reference reports it
            ax = [(s, c) for s, c in a.terms if isinstance(s, Axis)]
            axes.append(self.const(sum(grid[s] * c for s, c in ax), "AXS") if ax else "0")
            bases.append(
                self.aff(
                    Affine(tuple((s, c) for s, c in a.terms if not isinstance(s, Axis)), a.const)
                )
            )
        d = ind_acc.indirect_dim
        opn = self.const(op, "OP")
        index = f"_ind(({', '.join(axes)},), ({', '.join(bases)},), {d}, {rt.expr}, {shape!r})"
        lines = [f"I = {index}", f"if 0 <= I[{d}].min() and I[{d}].max() < {tshape[d]}:"]
        odt = dst.tensor.dtype
        dt = self.const(odt, "DT")
        size = int(np.prod(shape))
        if src.indirect is not None:  # gather into a plain destination
            w = self.access(dst, True, True)
            if w is None:
                return None
            self.last_outs = [w]
            value = f"{self.slot(src.tensor)}[I]"
            if dtypes.is_tf32(odt) or odt not in _DIRECT_CAST and src.tensor.dtype != odt:
                lines.append(f"    _write({w.expr}, {value}, {shape!r}, {size}, {dt})")
            else:
                lines.append(f"    _copy({w.expr}, {value}, {dt})")
        else:  # scatter a plain source
            r = self.access(src, False, True)
            if r is None:
                return None
            self.last_outs = None
            value = f"_prep({r.expr}, {shape!r}, {size}, {dt})"
            lines.append(f"    _scatter({self.slot(dst.tensor)}, I, {value}, None)")
        lines += ["else:", f"    interp.exec_op({opn}, env)"]
        return lines

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

    # -- specialized executors ------------------------------------------------------------------
    def special(self, op: Op, outs: list[_AccessCode], masked: bool) -> list[str] | None:
        """Cheaper code with the reference's exact results for the hottest instructions."""
        prim = op.prim
        out = op.outs[0] if op.outs else None
        if out is None or (len(op.outs) != 1 and prim != "activation"):
            return None
        odt = out.tensor.dtype
        if dtypes.is_tf32(odt) and prim != "memset":
            return None  # tf32 rounding: the reference's _write does it
        o_f32 = dtypes.storage_dtype(odt) == np.float32 and not dtypes.is_tf32(odt)
        w = outs[0].expr
        if prim in ("dma_copy", "tensor_copy") and not op.attrs.get("rmw_op"):
            src = op.ins[0]
            if not isinstance(src, Access) or src.shape != out.shape:
                return None
            r = self.access(src, False, True)
            if r is None:
                return None
            dt = self.const(odt, "DT")
            if dtypes.is_tf32(odt) or odt not in _DIRECT_CAST and src.tensor.dtype != odt:
                return [
                    f"_write({w}, {r.expr}, {tuple(out.shape)!r}, {int(np.prod(out.shape))}, {dt})"
                ]
            return [f"_copy({w}, {r.expr}, {dt})"]
        if prim == "memset":
            v = dtypes.cast(np.full((1,), op.attrs["value"], dtype=np.float32), odt)
            if dtypes.is_tf32(odt):
                v = v.astype(np.float32)
            return [f"{w}[...] = {self.const(v[0], 'V')}"]
        # The rest compute an fp32 value.  With an fp32 destination numpy writes it in place
        # (``out=``); otherwise it is computed into a temporary and rounded on the copy.
        direct = o_f32 and outs[0].layout_exact
        dt = self.const(odt, "DT")

        def finish(fn: str, args: str) -> list[str]:
            if direct:
                return [f"{fn}({args}, out={w})"]
            return [f"_copy({w}, {fn}({args}), {dt})"]

        ins = []
        for x in op.ins:
            if isinstance(x, Access):
                r = self.access(x, False, False)
                if r is None:
                    return None
                ins.append(self.f32(x, r))
            else:
                ins.append(repr(float(x)))

        def shaped(i: int) -> bool:
            x = op.ins[i]
            return (
                not isinstance(x, Access)
                or x.shape == out.shape
                or (
                    x.shape[0] == out.shape[0]
                    and x.free_size == 1
                    and len(x.shape) == len(out.shape)
                )
            )

        if odt not in _DIRECT_CAST and not direct:
            return None
        if prim == "bn_stats" and len(op.ins) == 1:
            # a mask that holds changes nothing in the reference's arithmetic
            return [
                f"_write({w}, _bn_stats_all({ins[0]}), {tuple(out.shape)!r}, {int(np.prod(out.shape))}, {dt})"
            ]
        if prim == "tensor_tensor":
            fn = _UFUNC_ALU.get(op.attrs["op"])
            if fn is None or op.ins[0].shape != out.shape or op.ins[1].shape != out.shape:
                return None
            return finish(self.const(fn, "UF"), f"{ins[0]}, {ins[1]}")
        if prim in ("tensor_scalar", "scalar_tensor_tensor"):
            a = op.attrs
            if (
                a.get("reduce_op")
                or op.ins[0].shape != out.shape
                or not all(shaped(i) for i in range(len(ins)))
            ):
                return None
            f0 = _UFUNC_ALU.get(a["op0"])
            f1 = _UFUNC_ALU.get(a["op1"]) if a.get("op1") else None
            if f0 is None or (a.get("op1") and f1 is None):
                return None
            first = (ins[1], ins[0]) if a["reverse0"] else (ins[0], ins[1])
            if f1 is None:
                return finish(self.const(f0, "UF"), f"{first[0]}, {first[1]}")
            # two ALU stages: the intermediate stays an fp32 array, as in the reference
            second = (ins[2], "y") if a["reverse1"] else ("y", ins[2])
            return [f"y = {self.const(f0, 'UF')}({first[0]}, {first[1]})"] + finish(
                self.const(f1, "UF"), f"{second[0]}, {second[1]}"
            )
        if prim == "nc_matmul":
            if not direct:
                return None
            mm = f"np.matmul({ins[0]}.T, {ins[1]}, dtype=np.float32)"
            if op.attrs.get("accumulate"):
                return [f"np.add({w}, {mm}, out={w})"]
            return [f"{w}[...] = {mm}"]
        if prim == "nc_transpose":
            return [f"_copy({w}, {ins[0]}.T, {dt})"]
        if prim == "affine_select":
            keep = self.predicate_code(op.attrs["pred"], out.shape)
            if keep is None:
                return None
            f = self.const(np.float32(op.attrs["on_false"]), "F")
            if direct and op.ins[0].tensor.root is not out.tensor.root:
                return [f"np.copyto({w}, {f})", f"np.copyto({w}, {ins[0]}, where={keep})"]
            return [f"_copy({w}, _where({keep}, {ins[0]}, {f}), {dt})"]
        if prim == "activation":
            a = op.attrs
            fn = _UFUNC_ACT.get(a["op"])
            if fn is None or op.ins[0].shape != out.shape or not all(shaped(i) for i in range(3)):
                return None
            data, bias, scale = ins
            scale_is_one = isinstance(op.ins[2], float) and op.ins[2] == 1.0
            uf = self.const(fn, "UF")
            lines = ["with np.errstate(all='ignore'):"]
            if scale_is_one:
                lines.append(f"    y = np.add({data}, {bias})")
            else:
                lines.append(f"    y = np.multiply({data}, {scale})")
                lines.append(f"    np.add(y, {bias}, out=y)")
            lines.append(f"    {uf}(y, out=y)")
            if a.get("reduce_op"):
                if len(op.outs) != 2:
                    return None
                r = self.access(op.outs[1], True, False)
                if r is None or a["reduce_op"] not in _REDUCE_FAST:
                    return None
                # y is a fresh C-ordered fp32 array: the reference's np.where(valid, y, id)
                # would be the same array, so the reduction sees the same layout
                red = self.const(_REDUCE_FAST[a["reduce_op"]], "RED")
                rdt = self.const(op.outs[1].tensor.dtype, "DT")
                p = out.shape[0]
                axes = tuple(range(1, len(out.shape)))
                lines.append(f"red = {red}(y, axis={axes!r}, keepdims=True).reshape({p}, 1)")
                if not self.dead(out.tensor):
                    lines.append(f"_copy({w}, y, {dt})")
                lines.append(
                    f"_write({r.expr}, red, {tuple(op.outs[1].shape)!r}, "
                    f"{int(np.prod(op.outs[1].shape))}, {rdt})"
                )
                return lines
            if len(op.outs) != 1:
                return None
            lines.append(f"_copy({w}, y, {dt})")
            return lines
        return None


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


def _loops_in(s: Loop):
    """(loop, depth) for ``s`` and every loop nested in it."""
    out = [(s, 0)]
    for x in s.body:
        if isinstance(x, Loop):
            out.extend(_loops_in(x))
    return out
