"""PSUM tensors that do not fit PSUM: the compiler keeps them where they fit.

NKI Beta 1 leaves the placement of an automatically allocated tensor -- the result of a
language-level call (``nl.matmul``, ``nl.transpose``, ...) or an ``nl.ndarray(...,
buffer=nl.psum)`` -- to the compiler, and the Neuron compiler inserts spills and refills to the
next memory tier when live data exceeds SBUF/PSUM (``reference/nki.md`` §1: "If live data
exceeds SBUF/PSUM, the compiler inserts spills/refills to the next tier" [PM, MEM]).  So a
kernel that keeps a dozen ``nl.matmul`` results live, or the attention tutorial's v3, which
writes all ``32 x 8`` bank-sized blocks of a score matrix in one loop nest and reads them in
later nests, runs on NKI.  :func:`evict_oversized_psum` does the same to the traced IR, before
it is verified:

* While the automatically placed PSUM tensors live at some program point need more bytes
  per partition than PSUM has above the user-allocated banks (blocks counted as the verifier
  counts them, ``nkikit/ir/residency.py``: :func:`psum_blocks_in_use`), the biggest tensor
  live there -- of equal ones, the one allocated first, whose PSUM staging tile then lives
  where the fewest others do -- leaves PSUM: to SBUF if it takes at
  most a quarter of an SBUF partition, otherwise to a private HBM tensor of the same shape
  (SBUF spilling then works on it as on any SBUF tensor).
* An instruction on TensorE that writes it writes a PSUM tile of the written region's shape
  instead (TensorE writes PSUM only), copied out after it (``tensor_copy``, the PSUM
  eviction); VectorE/ScalarE write SBUF directly.  For an HBM tensor the SBUF tile is then
  stored (``dma_copy``), and every instruction that reads it reads an SBUF tile loaded just
  before it (no engine reads HBM).  Engines read SBUF like PSUM, so readers of a tensor moved
  to SBUF are unchanged.
* Numbers do not change: the tiles have the tensor's dtype, and copies of equal dtypes are
  exact.  The cost model sees the copies and the DMA traffic, which is what it costs.
* A tensor stays in PSUM -- and the verifier reports ``err_psum_total_capacity_exceeded`` as
  before -- when an instruction accumulates into it (``+=`` of a matmul, a read-modify-write),
  writes it under a mask, both reads and writes it, or reaches it through an indirect
  access: staging would not be the same program.  A kernel that fits PSUM is not touched.
* With ``phased`` (NKI 0.x, whose matmuls accumulate into their PSUM ``dst``), a tensor that
  is first written and only then read -- in its own body, every statement that writes it
  comes before every statement that reads it, none under a mask or indirect -- moves to
  SBUF whole: its writes go to a PSUM tensor of its shape allocated just before the first
  of them, copied out once after the last (the PSUM eviction of a finished accumulation
  group).  The NKI Library's MoE accumulates a dozen bank-sized tiles one after the other
  and reads them all afterwards; PSUM then holds one tile at a time.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from ..ir.core import Access, Alloc, Kernel, Loop, Op, Stmt, Tensor
from ..ir.prims import check_op, engine_of, reads_dst
from ..ir.residency import psum_blocks_in_use, psum_user_top, timeline
from ..targets import Target

__all__ = ["evict_oversized_psum"]


def evict_oversized_psum(kernel: Kernel, target: Target, *, phased: bool = False) -> list[Tensor]:
    """Move automatically placed PSUM tensors of ``kernel`` out of PSUM until the PSUM tensors
    live at once fit, rewriting their instructions in place (see the module docstring;
    ``phased``: also tensors written, then read).  Returns the tensors moved."""
    capacity = target.psum_banks * target.psum_bank_bytes - psum_user_top(kernel)
    auto = [
        t for t in kernel.tensors if t.buffer == "psum" and t.user_span is None and t.kind == "temp"
    ]
    if not auto:
        return []
    blocks = psum_blocks_in_use(kernel)
    size: dict[int, int] = {}
    for t in auto:
        nblocks = prod(t.shape[: t.par_axis])
        size[t.uid] = blocks.get(t.uid, nblocks) * t.bytes_per_partition // max(nblocks, 1)
    if sum(size.values()) <= capacity:
        return []  # everything fits even if all of it lives at once
    # a tensor NKI 0.x placed by hand (``address=``) stays where it was put
    candidates = {t.uid: t for t in auto if t.address is None}
    blocked: set[int] = set()
    for op, _ in kernel.ops():
        blocked |= _blockers(op, candidates)
    whole = _finished(kernel.body, blocked) if phased else {}
    for uid in blocked - whole.keys():
        candidates.pop(uid)
    moved: list[Tensor] = []
    count = [0]
    while candidates:
        live = _fullest(kernel, size, capacity)
        if live is None:
            break
        picks = sorted(
            (uid for uid in live if uid in candidates), key=lambda uid: (-size[uid], live[uid])
        )
        if not picks:
            break  # what is live there stays in PSUM: the verifier names it
        # one at a time (the biggest); with ``phased`` every candidate live there at once:
        # an unrolled NKI 0.x kernel has thousands of tiles, and a walk per tile is quadratic
        for pick in picks if phased else picks[:1]:
            t = candidates.pop(pick)
            small = t.bytes_per_partition <= target.sbuf_bytes // _SBUF_SHARE
            if pick in whole:
                if not small:
                    continue
                _move_whole(kernel, t, whole[pick], count)
            else:
                _move(kernel, t, "sbuf" if small else "hbm", count)
            moved.append(t)
    return moved


def _finished(root: list[Stmt], uids: set[int]) -> dict[int, tuple[list[Stmt], Stmt, Stmt]]:
    """For each tensor of ``uids`` whose statements (of the body it is allocated in) that
    write it all come before those that read it, none writing under a mask or through an
    indirect access: (that body, its first and its last statement that writes it).  One
    walk of the kernel."""
    home: dict[int, int] = {}  # uid -> id() of the body holding its Alloc
    first: dict[int, tuple[int, Stmt]] = {}
    last: dict[int, tuple[int, Stmt]] = {}
    read: dict[int, int] = {}  # uid -> index of the first statement reading it
    bad: set[int] = set()
    where: dict[int, list[Stmt]] = {}

    def at(uid: int, frames: list) -> tuple[int, Stmt] | None:
        for body_id, i, stmt in reversed(frames):
            if body_id == home.get(uid):
                return i, stmt
        return None

    def visit(body: list[Stmt], frames: list) -> None:
        for i, s in enumerate(body):
            if isinstance(s, Alloc):
                if s.tensor.uid in uids:
                    home[s.tensor.uid] = id(body)
                    where[s.tensor.uid] = body
                continue
            here = [*frames, (id(body), i, s)]
            if isinstance(s, Loop):
                visit(s.body, here)
                continue
            for a in s.outs:
                uid = a.tensor.uid
                if uid in uids and (p := at(uid, here)) is not None:
                    if s.mask is not None or a.indirect is not None:
                        bad.add(uid)
                    first.setdefault(uid, p)
                    last[uid] = p
            for a in s.ins:
                if not isinstance(a, Access):
                    continue
                if a.indirect is not None and a.indirect.tensor.uid in uids:
                    bad.add(a.indirect.tensor.uid)
                uid = a.tensor.uid
                if uid in uids and a not in s.outs and (p := at(uid, here)) is not None:
                    read.setdefault(uid, p[0])

    visit(root, [])
    return {
        uid: (where[uid], first[uid][1], last[uid][1])
        for uid in last
        if uid not in bad and read.get(uid, len(where[uid])) > last[uid][0]
    }


def _ops_in(s: Stmt):
    if isinstance(s, Op):
        yield s
    elif isinstance(s, Loop):
        for x in s.body:
            yield from _ops_in(x)


def _move_whole(kernel: Kernel, t: Tensor, found: tuple, count: list[int]) -> None:
    """Keep ``t`` in SBUF: its writes go to a PSUM tensor of its shape, allocated before the
    first of them and copied to ``t`` after the last (``found``: see :func:`_finished`; the
    body may have grown since, its statements are the same objects)."""
    body, first_stmt, last_stmt = found
    first = next(i for i, s in enumerate(body) if s is first_stmt)
    last = next(i for i in range(len(body) - 1, -1, -1) if body[i] is last_stmt)
    count[0] += 1
    staging = Tensor(
        f"{t.name}.psum{count[0]}",
        t.shape,
        t.dtype,
        "psum",
        par_axis=t.par_axis,
        loc=t.loc,
        scope=t.scope,
    )
    kernel.tensors.append(staging)
    for s in body[first : last + 1]:
        for op in _ops_in(s):
            op.outs[:] = [_to(a, t, staging) for a in op.outs]
            op.ins[:] = [_to(a, t, staging) for a in op.ins]
    t.buffer = "sbuf"
    outs, ins = [Access.whole(t)], [Access.whole(staging)]
    copy = Op("tensor_copy", outs, ins, check_op("tensor_copy", outs, ins, {}), body[last].loc)
    body[last + 1 : last + 1] = [copy]
    body[first:first] = [Alloc(staging)]


def _to(a, t: Tensor, staging: Tensor):
    return replace(a, tensor=staging) if isinstance(a, Access) and a.tensor is t else a


# a tensor moved out of PSUM goes to SBUF if it takes at most this share of it, else to HBM
_SBUF_SHARE = 4


def _fullest(kernel: Kernel, size: dict[int, int], capacity: int) -> dict[int, int] | None:
    """The PSUM tensors live at the first program point where the automatically
    placed ones need more than ``capacity`` bytes per partition (uid -> first point), or None
    if none does
    (lifetimes from :func:`~nkikit.ir.residency.timeline`, as the allocator sees them)."""
    tl = timeline(kernel)
    n = len(tl.stmts)
    delta = [0] * (n + 1)
    spans = []
    for lt in tl.lifetimes.values():
        t = lt.tensor
        if t.buffer != "psum" or t.user_span is not None:
            continue
        b = size.get(t.uid, t.bytes_per_partition)
        delta[lt.lo] += b
        delta[lt.hi + 1] -= b
        spans.append((lt.lo, lt.hi, t.uid))
    total = 0
    for p in range(n):
        total += delta[p]
        if total > capacity:
            return {uid: lo for lo, hi, uid in spans if lo <= p <= hi}
    return None


def _blockers(op: Op, candidates: dict[int, Tensor]) -> set[int]:
    """Uids of candidates that ``op`` keeps in PSUM: it accumulates into one, writes one
    under a mask, reads and writes the same one, or reaches one indirectly."""
    accesses = [a for a in (*op.outs, *op.ins) if isinstance(a, Access)]
    written = {a.tensor.uid for a in op.outs if a.tensor.uid in candidates}
    read = {a.tensor.uid for a in op.ins if isinstance(a, Access) and a.tensor.uid in candidates}
    out = written & read
    if reads_dst(op) or op.mask is not None:
        out |= written
    for a in accesses:
        if a.indirect is not None:
            out |= {x.uid for x in (a.tensor, a.indirect.tensor) if x.uid in candidates}
    return out


def _move(kernel: Kernel, t: Tensor, memory: str, count: list[int]) -> None:
    """Keep ``t`` in ``memory`` ("sbuf" or "hbm": a private HBM tensor) and stage every
    instruction that touches it."""
    if memory == "hbm":
        t.buffer, t.kind, t.par_axis = "private_hbm", "hbm", 0
    else:
        t.buffer = "sbuf"
    _rewrite(kernel, kernel.body, (), t, count)


def _rewrite(kernel: Kernel, body: list[Stmt], scope: tuple, t: Tensor, count: list[int]) -> None:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            _rewrite(kernel, s.body, scope + (s.var,), t, count)
            out.append(s)
        elif isinstance(s, Alloc) and s.tensor is t and t.is_hbm:
            continue  # an HBM tensor has no allocation statement
        elif isinstance(s, Op) and _touches(s, t):
            out.extend(_staged(kernel, s, scope, t, count))
        else:
            out.append(s)
    body[:] = out


def _touches(op: Op, t: Tensor) -> bool:
    return any(isinstance(a, Access) and a.tensor is t for a in (*op.outs, *op.ins))


def _staged(kernel: Kernel, op: Op, scope: tuple, t: Tensor, count: list[int]) -> list[Stmt]:
    """``op`` with its accesses of ``t`` staged through on-chip tiles: for a tensor moved to
    HBM, loads before it and the store after it; for both, a TensorE result written to a PSUM
    tile and copied out after it (the PSUM eviction)."""
    before: list[Stmt] = []
    after: list[Stmt] = []

    def tile(a: Access, buffer: str) -> Access:
        count[0] += 1
        staging = Tensor(
            f"{t.name}.{buffer}{count[0]}", a.shape, t.dtype, buffer, loc=op.loc, scope=scope
        )
        kernel.tensors.append(staging)
        before.append(Alloc(staging))
        return Access.whole(staging)

    def emit(prim: str, outs: list[Access], ins: list[Access], into: list[Stmt]) -> None:
        into.append(Op(prim, outs, ins, check_op(prim, outs, ins, {}), op.loc))

    if t.is_hbm:
        for k, a in enumerate(op.ins):
            if isinstance(a, Access) and a.tensor is t:
                staged = tile(a, "sbuf")
                emit("dma_copy", [staged], [a], before)
                op.ins[k] = staged
    for k, a in enumerate(op.outs):
        if a.tensor is not t:
            continue
        # VectorE / ScalarE write SBUF; TensorE (and anything else) writes PSUM
        direct = engine_of(op) in ("vector", "scalar")
        sbuf = tile(a, "sbuf") if t.is_hbm else a
        if direct:
            op.outs[k] = sbuf
        else:
            psum = tile(a, "psum")
            op.outs[k] = psum
            emit("tensor_copy", [sbuf], [psum], after)
        if t.is_hbm:
            emit("dma_copy", [a], [sbuf], after)
    return [*before, op, *after]
