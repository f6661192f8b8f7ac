"""The reference interpreter: runs a kernel's IR on numpy arrays with NKI semantics.

Memory is numpy arrays in each tensor's dtype.  Every op reads its inputs (widened to fp32,
unless its primitive moves raw bits), applies its rule from ``rules.RULES`` with an
:class:`OpContext`, and writes each output once, rounded to the output's dtype.  The loop is
the same for every primitive: what one needs beyond its inputs (the destination's old value,
the loop values, the seed) it asks the context for.  Fresh buffers are poisoned (NaN for
floats).  Accesses are bounds-checked; masked-off elements are neither read nor written.
A verified kernel's rules produce exactly the elements each output access holds (in the
access's shape, or in another free shape with the same elements per partition); anything
else is a bug in nkikit and raises ``PrimError``, never a silent broadcast.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np

from .. import dtypes
from ..errors import NkiError, NkiInternalError
from ..ir.affine import Axis, LoopVar, ProgramId, axis_env
from ..ir.core import Access, Alloc, Kernel, Loop, Op, Tensor, declared_inputs
from ..ir.prims import PRIMS, PrimError, mask_ref
from .blas import one_blas_thread
from .memory import reserve
from .rules import RULES

# a while loop that has not ended after this many iterations is reported, not run forever
_MAX_DEVICE_ITERATIONS = 1 << 24
# a while loop's state is compared across an iteration only while it is at most this large
_SNAPSHOT_BYTES = 64 << 20
_PLAIN = (int, float, str, bool, type(None), np.generic, np.dtype, enum.Enum)


def _carried_state(loop: Loop) -> list[int] | None:
    """The uids of the tensors a while loop's body writes that its condition register depends
    on: the register, every tensor read by an op of the body that writes one of them, and so
    on (the PRNG state and registers are tensors too).  An iteration that leaves them as it
    found them leaves the next one the same condition and the same inputs for it: the loop
    never ends.  None when an iteration may depend on more than memory: an index or a mask of
    the loop's own variable, an attribute that is not a plain value."""
    var = loop.var
    ops: list[Op] = []  # the body's ops, nested loops' included
    counters: list[tuple[int, list[int]]] = []  # a nested device loop's counter and bounds

    def plain(v) -> bool:
        return (
            isinstance(v, _PLAIN)
            or callable(v)
            or (isinstance(v, tuple | list) and all(plain(x) for x in v))
        )

    def mentions_var(a: Access) -> bool:
        return any(s == var for x in a.index for s, _ in x.terms) or (
            a.indirect is not None and mentions_var(a.indirect)
        )

    def walk(body) -> bool:
        for s in body:
            if isinstance(s, Op):
                if any(isinstance(x, Access) and mentions_var(x) for x in (*s.outs, *s.ins)):
                    return False
                if not all(plain(v) for v in s.attrs.values()):
                    return False
                if s.mask is not None and var in s.mask.syms:
                    return False
                ops.append(s)
            elif isinstance(s, Loop):
                d = s.device
                if d is not None and d.counter is not None:
                    bounds = [x for x in (d.start, d.stop) if isinstance(x, Access)]
                    counters.append(
                        (d.counter.tensor.root.uid, [x.tensor.root.uid for x in bounds])
                    )
                if not walk(s.body):
                    return False
        return True

    if loop.device.cond is None or not walk(loop.body):
        return None
    needed = {loop.device.cond.tensor.root.uid}
    written: set[int] = set()
    writers = []
    for op in ops:
        outs = {o.tensor.root.uid for o in op.outs if isinstance(o, Access)}
        ins = {x.tensor.root.uid for x in op.ins if isinstance(x, Access)}
        ins |= {x.indirect.tensor.root.uid for x in (*op.outs, *op.ins)
                if isinstance(x, Access) and x.indirect is not None}  # fmt: skip
        writers.append((outs, ins | outs))  # a write may keep part of its old value
        written |= outs
    for counter, bounds in counters:
        writers.append(({counter}, {counter, *bounds}))
        written.add(counter)
    grew = True
    while grew:  # the tensors the condition depends on, to a fixed point
        grew = False
        for outs, reads in writers:
            if not outs.isdisjoint(needed) and not reads <= needed:
                needed |= reads
                grew = True
    return sorted(needed & written)


class _Plan:
    """How to turn an access into numpy indexing: basic slices when each tensor dimension
    follows at most one tile axis in order; otherwise a strided view (``strided``: per tensor
    dimension its tile-axis terms) when the tensor's memory allows one, else broadcast index
    arrays."""

    __slots__ = ("basic", "dims", "shape", "reshape", "bshape", "bcast", "strided", "injective")

    def __init__(self, access: Access) -> None:
        self.shape = access.shape
        axes_seen: list[int] = []
        basic = True
        dims = []
        for a in access.index:
            ax = [(s.k, c) for s, c in a.terms if isinstance(s, Axis)]
            if len(ax) > 1 or (ax and ax[0][1] <= 0):
                basic = False
            if ax:
                axes_seen.append(ax[0][0])
            dims.append(ax[0] if len(ax) == 1 else None)
        if basic and (axes_seen != sorted(axes_seen) or len(set(axes_seen)) != len(axes_seen)):
            basic = False
        self.basic = basic
        self.dims = dims
        # tile axes no tensor dimension follows are broadcast (read with stride 0)
        self.bshape = tuple(s if k in axes_seen else 1 for k, s in enumerate(self.shape))
        self.bcast = self.bshape != tuple(self.shape)
        kept = [self.shape[k] for k in axes_seen]
        self.reshape = basic and tuple(kept) != self.bshape
        # every tile axis term of every dimension: an access no slice expresses (several
        # axes in one dimension, a reversed axis) is still an affine map of the tile, which
        # one strided view of the tensor's memory reads without building index arrays
        self.strided = tuple(
            tuple((s.k, c) for s, c in a.terms if isinstance(s, Axis)) for a in access.index
        )
        self.injective = injective(self.strided, self.shape)


class Interpreter:
    """Runs one kernel.  ``run(args)`` returns the output arrays."""

    def __init__(self, kernel: Kernel, *, seed: int = 0, rank: int = 0, world=None) -> None:
        self.kernel = kernel
        self.seed = seed
        # the rank this run is and the rendezvous of its collectives (``sim/ranks.py``)
        self.rank = rank
        self.world = world
        self.mem: dict[int, np.ndarray] = {}
        self.plans: dict[int, _Plan] = {}
        self.declared: dict[int, int] = {}  # id(op) -> its declared inputs (declared_inputs)

    # -- memory -------------------------------------------------------------------------------
    def storage(self, t: Tensor) -> np.ndarray:
        if t.base is not None:  # a reshape, or a dtype view (bits reinterpreted)
            return dtypes.alias_storage(self.storage(t.base), t.dtype, t.shape)
        return self.mem[t.uid]

    def _plan(self, access: Access) -> _Plan:
        p = self.plans.get(id(access))
        if p is None:
            p = self.plans[id(access)] = _Plan(access)
        return p

    def _bounds_error(self, access: Access, dim: int, index: int, op: Op) -> NkiError:
        return NkiError(
            "err_tensor_access_out_of_bound",
            op.loc,
            tensor=access.tensor.name,
            dim=dim,
            index=index,
            size=access.tensor.shape[dim],
        )

    def _index(
        self, access: Access, env: dict, op: Op, valid: np.ndarray | None, writing: bool = False
    ):
        """numpy index for ``access`` and whether it is basic slicing.  Masked-off elements may
        lie out of bounds; they are not checked."""
        if access.indirect is not None:
            rt = self.read(access.indirect, env, op)
            return indirect_index(access, env, rt, valid, op), False
        plan = self._plan(access)
        tshape = access.tensor.shape
        if plan.basic and not (writing and plan.bcast):
            idx = []
            oob = None
            for d, (a, ax) in enumerate(zip(access.index, plan.dims)):
                base = a.const
                for s, c in a.terms:
                    if not isinstance(s, Axis):
                        base += c * env[s]
                if ax is None:
                    if not 0 <= base < tshape[d]:
                        oob = (d, base)
                        break
                    idx.append(base)
                else:
                    k, c = ax
                    last = base + c * (plan.shape[k] - 1)
                    if base < 0 or last >= tshape[d]:
                        oob = (d, last if last >= tshape[d] else base)
                        break
                    idx.append(slice(base, last + 1, c))
            if oob is None:
                return tuple(idx), True
            if valid is None:
                raise self._bounds_error(access, oob[0], oob[1], op)
        if not plan.basic and (plan.injective or not writing):
            view = self._strided(access, env, op, plan, valid)
            if view is not None:
                return view, None
        full = {**env, **axis_env(plan.shape)}
        idx = []
        for d, a in enumerate(access.index):
            v = np.broadcast_to(np.asarray(a.evaluate(full)), plan.shape)
            if valid is not None:
                v = np.where(valid, v, 0)
            if v.size:
                lo, hi = int(v.min()), int(v.max())
                if lo < 0 or hi >= tshape[d]:
                    raise self._bounds_error(access, d, hi if hi >= tshape[d] else lo, op)
            idx.append(v)
        return tuple(idx), False

    def _strided(
        self, access: Access, env: dict, op: Op, plan: _Plan, valid: np.ndarray | None
    ) -> np.ndarray | None:
        """A view of the access's elements in tile order (shape ``access.shape``), or None
        when (under a mask) the access leaves the tensor: the caller then builds index
        arrays, which check bounds element by element."""
        store = self.storage(access.tensor)
        tshape = access.tensor.shape
        first = []
        strides = [0] * len(plan.shape)
        for d, (a, axes) in enumerate(zip(access.index, plan.strided)):
            b = a.const
            for s, c in a.terms:
                if not isinstance(s, Axis):
                    b += c * env[s]
            lo = hi = b
            for k, c in axes:
                span = c * (plan.shape[k] - 1)
                if span < 0:
                    lo += span
                else:
                    hi += span
                strides[k] += c * store.strides[d]
            if lo < 0 or hi >= tshape[d]:
                if valid is not None:
                    return None
                raise self._bounds_error(access, d, hi if hi >= tshape[d] else lo, op)
            first.append(slice(b, None))
        # the tile's first element, and from there the steps of each tile axis (bounds are
        # checked above, so every element the view reaches lies inside the tensor)
        return dtypes.as_strided(store[tuple(first)], plan.shape, strides)

    def read(self, access: Access, env: dict, op: Op, valid=None) -> np.ndarray:
        store = self.storage(access.tensor)
        if valid is not None and valid.shape != access.shape:
            valid = None
        idx, basic = self._index(access, env, op, valid)
        if basic is None:  # a strided view: the fresh C-ordered copy index arrays would give
            return np.ascontiguousarray(idx)
        x = store[idx]
        if basic:
            plan = self._plan(access)
            if plan.reshape:
                x = x.reshape(plan.bshape)
            return np.broadcast_to(x, plan.shape) if plan.bcast else x
        return np.broadcast_to(x, access.shape)

    def write(self, access: Access, value, env: dict, op: Op, valid=None) -> None:
        store = self.storage(access.tensor)
        value = np.asarray(value)
        if value.shape != access.shape:
            if value.size != int(np.prod(access.shape)):
                raise PrimError(
                    f"{op.loc}: {op.prim} produced {value.shape} for {access!r}; the "
                    "verifier should have rejected the op or the rule is wrong"
                )
            value = value.reshape(access.shape)  # same elements, another free shape
        value = dtypes.cast(value, access.tensor.dtype)
        if dtypes.is_tf32(access.tensor.dtype):
            value = value.astype(np.float32)
        if valid is not None and valid.shape != access.shape:
            valid = _fit_valid(valid, access.shape)
        idx, basic = self._index(access, env, op, valid, writing=True)
        if access.indirect is not None:
            scatter(store, idx, value, valid)
            return
        if basic is None:  # a strided view of distinct elements
            if valid is None:
                idx[...] = value
            else:
                np.copyto(idx, value, where=np.broadcast_to(valid, idx.shape))
            return
        if basic:
            if all(isinstance(i, int | np.integer) for i in idx):
                # one element at a constant index: numpy gives a scalar copy, not a view
                if valid is None or bool(np.asarray(valid).reshape(-1)[0]):
                    store[idx] = value.reshape(-1)[0]
                return
            plan = self._plan(access)
            view = store[idx]
            if plan.reshape:
                view = view.reshape(plan.shape)
            if valid is None:
                view[...] = value
            else:
                np.copyto(view, value, where=np.broadcast_to(valid, view.shape))
            return
        if valid is None:
            store[idx] = value
        else:
            store[tuple(i[valid] for i in idx)] = value[valid]

    # -- execution ----------------------------------------------------------------------------
    def run(self, args: list[np.ndarray]) -> list[np.ndarray]:
        k = self.kernel
        for t, a in zip(k.params, args):
            self.mem[t.uid] = a
        fresh = [t for t in k.tensors if t.base is None and t.kind in ("hbm", "output")]
        need = sum(
            int(np.prod(t.shape, dtype=np.int64)) * dtypes.storage_dtype(t.dtype).itemsize
            for t in fresh
        )
        reserve(need, "the kernel's HBM tensors", k.loc)
        for t in k.tensors:
            if t.base is None and t.kind in ("hbm", "output"):
                self.mem[t.uid] = dtypes.new_buffer(t.shape, t.dtype)
            elif t.kind == "const":
                self.mem[t.uid] = dtypes.widen(t.const_value)
        grid = k.grid or (1,)
        with one_blas_thread():  # see sim/blas.py: speed, and bits independent of the cores
            for pid in np.ndindex(*grid):
                env = {ProgramId(i): int(v) for i, v in enumerate(pid)}
                self.exec_body(k.body, env)
        return [self.storage(t) for t in k.outputs]  # an output may be a reshape of its base

    def exec_body(self, body, env: dict) -> None:
        for s in body:
            if isinstance(s, Op):
                try:
                    self.exec_op(s, env)
                except (NkiError, NkiInternalError):
                    raise
                except Exception as e:  # a verified op must not fail in numpy: our bug
                    raise NkiInternalError(
                        f"{s.loc}: the simulator failed on {s.prim} "
                        f"(outs {[getattr(o, 'shape', o) for o in s.outs]}, ins "
                        f"{[getattr(x, 'shape', x) for x in s.ins]}): {type(e).__name__}: {e}"
                    ) from e
            elif isinstance(s, Alloc):
                t = s.tensor
                self.mem[t.uid] = dtypes.new_buffer(t.shape, t.dtype)
            elif isinstance(s, Loop) and s.device is not None:
                self.exec_device_loop(s, env)
            elif isinstance(s, Loop):
                var: LoopVar = s.var
                for i in range(s.trip):
                    env[var] = i
                    self.exec_body(s.body, env)
                env.pop(var, None)

    def exec_device_loop(self, loop: Loop, env: dict) -> None:
        """A loop whose trip count the kernel computes at run time (``Loop.device``): bounds
        read from their registers when it starts, the induction value written to its counter
        register before each iteration; a while loop tests its condition register before
        each iteration."""
        d = loop.device
        at = Op("register_move", [], [], {}, loop.loc)  # names the loop's line in errors

        def value(x) -> int:
            if isinstance(x, Access):
                return int(np.asarray(self.read(x, env, at)).reshape(-1)[0])
            return int(x)

        var: LoopVar = loop.var
        if d.stop is None:
            k = 0
            state = _carried_state(loop) if self.world is None else None
            look_at = 1  # the iteration whose state is compared next (1, 2, 4, ...)
            while self._while_goes_on(loop, k, value):
                if k >= _MAX_DEVICE_ITERATIONS:
                    raise NkiError(
                        "err_invalid_argument",
                        loop.loc,
                        op="nl.while_loop",
                        why=f"still running after {k} iterations: the condition register "
                        "never became 0",
                    )
                before = self._snapshot(state) if k == look_at and state else None
                env[var] = k
                self.exec_body(loop.body, env)
                if before is not None:
                    if self._unchanged(before):
                        raise NkiError(
                            "err_invalid_argument",
                            loop.loc,
                            op="nl.while_loop",
                            why=f"iteration {k} left the condition register ({value(d.cond)}) "
                            "and every tensor the body computes it from as it found them: "
                            "each iteration after it does the same, so the loop never ends",
                        )
                    look_at *= 2
                k += 1
        else:
            steps = range(value(d.start), value(d.stop), d.step)
            if len(steps) > _MAX_DEVICE_ITERATIONS:
                raise NkiError(
                    "err_invalid_argument",
                    loop.loc,
                    op="device loop",
                    why=f"{len(steps)} iterations ({_span(steps)}), more than a simulation "
                    f"runs ({_MAX_DEVICE_ITERATIONS}); a register never written reads "
                    "2147483647",
                )
            for start, stop in d.peers:
                other = range(value(start), value(stop), d.step)
                if other != steps:
                    raise NkiError(
                        "err_invalid_argument",
                        loop.loc,
                        op="device loop",
                        why=f"the cores of the launch loop over {_span(steps)} and "
                        f"{_span(other)}; every core must run the same iterations (the "
                        "hardware runs one control flow on all cores)",
                    )
            for k, i in enumerate(steps):
                if d.counter is not None:
                    self.write(d.counter, np.asarray(i, dtype=np.int64), env, at)
                env[var] = k
                self.exec_body(loop.body, env)
        env.pop(var, None)

    def _snapshot(self, uids: list[int]) -> list[tuple[int, np.ndarray]] | None:
        """Copies of the memory of tensors ``uids`` (None when one has none yet, or they are
        too large to copy for this check)."""
        arrays = [self.mem.get(u) for u in uids]
        if any(a is None for a in arrays) or sum(a.nbytes for a in arrays) > _SNAPSHOT_BYTES:
            return None
        return [(u, a.copy()) for u, a in zip(uids, arrays)]

    def _unchanged(self, snapshot: list[tuple[int, np.ndarray]]) -> bool:
        """Whether every tensor of ``snapshot`` holds the same bits now (NaN payloads too)."""
        for u, old in snapshot:
            now = self.mem.get(u)
            if now is None or now.shape != old.shape or now.dtype != old.dtype:
                return False
            if now.tobytes() != old.tobytes():
                return False
        return True

    @staticmethod
    def _while_goes_on(loop: Loop, k: int, value: Callable[[object], int]) -> bool:
        """Whether a while loop runs iteration ``k``: its condition register is not 0, and the
        other programs' of an LNC launch (``DeviceLoop.peer_conds``) agree."""
        d = loop.device
        mine = value(d.cond)
        for other in d.peer_conds:
            theirs = value(other)
            if (mine != 0) != (theirs != 0):
                raise NkiError(
                    "err_invalid_argument",
                    loop.loc,
                    op="device loop",
                    why=f"before iteration {k} of the while loop the cores' conditions are "
                    f"{mine} and {theirs}: one core would run it, the other not; every core "
                    "must run the same iterations (the hardware runs one control flow on all "
                    "cores)",
                )
        return mine != 0

    def _mask(self, op: Op, env: dict) -> np.ndarray | None:
        if op.mask is None:
            return None
        shape = mask_ref(op).shape
        full = {**env, **axis_env(shape)}
        for s in op.mask.syms:
            if isinstance(s, Axis) and s.k >= len(shape):
                raise NkiError(
                    "err_unsupported_expression_in_mask",
                    op.loc,
                    got=f"{op.mask} for a tile of shape {shape}",
                )
        return np.broadcast_to(np.asarray(op.mask.evaluate(full), dtype=bool), shape)

    def exec_op(self, op: Op, env: dict) -> None:
        valid = self._mask(op, env)
        if op.attrs.get("oob_skip"):
            valid = self._in_bounds(op, env, valid)
        raw = PRIMS[op.prim].raw
        ins = []
        n = self.declared.get(id(op))
        if n is None:  # the rule takes the declared operands, not the index tiles after them
            n = self.declared[id(op)] = declared_inputs(op)
        for x in op.ins[:n] if n < len(op.ins) else op.ins:
            if isinstance(x, Access):
                v = self.read(x, env, op, valid)
                ins.append(v if raw else dtypes.to_f32(v))
            else:
                ins.append(x)
        results = RULES[op.prim](op, ins, OpContext(self, op, env, valid))
        for out, r in zip(op.outs, results):
            if r is not None:
                self.write(out, r, env, op, valid)

    def _in_bounds(self, op: Op, env: dict, valid: np.ndarray | None) -> np.ndarray | None:
        """``oob_mode.skip``: the op's mask narrowed to the elements whose runtime index
        (along the indirect dimension of its indirect access) lies inside the indexed tensor;
        the others are not transferred."""
        acc = next(a for a in (*op.outs, *op.ins) if isinstance(a, Access) and a.indirect)
        shape = acc.shape
        rt = np.broadcast_to(np.asarray(self.read(acc.indirect, env, op)).astype(np.int64), shape)
        d = acc.indirect_dim
        full = {**env, **axis_env(shape)}
        at = np.asarray(acc.index[d].evaluate(full), dtype=np.int64) + rt
        keep = (at >= 0) & (at < acc.tensor.shape[d])
        fitted = None if valid is None else _fit_valid(valid, shape)
        return keep if fitted is None else keep & fitted

    def context(self, op: Op, env: dict, valid: np.ndarray | None) -> OpContext:
        """The rule context of ``op`` in ``env`` (the fast simulator asks for it too)."""
        return OpContext(self, op, env, valid)


class OpContext:
    """What a rule may ask for besides its inputs (``rules.Ctx``), for one op of one
    interpreter in one environment."""

    __slots__ = ("interp", "op", "env", "valid")

    def __init__(self, interp: Interpreter, op: Op, env: dict, valid: np.ndarray | None):
        self.interp = interp
        self.op = op
        self.env = env
        self.valid = valid

    @property
    def seed(self) -> int:
        return self.interp.seed

    def dst(self, i: int) -> np.ndarray:
        v = self.interp.read(self.op.outs[i], self.env, self.op)
        return v if PRIMS[self.op.prim].raw else dtypes.to_f32(v)

    @property
    def rank(self) -> int:
        return self.interp.rank

    def exchange(self, value: np.ndarray, members: tuple[int, ...]) -> dict[int, np.ndarray]:
        world = self.interp.world
        if world is None:
            if members != (self.interp.rank,):
                raise NkiInternalError(
                    f"{self.op.loc}: {self.op.prim} with ranks {members} run without the "
                    "other ranks (simulate through nkikit.sim.simulate)"
                )
            return {self.interp.rank: np.array(value)}
        return world.exchange(self.interp.rank, self.op, value, members)

    def rmw(self, i: int, op: str, value: np.ndarray) -> np.ndarray | None:
        from .alu import alu

        it, out = self.interp, self.op.outs[i]
        if out.indirect is not None:  # atomic read-modify-write of the gathered rows
            idx, _ = it._index(out, self.env, self.op, self.valid, writing=True)
            v = np.broadcast_to(dtypes.to_f32(np.asarray(value)), out.shape)
            scatter_rmw(it.storage(out.tensor), idx, v, op, out.tensor.dtype, self.valid)
            return None
        old = dtypes.to_f32(it.read(out, self.env, self.op))
        return alu(op, old, dtypes.to_f32(value))


# ---------------------------------------------------------------------------------------------
# indirect DMA: shared with the fast simulator, which calls these same functions


def _span(r: range) -> str:
    return f"range({r.start}, {r.stop}" + (f", {r.step})" if r.step != 1 else ")")


def indirect_index(
    access: Access, env: dict, rt: np.ndarray, valid: np.ndarray | None, op: Op
) -> tuple[np.ndarray, ...]:
    """The numpy (fancy) index of an indirect access: per tensor dimension an int64 array of
    the tile's shape; along ``access.indirect_dim`` the static offset plus ``rt``, the index
    tile's values (broadcast from (P, 1)).  Masked-off elements index 0 and are not checked;
    a kept element outside the tensor raises ``err_tensor_access_out_of_bound`` naming the
    runtime index, the index tile and the partition (an indirect DMA's bounds are only known
    when it runs)."""
    shape = access.shape
    full = {**env, **axis_env(shape)}
    tshape = access.tensor.shape
    ind = access.indirect
    assert ind is not None
    runtime = np.broadcast_to(np.asarray(rt).astype(np.int64), shape)
    if access.indirect_extent is not None:
        _check_offsets(access, runtime, valid, op)
    idx = []
    for d, a in enumerate(access.index):
        v = np.broadcast_to(np.asarray(a.evaluate(full), dtype=np.int64), shape)
        if d == access.indirect_dim:
            v = v + runtime
        if valid is not None:
            v = np.where(valid, v, 0)
        if v.size:
            bad = (v < 0) | (v >= tshape[d])
            if bad.any():
                at = tuple(int(i[0]) for i in np.nonzero(bad))
                value = int(v[at])
                if d == access.indirect_dim and all(n == 1 for n in ind.shape):
                    where = (
                        f"{value} (the runtime offset {ind.tensor.name} holds "
                        f"{int(runtime[at])}; runtime offsets are checked when the kernel runs)"
                    )
                elif d == access.indirect_dim:
                    where = (
                        f"{value} (index tile {ind.tensor.name} holds {int(runtime[at])} for "
                        f"partition {at[0]}; an indirect DMA's indices are checked at run time)"
                    )
                else:
                    where = str(value)
                raise NkiError(
                    "err_tensor_access_out_of_bound",
                    op.loc,
                    tensor=access.tensor.name,
                    dim=d,
                    index=where,
                    size=tshape[d],
                )
        idx.append(v)
    return tuple(idx)


def _check_offsets(access: Access, runtime: np.ndarray, valid: np.ndarray | None, op: Op) -> None:
    """Tensor indirection (``NkiTensor.indirect``): every offset the index tile gives lies in
    ``[0, indirect_extent)``, the view it selects columns of; else
    ``err_tensor_access_out_of_bound`` naming the offset, the index tile and the element."""
    extent = access.indirect_extent
    bad = (runtime < 0) | (runtime >= extent)
    if valid is not None:
        bad &= np.broadcast_to(valid, bad.shape)
    if not bad.any():
        return
    at = tuple(int(i[0]) for i in np.nonzero(bad))
    ind = access.indirect
    assert ind is not None
    position = int(np.ravel_multi_index(at[1:], access.shape[1:])) if len(at) > 1 else 0
    raise NkiError(
        "err_tensor_access_out_of_bound",
        op.loc,
        tensor=f"the indirect view of {access.tensor.root.name}",
        dim=access.indirect_dim,
        index=f"{int(runtime[at])} (the offset index tile {ind.tensor.root.name} holds for "
        f"element {position}; tensor indirection offsets are checked when the kernel runs)",
        size=extent,
    )


def _flat_kept(idx, value, valid, shape):
    """The index arrays and values of the written elements, flattened in element order
    (partition-major), and their linear offsets in a tensor of ``shape``."""
    tile = idx[0].shape
    value = np.broadcast_to(value, tile)
    if valid is not None:
        keep = np.broadcast_to(valid, tile)
        idx = tuple(i[keep] for i in idx)
        value = value[keep]
    else:
        idx = tuple(i.reshape(-1) for i in idx)
        value = value.reshape(-1)
    return idx, value, np.ravel_multi_index(idx, shape)


def scatter(store: np.ndarray, idx, value: np.ndarray, valid: np.ndarray | None) -> None:
    """``store[idx] = value`` for an indirect write (``value`` already in the store's dtype).
    Where several elements land on one location the last one in element order (the highest
    partition) wins: the DMA queues may run the rows in any order on hardware, so a kernel
    that relies on which duplicate wins is not portable."""
    idx, value, lin = _flat_kept(idx, value, valid, store.shape)
    if lin.size == 0:
        return
    _, first_from_end = np.unique(lin[::-1], return_index=True)
    if first_from_end.size != lin.size:
        keep = np.sort(lin.size - 1 - first_from_end)
        idx = tuple(i[keep] for i in idx)
        value = value[keep]
    store[idx] = value


def scatter_rmw(
    store: np.ndarray, idx, value: np.ndarray, op: str, dt: np.dtype, valid: np.ndarray | None
) -> None:
    """Atomic ``store[idx] = op(store[idx], value)`` (``nl.atomic_rmw``): computed in fp32
    and rounded to the store's dtype once per update; updates of one location apply one after
    another in element order (partition-major), so duplicates accumulate."""
    from .alu import alu

    idx, value, lin = _flat_kept(idx, value, valid, store.shape)
    if lin.size == 0:
        return
    order = np.argsort(lin, kind="stable")
    ranked = lin[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    group = np.repeat(starts, np.diff(np.r_[starts, ranked.size]))
    rank = np.empty_like(order)
    rank[order] = np.arange(ranked.size) - group
    for r in range(int(rank.max()) + 1):
        sel = rank == r  # at most one update per location in this round
        where = tuple(i[sel] for i in idx)
        new = dtypes.cast(np.asarray(alu(op, dtypes.to_f32(store[where]), value[sel])), dt)
        store[where] = new.astype(np.float32) if dtypes.is_tf32(dt) else new


def injective(strided: tuple, shape: tuple[int, ...]) -> bool:
    """Whether distinct tile positions reach distinct elements (a write may then go through
    one strided view): per tensor dimension, its tile axes' steps must nest like the digits
    of a mixed-radix number, and no tile axis may be broadcast."""
    used = [k for axes in strided for k, _ in axes]
    if sorted(used) != list(range(len(shape))):
        return False
    for axes in strided:
        reach = 0
        for k, c in sorted(((k, abs(c)) for k, c in axes), key=lambda t: t[1]):
            if c <= reach:
                return False
            reach += c * (shape[k] - 1)
    return True


def _fit_valid(valid: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """The mask of an op's iteration space, as seen by an output of another shape."""
    if valid.ndim == len(shape):
        axes = tuple(k for k, (a, b) in enumerate(zip(valid.shape, shape)) if a != b and b == 1)
        v = valid.any(axis=axes, keepdims=True) if axes else valid
        if v.shape == tuple(shape):
            return v
    p = valid.shape[0]
    if shape and shape[0] == p:
        v = valid.reshape(p, -1).any(axis=1)
        return np.broadcast_to(v.reshape((p,) + (1,) * (len(shape) - 1)), shape)
    return None


def simulate(
    kernel: Kernel, args: list[np.ndarray], *, seed: int = 0, rank: int = 0, world=None
) -> list[np.ndarray]:
    """Run ``kernel`` on ``args`` (numpy arrays in the kernel's parameter dtypes) as
    ``rank`` of ``world`` (``sim/ranks.py``; None: a single rank)."""
    return Interpreter(kernel, seed=seed, rank=rank, world=world).run(args)
