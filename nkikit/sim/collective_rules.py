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


@rule("ring_rank_id")
def _ring_rank_id(op, ins, ctx):
    members = group_of(op, ctx.rank)
    k = members.index(ctx.rank)
    who = members[(k - op.attrs["iteration"]) % len(members)]
    return [np.full((1,) * len(op.outs[0].shape), who, dtype=np.int32)]


def _meta(op, meta: np.ndarray, row: int, col: int, what: str) -> int:
    """Entry (row, col) of a metadata tile (``err_invalid_argument`` when it has no such)."""
    m = np.asarray(meta).reshape(meta.shape[0], -1)
    if row >= m.shape[0] or col >= m.shape[1]:
        raise NkiError(
            "err_invalid_argument",
            op.loc,
            op=f"ncc.{op.prim}",
            why=f"the metadata tensor {list(m.shape)} has no {what} (row {row}, column {col})",
        )
    return int(m[row, col])


def _chunk(op, flat: np.ndarray, start: int, count: int, what: str) -> np.ndarray:
    if start + count > flat.size:
        raise NkiError(
            "err_invalid_argument",
            op.loc,
            op=f"ncc.{op.prim}",
            why=f"{what} [{start}, {start + count}) leaves the {flat.size}-element buffer",
        )
    return flat[start : start + count]


def _receive(op, dst: np.ndarray, chunks: dict, members, meta, slot: int | None) -> np.ndarray:
    """``dst`` (flat) with the chunk from each member placed: at its receive displacement
    (row 3) when the op has them, else at the start of the member's slot; ``recv counts``
    (row 2), when known, say how many of the chunk's elements arrive."""
    out = dst.copy()
    for j, r in enumerate(members):
        c = chunks[r]
        n = c.size
        if op.attrs["recv_counts_known"]:
            n = _meta(op, meta, 2, j, "receive count")
            if n > c.size:
                raise NkiError(
                    "err_invalid_argument",
                    op.loc,
                    op=f"ncc.{op.prim}",
                    why=f"the receive count {n} from rank {r} exceeds the {c.size} elements "
                    "it sends",
                )
        if op.attrs["has_rdispls"]:
            at = _meta(op, meta, 3, j, "receive displacement")
        else:
            at = j * slot
            if n > slot:
                raise NkiError(
                    "err_invalid_argument",
                    op.loc,
                    op=f"ncc.{op.prim}",
                    why=f"rank {r} sends {n} elements, more than its {slot}-element slot of dst",
                )
        _chunk(op, out, at, n, f"the chunk from rank {r}")[...] = c[:n]
    return out


@rule("all_gather_v")
def _all_gather_v(op, ins, ctx):
    # each rank sends one chunk src[send_displ : send_displ + send_count] (column 0 of rows 0
    # and 1) to every member; the chunk from the j-th member lands in slot j of dst (dst
    # split into one equal slot per member) [nki.collectives.all_gather_v docs]
    src, meta = ins
    members = group_of(op, ctx.rank)
    count, start = _meta(op, meta, 0, 0, "send count"), _meta(op, meta, 1, 0, "send displacement")
    mine = _chunk(op, np.asarray(src).reshape(-1), start, count, "the chunk sent")
    chunks = ctx.exchange(mine, members)
    dst = ctx.dst(0).reshape(-1)
    out = _receive(op, dst, chunks, members, meta, dst.size // len(members))
    return [out.reshape(op.outs[0].shape)]


@rule("all_to_all_v")
def _all_to_all_v(op, ins, ctx):
    # the j-th member receives src[send_displ[j] : send_displ[j] + send_count[j]] from every
    # rank (rows 0 and 1, one column per member), placed at the receive displacements (row 3)
    # [nki.collectives.all_to_all_v docs]
    src, meta = ins
    members = group_of(op, ctx.rank)
    k = members.index(ctx.rank)
    srcs = ctx.exchange(np.asarray(src).reshape(-1), members)
    metas = ctx.exchange(np.asarray(meta), members)
    chunks = {}
    for r in members:
        count = _meta(op, metas[r], 0, k, "send count")
        start = _meta(op, metas[r], 1, k, "send displacement")
        chunks[r] = _chunk(op, srcs[r], start, count, f"the chunk rank {r} sends")
    out = _receive(op, ctx.dst(0).reshape(-1), chunks, members, meta, None)
    return [out.reshape(op.outs[0].shape)]
