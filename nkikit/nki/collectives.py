"""``nki.collectives`` (``ncc``): collective communication between ranks
[reference/nki-0x.md §5.8].

Every rank runs the same kernel on its own data; a collective exchanges tiles between the
ranks of each replica group.  Each call emits one IR op per ``(src, dst)`` pair (primitives
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``collective_permute``
in ``nkikit/ir/prims.py``); the simulator runs every rank of the kernel's world and meets
them at those ops (``nkikit/sim/ranks.py``).  ``rank_id()`` returns a register holding the
rank's id (0 in a kernel without collectives, which runs as one rank).

Not modeled (``err_unsupported_api``): the variable-size ``all_gather_v`` / ``all_to_all_v``
(their metadata tensor's layout is not documented) and the ring forms
``collective_permute_implicit*`` (which neighbour each channel reads is not documented).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

# absolute imports: a harness that aliases only ``nki`` to ``nkikit.nki`` reaches this file as
# ``nki.collectives`` through the package's __path__, where relative imports do not resolve
from nkikit.errors import NkiError, SourceLoc, caller_loc
from nkikit.nki.isa.registers import VirtualRegister, new_register
from nkikit.nki.tensor import NkiTensor, access_of
from nkikit.trace import instructions as E

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
        for what, x in (("src", s), ("dst", d)):
            if not isinstance(x, NkiTensor):
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op=f"ncc.{api}",
                    why=f"every {what} must be a tensor, got {type(x).__name__}",
                )
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


def _not_modeled(api: str, why: str):
    def fn(*args, **kwargs):
        raise NkiError("err_unsupported_api", caller_loc(), api=f"nki.collectives.{api}", why=why)

    fn.__name__ = api
    return fn


_V = "the layout of its metadata tensor (variable sizes) is not documented"
_RING = "which neighbour each ring channel receives from is not documented"
all_gather_v = _not_modeled("all_gather_v", _V)
all_to_all_v = _not_modeled("all_to_all_v", _V)
collective_permute_implicit = _not_modeled("collective_permute_implicit", _RING)
collective_permute_implicit_reduce = _not_modeled("collective_permute_implicit_reduce", _RING)
collective_permute_implicit_current_processing_rank_id = _not_modeled(
    "collective_permute_implicit_current_processing_rank_id", _RING
)
