"""Unrolled loops: the loops ``nkikit.trace.reroll`` folds an unrolled trace into, written
out again step by step.

A loop of kind ``"unrolled"`` stands for the steps a Python ``for`` loop traced, one after
the other, each with tiles of its own.  The verifier and the simulators run it as a loop (it
means what the steps meant); the compiler places and schedules the steps themselves, as the
Neuron compiler sees the unrolled instruction stream (address rotation, pipelining across
steps: ``compiler/allocate.py``), so :func:`unroll` gives it the steps back.
"""

from __future__ import annotations

from dataclasses import fields

from .affine import Affine, LoopVar
from .core import Access, Alloc, Kernel, Loop, Op, Tensor

UNROLLED = "unrolled"  # the LoopVar kind of a re-rolled run of unrolled steps


def has_unrolled(kernel: Kernel) -> bool:
    """Whether ``kernel``'s body holds a loop of kind ``"unrolled"``."""
    return any(type(s) is Loop and s.var.kind == UNROLLED for s in kernel.body)


def unroll(kernel: Kernel) -> Kernel:
    """``kernel`` with each ``"unrolled"`` loop of its body replaced by its steps: the
    loop's body once per iteration, the loop variable a constant, a fresh tile for each
    allocation (named as the trace names the allocations of one line: ``t``, ``t.1``, ...).
    The same kernel when it has none.  Made anew at every call, not kept with the kernel:
    the steps take the memory folding saved."""
    if not has_unrolled(kernel):
        return kernel
    return _unroll(kernel)


def _unroll(kernel: Kernel) -> Kernel:
    loop_tiles = {
        x.tensor.uid
        for s in kernel.body
        if type(s) is Loop and s.var.kind == UNROLLED
        for x in s.body
        if type(x) is Alloc
    }
    # the views of the loops' tiles (an on-chip ``.reshape`` in a step) are the steps' too
    loop_tiles |= {t.uid for t in kernel.tensors if t.base is not None and t.root.uid in loop_tiles}
    taken = {t.name for t in kernel.tensors if t.uid not in loop_tiles}
    counters: dict[str, int] = {}
    tensors = list(kernel.tensors)
    body: list = []
    for s in kernel.body:
        if type(s) is not Loop or s.var.kind != UNROLLED:
            body.append(s)
            continue
        var = s.var
        for k in range(var.trip):
            fresh: dict[int, Tensor] = {}
            value = Affine((), k)
            for x in s.body:
                if type(x) is Alloc:
                    t = _copy(x.tensor, var, taken, counters)
                    fresh[x.tensor.uid] = t
                    tensors.append(t)
                    body.append(Alloc(t))
                    continue
                made: dict[int, Access] = {}
                outs = [_at(a, var, value, fresh, made, tensors) for a in x.outs]
                ins = [
                    _at(a, var, value, fresh, made, tensors) if type(a) is Access else a
                    for a in x.ins
                ]
                body.append(Op(x.prim, outs, ins, dict(x.attrs), x.loc, x.mask))
    return Kernel(
        kernel.name,
        kernel.params,
        kernel.outputs,
        body,
        kernel.grid,
        kernel.loc,
        [t for t in tensors if t.uid not in loop_tiles],
        kernel.return_structure,
        kernel.dialect,
        kernel.unlaunched_program_ids,
    )


def _copy(t: Tensor, var: LoopVar, taken: set[str], counters: dict[str, int]) -> Tensor:
    """A fresh tile like ``t`` outside ``var``'s loop, named ``base.N`` for a free N."""
    base, dot, suffix = t.name.rpartition(".")
    base = base if dot and suffix.isdigit() else t.name
    n = counters.get(base, 0)
    name = base if n == 0 and base not in taken else None
    while name is None or name in taken:
        n += 1
        name = f"{base}.{n}"
    counters[base] = n
    taken.add(name)
    return copy_tensor(t, name=name, scope=tuple(v for v in t.scope if v is not var))


def copy_tensor(t: Tensor, **changes) -> Tensor:
    """A new tensor (its own uid) like ``t`` but for ``changes`` (field -> value)."""
    kept = {f.name: getattr(t, f.name) for f in fields(Tensor) if f.init and f.name != "uid"}
    return Tensor(**{**kept, **changes})


def _at(
    a: Access,
    var: LoopVar,
    value: Affine,
    fresh: dict[int, Tensor],
    made: dict,
    tensors: list[Tensor],
) -> Access:
    """Access ``a`` at iteration ``value`` of ``var``, on the iteration's own tiles (and
    views of them, made here and added to ``tensors``)."""
    hit = made.get(id(a))
    if hit is not None:
        return hit
    index = a.index
    if any(s is var for x in index for s, _ in x.terms):
        index = tuple(x.substitute({var: value}) for x in index)
    ind = a.indirect
    if ind is not None:
        ind = _at(ind, var, value, fresh, made, tensors)
    t = _tensor_at(a.tensor, fresh, tensors)
    out = made[id(a)] = Access(t, a.shape, index, ind, a.indirect_dim, a.indirect_extent)
    return out


def _tensor_at(t: Tensor, fresh: dict[int, Tensor], tensors: list[Tensor]) -> Tensor:
    """The iteration's own copy of ``t`` (a view of a loop tile: a view of the copy)."""
    hit = fresh.get(t.uid)
    if hit is not None or t.base is None:
        return hit or t
    base = _tensor_at(t.base, fresh, tensors)
    if base is t.base:
        return t
    view = fresh[t.uid] = copy_tensor(t, name=f"{base.name}.reshape", base=base, scope=base.scope)
    tensors.append(view)
    return view
