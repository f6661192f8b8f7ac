"""Lifetimes of on-chip tensors, and the SBUF bytes that must stay resident at each statement.

One walk serves the verifier's capacity rule and the compiler's allocator, so that what the
verifier accepts the allocator can place, spilling if it must.

*Program points* number the statements of a kernel in program order, depth first: every
``Alloc``, ``Op`` and ``Loop`` is one point, and a loop's body follows its own point.  A
tensor's *uses* are the statements of its own body (the body it was created in) that touch
it, as point intervals: an op is one point; a loop nested in that body that touches it
anywhere inside is the loop's whole span, since any iteration may touch it.  A tensor lives
from its ``Alloc`` (or first use, if it has none) to its last use (:class:`Lifetime`).

Spilling (the Neuron compiler saves a tile to HBM and reloads it before its next use [PM,
MEM]) can free a tensor's SBUF between two uses with at least one statement between them,
and nowhere else.  So with every such stretch spilled, a tensor holds SBUF only over its
*resident segments*: from its first use to the end of its last use, cut at every such
stretch.  The bytes of the segments covering a point are a floor no allocation can go
below; :func:`resident_overflow` finds the first statement where that floor exceeds the
capacity.  A kernel with such a statement cannot run, spilled or not; any other kernel the
allocator places, spilling as needed (``nkikit/compiler/allocate.py``).  Sizes are bytes per
partition rounded up to the allocation alignment, as the allocator places them.

PSUM is not spilled (its tiles are accumulation groups in flight), so none of this applies
to it: a PSUM tensor holds its bytes over its whole lifetime.

A tensor with a ``user_span`` (a direct allocation: ``nki.compiler.sbuf/psum.mod_alloc`` or
``alloc``) occupies that span: blocks beyond the allocated tiles alias, so an SBUF tensor
takes the span's bytes (:func:`sbuf_size`), and a PSUM tensor stays at its banks for the whole
kernel -- user allocations may overlap (the program orders them), so they take the banks of
their union, and automatically allocated PSUM goes above the highest of them
(:func:`psum_user_top`), in the verifier's capacity rule and in the allocator alike.

Cost: one walk, O(statements x loop depth + accesses), and a sweep over the segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from ..errors import UNKNOWN_LOC, NkiError, SourceLoc
from ..targets import Target
from .core import ON_CHIP, Access, Alloc, Kernel, Loop, Op, Stmt, Tensor


@dataclass(slots=True)
class Lifetime:
    """Where one on-chip tensor lives, in program points.

    ``lo``..``hi``: from its allocation to its last use; ``execs``: how many times its
    ``Alloc`` runs per kernel instance; ``pipelined``: its innermost enclosing loop is an
    ``affine_range``; ``outer_end``: the last point of its outermost enclosing loop (``hi`` at
    top level); ``uses``: the statements of its own body that touch it (see the module
    docstring), disjoint and in program order."""

    tensor: Tensor
    lo: int
    hi: int
    execs: int
    pipelined: bool
    outer_end: int
    uses: list[tuple[int, int]] = field(default_factory=list)

    def gaps(self) -> list[int]:
        """The ``j`` for which the tensor may be spilled between uses ``j`` and ``j + 1``:
        at least one statement lies between them."""
        u = self.uses
        return [j for j in range(len(u) - 1) if u[j][1] + 1 < u[j + 1][0]]

    def resident(self) -> list[tuple[int, int]]:
        """Its resident segments: the points it holds memory at when every gap is spilled."""
        u = self.uses
        if not u:
            return [(self.lo, self.lo)]
        out, start = [], u[0][0]
        for j in self.gaps():
            out.append((start, u[j][1]))
            start = u[j + 1][0]
        out.append((start, u[-1][1]))
        return out


@dataclass(slots=True)
class Timeline:
    """The statement at every program point (``stmts[p]``; point 0 is the kernel entry, no
    statement) and the lifetime of every on-chip tensor, by uid, in order of first sight."""

    stmts: list[Stmt | None]
    lifetimes: dict[int, Lifetime]


def timeline(kernel: Kernel) -> Timeline:
    """Number the statements of ``kernel`` and record every on-chip tensor's lifetime."""
    stmts: list[Stmt | None] = [None]
    lifetimes: dict[int, Lifetime] = {}
    starts: dict[int, int] = {}  # id(loop) -> its point
    ends: dict[int, int] = {}  # id(loop) -> the last point of its body

    def touch(t: Tensor, point: int, loops: tuple[Loop, ...]) -> None:
        if t.buffer not in ON_CHIP:
            return
        lt = lifetimes.get(t.uid)
        if lt is None:  # used without an Alloc statement: live from its first use
            end = ends[id(loops[0])] if loops else point
            lt = lifetimes[t.uid] = Lifetime(t, point, point, 1, False, end)
        depth = len(t.scope)
        if len(loops) > depth:
            lp = loops[depth]
            use = (starts[id(lp)], ends[id(lp)])
        else:
            use = (point, point)
        if not lt.uses or lt.uses[-1] != use:
            lt.uses.append(use)
        lt.hi = max(lt.hi, use[1])
        lt.outer_end = max(lt.outer_end, lt.hi)

    def walk(body: list[Stmt], loops: tuple[Loop, ...]) -> None:
        for s in body:
            point = len(stmts)
            stmts.append(s)
            if isinstance(s, Alloc):
                t = s.tensor
                if t.buffer in ON_CHIP:
                    execs = prod(lp.trip for lp in loops)
                    pipelined = bool(loops) and loops[-1].kind == "affine"
                    end = ends[id(loops[0])] if loops else point
                    lifetimes[t.uid] = Lifetime(t, point, point, execs, pipelined, end)
            elif isinstance(s, Op):
                for a in (*s.outs, *s.ins):
                    if isinstance(a, Access):
                        touch(a.tensor, point, loops)
            elif isinstance(s, Loop):
                starts[id(s)] = point
                ends[id(s)] = point + _count(s.body)
                walk(s.body, loops + (s,))

    walk(kernel.body, ())
    return Timeline(stmts, lifetimes)


def _count(body: list[Stmt]) -> int:
    n = 0
    for s in body:
        n += 1
        if isinstance(s, Loop):
            n += _count(s.body)
    return n


def sbuf_size(t: Tensor, target: Target) -> int:
    """Bytes per partition one buffer of SBUF tensor ``t`` takes, alignment included: its
    user allocation's span if it has one (aliasing blocks share bytes)."""
    a = target.sbuf_align
    return -(-max(footprint(t), 1) // a) * a


def footprint(t: Tensor) -> int:
    """Bytes per partition ``t`` occupies: its user allocation's span, else the whole tensor."""
    if t.user_span is not None:
        return t.user_span[1] - t.user_span[0]
    return t.bytes_per_partition


def psum_user_top(kernel: Kernel) -> int:
    """The end (bytes per partition) of the highest PSUM bank a user allocation of ``kernel``
    holds, 0 without any: automatically allocated PSUM tensors go above it."""
    top = 0
    for t in kernel.tensors:
        if t.buffer == "psum" and t.user_span is not None:
            top = max(top, t.user_span[1])
    for s, _ in kernel.walk():
        if isinstance(s, Alloc) and s.tensor.buffer == "psum" and s.tensor.user_span is not None:
            top = max(top, s.tensor.user_span[1])
    return top


@dataclass(frozen=True, slots=True)
class Overflow:
    """The first statement whose resident SBUF tensors exceed the capacity."""

    point: int
    loc: SourceLoc
    used: int  # resident bytes per partition there
    limit: int
    tensors: tuple[Tensor, ...]  # resident there, biggest first

    def error(self) -> NkiError:
        """``err_sbuf_capacity_exceeded`` at the statement, naming what it needs at once."""
        shown = ", ".join(
            f"{t.name} ({t.bytes_per_partition} B, {t.loc or '?'})" for t in self.tensors[:6]
        )
        if len(self.tensors) > 6:
            shown += f", and {len(self.tensors) - 6} more"
        shown += " (all in use here: spilling cannot free them; use smaller tiles)"
        return NkiError(
            "err_sbuf_capacity_exceeded",
            self.loc,
            buffer="SBUF",
            used=self.used,
            limit=self.limit,
            tensors=shown,
        )


def resident_overflow(tl: Timeline, target: Target, capacity: int | None = None) -> Overflow | None:
    """The first statement (an instruction if any qualifies) where the resident segments of
    the SBUF tensors need more than ``capacity`` (default: the target's SBUF) bytes per
    partition, or None when every statement fits.  The partition ranges of the tensors are
    not considered: their bytes add up as if they all shared one partition."""
    limit = target.sbuf_bytes if capacity is None else capacity
    n = len(tl.stmts)
    delta = [0] * (n + 1)
    segs: list[tuple[int, int, Lifetime]] = []
    for lt in tl.lifetimes.values():
        if lt.tensor.buffer != "sbuf":
            continue
        size = sbuf_size(lt.tensor, target)
        for a, b in lt.resident():
            delta[a] += size
            delta[b + 1] -= size
            segs.append((a, b, lt))
    first = None
    total = 0
    for p in range(n):
        total += delta[p]
        if total > limit:
            if isinstance(tl.stmts[p], Op):
                first = (p, total)
                break
            if first is None:
                first = (p, total)
    if first is None:
        return None
    p, used = first
    here = sorted(
        {lt.tensor.uid: lt.tensor for a, b, lt in segs if a <= p <= b}.values(),
        key=lambda t: -t.bytes_per_partition,
    )
    s = tl.stmts[p]
    if isinstance(s, Op | Loop):
        loc = s.loc
    elif isinstance(s, Alloc) and s.tensor.loc is not None:
        loc = s.tensor.loc
    else:
        loc = here[0].loc if here and here[0].loc else UNKNOWN_LOC
    return Overflow(p, loc, used, limit, tuple(here))
