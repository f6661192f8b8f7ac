"""Trace-time state: the kernel under construction, the open loop bodies, naming and scoping."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np

from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.affine import Affine, Axis, LoopVar, Predicate, Sym
from ..ir.core import ON_CHIP, Access, Alloc, Loop, Op, Operand, Stmt, Tensor, indirect_index_tiles
from ..ir.prims import EngineChoiceError, check_op, engine_of

_state = threading.local()
_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=[^=]")

_UNREAD = object()  # a line name_for has not read yet
LoopSite = tuple[str, int]  # a rolled loop's ``for`` statement: (file, line)


class Builder:
    """Collects the IR of one kernel while its Python function runs on proxies."""

    def __init__(
        self, name: str, grid: tuple[int, ...], splits: dict[LoopSite, int] | None = None
    ) -> None:
        """``splits``: the loop split plan of a trace that can be re-run (see
        :mod:`nkikit.trace.loops`); None when this trace cannot split loops."""
        self.name = name
        self.grid = grid
        self.body: list[Stmt] = []
        self.bodies: list[list[Stmt]] = [self.body]
        self.loops: list[LoopVar] = []
        self.tensors: list[Tensor] = []
        self.names: dict[str, int] = {}
        self.last_op: Op | None = None
        # a front end's calls whose checks passed, by what those checks read (operand kinds
        # and options) -> how to make the op again (``nkikit.nki.isa._kind``)
        self.accepted: dict[tuple, tuple] = {}
        self.instructions = 0  # NKI 0.x instructions traced so far (``nkikit.nki.isa._done``)
        self.fresh: set[int] = set()  # uids of temporaries no one has read yet
        # nl.program_id axes read while launched without a grid (each read 0): a hint for
        # outputs left partly unwritten (trace/outputs.py)
        self.unlaunched_program_ids: set[int] = set()
        # after ``t[...] = op(...)`` retargets op's result into t, the temporary's data lives
        # there: proxies of the temporary read through this map (see ``resolve``)
        self.aliases: dict[int, Access] = {}  # by the temporary's uid
        self.line_names: dict[tuple[str, int], str | None] = {}  # name_for's reading of a line
        self.splits = splits
        # the call's arrays, when it has them: what ``np.asarray(tile)`` inside the kernel
        # runs the instructions traced so far on (``nkikit.trace.peek``)
        self.concrete = None
        # the rolled loops traced so far: their ``for`` line and the factor they are split by
        self.loop_sites: dict[LoopVar, tuple[LoopSite, int]] = {}
        # open rolled loops whose first body copy is being traced: they may split in place
        # (``nkikit.trace.loops.InPlaceSplit``)
        self.first_pass: dict[LoopVar, object] = {}

    # -- naming ---------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        n = self.names.get(base, 0)
        self.names[base] = n + 1
        return base if n == 0 else f"{base}.{n}"

    def name_for(self, loc: SourceLoc, fallback: str) -> str:
        key = (loc.file, loc.line)
        try:
            got = self.line_names[key]
        except KeyError:  # read each line once per trace (an unrolled loop comes back to it)
            m = _ASSIGN.match(loc.text) if loc.line else None
            got = self.line_names[key] = m.group(1) if m else None
        return self.unique(got or fallback)

    # -- tensors --------------------------------------------------------------------------
    def new_tensor(
        self,
        shape: tuple[int, ...],
        dtype: np.dtype,
        buffer: str,
        *,
        kind: str = "temp",
        name: str | None = None,
        par_axis: int = 0,
        loc: SourceLoc | None = None,
        fallback: str = "t",
    ) -> Tensor:
        loc = loc or caller_loc()
        if name:
            tname = self.unique(name)
        else:  # name_for, inlined (an unrolled kernel allocates per step)
            got = self.line_names.get((loc.file, loc.line), _UNREAD)
            tname = self.name_for(loc, fallback) if got is _UNREAD else self.unique(got or fallback)
        t = Tensor(
            tname,
            tuple(map(int, shape)),
            dtype,
            buffer,
            kind=kind,
            par_axis=par_axis,
            loc=loc,
            scope=tuple(self.loops),
        )
        self.tensors.append(t)
        if kind == "temp":
            self.bodies[-1].append(Alloc(t))
        return t

    def check_scope(self, tensor: Tensor, loc: SourceLoc) -> None:
        root = tensor.root
        if root.kind != "temp":
            return
        scope = root.scope
        if tuple(self.loops[: len(scope)]) != scope:
            raise NkiError("err_local_variable_used_out_of_scope", loc, tensor=root.name)

    # -- statements -------------------------------------------------------------------------
    def emit(
        self,
        prim: str,
        outs: list[Access],
        ins: list[Operand],
        attrs: dict | None = None,
        *,
        mask=None,
        loc: SourceLoc | None = None,
    ) -> Op:
        """Append one op of primitive ``prim`` writing ``outs`` from ``ins`` and return it.

        The op is checked against the primitive's record (``nkikit/ir/prims.py``): a known
        primitive, inputs and outputs for its roles, attributes of its schema and types; its
        attributes are completed with the record's defaults, and the ``engine`` attribute
        holds the engine that runs it.  A front end that breaks the record is a bug in
        nkikit (``PrimError``); an engine the instruction cannot run on is the user's
        choice: ``err_invalid_argument`` at ``loc``.  Indirect accesses' index tiles are
        appended to the inputs.
        """
        loc = loc or caller_loc()
        try:
            full = check_op(prim, outs, ins, attrs or {})
        except EngineChoiceError as e:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{prim}",
                why=f"engine={e.engine} is not one of its engines ({', '.join(e.choices)})",
            ) from None
        return self.append(prim, outs, ins, full, mask, loc)

    def append(
        self,
        prim: str,
        outs: Sequence[Access],
        ins: Sequence[Operand],
        attrs: dict,
        mask: Predicate | None,
        loc: SourceLoc,
    ) -> Op:
        """:meth:`emit` for an op already checked against its record, ``attrs`` complete
        (the op keeps that dict): checks the scopes of its tensors, lists the index tiles of
        its indirect accesses among its inputs and appends it."""
        # an indirect access reads its index tile: list it as an input, so that every pass
        # that follows reads (liveness, dependencies, the simulators' memory plans) sees it
        ins = list(ins)
        outs = list(outs)
        n_ins = len(ins)
        indirect = False
        in_loop = bool(self.loops)
        # one pass over the accesses (an unrolled kernel appends an op per instruction)
        for a in (*outs, *ins):
            if type(a) is not Access and not isinstance(a, Access):
                continue
            if a.indirect is not None:
                indirect = True
            root = a.tensor
            if root.base is not None:
                root = root.root
            # check_scope, inlined for the common case (a kernel-level tensor)
            if root.scope and root.kind == "temp":
                if in_loop:
                    self.check_scope(root, loc)
                else:
                    raise NkiError("err_local_variable_used_out_of_scope", loc, tensor=root.name)
        if indirect:
            tiles = [a for a in (*outs, *ins) if isinstance(a, Access)]
            ins.extend(x for x in indirect_index_tiles(tiles) if x not in ins)
            for a in ins[n_ins:]:
                self.check_scope(a.tensor, loc)
        fresh = self.fresh
        if fresh:
            for a in ins:  # a temporary stays fresh (retargetable) until read
                if isinstance(a, Access):
                    fresh.discard(a.tensor.uid)
        op = Op(prim, outs, ins, attrs, loc, mask)
        self.bodies[-1].append(op)
        self.last_op = op
        return op

    @contextmanager
    def loop(self, var: LoopVar, loc: SourceLoc, device=None):
        body: list[Stmt] = []
        self.bodies[-1].append(Loop(var, body, loc, device))
        self.bodies.append(body)
        self.loops.append(var)
        self.last_op = None
        try:
            yield
        finally:
            self.bodies.pop()
            self.loops.pop()
            self.last_op = None

    def resplit(self, var: LoopVar, new: LoopVar, k: int, made: tuple[int, int]) -> None:
        """The innermost open loop, over ``var``, becomes a loop over ``new`` with
        ``var = k * new`` in the body traced so far (its first copy): its statements, the
        scopes of the tensors it created and the retargeted temporaries are rewritten.
        ``made``: the number of tensors and of retargeted temporaries when the loop opened
        (only those created since can mention ``var``; ``retarget`` removes only temporaries
        of the innermost body, so the earlier entries keep their positions)."""
        loop = self.bodies[-2][-1]
        assert isinstance(loop, Loop) and loop.var is var and self.loops[-1] is var
        mapping = {var: Affine.of(new) * k}
        _substitute_body(loop.body, var, mapping)
        loop.var = new
        self.loops[-1] = new
        for t in self.tensors[made[0] :]:
            if var in t.scope:
                t.scope = tuple(new if v is var else v for v in t.scope)
        fresh = len(self.aliases) - made[1]
        for uid, a in list(itertools.islice(reversed(self.aliases.items()), fresh)):
            if var in a.syms:
                self.aliases[uid] = a.substitute(mapping)

    def retarget(self, temp: Tensor, dst: Access) -> bool:
        """Make the op that just produced ``temp`` write ``dst`` instead (``dst[...] = op(...)``).

        Only valid when that op is the last one in the current body and nothing read ``temp``.
        """
        op = self.last_op
        if op is None or temp.uid not in self.fresh or not op.outs or op.outs[0].tensor is not temp:
            return False
        if temp.uid in self.aliases or not op.outs[0].is_whole:
            return False
        if dst.tensor.buffer != temp.buffer and not _writes_psum_too(op, temp, dst):
            # e.g. a TensorE result (PSUM) assigned into SBUF, or a load assigned into PSUM:
            # the instruction cannot write there, so keep the temporary and copy.
            return False
        target = reshape_access(dst, temp.shape)
        if target is None:
            return False
        op.outs[0] = target
        self.aliases[temp.uid] = target
        body = self.bodies[-1]
        for i in range(len(body) - 1, -1, -1):
            s = body[i]
            if isinstance(s, Alloc) and s.tensor is temp:
                del body[i]
                break
        self.tensors.remove(temp)
        self.fresh.discard(temp.uid)
        return True


def _substitute_body(body: list[Stmt], var: LoopVar, mapping: dict[Sym, Affine]) -> None:
    """Rewrite ``var`` by ``mapping`` in every index, mask and affine attribute of ``body``."""
    for s in body:
        if isinstance(s, Loop):
            _substitute_body(s.body, var, mapping)
        elif isinstance(s, Op):
            s.outs = [_sub(a, var, mapping) for a in s.outs]
            s.ins = [_sub(a, var, mapping) for a in s.ins]
            if s.mask is not None and var in s.mask.syms:
                s.mask = s.mask.substitute(mapping)
            for key, v in s.attrs.items():
                if isinstance(v, Affine | Predicate | Access):
                    s.attrs[key] = _sub(v, var, mapping)


def _sub(x, var: LoopVar, mapping: dict[Sym, Affine]):
    if isinstance(x, Access | Affine | Predicate) and var in x.syms:
        return x.substitute(mapping)
    return x


def _writes_psum_too(op: Op, temp: Tensor, dst: Access) -> bool:
    """VectorE and ScalarE write PSUM as well as SBUF, so their SBUF result may be retargeted
    into a PSUM tile (GpSimd and DMA have no path to PSUM)."""
    return (
        temp.buffer == "sbuf"
        and dst.tensor.buffer == "psum"
        and engine_of(op) in ("vector", "scalar")
    )


def reshape_access(access: Access, shape: tuple[int, ...]) -> Access | None:
    """View ``access`` with ``shape`` when both have the same non-unit dimensions in order."""
    if access.shape == shape:
        return access
    src = [k for k, s in enumerate(access.shape) if s != 1]
    dst = [k for k, s in enumerate(shape) if s != 1]
    if [access.shape[k] for k in src] != [shape[k] for k in dst]:
        return None
    mapping: dict[Sym, Affine] = {Axis(k): Affine() for k, s in enumerate(access.shape) if s == 1}
    for a, b in zip(src, dst):
        mapping[Axis(a)] = Affine.of(Axis(b))
    return access.remap(shape, mapping)


def resolve(access: Access) -> Access:
    """Follow retargeted temporaries of the kernel being traced to where their data really
    lives (outside a trace, ``access`` itself)."""
    b = getattr(_state, "builder", None)
    if b is None or not b.aliases:
        return access
    aliases = b.aliases
    while (target := aliases.get(access.tensor.uid)) is not None:
        mapping = {Axis(k): a for k, a in enumerate(access.index)}
        access = target.remap(access.shape, mapping)
    return access


def current(api: str = "this API") -> Builder:
    b = getattr(_state, "builder", None)
    if b is None:
        raise NkiError("err_nki_api_outside_of_nki_kernel", caller_loc(), api=api)
    return b


def maybe_current() -> Builder | None:
    return getattr(_state, "builder", None)


@contextmanager
def tracing(builder: Builder):
    prev = getattr(_state, "builder", None)
    _state.builder = builder
    try:
        yield builder
    finally:
        _state.builder = prev


def is_on_chip(t: Tensor) -> bool:
    return t.buffer in ON_CHIP
