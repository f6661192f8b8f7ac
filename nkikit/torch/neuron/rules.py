"""The code generator's table: one entry per ATen op, saying how its tile layout is derived
(:mod:`.layout`) and which NKI 0.x instructions compute it on one tile (:class:`Body`).

Every rule writes its result in the node's own dtype, computing in fp32 as the engines do
(reference/nki-0x.md §4.0, §6.1): a region therefore rounds where the torch ops it came from
round, once per op, and an op that torch computes in fp32 internally (softmax, the norms)
rounds once.  Instructions follow the ISA reference: ScalarE ``activation`` for transcendental
functions (§4.10), VectorE ``tensor_tensor`` / ``tensor_scalar`` for arithmetic, with a ``(P, 1)`` fp32 tile as the per-partition operand (§4.6),
``tensor_reduce`` and ``activation(reduce_op=nl.add)`` for reductions along the free axis,
``tensor_copy`` for casts, ``tensor_copy_predicated`` for ``where`` (§4.4).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .region import Node

FLOATS = frozenset({"float32", "bfloat16", "float16"})
INTS = frozenset({"int32", "int16", "int8", "uint8"})
NL_DTYPES = {
    "float32": "nl.float32",
    "bfloat16": "nl.bfloat16",
    "float16": "nl.float16",
    "bool": "nl.bool_",
    "int32": "nl.int32",
    "int16": "nl.int16",
    "int8": "nl.int8",
    "uint8": "nl.uint8",
}
# on chip a bool is a uint8 0/1 (the predicate dtype of tensor_copy_predicated, §4.4)
SBUF_DTYPES = {**NL_DTYPES, "bool": "nl.uint8"}


@dataclass(frozen=True, slots=True)
class Tile:
    """A value held on chip for the current tile: the expression naming it, whether it spans
    the free axis (``(P, F)``) or is one element per partition (``(P, 1)``), its dtype."""

    var: str
    wide: bool
    dtype: str

    def __str__(self) -> str:
        return self.var


@dataclass(frozen=True, slots=True)
class Lazy:
    """An instruction not written yet, because its only consumer can fold it into its own:
    ``op(x)`` on ScalarE (``kind="act"``: a following sum becomes the activation's
    accumulate) or ``x op operand`` on VectorE (``kind="ts"``: a following op with a scalar
    operand becomes the second stage of one ``tensor_scalar``, a following activation takes
    it as its ``scale`` or ``bias``).  ``name`` is the tile
    name it gets if written on its own."""

    kind: str
    name: str
    dtype: str
    x: Tile
    op: str
    operand: str = ""
    reverse: bool = False
    value: Any = None
    """The operand as given (a scalar or a ``(P, 1)`` Tile), for folding into ``scale``/``bias``."""
    op1: str = ""
    """A second ``tensor_scalar`` stage ``(x op operand) op1 operand1`` (``"ts"`` only): kept
    pending so that an activation can take a scale and a shift together (``rsqrt(mean + eps)``
    is one ScalarE instruction)."""
    operand1: str = ""

    @property
    def wide(self) -> bool:
        return self.x.wide


Arg = Any  # a Tile (or Lazy) for tensor arguments, else the Python scalar torch passed


class Body:
    """The instructions of one tile, as source lines.  ``shape(wide)`` is the tile shape
    expression (``(p, f)`` or ``(p, 1)``), sized by the enclosing loops."""

    def __init__(
        self, p: str, f: str, indent: str, reduced_count: int = 1, fold: bool = False
    ) -> None:
        self.p, self.f, self.indent = p, f, indent
        self.fold = fold
        """Reductions finish across partitions; their results are ``(1, 1)`` tiles."""
        self.reduced_count = reduced_count
        """Elements per partition a reduction of this region reduces (means divide by it)."""
        self.lines: list[str] = []
        self.out_wide = False
        """Whether the result of the node being written spans the free axis."""
        self.prefix = "t"
        """Names of the tiles the next rule allocates (the node's value name)."""
        self._names: dict[str, int] = {}
        self._vec32: dict[str, str] = {}

    def shape(self, wide: bool) -> str:
        if self.fold and not wide:
            return "(1, 1)"
        return f"({self.p}, {self.f if wide else 1})"

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def new(self, dtype: str, wide: bool, hint: str | None = None, partials: bool = False) -> Tile:
        """A fresh SBUF tile (``partials``: ``(P, 1)`` even when reductions fold)."""
        base = hint or self.prefix
        k = self._names.get(base, 0)
        self._names[base] = k + 1
        var = base if k == 0 else f"{base}_{k}"
        shape = f"({self.p}, 1)" if partials else self.shape(wide)
        self.emit(f"{var} = nl.ndarray({shape}, dtype={SBUF_DTYPES[dtype]}, buffer=nl.sbuf)")
        return Tile(var, wide, dtype)

    def vec32(self, t: Tile) -> str:
        """``t`` (a ``(P, 1)`` tile) as an fp32 tile: tensor_scalar's vector operands are fp32."""
        if t.dtype == "float32":
            return t.var
        if t.var not in self._vec32:
            c = self.new("float32", False, f"{t.var.split('[')[0]}_f32")
            self.emit(f"nisa.tensor_copy(dst={c}, src={t})")
            self._vec32[t.var] = c.var
        return self._vec32[t.var]

    # -- building blocks -------------------------------------------------------------------
    def act(
        self, dtype: str, op: str, x: Tile, bias: str | None = None, scale: float = 1.0
    ) -> Tile:
        d = self.new(dtype, x.wide)
        extra = (f", bias={bias}" if bias else "") + (
            f", scale={lit(scale)}" if scale != 1.0 else ""
        )
        self.emit(f"nisa.activation(dst={d}, op=nl.{op}, data={x}{extra})")
        return d

    def force(self, a: Arg) -> Arg:
        """``a`` with a pending instruction written out (other arguments unchanged)."""
        if not isinstance(a, Lazy):
            return a
        d = self.new(a.dtype, a.wide, a.name)
        if a.kind == "act":
            self.emit(f"nisa.activation(dst={d}, op=nl.{a.op}, data={a.x})")
        else:
            rev = ", reverse0=True" if a.reverse else ""
            second = f", op1=nl.{a.op1}, operand1={a.operand1}" if a.op1 else ""
            self.emit(
                f"nisa.tensor_scalar(dst={d}, data={a.x}, op0=nl.{a.op}, "
                f"operand0={a.operand}{second}{rev})"
            )
        return d

    def pending_binary(self, dtype: str, op: str, x: Arg, y: Arg) -> Lazy | None:
        """``op(x, y)`` as a pending ``tensor_scalar`` when it is one (a ``(P, F)`` tile and a
        ``(P, 1)`` tile or a scalar), else None."""
        if (
            isinstance(x, Lazy)
            and x.kind == "ts"
            and not x.op1
            and not x.reverse
            and x.op in ("multiply", "divide")
            and _is_scalar(x.value)
            and op == "add"
            and (_is_scalar(y) or isinstance(y, Tile) and not y.wide)
        ):
            operand1 = lit(y) if _is_scalar(y) else self.vec32(y)
            return dataclasses.replace(x, dtype=dtype, op1="add", operand1=operand1)
        for data, other, rev in ((x, y, False), (y, x, True)):
            if isinstance(data, Tile) and not isinstance(other, Tile | Lazy):
                return Lazy("ts", self.prefix, dtype, data, op, lit(other), rev, other)
            if isinstance(data, Tile) and data.wide and isinstance(other, Tile) and not other.wide:
                return Lazy("ts", self.prefix, dtype, data, op, self.vec32(other), rev, other)
        return None

    def binary(self, dtype: str, op: str, x: Arg, y: Arg) -> Tile:
        """``op(x, y)`` elementwise with broadcasting between ``(P, F)`` and ``(P, 1)`` tiles
        and scalars (a ``(P, 1)`` or scalar operand is ``tensor_scalar``'s operand).  A
        pending ``tensor_scalar`` and a scalar or ``(P, 1)`` operand make one two-stage
        ``tensor_scalar`` (§4.6).  (A pending one and a ``(P, F)`` tile stay two
        instructions: the cost model rates ``scalar_tensor_tensor`` below a bf16
        ``tensor_scalar`` plus ``tensor_tensor``.)"""
        for lazy, other, rev in ((x, y, False), (y, x, True)):
            if (
                isinstance(lazy, Lazy)
                and lazy.kind == "ts"
                and not lazy.op1
                and (
                    not isinstance(other, Tile | Lazy) or isinstance(other, Tile) and not other.wide
                )
            ):
                # two ALU stages in one tensor_scalar: (x op0 a) op1 b
                operand = self.vec32(other) if isinstance(other, Tile) else lit(other)
                d = self.new(dtype, lazy.wide)
                flags = (", reverse0=True" if lazy.reverse else "") + (
                    ", reverse1=True" if rev else ""
                )
                self.emit(
                    f"nisa.tensor_scalar(dst={d}, data={lazy.x}, op0=nl.{lazy.op}, "
                    f"operand0={lazy.operand}, op1=nl.{op}, operand1={operand}{flags})"
                )
                return d
        x, y = self.force(x), self.force(y)
        xt, yt = isinstance(x, Tile), isinstance(y, Tile)
        if xt and yt and x.wide == y.wide:
            d = self.new(dtype, x.wide)
            self.emit(f"nisa.tensor_tensor(dst={d}, data1={x}, data2={y}, op=nl.{op})")
            return d
        if xt and (not yt or x.wide):
            operand = self.vec32(y) if yt else lit(y)
            d = self.new(dtype, x.wide)
            self.emit(f"nisa.tensor_scalar(dst={d}, data={x}, op0=nl.{op}, operand0={operand})")
            return d
        if yt:
            operand = self.vec32(x) if xt else lit(x)
            d = self.new(dtype, y.wide)
            self.emit(
                f"nisa.tensor_scalar(dst={d}, data={y}, op0=nl.{op}, operand0={operand}, "
                "reverse0=True)"
            )
            return d
        raise ValueError(f"{op} of two scalars")

    def copy(self, dtype: str, x: Tile, wide: bool | None = None) -> Tile:
        """``x`` converted to ``dtype`` (through fp32, rounding to nearest even), widened to a
        ``(P, F)`` tile when ``wide`` and ``x`` is ``(P, 1)``."""
        wide = x.wide if wide is None else wide
        d = self.new(dtype, wide)
        if wide and not x.wide:
            self.emit(f"nisa.memset(dst={d}, value={zero(dtype)})")
            self.emit(
                f"nisa.tensor_scalar(dst={d}, data={d}, op0=nl.add, operand0={self.vec32(x)})"
            )
        else:
            self.emit(f"nisa.tensor_copy(dst={d}, src={x})")
        return d

    def fill(self, dtype: str, wide: bool, value: Any) -> Tile:
        d = self.new(dtype, wide)
        self.emit(f"nisa.memset(dst={d}, value={lit(value, dtype)})")
        return d

    def reduce(self, dtype: str, op: str, x: Tile, negate: bool = False) -> Tile:
        if self.fold:
            return self._fold_reduce(dtype, op, x)
        d = self.new(dtype, False)
        neg = ", negate=True" if negate else ""
        self.emit(f"nisa.tensor_reduce(dst={d}, op=nl.{op}, data={x}, axis=1{neg})")
        return d

    def _fold_reduce(self, dtype: str, op: str, x: Tile) -> Tile:
        """Reduce along the free axis, then across partitions (GpSimd ``tensor_partition_reduce``,
        §4.9, which has add and max: a min is the negated max of the negation)."""
        var = self.new("float32", False, partials=True).var
        neg = ", negate=True" if op == "minimum" else ""
        self.emit(f"nisa.tensor_reduce(dst={var}, op=nl.{op}, data={x}, axis=1{neg})")
        op = "maximum" if op == "minimum" else op
        d = self.new("float32" if neg else dtype, False)
        self.emit(f"nisa.tensor_partition_reduce(dst={d}, op=nl.{op}, data={var})")
        return self.binary(dtype, "multiply", d, -1.0) if neg else d

    def sum_of(self, op: str, x: Tile, bias: str | None = None) -> tuple[Tile, Tile]:
        """``(op(x + bias), its sum over the free axis)`` as fp32 tiles, in one ScalarE
        instruction (``activation`` with the accumulate, §4.10)."""
        y = self.new("float32", True)
        s = self.new("float32", False)
        b = f", bias={bias}" if bias else ""
        self.emit(
            f"nisa.activation(dst={y}, op=nl.{op}, data={x}{b}, reduce_op=nl.add, "
            f"reduce_res={s}, reduce_cmd=nisa.reduce_cmd.reset_reduce)"
        )
        return y, s

    def where(self, dtype: str, cond: Tile, a: Arg, b: Arg) -> Tile:
        wide = any(isinstance(t, Tile) and t.wide for t in (cond, a, b))
        out = self._materialize(dtype, b, wide)
        src = self._materialize(dtype, a, wide)
        pred = cond if cond.wide == wide and cond.dtype == "bool" else self.copy("bool", cond, wide)
        self.emit(f"nisa.tensor_copy_predicated(dst={out}, src={src}, predicate={pred})")
        return out

    def _materialize(self, dtype: str, x: Arg, wide: bool) -> Tile:
        if isinstance(x, Tile):
            return self.copy(dtype, x, wide)
        return self.fill(dtype, wide, x)


def lit(v: Any, dtype: str = "float32") -> str:
    """A Python literal for an immediate: fp32 operands are floats, integer tiles take ints
    (memset's value must match its dtype, §4.4)."""
    if dtype in INTS or dtype == "bool":
        return str(int(v))
    v = float(v)
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


def zero(dtype: str) -> str:
    return lit(0, dtype)


# -- rules --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """How one ATen op is generated.  ``kind`` is its layout kind (see :func:`.layout.plan`);
    ``dims(node)`` the dimensions it reduces (reductions and row-wise ops); ``emit(b, node,
    args, kwargs)`` writes its instructions and returns its tile (a list for multi-result
    ops); ``check(node, dtypes)`` returns why a node cannot be generated, or None."""

    kind: str
    emit: Callable[..., Tile | list[Tile]]
    check: Callable[[Node, list[str]], str | None]
    dims: Callable[[Node], tuple[int, ...]] | None = None
    folds: bool = False
    """A reduction that can finish across partitions (:attr:`.layout.Plan.fold`)."""
    lazy: Callable[..., Lazy | None] | None = None
    """``lazy(b, node, args, kwargs)``: the op as one pending instruction (:class:`Lazy`), or
    None; used when its only consumer ``takes_lazy``."""
    takes_lazy: str = ""
    """The :class:`Lazy` kind its arguments may be (``"ts"``, ``"act"``), "" for none."""


def _floats(node: Node, dtypes: list[str]) -> str | None:
    """Arithmetic: float (or bool mask) operands, a float result."""
    for d in dtypes + [node.out.dtype]:
        if d not in FLOATS and d != "bool":
            return f"dtype {d} is not supported by {node.op} (float32, bfloat16, float16)"
    if node.out.dtype not in FLOATS:
        return f"{node.op} with a {node.out.dtype} result is not supported"
    return None


def _compare(node: Node, dtypes: list[str]) -> str | None:
    for d in dtypes:
        if d not in FLOATS and d != "bool":
            return f"dtype {d} is not supported by {node.op} (float32, bfloat16, float16, bool)"
    return None


def _cast(node: Node, dtypes: list[str]) -> str | None:
    ok = FLOATS | INTS | {"bool"}
    for d in dtypes + [node.out.dtype]:
        if d not in ok:
            return f"dtype {d} has no NKI tile dtype" + (
                " (int64 tensors stay on the CPU)" if d == "int64" else ""
            )
    if dtypes and dtypes[0] in FLOATS and node.out.dtype in INTS:
        # the engines round float->int to nearest even and saturate (reference/nki-0x.md §6.1)
        # where torch truncates: the device would give different integers
        return "float to integer casts round to nearest on NeuronCore (torch truncates)"
    return None


def _any(node: Node, dtypes: list[str]) -> str | None:
    ok = FLOATS | {"bool"}
    for d in dtypes + [node.out.dtype]:
        if d not in ok:
            return f"dtype {d} is not supported by {node.op}"
    return None


def _kw(node: Node) -> dict:
    return dict(node.kwargs)


def _arg(args: list, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


RULES: dict[str, Rule] = {}


def _rule(
    ops: str,
    kind: str = "map",
    check=_floats,
    dims=None,
    folds=False,
    lazy=None,
    takes_lazy="",
):
    def deco(fn):
        for op in ops.split():
            RULES[op] = Rule(kind, fn, check, dims, folds, lazy, takes_lazy)
        return fn

    return deco


# ScalarE activation functions, one instruction each (§4.10, §4.16)
_ACTIVATIONS = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "sin": "sin",
    "cos": "cos",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "silu": "silu",
    "relu": "relu",
    "abs": "abs",
    "erf": "erf",
    "sign": "sign",
}


def _is_scalar(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _act_rule(fn_name: str):
    def emit(b: Body, node: Node, args: list, kwargs: dict) -> Tile:
        x = args[0]
        if isinstance(x, Lazy):
            # ScalarE computes op(data * scale + bias): a pending scale or shift comes free
            v = x.value
            scalar = _is_scalar(v)
            if x.op1:  # (x * s) + b or (x / s) + b, made by pending_binary for this fold
                s = float(v) if x.op == "multiply" else 1.0 / float(v)
                return b.act(node.out.dtype, fn_name, x.x, bias=x.operand1, scale=s)
            if x.op == "multiply" and scalar and not x.reverse:
                return b.act(node.out.dtype, fn_name, x.x, scale=float(v))
            if x.op == "divide" and scalar and not x.reverse and v != 0:
                return b.act(node.out.dtype, fn_name, x.x, scale=1.0 / float(v))
            if x.op == "add" and (scalar or isinstance(v, Tile)):
                return b.act(node.out.dtype, fn_name, x.x, bias=x.operand)
            x = b.force(x)
        return b.act(node.out.dtype, fn_name, x)

    return emit


def _act_lazy(fn_name: str):
    def lazy(b: Body, node: Node, args: list, kwargs: dict) -> Lazy | None:
        if not isinstance(args[0], Tile):
            return None
        return Lazy("act", b.prefix, node.out.dtype, args[0], fn_name)

    return lazy


for _op, _fn in _ACTIVATIONS.items():
    RULES[f"{_op}.default"] = Rule(
        "map", _act_rule(_fn), _floats, lazy=_act_lazy(_fn), takes_lazy="ts"
    )


@_rule("gelu.default")
def _gelu(b, node, args, kwargs):
    approx = _arg(args, kwargs, 1, "approximate", "none")
    return b.act(node.out.dtype, "gelu_apprx_tanh" if approx == "tanh" else "gelu", args[0])


@_rule("reciprocal.default")
def _reciprocal(b, node, args, kwargs):
    # VectorE's reciprocal is the precise one (ScalarE's is a polynomial, §4.6)
    d = b.new(node.out.dtype, args[0].wide)
    b.emit(f"nisa.reciprocal(dst={d}, data={args[0]})")
    return d


@_rule("neg.default")
def _neg(b, node, args, kwargs):
    return b.binary(node.out.dtype, "multiply", args[0], -1.0)


_BINARY = {
    "mul": "multiply",
    "div": "divide",
    "maximum": "maximum",
    "minimum": "minimum",
    "fmax": "maximum",
    "fmin": "minimum",
}
_COMPARE = {
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
}


def _binary_rule(alu: str):
    def emit(b: Body, node: Node, args: list, kwargs: dict) -> Tile:
        return b.binary(node.out.dtype, alu, args[0], args[1])

    return emit


def _binary_lazy(alu: str):
    def lazy(b: Body, node: Node, args: list, kwargs: dict) -> Lazy | None:
        if alu == "multiply" and isinstance(args[0], Tile) and args[1] is args[0]:
            return Lazy("act", b.prefix, node.out.dtype, args[0], "square")
        return b.pending_binary(node.out.dtype, alu, args[0], args[1])

    return lazy


for _op, _alu in _BINARY.items():
    for _ov in ("Tensor", "Scalar", "default"):
        RULES[f"{_op}.{_ov}"] = Rule(
            "map", _binary_rule(_alu), _floats, lazy=_binary_lazy(_alu), takes_lazy="ts"
        )
for _op, _alu in _COMPARE.items():
    for _ov in ("Tensor", "Scalar"):
        RULES[f"{_op}.{_ov}"] = Rule("map", _binary_rule(_alu), _compare)


def _check_div_mode(node: Node, dtypes: list[str]) -> str | None:
    mode = dict(node.kwargs).get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if mode is not None:
        return f"div with rounding_mode={mode!r} is not generated"
    return _floats(node, dtypes)


@_rule("div.Tensor_mode div.Scalar_mode", check=_check_div_mode)
def _div_mode(b, node, args, kwargs):
    return b.binary(node.out.dtype, "divide", args[0], args[1])


def _scaled(b: Body, y: Arg, alpha: Any) -> Arg:
    if alpha in (None, 1):
        return y
    if isinstance(y, Tile):
        return b.binary("float32", "multiply", y, float(alpha))
    return y * alpha


def _alpha_lazy(alu: str, swap: bool = False):
    def lazy(b: Body, node: Node, args: list, kwargs: dict) -> Lazy | None:
        if _arg(args, kwargs, 2, "alpha", 1) != 1:
            return None
        x, y = (args[1], args[0]) if swap else (args[0], args[1])
        return b.pending_binary(node.out.dtype, alu, x, y)

    return lazy


@_rule("add.Tensor add.Scalar", lazy=_alpha_lazy("add"), takes_lazy="ts")
def _add(b, node, args, kwargs):
    y = _scaled(b, args[1], _arg(args, kwargs, 2, "alpha", 1))
    return b.binary(node.out.dtype, "add", args[0], y)


@_rule("sub.Tensor sub.Scalar", lazy=_alpha_lazy("subtract"), takes_lazy="ts")
def _sub(b, node, args, kwargs):
    y = _scaled(b, args[1], _arg(args, kwargs, 2, "alpha", 1))
    return b.binary(node.out.dtype, "subtract", args[0], y)


@_rule("rsub.Tensor rsub.Scalar", lazy=_alpha_lazy("subtract", swap=True), takes_lazy="ts")
def _rsub(b, node, args, kwargs):
    x = _scaled(b, args[0], _arg(args, kwargs, 2, "alpha", 1))
    return b.binary(node.out.dtype, "subtract", args[1], x)


def _pow_lazy(b: Body, node: Node, args: list, kwargs: dict) -> Lazy | None:
    if args[1] == 2 and isinstance(args[0], Tile):
        return Lazy("act", b.prefix, node.out.dtype, args[0], "square")
    return None


@_rule("pow.Tensor_Scalar", lazy=_pow_lazy)
def _pow(b, node, args, kwargs):
    x, e = args[0], args[1]
    if e == 2:
        return b.binary(node.out.dtype, "multiply", x, x)
    if e == 1:
        return b.copy(node.out.dtype, x)
    if e == 0.5:
        return b.act(node.out.dtype, "sqrt", x)
    if e == -1:
        d = b.new(node.out.dtype, x.wide)
        b.emit(f"nisa.reciprocal(dst={d}, data={x})")
        return d
    return b.binary(node.out.dtype, "power", x, float(e))


@_rule("pow.Tensor_Tensor pow.Scalar")
def _pow_tt(b, node, args, kwargs):
    return b.binary(node.out.dtype, "power", args[0], args[1])


@_rule("clamp.default clamp_min.default clamp_max.default hardtanh.default")
def _clamp(b, node, args, kwargs):
    x = args[0]
    if node.op == "clamp_max.default":
        lo, hi = None, args[1]
    elif node.op == "hardtanh.default":
        lo, hi = _arg(args, kwargs, 1, "min_val", -1.0), _arg(args, kwargs, 2, "max_val", 1.0)
    else:
        lo, hi = _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
    if lo is not None:
        x = b.binary(node.out.dtype if hi is None else "float32", "maximum", x, lo)
    if hi is not None:
        x = b.binary(node.out.dtype, "minimum", x, hi)
    return x


def _check_clamp(node: Node, dtypes: list[str]) -> str | None:
    if any(isinstance(a, str) for a in node.args[1:]):
        return "clamp with tensor bounds is not generated (use maximum/minimum)"
    return _floats(node, dtypes)


for _op in ("clamp.default", "clamp_min.default", "clamp_max.default"):
    RULES[_op] = Rule("map", _clamp, _check_clamp)


@_rule("where.self", check=_any)
def _where(b, node, args, kwargs):
    return b.where(node.out.dtype, args[0], args[1], args[2])


@_rule("masked_fill.Scalar masked_fill.Tensor", check=_any)
def _masked_fill(b, node, args, kwargs):
    return b.where(node.out.dtype, args[1], args[2], args[0])


@_rule("logical_not.default", check=_compare)
def _logical_not(b, node, args, kwargs):
    return b.binary(node.out.dtype, "equal", args[0], 0.0)


@_rule("detach.default alias.default lift_fresh_copy.default", check=_any)
def _identity(b, node, args, kwargs):
    # an alias of a value already on chip: no instruction
    return args[0]


@_rule(
    "view.default _unsafe_view.default reshape.default unsqueeze.default squeeze.dim "
    "squeeze.dims squeeze.default expand.default",
    "view",
    _any,
)
def _view(b, node, args, kwargs):
    # the layout checked that no element moves: the tile is the value, widened if expanded
    x = b.force(args[0])
    return b.copy(x.dtype, x, True) if b.out_wide and not x.wide else x


@_rule("_to_copy.default clone.default", check=_cast)
def _to_copy(b, node, args, kwargs):
    x = args[0]
    if node.out.dtype == "bool" and x.dtype != "bool":
        return b.binary("bool", "not_equal", x, 0.0)
    return b.copy(node.out.dtype, x)


_FILL_VALUES = {"zeros_like": 0, "ones_like": 1, "zeros": 0, "ones": 1}


@_rule(
    "zeros_like.default ones_like.default full_like.default fill.Scalar full.default "
    "zeros.default ones.default scalar_tensor.default",
    "fill",
    _any,
)
def _fill(b, node, args, kwargs):
    name = node.op.split(".")[0]
    value = _FILL_VALUES.get(name)
    if value is None and name == "scalar_tensor":
        value = args[0]
    elif value is None:
        value = _arg(args, kwargs, 1, "value" if name == "fill" else "fill_value")
    return b.fill(node.out.dtype, b.out_wide, value)


# -- backward of elementwise functions ---------------------------------------------------------


@_rule("silu_backward.default")
def _silu_backward(b, node, args, kwargs):
    d = b.act("float32", "silu_dx", args[1])
    return b.binary(node.out.dtype, "multiply", args[0], d)


def _check_gelu_backward(node: Node, dtypes: list[str]) -> str | None:
    if dict(node.kwargs).get("approximate", "none") != "none" or (
        len(node.args) > 2 and node.args[2] != "none"
    ):
        return "gelu_backward with approximate='tanh' is not generated"
    return _floats(node, dtypes)


@_rule("gelu_backward.default", check=_check_gelu_backward)
def _gelu_backward(b, node, args, kwargs):
    d = b.act("float32", "gelu_dx", args[1])
    return b.binary(node.out.dtype, "multiply", args[0], d)


@_rule("sigmoid_backward.default")
def _sigmoid_backward(b, node, args, kwargs):
    g, y = args
    one_minus = b.binary("float32", "subtract", 1.0, y)
    return b.binary(node.out.dtype, "multiply", g, b.binary("float32", "multiply", y, one_minus))


@_rule("tanh_backward.default")
def _tanh_backward(b, node, args, kwargs):
    g, y = args
    sq = b.binary("float32", "multiply", y, y)
    return b.binary(node.out.dtype, "multiply", g, b.binary("float32", "subtract", 1.0, sq))


@_rule("threshold_backward.default")
def _threshold_backward(b, node, args, kwargs):
    g, x, threshold = args[0], args[1], args[2]
    keep = b.binary("bool", "greater", x, threshold)
    return b.where(node.out.dtype, keep, g, 0.0)


# -- reductions (over the free axis) ------------------------------------------------------------


def _reduce_dims(node: Node) -> tuple[int, ...]:
    """The dims a reduction reduces, in its operand's numbering (all of them when none given)."""
    kw = dict(node.kwargs)
    dims = node.args[1] if len(node.args) > 1 else kw.get("dim")
    if node.op in ("sum.default", "mean.default", "max.default", "min.default"):
        dims = None  # these overloads take no dims: they reduce everything
    if isinstance(dims, int):
        dims = (dims,)
    if not dims:
        return tuple(range(-64, 0))  # every dim (taken modulo the operand's rank)
    return tuple(dims)


def _keep(node: Node, kwargs: dict, i: int) -> bool:
    return bool(_arg(list(node.args), kwargs, i, "keepdim", False))


def _check_reduce(node: Node, dtypes: list[str]) -> str | None:
    kw = dict(node.kwargs)
    if kw.get("dtype") not in (None, node.out.dtype):
        return f"{node.op} with dtype={kw['dtype']} is not generated"
    return _floats(node, dtypes)


@_rule("sum.dim_IntList sum.default", "reduce", _check_reduce, _reduce_dims, True, takes_lazy="act")
def _sum(b, node, args, kwargs):
    s = _sum_into(b, node.out.dtype, args[0])
    return s if s.dtype == node.out.dtype else b.copy(node.out.dtype, s)


def _sum_into(b: Body, dtype: str, x: Arg) -> Tile:
    """The sum of ``x`` along the free axis; a pending activation accumulates it as it goes
    (one ScalarE pass instead of an activation and a reduce)."""
    if isinstance(x, Lazy) and x.kind == "act" and not b.fold and x.wide:
        return b.sum_of(x.op, x.x)[1]
    return b.reduce(dtype, "add", _wide(b, b.force(x)))


def _mean_lazy(b: Body, node: Node, args: list, kwargs: dict) -> Lazy:
    s = _sum_into(b, "float32", args[0])
    n = float(b.reduced_count)
    return Lazy("ts", b.prefix, node.out.dtype, s, "divide", lit(n), False, n)


@_rule(
    "mean.dim mean.default",
    "reduce",
    _check_reduce,
    _reduce_dims,
    True,
    lazy=_mean_lazy,
    takes_lazy="act",
)
def _mean(b, node, args, kwargs):
    s = _sum_into(b, "float32", args[0])
    return b.binary(node.out.dtype, "divide", s, float(b.reduced_count))


@_rule(
    "amax.default amin.default max.default min.default", "reduce", _check_reduce, _reduce_dims, True
)
def _amax(b, node, args, kwargs):
    op = "maximum" if node.op.startswith(("amax", "max")) else "minimum"
    return b.reduce(node.out.dtype, op, _wide(b, args[0]))


def _var_dims(node: Node) -> tuple[int, ...]:
    kw = dict(node.kwargs)
    dims = node.args[1] if len(node.args) > 1 else kw.get("dim")
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(dims) if dims else tuple(range(-64, 0))


def _variance(b: Body, node: Node, x: Tile, kwargs: dict) -> tuple[Tile, Tile]:
    n = b.reduced_count
    correction = kwargs.get("correction", None)
    correction = 1 if correction is None else correction
    s = b.reduce("float32", "add", x)
    mean = b.binary("float32", "divide", s, float(n))
    neg_mean = b.binary("float32", "multiply", mean, -1.0)
    _, ss = b.sum_of("square", x, bias=neg_mean.var)
    var = b.binary(node.out.dtype, "divide", ss, float(max(n - correction, 0)))
    return var, mean


@_rule("var.correction", "reduce", _check_reduce, _var_dims)
def _var(b, node, args, kwargs):
    return _variance(b, node, _wide(b, args[0]), kwargs)[0]


@_rule("var_mean.correction", "reduce", _check_reduce, _var_dims)
def _var_mean(b, node, args, kwargs):
    var, mean = _variance(b, node, _wide(b, args[0]), kwargs)
    return [var, b.copy(node.out.dtype, mean)]


def _wide(b: Body, x: Tile) -> Tile:
    return x if x.wide else b.copy(x.dtype, x, True)


# -- row-wise ops: softmax, norms ----------------------------------------------------------------


def _dim_arg(node: Node) -> tuple[int, ...]:
    return (node.args[1],)


@_rule("_softmax.default", "rows", dims=_dim_arg)
def _softmax(b, node, args, kwargs):
    x = _wide(b, args[0])
    neg_max = b.reduce("float32", "maximum", x, negate=True)
    e, s = b.sum_of("exp", x, bias=neg_max.var)
    return b.binary(node.out.dtype, "divide", e, s)


@_rule("_log_softmax.default", "rows", dims=_dim_arg)
def _log_softmax(b, node, args, kwargs):
    x = _wide(b, args[0])
    neg_max = b.reduce("float32", "maximum", x, negate=True)
    _, s = b.sum_of("exp", x, bias=neg_max.var)
    log_s = b.act("float32", "log", s)
    shifted = b.binary("float32", "add", x, neg_max)
    return b.binary(node.out.dtype, "subtract", shifted, log_s)


@_rule("_softmax_backward_data.default", "rows", dims=lambda n: (n.args[2],))
def _softmax_backward(b, node, args, kwargs):
    g, y = _wide(b, args[0]), _wide(b, args[1])
    gy = b.binary("float32", "multiply", g, y)
    s = b.reduce("float32", "add", gy)
    centered = b.binary("float32", "subtract", g, s)
    return b.binary(node.out.dtype, "multiply", centered, y)


@_rule("_log_softmax_backward_data.default", "rows", dims=lambda n: (n.args[2],))
def _log_softmax_backward(b, node, args, kwargs):
    g, y = _wide(b, args[0]), _wide(b, args[1])
    s = b.reduce("float32", "add", g)
    e = b.act("float32", "exp", y)
    es = b.binary("float32", "multiply", e, s)
    return b.binary(node.out.dtype, "subtract", g, es)


def _norm_dims(node: Node) -> tuple[int, ...]:
    return tuple(range(-len(node.args[1]), 0))


@_rule("native_layer_norm.default", "rows", dims=_norm_dims)
def _layer_norm(b, node, args, kwargs):
    x, _, w, bias, eps = (list(args) + [None] * 5)[:5]
    x = _wide(b, x)
    n = float(b.reduced_count)
    s = b.reduce("float32", "add", x)
    mean = b.binary("float32", "divide", s, n)
    xc = b.binary("float32", "subtract", x, mean)
    _, ss = b.sum_of("square", xc)
    var = b.binary("float32", "divide", ss, n)
    rstd = b.act("float32", "rsqrt", b.binary("float32", "add", var, float(eps)))
    y = b.binary(
        "float32" if w is not None or bias is not None else node.out.dtype, "multiply", xc, rstd
    )
    if w is not None:
        y = b.binary("float32" if bias is not None else node.out.dtype, "multiply", y, w)
    if bias is not None:
        y = b.binary(node.out.dtype, "add", y, bias)
    return [y, mean, rstd]


@_rule("rms_norm.default", "rows", dims=_norm_dims)
def _rms_norm(b, node, args, kwargs):
    x = _wide(b, args[0])
    w = _arg(args, kwargs, 2, "weight")
    eps = _arg(args, kwargs, 3, "eps")
    if eps is None:  # torch uses the input dtype's machine epsilon
        eps = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}[x.dtype]
    # torch.rms_norm computes in fp32 and rounds to the input dtype before the weight
    _, ss = b.sum_of("square", x)
    ms = b.binary("float32", "divide", ss, float(b.reduced_count))
    rstd = b.act("float32", "rsqrt", b.binary("float32", "add", ms, float(eps)))
    y = b.binary(x.dtype if w is not None else node.out.dtype, "multiply", x, rstd)
    if w is not None:
        y = b.binary(node.out.dtype, "multiply", y, w)
    return y


@_rule("getitem", "alias", _any)
def _getitem(b, node, args, kwargs):
    raise AssertionError("getitem is resolved by the code generator")


# in-place variants: the device writes the result back into the tensor; the kernel is the same
for _op in list(RULES):
    _name, _, _overload = _op.partition(".")
    if _name in (
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "clamp",
        "clamp_min",
        "clamp_max",
        "relu",
        "neg",
        "exp",
        "sqrt",
        "rsqrt",
        "sigmoid",
        "tanh",
        "silu",
        "gelu",
        "masked_fill",
        "abs",
        "reciprocal",
        "log",
        "sin",
        "cos",
        "hardtanh",
    ):
        RULES[f"{_name}_.{_overload}"] = RULES[_op]


def tensor_dtypes(node: Node, dtype_of: Callable[[str], str | None]) -> list[str]:
    """The dtypes of ``node``'s tensor arguments (``dtype_of`` answers None for non-names)."""
    out = []
    for a in list(node.args) + [v for _, v in node.kwargs]:
        for e in a if isinstance(a, tuple | list) else (a,):
            if isinstance(e, str):
                d = dtype_of(e)
                if d is not None:
                    out.append(d)
    return out
