"""``nki.collectives`` (``ncc``): collective communication between ranks
[reference/nki-0x.md §5.8].

Every rank runs the same kernel on its own data; a collective exchanges tiles between the
ranks of each replica group.  Each call emits one IR op per ``(src, dst)`` pair (primitives
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``collective_permute``
in ``nkikit/ir/prims.py``); the simulator runs every rank of the kernel's world and meets
them at those ops (``nkikit/sim/ranks.py``).  ``rank_id()`` returns a register holding the
rank's id (0 in a kernel without collectives, which runs as one rank).

The variable-length ``all_gather_v`` / ``all_to_all_v`` (primitives of their own: the counts
are a metadata tile read when the op runs) follow AWS's API docs of ``nki.collectives``; the
ring forms ``collective_permute_implicit*`` are ``collective_permute`` ops along the ring of
each replica group, taken in the group's rank order (the hardware's ring follows its
topology, which kernels do not see: they locate received data through
``collective_permute_implicit_current_processing_rank_id``, which uses the same ring).
Not modeled (``err_unsupported_api``): ``all_to_all_v`` without receive displacements
(where the data lands is not documented) and a run-time ``iteration_id``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

# absolute imports: a harness that aliases only ``nki`` to ``nkikit.nki`` reaches this file as
# ``nki.collectives`` through the package's __path__, where relative imports do not resolve
from nkikit.errors import NkiError, SourceLoc, caller_loc
from nkikit.ir.core import Access
from nkikit.nki.isa.registers import VirtualRegister, new_register
from nkikit.nki.tensor import NkiTensor, access_of, got_type, require_tensor
from nkikit.trace import instructions as E
from nkikit.trace.builder import current

if __name__ != "nkikit.nki.collectives":
    # ... and is then this module, not a second copy with its own ReplicaGroup class
    sys.modules[__name__] = importlib.import_module("nkikit.nki.collectives")


@dataclass
class ReplicaGroup:
    """Non-overlapping groups of ranks, e.g. ``ReplicaGroup([[0, 1], [2, 3]])``."""

    groups: list = field(default_factory=list)


def _groups(replica_group, loc: SourceLoc, api: str) -> tuple[tuple[int, ...], ...]:
    """The groups of a ``ReplicaGroup`` (or of a list of lists) as a tuple of tuples, checked:
    non-empty, of one size, no rank twice."""
    # duck-typed: a harness that imports ``nki.collectives`` under another module name has
    # its own copy of the class
    raw = getattr(replica_group, "groups", replica_group)
    try:
        groups = tuple(tuple(int(r) for r in g) for g in raw)
    except TypeError:
        groups = ()
    ranks = [r for g in groups for r in g]
    why = None
    if not groups or not all(groups):
        why = f"replica_group must hold non-empty lists of ranks, got {replica_group!r}"
    elif len({len(g) for g in groups}) != 1:
        why = f"every group must have as many ranks, got {[list(g) for g in groups]}"
    elif len(set(ranks)) != len(ranks) or min(ranks) < 0:
        why = f"the groups must not overlap or name negative ranks, got {[list(g) for g in groups]}"
    if why:
        raise NkiError("err_invalid_argument", loc, op=f"ncc.{api}", why=why)
    return groups


def _pairs(srcs, dsts, loc: SourceLoc, api: str) -> list[tuple]:
    """The ``(dst, src)`` accesses of the lists ``srcs`` and ``dsts`` (same length)."""
    srcs = list(srcs) if isinstance(srcs, list | tuple) else [srcs]
    dsts = list(dsts) if isinstance(dsts, list | tuple) else [dsts]
    if len(srcs) != len(dsts) or not srcs:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why=f"srcs and dsts must be lists of as many tensors, got {len(srcs)} and {len(dsts)}",
        )
    out = []
    for s, d in zip(srcs, dsts):
        require_tensor(s, loc, f"ncc.{api}", "every src")
        require_tensor(d, loc, f"ncc.{api}", "every dst")
        out.append((access_of(d, loc, api), access_of(s, loc, api)))
    if len(out) > 1 and any(not a.tensor.is_hbm for pair in out for a in pair):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why="several tensors in one collective (coalescing) only on HBM",
        )
    return out


def _check_dim(dst, src, dim: int, factor: tuple[int, int], loc: SourceLoc, api: str) -> None:
    """``dst`` has ``src``'s shape with dimension ``dim`` scaled by ``factor`` (mul, div)."""
    if not 0 <= dim < len(src.shape):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why=f"collective_dim={dim} is not a dimension of src {list(src.shape)}",
        )
    mul, div = factor
    if src.shape[dim] % div:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why=f"dimension {dim} of src {list(src.shape)} does not split into {div} chunks",
        )
    want = list(src.shape)
    want[dim] = want[dim] * mul // div
    if list(dst.shape) != want:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why=f"dst must have shape {want} (src {list(src.shape)} along collective_dim={dim}), "
            f"got {list(dst.shape)}",
        )


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None) -> None:
    """Every rank's ``dsts[i]`` = ``op`` (nl.add, nl.maximum, nl.minimum) over the
    ``srcs[i]`` of the ranks of its group."""
    loc = caller_loc()
    groups = _groups(replica_group, loc, "all_reduce")
    for d, s in _pairs(srcs, dsts, loc, "all_reduce"):
        if list(d.shape) != list(s.shape):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="ncc.all_reduce",
                why=f"dst {list(d.shape)} and src {list(s.shape)} must have one shape",
            )
        E.emit_all_reduce(d, s, groups=groups, op=op, loc=loc)


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """Every rank's ``dsts[i]`` = the ``srcs[i]`` of the ranks of its group, concatenated in
    group order along ``collective_dim``."""
    loc = caller_loc()
    groups = _groups(replica_group, loc, "all_gather")
    dim = int(collective_dim)
    for d, s in _pairs(srcs, dsts, loc, "all_gather"):
        _check_dim(d, s, dim, (len(groups[0]), 1), loc, "all_gather")
        E.emit_all_gather(d, s, groups=groups, dim=dim, loc=loc)


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None):
    """The group's ``op``-reduction of ``srcs[i]``, split along ``collective_dim`` into one
    chunk per rank: the ``k``-th rank of a group receives chunk ``k`` in ``dsts[i]``."""
    loc = caller_loc()
    groups = _groups(replica_group, loc, "reduce_scatter")
    dim = int(collective_dim)
    for d, s in _pairs(srcs, dsts, loc, "reduce_scatter"):
        _check_dim(d, s, dim, (1, len(groups[0])), loc, "reduce_scatter")
        E.emit_reduce_scatter(d, s, groups=groups, dim=dim, op=op, loc=loc)


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """``srcs[i]`` split along ``collective_dim`` into one chunk per rank of the group; the
    ``k``-th rank receives chunk ``k`` of every rank, in group order, in ``dsts[i]``."""
    loc = caller_loc()
    groups = _groups(replica_group, loc, "all_to_all")
    dim = int(collective_dim)
    for d, s in _pairs(srcs, dsts, loc, "all_to_all"):
        n = len(groups[0])
        _check_dim(d, s, dim, (n, n), loc, "all_to_all")
        E.emit_all_to_all(d, s, groups=groups, dim=dim, loc=loc)


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None) -> None:
    """For each ``(source, target)`` pair of ranks, the target's ``dsts[i]`` = the source's
    ``srcs[i]`` (HBM only); a rank that no pair targets keeps its ``dsts[i]``."""
    loc = caller_loc()
    try:
        pairs = tuple((int(s), int(t)) for s, t in source_target_pairs)
    except (TypeError, ValueError):
        pairs = ()
    targets = [t for _, t in pairs]
    if not pairs or len(set(targets)) != len(targets) or min(min(p) for p in pairs) < 0:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="ncc.collective_permute",
            why="source_target_pairs must be (source, target) rank pairs, each target once, "
            f"got {source_target_pairs!r}",
        )
    for d, s in _pairs(srcs, dsts, loc, "collective_permute"):
        if not (d.tensor.is_hbm and s.tensor.is_hbm):
            raise NkiError(
                "err_unsupported_memory",
                loc,
                op="ncc.collective_permute",
                what="srcs and dsts",
                allowed="HBM",
                got="SBUF",
            )
        if list(d.shape) != list(s.shape):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="ncc.collective_permute",
                why=f"dst {list(d.shape)} and src {list(s.shape)} must have one shape",
            )
        E.emit_collective_permute(d, s, pairs=pairs, loc=loc)


def rank_id(name=None) -> VirtualRegister:
    """A register holding this rank's id (use it as ``.ap(scalar_offset=...)``)."""
    loc = caller_loc()
    reg = new_register(loc, "rank")
    E.emit_rank_id(access_of(reg.tile, loc, "rank_id"), loc=loc)
    return reg


def _one_pair(srcs, dsts, loc: SourceLoc, api: str) -> tuple:
    """The ``(dst, src)`` accesses of one-tensor lists (no coalescing for these collectives)."""
    pairs = _pairs(srcs, dsts, loc, api)
    if len(pairs) != 1:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why=f"srcs and dsts must hold exactly one tensor each, got {len(pairs)}",
        )
    return pairs[0]


def _variable(
    api, srcs, dsts, replica_group, metadata_tensor, recv_counts_known, has_rdispls, loc
) -> None:
    """Emit the variable-length collective ``api`` (one tensor each side, a metadata tile)."""
    groups = _groups(replica_group, loc, api)
    dst, src = _one_pair(srcs, dsts, loc, api)
    if not isinstance(metadata_tensor, NkiTensor):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{api}",
            why=f"metadata_tensor must be a uint32 tensor, got {got_type(metadata_tensor)}",
        )
    meta = access_of(metadata_tensor, loc, f"{api} metadata_tensor")
    flags = {"recv_counts_known": bool(recv_counts_known), "has_rdispls": bool(has_rdispls)}
    E.EMITTERS[api](dst, src, meta, groups=groups, **flags, loc=loc)


def all_gather_v(
    srcs,
    dsts,
    replica_group,
    metadata_tensor,
    recv_counts_known=False,
    has_rdispls=False,
    priority=None,
    name=None,
) -> None:
    """Variable-length all-gather of flat HBM buffers (sizes known when the kernel runs):
    every rank broadcasts ``src[send_displ : send_displ + send_count]`` (column 0 of
    ``metadata_tensor`` rows 0 and 1, uint32); the chunk of the group's j-th rank lands at
    the start of slot j of ``dst`` (``dst`` split into one equal slot per rank), or at its
    receive displacement (row 3) with ``has_rdispls``; with ``recv_counts_known`` row 2 says
    how many elements arrive from each rank.  Elements no chunk lands on keep their value."""
    loc = caller_loc()
    args = (srcs, dsts, replica_group, metadata_tensor, recv_counts_known, has_rdispls)
    _variable("all_gather_v", *args, loc)


def all_to_all_v(
    srcs,
    dsts,
    replica_group,
    metadata_tensor,
    recv_counts_known=False,
    has_rdispls=False,
    priority=None,
    name=None,
) -> None:
    """Variable-length all-to-all of flat HBM buffers: rank ``r`` sends the group's j-th rank
    ``src[send_displ[j] : send_displ[j] + send_count[j]]`` (``metadata_tensor`` rows 0 and 1,
    uint32, one column per rank of the group); the receiver places the chunk from its group's
    j-th rank at ``recv_displ[j]`` (row 3).  Without ``has_rdispls`` nkikit raises
    ``err_unsupported_api``: where the data then lands is not documented."""
    loc = caller_loc()
    if not has_rdispls:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api="ncc.all_to_all_v(has_rdispls=False)",
            why="where each chunk lands without receive displacements is not documented; "
            "pass them in row 3 of metadata_tensor with has_rdispls=True",
        )
    args = (srcs, dsts, replica_group, metadata_tensor, recv_counts_known, has_rdispls)
    _variable("all_to_all_v", *args, loc)


def _ring_pairs(groups) -> tuple[tuple[int, int], ...]:
    """Each rank sends to its successor in its group's ring (the group's rank order)."""
    return tuple((g[k], g[(k + 1) % len(g)]) for g in groups for k in range(len(g)))


def _channels(by_channel, channel_ids, loc: SourceLoc, api: str, what: str) -> list:
    """One tensor per channel; channels consecutive from 0, at most 4 [nki-0x.md §5.8]."""
    lists = list(by_channel) if isinstance(by_channel, list | tuple) else [by_channel]
    ids = list(channel_ids) if isinstance(channel_ids, list | tuple) else [channel_ids]
    why = None
    if ids != list(range(len(ids))) or not 1 <= len(ids) <= 4:
        why = f"channel_ids must be consecutive from 0, at most 4 of them, got {channel_ids!r}"
    elif len(lists) != len(ids):
        why = f"{what} has {len(lists)} channels, channel_ids {len(ids)}"
    if why:
        raise NkiError("err_invalid_argument", loc, op=f"ncc.{api}", why=why)
    return [c if isinstance(c, list | tuple) else [c] for c in lists]


def collective_permute_implicit(
    srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None, name=None
) -> None:
    """Ring permute: on every channel each rank sends its source to its successor in its
    replica group's ring and receives its predecessor's into its destination.  The ring is
    the group's rank order (the hardware's follows its topology; a kernel that locates
    received data with ``collective_permute_implicit_current_processing_rank_id`` gets the
    same result with either)."""
    loc = caller_loc()
    api = "collective_permute_implicit"
    groups = _groups(replica_group, loc, api)
    srcs = _channels(srcs_by_channel, channel_ids, loc, api, "srcs_by_channel")
    dsts = _channels(dsts_by_channel, channel_ids, loc, api, "dsts_by_channel")
    for s, d in zip(srcs, dsts):
        dst, src = _one_pair(s, d, loc, api)
        E.emit_collective_permute(dst, src, pairs=_ring_pairs(groups), loc=loc)


def collective_permute_implicit_reduce(
    srcs0_by_channel,
    srcs1_by_channel,
    dsts_by_channel,
    replica_group,
    op,
    channel_ids=(0,),
    priority=None,
    name=None,
) -> None:
    """Ring permute of ``op(srcs0, srcs1)``: each rank reduces its two sources (an HBM
    temporary: a copy, then a DMA read-modify-write with ``op``), sends the result to its
    successor and receives its predecessor's into its destination."""
    loc = caller_loc()
    api = "collective_permute_implicit_reduce"
    groups = _groups(replica_group, loc, api)
    s0 = _channels(srcs0_by_channel, channel_ids, loc, api, "srcs0_by_channel")
    s1 = _channels(srcs1_by_channel, channel_ids, loc, api, "srcs1_by_channel")
    dsts = _channels(dsts_by_channel, channel_ids, loc, api, "dsts_by_channel")
    b = current(f"ncc.{api}")
    for a, c, d in zip(s0, s1, dsts):
        dd, aa = _one_pair(a, d, loc, api)
        _, cc = _one_pair(c, d, loc, api)
        if list(aa.shape) != list(cc.shape):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"ncc.{api}",
                why=f"the two sources must have one shape, got {list(aa.shape)} and "
                f"{list(cc.shape)}",
            )
        t = b.new_tensor(aa.shape, aa.dtype, "private_hbm", loc=loc, fallback="ring_reduce")
        tmp = Access.whole(t)
        E.emit_dma_copy(tmp, aa, loc=loc)
        E.emit_dma_copy(tmp, cc, rmw_op=op, loc=loc)
        E.emit_collective_permute(dd, tmp, pairs=_ring_pairs(groups), loc=loc)


def collective_permute_implicit_current_processing_rank_id(
    iteration_id, replica_group, channel_id=0, name=None
) -> VirtualRegister:
    """A register holding the rank whose data ring step ``iteration_id`` (a Python int)
    holds: this rank's own id at 0, then its predecessors' in the ring of its replica group
    (the group's rank order, as ``collective_permute_implicit``)."""
    loc = caller_loc()
    api = "collective_permute_implicit_current_processing_rank_id"
    groups = _groups(replica_group, loc, api)
    if isinstance(iteration_id, bool) or not isinstance(iteration_id, int):
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"ncc.{api} with a {type(iteration_id).__name__} iteration_id",
            why="only an iteration number known when the kernel is traced (a Python int) "
            "is modeled",
        )
    reg = new_register(loc, "ring_rank")
    E.emit_ring_rank_id(
        access_of(reg.tile, loc, api), groups=groups, iteration=iteration_id, loc=loc
    )
    return reg
