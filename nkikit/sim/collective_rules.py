"""Simulation rules of the primitives that involve ranks: registers, ``rank_id`` and the
collectives (``nkikit/ir/prims.py``), registered in ``rules.RULES`` like every other rule.

A collective's rule deposits its source tile with the other ranks of its group through the
context (``ctx.exchange``, the rendezvous of ``sim/ranks.py``) and computes this rank's result
from every member's source, in group order, so every rank computes the same values from the
same data whatever order the ranks arrive in.  Semantics: ``reference/nki-0x.md`` §5.8.
"""

from __future__ import annotations

import numpy as np

from ..errors import NkiError
from .alu import alu
from .rules import rule


def group_of(op, rank: int) -> tuple[int, ...]:
    """The replica group of ``op`` that ``rank`` belongs to (``err_invalid_argument`` at the
    op's line when it is in none: every rank runs every collective of the kernel)."""
    for g in op.attrs["groups"]:
        if rank in g:
            return tuple(g)
    raise NkiError(
        "err_invalid_argument",
        op.loc,
        op=f"ncc.{op.prim}",
        why=f"rank {rank} is in no replica group of {[list(g) for g in op.attrs['groups']]}; "
        "every rank that runs the kernel must be in one",
    )


def _reduce(op, ins, ctx) -> tuple[np.ndarray, int, int]:
    """The group's reduction of the source (fp32, in group order), this rank's position in
    the group and the group size."""
    members = group_of(op, ctx.rank)
    values = ctx.exchange(ins[0], members)
    acc = values[members[0]]
    for r in members[1:]:
        acc = alu(op.attrs["op"], acc, values[r])
    return np.asarray(acc, dtype=np.float32), members.index(ctx.rank), len(members)


@rule("all_reduce")
def _all_reduce(op, ins, ctx):
    return [_reduce(op, ins, ctx)[0]]


@rule("reduce_scatter")
def _reduce_scatter(op, ins, ctx):
    total, pos, n = _reduce(op, ins, ctx)
    return [np.split(total, n, axis=op.attrs["dim"])[pos]]


@rule("all_gather")
def _all_gather(op, ins, ctx):
    members = group_of(op, ctx.rank)
    values = ctx.exchange(ins[0], members)
    return [np.concatenate([values[r] for r in members], axis=op.attrs["dim"])]


@rule("all_to_all")
def _all_to_all(op, ins, ctx):
    members = group_of(op, ctx.rank)
    values = ctx.exchange(ins[0], members)
    dim, pos, n = op.attrs["dim"], members.index(ctx.rank), len(members)
    return [np.concatenate([np.split(values[r], n, axis=dim)[pos] for r in members], axis=dim)]


@rule("collective_permute")
def _permute(op, ins, ctx):
    pairs = op.attrs["pairs"]
    everyone = tuple(sorted({r for p in pairs for r in p}))
    if ctx.rank not in everyone:
        return [ctx.dst(0)]  # neither sends nor receives
    values = ctx.exchange(ins[0], everyone)
    sources = [s for s, t in pairs if t == ctx.rank]
    return [values[sources[0]] if sources else ctx.dst(0)]


@rule("rank_id")
def _rank_id(op, ins, ctx):
    return [np.full((1,) * len(op.outs[0].shape), ctx.rank, dtype=np.int32)]


@rule("register_move")
def _register_move(op, ins, ctx):
    return [np.asarray(ins[0]).reshape((1,) * len(op.outs[0].shape))]
