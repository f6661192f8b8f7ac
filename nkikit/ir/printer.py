"""A stable, readable text form of the IR (golden-file tested)."""

from __future__ import annotations

import os

from .. import dtypes
from .core import Access, Alloc, Kernel, Loop, Op, Tensor
from .prims import PRIMS
from .unrolled import UNROLLED


def _ty(t: Tensor) -> str:
    shape = ", ".join(str(s) for s in t.shape)
    par = f" par={t.par_axis}" if t.par_axis else ""
    return f"{t.buffer}[{shape}] {dtypes.name(t.dtype)}{par}"


def _operand(x) -> str:
    if isinstance(x, Access):
        return repr(x)
    if isinstance(x, float) and x.is_integer():
        return str(int(x)) + ".0"
    return repr(x)


def _attrs(op: Op) -> str:
    """The attributes that say something: set (not None) and not the record's default."""
    schema = PRIMS[op.prim].attr_index
    items = []
    for k, v in op.attrs.items():
        a = schema.get(k)
        if v is None or (a is not None and not a.required and _same(v, a.default)):
            continue
        items.append(k if v is True else f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}")
    return " {" + ", ".join(items) + "}" if items else ""


def _same(v: object, default: object) -> bool:
    # type-exact: 0 and 0.0 print differently, and a bool is no int here
    return type(v) is type(default) and v == default


def _loc(loc) -> str:
    return f"{os.path.basename(loc.file)}:{loc.line}" if loc and loc.line else "?"


def print_kernel(k: Kernel) -> str:
    params = ", ".join(f"%{t.name}: {_ty(t)}" for t in k.params)
    outs = ", ".join(f"%{t.name}" for t in k.outputs)
    grid = f"[{', '.join(map(str, k.grid))}]" if k.grid else ""
    lines = [f"kernel {k.name}{grid}({params}) -> ({outs})"]
    for t in k.tensors:
        if t.kind in ("hbm", "output", "const") or (t.base is not None):
            what = t.kind
            if t.base is not None:  # the same bytes in another dtype: a bit view
                same = dtypes.name(t.base.dtype) == dtypes.name(t.dtype)
                what = f"{'reshape' if same else 'bitcast'}(%{t.base.name})"
            lines.append(f"  %{t.name} = {what} : {_ty(t)}")

    def body(stmts, depth):
        pad = "  " * depth
        for s in stmts:
            if isinstance(s, Alloc):
                lines.append(f"{pad}%{s.tensor.name} = alloc : {_ty(s.tensor)}")
            elif isinstance(s, Loop) and s.device is not None:
                d = s.device
                head = (
                    f"while {_operand(d.cond)} != 0"
                    if d.stop is None
                    else f"for {_operand(d.counter)} in device_range("
                    f"{_operand(d.start)}, {_operand(d.stop)}, {d.step})"
                )
                lines.append(f"{pad}{head}:  # {_loc(s.loc)}")
                body(s.body, depth + 1)
            elif isinstance(s, Loop):
                # a re-rolled run of unrolled steps (``trace/reroll.py``) was a Python range
                kind = "" if s.kind == UNROLLED else f"{s.kind}_"
                lines.append(f"{pad}for {s.var.name} in {kind}range({s.trip}):  # {_loc(s.loc)}")
                body(s.body, depth + 1)
            else:
                outs = ", ".join(_operand(o) for o in s.outs)
                ins = ", ".join(_operand(i) for i in s.ins)
                mask = f" mask={s.mask!r}" if s.mask is not None else ""
                lhs = f"{outs} = " if outs else ""
                lines.append(f"{pad}{lhs}{s.prim}({ins}){_attrs(s)}{mask}  # {_loc(s.loc)}")

    body(k.body, 1)
    return "\n".join(lines) + "\n"
