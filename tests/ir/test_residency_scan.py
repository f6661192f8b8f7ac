"""The flat scan of ``nkikit/ir/residency.py`` (one walk, lifetimes and residency as array
computations) and the verifier's PSUM liveness built on it agree exactly with the direct
statement-by-statement definitions they replace (written out here as the reference): the same
lifetimes in the same order, the same first SBUF overflow, the same PSUM capacity error, on
kernels with nested rolled loops, block-indexed PSUM, unrolled loops, and hand-built IR with
tensors touched before or without an ``Alloc``."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.errors import UNKNOWN_LOC, NkiError, SourceLoc
from nkikit.ir import verify as V
from nkikit.ir.affine import Affine, Axis, LoopVar
from nkikit.ir.core import ON_CHIP, Access, Alloc, Kernel, Loop, Op, Tensor
from nkikit.ir.residency import (
    Lifetime,
    Recorder,
    psum_blocks_in_use,
    psum_user_top,
    resident_overflow,
    sbuf_size,
    scan,
    timeline,
)
from nkikit.targets import get_target
from nkikit.testing.profiles import register_profiles
from nkikit.testing.random_kernels import random_kernels

register_profiles()
F32 = nl.float32
TRN2 = get_target("trn2")

# ---------------------------------------------------------------------------------------------
# the reference: the definitions, one statement at a time


def ref_lifetimes(kernel: Kernel) -> tuple[list, dict[int, Lifetime]]:
    stmts: list = [None]
    lifetimes: dict[int, Lifetime] = {}
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}

    def count(body) -> int:
        return sum(1 + (count(s.body) if isinstance(s, Loop) else 0) for s in body)

    def touch(t: Tensor, point: int, loops: tuple) -> None:
        if t.buffer not in ON_CHIP:
            return
        lt = lifetimes.get(t.uid)
        if lt is None:
            end = ends[id(loops[0])] if loops else point
            lt = lifetimes[t.uid] = Lifetime(t, point, point, 1, False, end)
        depth = len(t.scope)
        use = (starts[id(loops[depth])], ends[id(loops[depth])]) if len(loops) > depth else None
        use = use or (point, point)
        if not lt.uses or lt.uses[-1] != use:
            lt.uses.append(use)
        lt.hi = max(lt.hi, use[1])
        lt.outer_end = max(lt.outer_end, lt.hi)

    def walk(body, loops) -> None:
        for s in body:
            point = len(stmts)
            stmts.append(s)
            if isinstance(s, Alloc) and s.tensor.buffer in ON_CHIP:
                t = s.tensor
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
                ends[id(s)] = point + count(s.body)
                walk(s.body, loops + (s,))

    walk(kernel.body, ())
    return stmts, lifetimes


def ref_overflow(kernel: Kernel, limit: int):
    stmts, lifetimes = ref_lifetimes(kernel)
    delta = [0] * (len(stmts) + 1)
    segs = []
    for lt in lifetimes.values():
        if lt.tensor.buffer != "sbuf":
            continue
        size = sbuf_size(lt.tensor, TRN2)
        for a, b in lt.resident():
            delta[a] += size
            delta[b + 1] -= size
            segs.append((a, b, lt))
    first, total = None, 0
    for p in range(len(stmts)):
        total += delta[p]
        if total > limit:
            if isinstance(stmts[p], Op):
                first = (p, total)
                break
            first = first or (p, total)
    if first is None:
        return None
    p, used = first
    here = sorted(
        {lt.tensor.uid: lt.tensor for a, b, lt in segs if a <= p <= b}.values(),
        key=lambda t: -t.bytes_per_partition,
    )
    return p, used, [t.uid for t in here]


def ref_psum(kernel: Kernel, limit: int, psum: int | None = None) -> str | None:
    """The PSUM liveness rule, body by body: the error it raises, as text (None: it passes).
    Unplaced tensors add their bytes; the tensors placed by hand (``Tensor.address``) live at a
    statement add the bytes of the union of their byte ranges.  ``psum``: the bytes of a
    partition, which no placement may pass (checked as the walk enters a body)."""
    blocks = psum_blocks_in_use(kernel)

    def size(t: Tensor) -> int:
        n = blocks.get(t.uid)
        whole = t.bytes_per_partition
        return whole if n is None else n * whole // prod(t.shape[: t.par_axis])

    def uses(s) -> set[int]:
        if isinstance(s, Op):
            return {a.tensor.uid for a in (*s.outs, *s.ins) if isinstance(a, Access)}
        if isinstance(s, Loop):
            return set().union(*(uses(x) for x in s.body)) if s.body else set()
        return set()

    def union(ranges) -> int:
        covered: set[int] = set()
        for lo, hi in ranges:
            covered.update(range(lo, hi))
        return len(covered)

    def allocs_of(body) -> list:
        return [
            (i, s.tensor)
            for i, s in enumerate(body)
            if isinstance(s, Alloc) and s.tensor.buffer == "psum" and s.tensor.user_span is None
        ]

    def show(x: Tensor) -> str:
        at = "" if x.address is None else f" at byte {x.address}"
        return f"{x.name} ({size(x)} B{at}, line {x.loc.line if x.loc else '?'})"

    def run(body, outer: int, chain: list) -> str | None:
        allocs = allocs_of(body)
        for _, t in allocs:  # the body's placements, as the walk enters it
            if t.address is not None and psum is not None and t.address + size(t) > psum:
                lo, hi = t.address, t.address + size(t)
                what = f"{t.name} at bytes [{lo}, {hi}) of each PSUM partition, which has {psum}"
                err = NkiError("err_allocation_out_of_bounds", t.loc or UNKNOWN_LOC, what=what)
                return str(err)
        last = {t.uid: i for i, t in allocs}
        for i, s in enumerate(body):
            for uid in uses(s):
                if uid in last:
                    last[uid] = i
        cur = 0
        for i, s in enumerate(body):
            frames = chain + [((allocs, last), i)]
            live = [x for (al, la), pos in frames for a, x in al if a <= pos <= la[x.uid]]
            cur = sum(size(x) for a, x in allocs if a <= i <= last[x.uid] and x.address is None)
            placed = union((x.address, x.address + size(x)) for x in live if x.address is not None)
            used = outer + cur + placed
            if isinstance(s, Alloc) and s.tensor.uid in last and used > limit:
                live.sort(key=lambda x: -size(x))
                shown = ", ".join(show(x) for x in live[:5])
                if len(live) > 5:
                    shown += f", and {len(live) - 5} more"
                err = NkiError(
                    "err_psum_total_capacity_exceeded",
                    s.tensor.loc or UNKNOWN_LOC,
                    used=used,
                    limit=limit,
                    banks=limit // 2048,
                    tensors=shown,
                )
                return str(err)
            if isinstance(s, Loop):
                got = run(s.body, outer + cur, frames)
                if got is not None:
                    return got
        return None

    return run(kernel.body, 0, [])


# ---------------------------------------------------------------------------------------------
# the comparisons


def check_scan(kernel: Kernel) -> None:
    stmts, want = ref_lifetimes(kernel)
    tl = timeline(kernel)
    assert tl.stmts == stmts
    got = tl.lifetimes
    assert list(got) == list(want)
    for uid, lt in want.items():
        g = got[uid]
        assert g.tensor is lt.tensor
        assert (g.lo, g.hi, g.execs, g.pipelined, g.outer_end) == (
            lt.lo,
            lt.hi,
            lt.execs,
            lt.pipelined,
            lt.outer_end,
        ), lt.tensor.name
        assert g.uses == lt.uses, lt.tensor.name
    # the first overflow at every capacity that makes one, and at none
    peak = max((sbuf_size(lt.tensor, TRN2) for lt in want.values()), default=0)
    steps = {k * peak + e for k in range(1, 6) for e in (-1, 0)}
    for limit in sorted({0, 1, 10**9} | steps):
        over = resident_overflow(timeline(kernel), TRN2, limit)
        ref = ref_overflow(kernel, limit)
        if ref is None:
            assert over is None, limit
        else:
            assert over is not None, limit
            assert (over.point, over.used, [t.uid for t in over.tensors]) == ref, limit
    # the PSUM rule at every limit around the tensors' sizes
    sc = scan(kernel)
    top = psum_user_top(kernel)
    steps = {k * 256 + e for k in range(1, 9) for e in (-1, 0)}
    for limit in sorted({0, 1, 2048, 4096, 8192, 16384, 10**9} | steps):
        target = TRN2.with_overrides(psum_bytes=limit + top)
        try:
            V._psum_liveness(kernel, target, sc)
            got_psum = None
        except NkiError as e:
            got_psum = e
        ref = ref_psum(kernel, limit, psum=limit + top)
        assert (None if got_psum is None else str(got_psum)) == ref, limit


def _ir(kernel, *specs) -> Kernel:
    return kernel.ir(*specs)


@nki.jit
def nested(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    keep = nl.load(a[0:128, :])
    for i in nl.affine_range(2):
        acc = nl.zeros((128, 64), dtype=F32, buffer=nl.psum)
        x = nl.load(a[i * 128 : (i + 1) * 128, :])
        for _j in nl.sequential_range(3):
            y = nl.multiply(x, 2.0)
            for _k in nl.affine_range(2):
                acc += nl.add(y, keep)
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.copy(acc))
    for r in range(3):  # unrolled
        z = nl.load(a[r * 128 : (r + 1) * 128, :])
        nl.store(out[r * 128 : (r + 1) * 128, :], nl.add(z, keep))
    return out


@nki.jit
def psum_blocks(a, b):
    out = nl.ndarray((4, 128, 512), dtype=F32, buffer=nl.shared_hbm)
    acc = nl.ndarray((4, nl.par_dim(128), 512), dtype=F32, buffer=nl.psum)
    ta = nl.load(a)
    for i in nl.affine_range(4):
        acc[i] = nisa.nc_matmul(ta, nl.load(b[:, nl.ds(i * 512, 512)]))
        nl.store(out[i], value=nl.copy(acc[i]))
    return out


def _unrolled(steps: int):
    import nkikit.nki as nki0
    import nkikit.nki.isa as nisa0
    import nkikit.nki.language as nl0

    @nki0.jit
    def unrolled(a, w):
        out = nl0.ndarray((4 * 128, 128), dtype=nl0.float32, buffer=nl0.shared_hbm)
        ws = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.sbuf)
        nisa0.dma_copy(dst=ws, src=w)
        for i in range(steps):
            rows = slice((i % 4) * 128, (i % 4 + 1) * 128)
            t = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.sbuf)
            nisa0.dma_copy(dst=t, src=a[rows, :])
            acc = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.psum)
            nisa0.nc_matmul(dst=acc, stationary=ws, moving=t)
            res = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.sbuf)
            nisa0.tensor_copy(dst=res, src=acc)
            nisa0.dma_copy(dst=out[rows, :], src=res)
        return out

    a = np.zeros((4 * 128, 128), np.float32)
    return unrolled._trace(unrolled.bind((a, np.zeros((128, 128), np.float32)), {}), "trn2")


def _hand_built() -> Kernel:
    """Tensors touched before their Alloc, without any, allocated twice, an empty loop."""
    loc = SourceLoc("hand.py", 1, "x")

    def tensor(name, buffer, scope=()):
        return Tensor(name, (128, 64), np.dtype(np.float32), buffer, scope=scope)

    hbm = Tensor("h", (128, 64), np.dtype(np.float32), "shared_hbm", kind="output")
    i = LoopVar("i", 3, "affine")
    j = LoopVar("j", 2, "sequential")
    early, loose, twice = tensor("early", "sbuf"), tensor("loose", "sbuf"), tensor("twice", "psum")
    inner, p = tensor("inner", "sbuf", (i,)), tensor("p", "psum", (i,))

    def op(dst, *src):
        return Op("tensor_copy", [Access.whole(dst)], [Access.whole(s) for s in src], {}, loc)

    idx = (Affine.of(Axis(0)), Affine.of(Axis(1)))
    body = [
        op(early, hbm),
        Alloc(early),
        Alloc(twice),
        op(twice, early),
        Loop(j, [], loc),
        Loop(
            i,
            [
                Alloc(inner),
                Alloc(p),
                op(inner, loose),
                Loop(
                    j,
                    [op(p, inner), Op("tensor_copy", [Access(p, (128, 64), idx)], [1.0], {}, loc)],
                    loc,
                ),
                op(loose, p),
            ],
            loc,
        ),
        Alloc(twice),
        op(hbm, twice),
        op(hbm, early),
    ]
    return Kernel("hand", [], [hbm], body, tensors=[hbm, early, loose, twice, inner, p])


def _placed() -> Kernel:
    """PSUM tensors placed by hand (``Tensor.address``) among unplaced ones: two placed on the
    same bank, two overlapping by half a bank, a placed tensor of the outer body live across a
    loop whose body places one per iteration on bytes it shares, one allocated twice."""
    loc = SourceLoc("placed.py", 1, "x")
    f32 = np.dtype(np.float32)
    i = LoopVar("i", 4, "affine")

    def psum(name, cols, address=None, scope=()):
        return Tensor(name, (128, cols), f32, "psum", scope=scope, address=address, loc=loc)

    hbm = Tensor("h", (128, 512), f32, "shared_hbm", kind="output")
    a, b = psum("a", 512, 0), psum("b", 512, 0)  # one bank, shared
    c, d = psum("c", 512, 2048), psum("d", 512, 3072)  # bytes [2048, 4096) and [3072, 5120)
    u = psum("u", 256)  # unplaced, 1 KiB
    e = psum("e", 256, 5120, (i,))  # per iteration, inside d's and beside it
    v = psum("v", 128, None, (i,))
    twice = psum("twice", 512, 8192)

    def op(dst, *src):
        return Op("tensor_copy", [Access.whole(dst)], [Access.whole(x) for x in src], {}, loc)

    body = [
        Alloc(a),
        Alloc(u),
        op(a, hbm),
        Alloc(b),
        op(b, a),
        Alloc(c),
        Alloc(d),
        op(c, d),
        Loop(i, [Alloc(e), Alloc(v), op(e, c), op(v, e), op(u, v)], loc),
        Alloc(twice),
        op(twice, b),
        Alloc(twice),
        op(hbm, twice, u),
    ]
    return Kernel("placed", [], [hbm], body, tensors=[hbm, a, b, c, d, u, e, v, twice])


@pytest.mark.parametrize(
    "make",
    [
        lambda: _ir(nested, nt.tensor[[384, 64], F32]),
        lambda: _ir(psum_blocks, nt.tensor[[128, 128], F32], nt.tensor[[128, 4 * 512], F32]),
        lambda: _unrolled(9),
        _hand_built,
        _placed,
    ],
    ids=["nested-loops", "psum-blocks", "nki0x-unrolled", "hand-built", "placed"],
)
def test_scan_matches_the_definitions(make) -> None:
    check_scan(make())


@settings(settings.get_profile("ci"), max_examples=40)
@given(random_kernels(illegal=False))
def test_scan_matches_the_definitions_on_random_kernels(case) -> None:
    check_scan(case.build().ir(*case.inputs))


def test_the_verifier_records_the_scan_it_checks_capacity_with() -> None:
    """The verifier's walk records the same scan as ``residency.scan`` walks."""
    ir = _ir(nested, nt.tensor[[384, 64], F32])
    walk = V._Walk(ir, TRN2)
    walk.body(ir.body, (), {}, 0)
    mine, theirs = walk.rec.finish(), scan(ir)
    assert mine.stmts == theirs.stmts and mine.chain == theirs.chain
    assert [t.uid for t in mine.tensors] == [t.uid for t in theirs.tensors]
    for f in ("touch_owner", "touch_point", "touch_ctx", "alloc_owner", "alloc_point"):
        assert np.array_equal(getattr(mine, f), getattr(theirs, f)), f
    assert isinstance(Recorder().finish().touch_owner, np.ndarray)


@st.composite
def placed_kernels(draw) -> Kernel:
    """Random hand-built kernels of PSUM tensors, some placed by hand at random bytes (so
    placements coincide, overlap or sit apart), allocated in loops up to two deep and used by
    later statements of the same or of nested bodies."""
    loc = SourceLoc("random_placed.py", 1, "x")
    f32 = np.dtype(np.float32)
    hbm = Tensor("h", (128, 128), f32, "shared_hbm", kind="output")
    made: list[Tensor] = [hbm]

    def body(scope: tuple, visible: list[Tensor], depth: int) -> list:
        out: list = []
        mine = list(visible)
        for _ in range(draw(st.integers(1, 5))):
            kind = draw(
                st.sampled_from(
                    ["alloc", "alloc", "use", "loop"] if depth < 2 else ["alloc", "use"]
                )
            )
            if kind == "alloc":
                again = [t for t in mine if t.scope == scope and t.buffer == "psum"]
                if again and draw(st.booleans()):
                    out.append(Alloc(draw(st.sampled_from(again))))
                    continue
                cols = draw(st.sampled_from([128, 256, 512]))
                address = draw(st.sampled_from([None, None, 0, 1024, 2048, 4096, 7168]))
                t = Tensor(
                    f"t{len(made)}",
                    (128, cols),
                    f32,
                    "psum",
                    scope=scope,
                    address=address,
                    loc=SourceLoc("random_placed.py", len(made), "x"),
                )
                made.append(t)
                mine.append(t)
                out.append(Alloc(t))
            elif kind == "use":
                t = draw(st.sampled_from(mine))
                out.append(Op("tensor_copy", [Access.whole(hbm)], [Access.whole(t)], {}, loc))
            else:
                var = LoopVar(f"i{len(made)}", draw(st.integers(1, 3)), "affine")
                out.append(Loop(var, body(scope + (var,), mine, depth + 1), loc))
        return out

    stmts = body((), [hbm], 0)
    return Kernel("random_placed", [], [hbm], stmts, tensors=made)


@settings(settings.get_profile("ci"), max_examples=60)
@given(placed_kernels())
def test_psum_liveness_matches_the_definition_on_random_placed_kernels(kernel) -> None:
    sc = scan(kernel)
    for limit in (0, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 10**9):
        target = TRN2.with_overrides(psum_bytes=limit)
        try:
            V._psum_liveness(kernel, target, sc)
            got = None
        except NkiError as e:
            got = str(e)
        assert got == ref_psum(kernel, limit, psum=limit), limit
