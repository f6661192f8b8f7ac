"""The fast path's executor table: how each primitive runs in generated code.

:data:`EXECUTORS` has one :class:`Executor` per primitive of ``nkikit/ir/prims.py``, as the
reference interpreter's ``rules.RULES`` has one rule (``tests/ir/test_prims.py`` holds both
tables to the records).  An entry is one of:

* **generic** (``GENERIC``): the op's inputs are read in the generated code and the
  reference's own rule computes its results, which are written as the reference writes them;
* **special**: an emitter (registered with :func:`executes`, as xDSL registers ``@impl``\\ s)
  writes cheaper code with the reference's exact bits for the hottest instructions -- copies
  and fp32 ALU/activation/matmul straight into the destination (``out=``), with the same
  numpy call, rounding order and array layout as the rule.  An emitter returns None for an
  op it has no code for, and that op runs generic;
* **reference** (``REFERENCE``): every op runs on the reference interpreter, which shares the
  program's memory -- correct always, only slower; for rare primitives whose rule depends on
  more than the generated program passes it.

Every emitter gets the compiler (``Compiler``: access code, constants, plans), the op, the
code of its output accesses and whether it has a mask that holds; it returns the op's
lines.  Any access it asks for may add runtime conditions to ``compiler.conds``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ... import dtypes
from ...ir.affine import Affine, Axis, axis_env
from ...ir.core import Access, Op
from ...ir.prims import PrimError, reads_dst
from .access import AccessCode
from .runtime import DIRECT_CAST

if TYPE_CHECKING:
    from .codegen import Compiler

Emit = Callable[["Compiler", Op, list[AccessCode], bool], "list[str] | None"]
Results = Callable[["Compiler", Op, list[str]], "str | None"]
Indirect = Callable[["Compiler", Op], "list[str] | None"]


@dataclass(frozen=True, slots=True)
class Executor:
    """How the fast path runs one primitive.

    ``special``: cheaper code for it (None: the generic rule call).  ``results``: in the
    generic path, code for the rule's result list instead of a call of the reference's rule
    (its None: the reference runs the op).  ``indirect``: code for an op with a gather or
    scatter access (None: the reference runs those).  ``reference``: every op of it runs on
    the reference interpreter.  ``copy``: it copies one tile (unless it reads its
    destination), so load and store forwarding may replace it by a view."""

    special: Emit | None = None
    results: Results | None = None
    indirect: Indirect | None = None
    reference: bool = False
    copy: bool = False


GENERIC = Executor()
REFERENCE = Executor(reference=True)

EXECUTORS: dict[str, Executor] = {}


def executes(*names: str, **facts) -> Callable[[Emit], Emit]:
    """Register the decorated emitter as the ``special`` code of primitives ``names``
    (``facts``: the entry's other fields)."""

    def deco(fn: Emit) -> Emit:
        for name in names:
            EXECUTORS[name] = Executor(special=fn, **facts)
        return fn

    return deco


def executor(name: str) -> Executor:
    """The entry of primitive ``name``."""
    try:
        return EXECUTORS[name]
    except KeyError:
        raise PrimError(
            f"primitive {name!r} has no entry in the fast simulator's executor table "
            "(nkikit/sim/fast/executors.py EXECUTORS)"
        ) from None


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
# activation functions that are one ufunc applied to the fp32 argument (sin and arctan go
# through the reference's rule, which warns about arguments outside their valid range)
_UFUNC_ACT = {
    "exp": np.exp,
    "tanh": np.tanh,
    "square": np.square,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "negative": np.negative,
    "cos": np.cos,
    "log": np.log,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
}


# ---------------------------------------------------------------------------------------------
# moving data


def gather_scatter(c: Compiler, op: Op) -> list[str] | None:
    """A gather (``nl.load(t[idx, i_f])``) or scatter (``nl.store(t[idx, i_f], v)``):
    as whole rows where the access allows (``_rows_form``), else the reference's fancy
    index built from precomputed tile-axis grids and the index tile; the runtime index
    checked against the tensor (else the reference runs the op and raises its error), the
    same numpy gather or the same ``scatter`` function.  Read-modify-write DMAs
    (``nl.atomic_rmw``) stay with the reference."""
    if reads_dst(op) or len(op.outs) != 1:
        return None
    src, dst = op.ins[0], op.outs[0]
    if not isinstance(src, Access) or src.shape != dst.shape:
        return None
    if (src.indirect is None) == (dst.indirect is None):
        return None
    ind_acc = src if src.indirect is not None else dst
    ind = ind_acc.indirect
    assert ind is not None
    rt = c.access(ind, False, True)
    if rt is None:
        return None
    shape = ind_acc.shape
    tshape = ind_acc.tensor.shape
    d = ind_acc.indirect_dim
    for k, a in enumerate(ind_acc.index):
        if k != d:
            lo, hi = c.sym_range(a, shape)
            if lo < 0 or hi >= tshape[k]:
                return None  # the reference reports it
    opn = c.const(op, "OP")
    rows = _rows_form(c, ind_acc, rt.expr)
    index = _fancy_index(c, ind_acc, rt.expr) if rows is None else ""
    in_bounds = f"0 <= I[{d}].min() and I[{d}].max() < {tshape[d]}"
    odt = dst.tensor.dtype
    dt = c.const(odt, "DT")
    size = int(np.prod(shape))
    slot = c.slot(ind_acc.tensor)
    if src.indirect is not None:  # gather into a plain destination
        w = c.access(dst, True, True)
        if w is None:
            return None
        c.last_outs = [w]
        if dtypes.is_tf32(odt) or odt not in DIRECT_CAST and src.tensor.dtype != odt:
            write = f"_write({w.expr}, {{}}, {shape!r}, {size}, {dt})"
        else:
            write = f"_copy({w.expr}, {{}}, {dt})"
        if rows is not None:
            r_line, r_bounds, r_index, _ = rows
            return [
                r_line,
                f"if {r_bounds}:",
                "    " + write.format(f"{slot}[{', '.join(r_index)}].reshape({shape!r})"),
                "else:",
                f"    interp.exec_op({opn}, env)",
            ]
        lines = [f"I = {index}", f"if {in_bounds}:", "    " + write.format(f"{slot}[I]")]
    else:  # scatter a plain source
        r = c.access(src, False, True)
        if r is None:
            return None
        c.last_outs = None
        value = f"_prep({r.expr}, {shape!r}, {size}, {dt})"
        scatter = f"_scatter({slot}, I, {value}, None)"
        if rows is not None:
            r_line, r_bounds, r_index, region = rows
            put = f"{slot}[{', '.join(r_index)}] = {value}.reshape({region!r})"
            if r_line.startswith("R = int("):  # one runtime index: no two rows can meet
                body = ["    " + put]
            else:
                # partitions with one row index write the same elements: the last one's
                # stay (the reference's last-wins scatter), so only those are written
                kept = f"{slot}[{', '.join('R[K]' if x == 'R' else x for x in r_index)}]"
                body = [
                    "    K = _last_rows(R)",
                    "    if K is None:",
                    "        " + put,
                    "    else:",
                    f"        {kept} = {value}.reshape({region!r}).take(K, axis={d})",
                ]
            return [r_line, f"if {r_bounds}:", *body, "else:", f"    interp.exec_op({opn}, env)"]
        lines = [f"I = {index}", f"if {in_bounds}:", "    " + scatter]
    lines += ["else:", f"    interp.exec_op({opn}, env)"]
    return lines


def _fancy_index(c: Compiler, acc: Access, rt: str) -> str:
    """The reference's fancy index of an indirect access (``runtime.ind``): per dimension
    the tile-axis part, a constant array shared by ops of one kind (they then give equal
    table rows, which the table memo replays; the array is only read), the loop-dependent
    part, and the index tile's values along the indirect dimension."""
    shape = acc.shape
    grid = axis_env(shape)
    axes, bases = [], []
    for a in acc.index:
        ax = tuple((s, k) for s, k in a.terms if isinstance(s, Axis))
        if ax:
            key = ("AXS", shape, ax)
            name = c.const_names.get(key)
            if name is None:
                name = c.const_names[key] = c.const(sum(grid[s] * k for s, k in ax), "AXS")
            axes.append(name)
        else:
            axes.append("0")
        bases.append(
            c.aff(Affine(tuple((s, k) for s, k in a.terms if not isinstance(s, Axis)), a.const))
        )
    axes_s, bases_s = ", ".join(axes), ", ".join(bases)
    return f"_ind(({axes_s},), ({bases_s},), {acc.indirect_dim}, {rt}, {shape!r})"


def _rows_form(c: Compiler, acc: Access, rt: str) -> tuple[str, str, list[str], tuple] | None:
    """An indirect access whose runtime index is one per partition (an ``(P, 1)`` index
    tile) or one for the whole tile, and whose other dimensions each follow at most one tile
    axis with a positive step, in the tile's axis order: the same elements as the reference's
    fancy index, read or written by basic slicing plus (at most) one row array -- numpy
    then copies whole rows, not element by element.  (R's line, its bounds test, the index
    per tensor dimension -- "R" at the runtime one --, the indexed region's shape); None for
    any other access."""
    shape, ind, d = acc.shape, acc.indirect, acc.indirect_dim
    if ind is None or ind.tensor.dtype.kind not in "iu" or any(n != 1 for n in ind.shape[1:]):
        return None
    per_row = ind.shape[0] > 1
    if per_row and ind.shape[0] != shape[0]:
        return None
    parts: list[str] = []
    region: list[int] = []
    placed = {0} if per_row else set()
    last = 0 if per_row else -1  # the last tile axis placed: they must come in order
    base_d = "0"
    for k, a in enumerate(acc.index):
        live = [(s.k, x) for s, x in a.terms if isinstance(s, Axis) and shape[s.k] > 1]
        base = c.aff(Affine(tuple((s, x) for s, x in a.terms if not isinstance(s, Axis)), a.const))
        if k == d:
            if live:
                return None
            base_d = base
            parts.append("R")
            if per_row:
                region.append(shape[0])
            continue
        if not live:
            # per row, a fixed coordinate stays a slice: R is then the only array index, and
            # numpy keeps the dimensions where they are
            parts.append(f"{base}:{base} + 1" if per_row else base)
            if per_row:
                region.append(1)
            continue
        if len(live) != 1 or (per_row and k < d):
            return None
        j, step = live[0]
        if step <= 0 or j <= last:
            return None
        last = j
        placed.add(j)
        parts.append(f"{base}:{base} + {step * (shape[j] - 1) + 1}:{step}")
        region.append(shape[j])
    if placed != {j for j, n in enumerate(shape) if n > 1} | ({0} if per_row else set()):
        return None
    top = acc.tensor.shape[d]
    if per_row:
        line = f"R = ({rt}).reshape(-1).astype(np.int64) + ({base_d})"
        bounds = f"0 <= R.min() and R.max() < {top}"
    else:
        line = f"R = int(({rt}).reshape(-1)[0]) + ({base_d})"
        bounds = f"0 <= R < {top}"
    return line, bounds, parts, tuple(region)


@executes("dma_copy", copy=True, indirect=gather_scatter)
@executes("tensor_copy", copy=True)
def emit_copy(c: Compiler, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
    """A tile copy: numpy's cast loop straight into the destination where it rounds as the
    reference does, else the reference's write."""
    out = op.outs[0] if len(op.outs) == 1 else None
    if out is None or reads_dst(op):  # an atomic read-modify-write: generic
        return None
    odt = out.tensor.dtype
    if dtypes.is_tf32(odt):
        return None  # tf32 rounding: the reference's write does it
    src = op.ins[0]
    if not isinstance(src, Access) or src.shape != out.shape:
        return None
    r = c.access(src, False, True)
    if r is None:
        return None
    dt = c.const(odt, "DT")
    w = outs[0].expr
    if odt not in DIRECT_CAST and src.tensor.dtype != odt:
        return [f"_write({w}, {r.expr}, {tuple(out.shape)!r}, {int(np.prod(out.shape))}, {dt})"]
    return [f"_copy({w}, {r.expr}, {dt})"]


@executes("memset")
def emit_memset(c: Compiler, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
    """The value rounded once at compile time, stored by one assignment."""
    if len(op.outs) != 1:
        return None
    odt = op.outs[0].tensor.dtype
    v = dtypes.cast(np.full((1,), op.attrs["value"], dtype=np.float32), odt)
    if dtypes.is_tf32(odt):
        v = v.astype(np.float32)
    return [f"{outs[0].expr}[...] = {c.const(v[0], 'V')}"]


# ---------------------------------------------------------------------------------------------
# computing an fp32 value


class _Fp32:
    """An op computing an fp32 value, read for an emitter: ``ins`` is the code of each
    input as the rule receives it (fp32 arrays, floats), ``w`` the destination view.
    With an fp32 destination numpy writes the value in place (``direct``: ``out=``);
    otherwise it is computed into a temporary and rounded on the copy."""

    __slots__ = ("op", "out", "w", "dt", "direct", "ins")

    def finish(self, fn: str, args: str) -> list[str]:
        if self.direct:
            return [f"{fn}({args}, out={self.w})"]
        return [f"_copy({self.w}, {fn}({args}), {self.dt})"]

    def shaped(self, i: int) -> bool:
        """Input ``i`` is an immediate, the output's shape, or one value per partition."""
        x, out = self.op.ins[i], self.out
        return (
            not isinstance(x, Access)
            or x.shape == out.shape
            or (x.shape[0] == out.shape[0] and x.free_size == 1 and len(x.shape) == len(out.shape))
        )


def _fp32(c: Compiler, op: Op, outs: list[AccessCode], multi: bool = False) -> _Fp32 | None:
    """The inputs and destination of ``op`` (one output unless ``multi``), or None when its
    destination's rounding is not one numpy cast (tf32, or a dtype numpy does not cast to
    exactly and no fp32 destination to write in place)."""
    if not op.outs or (len(op.outs) != 1 and not multi):
        return None
    f = _Fp32()
    f.op = op
    f.out = out = op.outs[0]
    odt = out.tensor.dtype
    if dtypes.is_tf32(odt):
        return None  # tf32 rounding: the reference's write does it
    f.w = outs[0].expr
    f.direct = dtypes.storage_dtype(odt) == np.float32 and outs[0].layout_exact
    f.dt = c.const(odt, "DT")
    f.ins = []
    for x in op.ins:
        if isinstance(x, Access):
            r = c.access(x, False, False)
            if r is None:
                return None
            f.ins.append(c.f32(x, r))
        else:
            f.ins.append(repr(float(x)))
    if odt not in DIRECT_CAST and not f.direct:
        return None
    return f


@executes("bn_stats")
def emit_bn_stats(c: Compiler, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
    """The rule's float64 statistics without its mask copies (a mask that holds changes
    nothing in the reference's arithmetic)."""
    f = _fp32(c, op, outs)
    if f is None or len(op.ins) != 1:
        return None
    shape = tuple(f.out.shape)
    return [f"_write({f.w}, _bn_stats_all({f.ins[0]}), {shape!r}, {int(np.prod(shape))}, {f.dt})"]


@executes("tensor_tensor")
def emit_tensor_tensor(
    c: Compiler, op: Op, outs: list[AccessCode], masked: bool
) -> list[str] | None:
    """One ufunc of two same-shaped tiles."""
    f = _fp32(c, op, outs)
    if f is None:
        return None
    fn = _UFUNC_ALU.get(op.attrs["op"])
    if fn is None or op.ins[0].shape != f.out.shape or op.ins[1].shape != f.out.shape:
        return None
    return f.finish(c.const(fn, "UF"), f"{f.ins[0]}, {f.ins[1]}")


@executes("tensor_scalar", "scalar_tensor_tensor")
def emit_two_stage_alu(
    c: Compiler, op: Op, outs: list[AccessCode], masked: bool
) -> list[str] | None:
    """One or two ufunc stages; the intermediate stays an fp32 array, as in the rule."""
    f = _fp32(c, op, outs)
    if f is None:
        return None
    a, ins = op.attrs, f.ins
    if (
        a.get("reduce_op")
        or op.ins[0].shape != f.out.shape
        or not all(f.shaped(i) for i in range(len(ins)))
    ):
        return None
    f0 = _UFUNC_ALU.get(a["op0"])
    f1 = _UFUNC_ALU.get(a["op1"]) if a.get("op1") else None
    if f0 is None or (a.get("op1") and f1 is None):
        return None
    first = (ins[1], ins[0]) if a["reverse0"] else (ins[0], ins[1])
    if f1 is None:
        return f.finish(c.const(f0, "UF"), f"{first[0]}, {first[1]}")
    second = (ins[2], "y") if a["reverse1"] else ("y", ins[2])
    return [f"y = {c.const(f0, 'UF')}({first[0]}, {first[1]})"] + f.finish(
        c.const(f1, "UF"), f"{second[0]}, {second[1]}"
    )


@executes("nc_matmul")
def emit_matmul(c: Compiler, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
    """The rule's ``np.matmul`` into an fp32 (PSUM) destination; accumulation adds in place."""
    f = _fp32(c, op, outs)
    if f is None or not f.direct:
        return None
    mm = f"np.matmul({f.ins[0]}.T, {f.ins[1]}, dtype=np.float32)"
    if op.attrs.get("accumulate"):
        return [f"np.add({f.w}, {mm}, out={f.w})"]
    return [f"{f.w}[...] = {mm}"]


@executes("nc_transpose")
def emit_transpose(c: Compiler, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
    f = _fp32(c, op, outs)
    if f is None:
        return None
    return [f"_copy({f.w}, {f.ins[0]}.T, {f.dt})"]


def affine_select_results(c: Compiler, op: Op, ins: list[str]) -> str | None:
    """The rule's result list with its predicate as integer code (``predicate_code``)."""
    keep = c.predicate_code(op.attrs["pred"], op.outs[0].shape)
    if keep is None:
        return None
    return f"[_where({keep}, {ins[0]}, {c.const(np.float32(op.attrs['on_false']), 'F')})]"


@executes("affine_select", results=affine_select_results)
def emit_affine_select(
    c: Compiler, op: Op, outs: list[AccessCode], masked: bool
) -> list[str] | None:
    """The fill, then the kept elements copied over it where the destination is fp32."""
    f = _fp32(c, op, outs)
    if f is None:
        return None
    keep = c.predicate_code(op.attrs["pred"], f.out.shape)
    if keep is None:
        return None
    fill = c.const(np.float32(op.attrs["on_false"]), "F")
    if f.direct and op.ins[0].tensor.root is not f.out.tensor.root:
        return [f"np.copyto({f.w}, {fill})", f"np.copyto({f.w}, {f.ins[0]}, where={keep})"]
    return [f"_copy({f.w}, _where({keep}, {f.ins[0]}, {fill}), {f.dt})"]


@executes("activation")
def emit_activation(c: Compiler, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
    """``fn(data * scale + bias)`` for a function that is one ufunc, into a fresh fp32
    array (then rounded on the copy), and its free-axis reduction when it has one."""
    f = _fp32(c, op, outs, multi=True)
    if f is None:
        return None
    a, out, w, dt = op.attrs, f.out, f.w, f.dt
    fn = _UFUNC_ACT.get(a["op"])
    if fn is None or op.ins[0].shape != out.shape or not all(f.shaped(i) for i in range(3)):
        return None
    data, bias, scale = f.ins
    scale_is_one = isinstance(op.ins[2], float) and op.ins[2] == 1.0
    uf = c.const(fn, "UF")
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
        r = c.access(op.outs[1], True, False)
        if r is None or a["reduce_op"] not in _REDUCE_FAST:
            return None
        # y is a fresh C-ordered fp32 array: the reference's np.where(valid, y, id)
        # would be the same array, so the reduction sees the same layout
        red = c.const(_REDUCE_FAST[a["reduce_op"]], "RED")
        rdt = c.const(op.outs[1].tensor.dtype, "DT")
        p = out.shape[0]
        axes = tuple(range(1, len(out.shape)))
        lines.append(f"red = {red}(y, axis={axes!r}, keepdims=True).reshape({p}, 1)")
        if not c.dead(out.tensor):
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


# ---------------------------------------------------------------------------------------------
# the rest of the table

for _name in (
    "partition_broadcast",
    "tensor_reduce",
    "tensor_partition_reduce",
    "tensor_tensor_scan",
    "reciprocal",
    "select",
    "range_select",
    "select_reduce",
    "bn_aggr",
    "max8",
    "nc_find_index8",
    "nc_match_replace8",
    "local_gather",
    "nc_n_gather",
    "nc_matmul_mx",
    "quantize_mx",
    "activate2",
    "exponential",
    "tensor_scalar_cumulative",
    "sequence_bounds",
    "topk",
):
    EXECUTORS[_name] = GENERIC

# rare instructions whose rule needs more than the generated program hands it: the
# destination's old partitions (shuffle, nonzero_with_count), a side effect in the
# reference's order (device_print), the index expression over the tile (iota)
for _name in ("nc_stream_shuffle", "nonzero_with_count", "device_print", "iota"):
    EXECUTORS[_name] = REFERENCE

# the PRNG instructions (their state is an IR tensor, read and written in program order;
# the call's seed for the kernel-start seeding) and NkiScalar arithmetic: run by the
# reference's own rule on the shared memory, so both simulators draw the same stream
for _name in (
    "rng",
    "rand2",
    "dropout",
    "set_rng_seed",
    "rand_set_state",
    "rand_get_state",
    "scalar_arith",
):
    EXECUTORS[_name] = REFERENCE

# registers, rank_id and the collectives: a few per kernel; their rules ask the context for
# the rank and meet the other ranks (``sim/ranks.py``)
for _name in (
    "register_move",
    "rank_id",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "collective_permute",
    "all_gather_v",
    "all_to_all_v",
    "ring_rank_id",
):
    EXECUTORS[_name] = REFERENCE
