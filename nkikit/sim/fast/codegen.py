"""Code generation: the kernel's IR as one Python function over numpy.

:class:`Compiler` writes ``def _kernel(mem, interp)``: storage set up once per call, the
grid and the IR's loops as ``for`` loops over ``range``, and for every op the lines its
executor (``executors.EXECUTORS``) writes, guarded by the runtime conditions its accesses
and mask need; where one fails, or where no compiled form exists, the op runs on the
reference interpreter (``interp.exec_op``), which shares the program's memory.  Large
unrolled kernels are generated table-driven (``table.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes
from ...ir.affine import ProgramId
from ...ir.core import Access, Alloc, Kernel, Loop, Op, Tensor
from ...ir.prims import PRIMS
from ..interp import scatter
from ..rules import RULES
from . import runtime, table
from .access import AccessCode
from .executors import executor
from .plan import Planner, writes_all
from .runtime import Program
from .table import TableMode

_NUMPY_FLOATS = frozenset(map(np.dtype, (np.float16, np.float32, np.float64)))


class Compiler(Planner, TableMode):
    """Compiles one kernel: ``build()`` returns its :class:`Program`."""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        self.lines: list[str] = []
        self.ns.update(
            {
                "np": np,
                "_f32": runtime.f32,
                "_write": runtime.write,
                "_copy": runtime.copy,
                "_bt": np.broadcast_to,
                "_sv": runtime.strided_view,
                "_cast": dtypes.cast,
                "_alias": dtypes.alias_storage,
                "_where": np.where,
                "_bn_stats_all": runtime.bn_stats_all,
                "_prep": runtime.prep,
                "_ind": runtime.ind,
                "_scatter": scatter,
                "_last_rows": runtime.last_rows,
                # repr() of a non-finite float scalar is `inf` / `nan`: the names it refers to
                "inf": float("inf"),
                "nan": float("nan"),
            }
        )
        self.n_fallback = 0
        self.ints: dict[int, int] = {}
        self.last_outs: list[AccessCode] | None = None

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def build(self) -> Program:
        k = self.k
        self.chunked = self.n_statements > table.TABLE_ABOVE
        self.templates = {}
        self.chunks = []
        self.bound = []
        self._signatures = {}
        self._memo = {}
        self._poison = {}
        self._bound_key = ()
        self._tflags = {}
        self.n_replayed = 0
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
        rows = []
        storage: dict[int, tuple[str, np.dtype]] = {}  # id(dtype) -> its storage (and name)
        for t in temps:
            hit = storage.get(id(t.dtype))
            if hit is None:
                sdt = dtypes.storage_dtype(t.dtype)
                hit = storage[id(t.dtype)] = (self.const(sdt, "DT"), sdt)
            dt, sdt = hit
            off = offsets[t.uid]
            nbytes = math.prod(t.shape) * sdt.itemsize
            if self.chunked:
                rows.append((t.uid, off, off + nbytes, sdt, t.shape))
                continue
            self.emit(
                f"{self.slot(t)} = mem[{t.uid}] = arena[{off}:{off + nbytes}].view({dt}).reshape({t.shape!r})",
                1,
            )
        if rows:
            self.emit(f"for uid, lo, hi, dt, shape in {self.const(rows, 'TEMPS')}:", 1)
            self.emit("mem[uid] = arena[lo:hi].view(dt).reshape(shape)", 2)
        # reshapes, outermost base first
        done: set[int] = set()
        views = []

        def view(t: Tensor) -> None:
            if t.base is None or t.uid in done:
                return
            view(t.base)
            done.add(t.uid)
            dt = self.const(t.dtype, "DT")
            if self.chunked:
                views.append((t.uid, t.base.uid, t.base.base is not None, self.ns[dt], t.shape))
            else:
                self.emit(f"{self.slot(t)} = _alias({self.slot(t.base)}, {dt}, {t.shape!r})", 1)

        for t in self.tensors.values():
            view(t)
        # before the shadows: a forwarded tile keeps no shadow.  A table-driven kernel forwards
        # nothing: at 10^5 statements the analysis costs 0.43 s of generation and saves 0.1 s
        # per run, and an unrolled kernel that large is mostly run once (a test, a first call)
        self.plan_forwarding(scan=not self.chunked)
        poison_start = {}
        for t in self.tensors.values():
            if t.base is None and t.kind in ("hbm", "output"):
                poison_start[t.uid] = self.needs_poison_hbm(t)
        self.plan_shadows()
        # a shadow lives as long as its tile: the shadows get an arena of their own, planned
        # over the shadowed tiles' lifetimes as the tiles' arena is (``plan_arena``), each
        # offset scaled to fit the fp32 copy -- the shadows take their peak at any one time,
        # not the sum over every tile of an unrolled kernel
        spans: dict[int, tuple[int, int]] = {}
        sbytes = 0
        if self.shadow:
            shadowed = [self.tensors[uid] for uid in sorted(self.shadow)]
            soffsets, stotal = self.plan_arena(shadowed)
            scale = 4 // min(dtypes.storage_dtype(t.dtype).itemsize for t in shadowed)
            sbytes = scale * stotal
            for t in shadowed:
                lo = scale * soffsets[t.uid]
                spans[t.uid] = (lo, lo + 4 * math.prod(t.shape))
        if self.chunked:
            # V: reshaped views, B: the own buffers of forwarded tiles, S: fp32 shadows
            self.emit("V = {}", 1)
            if views:
                self.emit(f"for uid, base, of_view, dt, shape in {self.const(views, 'VIEWS')}:", 1)
                self.emit("V[uid] = _alias(V[base] if of_view else mem[base], dt, shape)", 2)
            fwd = self.const(sorted(self.forwarded), "FWD")
            self.emit(f"B = {{uid: mem[uid] for uid in {fwd}}}", 1)
            shadows = [(uid, self.tensors[uid].shape, *spans[uid]) for uid in sorted(self.shadow)]
            if shadows:
                self.emit(f"sarena = np.empty({sbytes}, np.uint8)", 1)
            self.emit(
                "S = {uid: sarena[lo:hi].view(np.float32).reshape(shape) for uid, shape, lo, hi "
                f"in {self.const(shadows, 'SHADOWS')}}}",
                1,
            )
        else:
            if self.shadow:
                self.emit(f"sarena = np.empty({sbytes}, np.uint8)", 1)
            for uid in sorted(self.shadow):
                lo, hi = spans[uid]
                shape = self.tensors[uid].shape
                self.emit(f"s{uid} = sarena[{lo}:{hi}].view(np.float32).reshape({shape!r})", 1)
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
        return Program(k, source, self.ns, poison_start, self.n_fallback, self.writes)

    # -- statements ---------------------------------------------------------------------------
    def body(self, stmts: list, depth: int, top: bool = False) -> None:
        if not stmts:
            self.emit("pass", depth)
            return
        if self.chunked and (top or len(stmts) > table.TABLE_BODY):
            # the kernel's own body always (its driver holds no tensor locals), and any
            # body too long to be one function
            self.table(stmts, depth)
            return
        self.statements(stmts, 0, len(stmts), depth)

    def _poison_fill(self, t: Tensor, shadow: str | None = None) -> str:
        """The line that fills temporary ``t`` with its poison (or its fp32 ``shadow`` with
        the poison widened to fp32, the bits a copy of the tile would give).  A non-numpy
        storage (ml_dtypes' bf16, fp8) and the shadow are filled through an unsigned view
        with the bit pattern: the same bits as ``fill`` converting per element, ~6x faster."""
        sdt = dtypes.storage_dtype(t.dtype)
        value = np.array(dtypes.poison_value(t.dtype), dtype=sdt)
        if shadow is not None:
            value = dtypes.to_f32(value)
        elif sdt.kind in "biu" or sdt in _NUMPY_FLOATS:
            return f"{self.slot(t)}.fill({self.const(value[()], 'POISON')})"
        bits = value.view(np.dtype(f"u{value.dtype.itemsize}"))
        target = shadow or self.slot(t)
        return f"{target}.view({self.const(bits.dtype, 'DT')}).fill({int(bits)})"

    def statements(self, stmts: list, lo: int, hi: int, depth: int) -> None:
        for i in range(lo, hi):
            s = stmts[i]
            if isinstance(s, Alloc):
                t = s.tensor
                if t.uid in self.forwarded:
                    self.emit(f"m{t.uid} = mem[{t.uid}] = b{t.uid}", depth)
                poison = self._poison.pop(id(s), None)  # decided by table mode's memo key
                if poison is None:
                    poison = self.needs_poison_temp(t, stmts, i + 1)
                if poison:
                    self.emit(self._poison_fill(t), depth)
                    if t.uid in self.shadow:  # the poison widened, as a copy would widen it
                        self.emit(self._poison_fill(t, f"s{t.uid}"), depth)
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

    # -- ops ----------------------------------------------------------------------------------
    def fallback(self, op: Op, depth: int) -> None:
        self.n_fallback += 1
        name = self.const(op, "OP")
        self.emit(f"interp.exec_op({name}, env)", depth)

    def refresh_shadow(self, op: Op, depth: int, outs: list[AccessCode] | None) -> None:
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

    def op(self, op: Op, depth: int) -> None:
        """An op, with the forwarding plan applied and dead results dropped."""
        if not self.chunked:  # templates are shared by many ops: they carry no comment
            self.emit(f"# {op.prim} {op.loc}", depth)
        t = self.load_fwd.get(id(op))
        if t is not None:
            src = self.static_access(op.ins[0], False)
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
            dst = self.static_access(st_op.outs[0], True)
            self.emit(f"v = {dst.expr}", depth)
            self.emit(f"m{t.uid} = mem[{t.uid}] = v if v.flags.c_contiguous else b{t.uid}", depth)
        if (
            op.outs
            and all(self.dead(o.tensor) for o in op.outs)
            and writes_all(op)
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
        """The op's compiled lines under their runtime conditions, else the reference."""
        mp = self.mask_plan(op)
        if executor(op.prim).reference or mp is None:
            self.fallback(op, depth)
            self.refresh_shadow(op, depth, None)
            return
        self.conds = [] if mp[1] is None else [mp[1]]
        self.last_outs = None
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
        """Generated lines for an op that runs unmasked (its mask, if any, holds): its
        executor's special code, else the generic rule call; None: only the reference."""
        ex = executor(op.prim)
        if any(isinstance(a, Access) and a.indirect is not None for a in (*op.outs, *op.ins)):
            return ex.indirect(self, op) if ex.indirect is not None else None
        raw = PRIMS[op.prim].raw
        outs = []
        for o in op.outs:
            w = self.access(o, True, raw)
            if w is None:
                return None
            outs.append(w)
        self.last_outs = outs
        if ex.special is not None:
            special = ex.special(self, op, outs, masked)
            if special is not None:
                return special
        return self.generic_lines(op, outs, masked)

    def generic_lines(self, op: Op, outs: list[AccessCode], masked: bool) -> list[str] | None:
        """The inputs read as the reference reads them, the results from the reference's
        rule (or the executor's ``results`` code), written as the reference writes them."""
        raw = PRIMS[op.prim].raw
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
        results = executor(op.prim).results
        if results is not None:
            code = results(self, op, ins)
            if code is None:
                return None
            lines.append(f"R = {code}")
        else:
            # the reference's rule and context: a destination it reads (accumulate, rmw) is
            # read through the interpreter, which shares this program's memory
            rule = self.const(RULES[op.prim], "RULE")
            ctx = f"interp.context({opn}, env, {valid})"
            lines.append(f"R = {rule}({opn}, [{', '.join(ins)}], {ctx})")
        for j, (o, w) in enumerate(zip(op.outs, outs)):
            dt = self.const(o.tensor.dtype, "DT")
            size = int(np.prod(o.shape))
            lines.append(
                f"if R[{j}] is not None: _write({w.expr}, R[{j}], {tuple(o.shape)!r}, {size}, {dt})"
            )
        return lines
