"""PSUM tensors too big for PSUM: the compiler keeps them in memory that holds them.

A Beta-1 kernel may declare a PSUM tensor (``nl.ndarray(..., buffer=nl.psum)``) whose blocks in
use at once exceed PSUM -- the attention tutorial's v3 writes all ``32 x 8`` bank-sized blocks of
a score matrix in one loop nest and reads them in later nests.  NKI leaves the placement of an
automatically allocated tensor to the compiler, and the Neuron compiler inserts spills and
refills to the next memory tier when live data exceeds SBUF/PSUM (``reference/nki.md`` §1,
"If live data exceeds SBUF/PSUM, the compiler inserts spills/refills to the next tier" [PM,
MEM]).  :func:`evict_oversized_psum` does that to the traced IR, before it is verified:

* A candidate is an automatically placed PSUM tensor (no direct allocation) whose blocks in
  use at once (``nkikit/ir/residency.py``: :func:`psum_blocks_in_use`, what the verifier's
  capacity rule counts) take more bytes per partition than all PSUM banks hold: no placement
  of it alone fits, so the verifier would reject the kernel.  It is kept in a private HBM
  tensor of the same shape.
* Every instruction that writes it writes a PSUM tile of the written region's shape instead
  (TensorE writes PSUM only), which is copied to an SBUF tile (``tensor_copy``, the PSUM
  eviction) and stored to the HBM tensor (``dma_copy``); an instruction on VectorE/ScalarE
  writes the SBUF tile directly.  Every instruction that reads it reads an SBUF tile loaded
  from the HBM tensor just before it (no engine reads HBM).
* Numbers do not change: the tiles have the tensor's dtype, and copies of equal dtypes are
  exact.  The cost model sees the traffic (two DMAs per block written and read), which is
  what keeping such a tensor costs.
* A tensor is not evicted -- and the verifier reports ``err_psum_total_capacity_exceeded`` as
  before -- when an instruction accumulates into it (``+=`` of a matmul, a read-modify-write),
  writes it under a mask, both reads and writes it, or reaches it through an indirect access:
  a store and reload would not be the same program.  Tensors that each fit but not together
  are not evicted either (the verifier names them).
"""

from __future__ import annotations

from math import prod

from ..ir.core import Access, Alloc, Kernel, Loop, Op, Stmt, Tensor
from ..ir.prims import check_op, engine_of, reads_dst
from ..ir.residency import psum_blocks_in_use
from ..targets import Target

__all__ = ["evict_oversized_psum"]


def evict_oversized_psum(kernel: Kernel, target: Target) -> list[Tensor]:
    """Move the PSUM tensors of ``kernel`` that cannot fit PSUM to HBM, rewriting their
    instructions in place (see the module docstring).  Returns the tensors moved."""
    capacity = target.psum_banks * target.psum_bank_bytes
    blocks = None
    candidates: dict[int, Tensor] = {}
    for t in kernel.tensors:
        if t.buffer != "psum" or t.user_span is not None or t.kind != "temp":
            continue
        if blocks is None:
            blocks = psum_blocks_in_use(kernel)
        nblocks = prod(t.shape[: t.par_axis])
        in_use = blocks.get(t.uid, nblocks)
        if in_use * t.bytes_per_partition // max(nblocks, 1) > capacity:
            candidates[t.uid] = t
    if not candidates:
        return []
    for op, _ in kernel.ops():
        for uid in _blockers(op, candidates):
            candidates.pop(uid, None)
    if not candidates:
        return []
    moved = list(candidates.values())
    for t in moved:
        t.buffer = "private_hbm"
        t.kind = "hbm"
        t.par_axis = 0
    _rewrite(kernel, kernel.body, (), candidates, [0])
    return moved


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


def _rewrite(
    kernel: Kernel, body: list[Stmt], scope: tuple, moved: dict[int, Tensor], count: list[int]
) -> None:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            _rewrite(kernel, s.body, scope + (s.var,), moved, count)
            out.append(s)
        elif isinstance(s, Alloc) and s.tensor.uid in moved:
            continue  # an HBM tensor has no allocation statement
        elif isinstance(s, Op) and _touches(s, moved):
            out.extend(_staged(kernel, s, scope, moved, count))
        else:
            out.append(s)
    body[:] = out


def _touches(op: Op, moved: dict[int, Tensor]) -> bool:
    return any(isinstance(a, Access) and a.tensor.uid in moved for a in (*op.outs, *op.ins))


def _staged(
    kernel: Kernel, op: Op, scope: tuple, moved: dict[int, Tensor], count: list[int]
) -> list[Stmt]:
    """``op`` with its moved operands staged through on-chip tiles: the loads before it, the
    PSUM -> SBUF copy and the store after it."""
    before: list[Stmt] = []
    after: list[Stmt] = []

    def tile(a: Access, buffer: str) -> Access:
        count[0] += 1
        t = Tensor(
            f"{a.tensor.name}.{buffer}{count[0]}",
            a.shape,
            a.tensor.dtype,
            buffer,
            loc=op.loc,
            scope=scope,
        )
        kernel.tensors.append(t)
        before.append(Alloc(t))
        return Access.whole(t)

    def emit(prim: str, outs: list[Access], ins: list[Access], into: list[Stmt]) -> None:
        into.append(Op(prim, outs, ins, check_op(prim, outs, ins, {}), op.loc))

    for k, a in enumerate(op.ins):
        if isinstance(a, Access) and a.tensor.uid in moved:
            staged = tile(a, "sbuf")
            emit("dma_copy", [staged], [a], before)
            op.ins[k] = staged
    for k, a in enumerate(op.outs):
        if a.tensor.uid not in moved:
            continue
        sbuf = tile(a, "sbuf")
        if engine_of(op) in ("vector", "scalar"):
            op.outs[k] = sbuf
        else:  # TensorE (and anything else) writes PSUM: evict it as the compiler would
            psum = tile(a, "psum")
            op.outs[k] = psum
            emit("tensor_copy", [sbuf], [psum], after)
        emit("dma_copy", [a], [sbuf], after)
    return [*before, op, *after]
