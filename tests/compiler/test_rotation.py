"""Address rotation: the tensors an unrolled loop allocates at one line take successive
buffers of one placement, so ``range``, ``nl.static_range`` and ``nl.affine_range``
versions of a loop model alike; rotation never puts two live tensors on one buffer and
gives way when it does not fit."""

from __future__ import annotations

import pytest

import nkikit.language as nl
import nkikit.typing as nt
from benchmarks.scale.kernels import make_loop
from nkikit.compiler.allocate import allocate
from nkikit.compiler.build import build_program
from nkikit.targets import get_target

from . import kernels as K

F32 = nl.float32


def _ir(kernel, *specs, target="trn2"):
    return kernel.specialize_for(target, *specs)[0]


def _used_range(p):
    """(first byte, end) of the buffer a straight-line tensor actually uses: the group's
    allocations take buffers in turn, this one is allocation number ``rotation``."""
    lo = p.address(p.rotation % p.buffers)
    return lo, lo + p.size


def _clash(p, q) -> bool:
    if p.memory != q.memory:
        return False
    if not (p.partition < q.partition + q.partitions and q.partition < p.partition + p.partitions):
        return False
    (a0, a1), (b0, b1) = _used_range(p), _used_range(q)
    return a0 < b1 and b0 < a1


def _assert_live_apart(alloc):
    """No two tensors live at the same time use a common byte (straight-line kernels)."""
    ps = sorted(alloc.placements.values(), key=lambda p: p.live[0])
    for i, p in enumerate(ps):
        for q in ps[i + 1 :]:
            if q.live[0] > p.live[1]:
                break
            assert not _clash(p, q), (p.tensor.name, q.tensor.name)


@pytest.mark.parametrize("steps", [8, 64, 128])
def test_loop_forms_model_alike(steps):
    args = (nt.tensor[[steps * 128, 128], F32], nt.tensor[[128, 128], F32])
    times = {}
    for form in ("range", "static_range", "affine_range"):
        program = build_program(_ir(make_loop(steps, form), *args), "trn2")
        times[form] = program.total_us
        assert len(program) == 16 + 34 * steps  # the same instructions in every form
    assert max(times.values()) <= 1.03 * min(times.values()), times
    # without rotation every unrolled step waits for the previous one's tiles
    fixed = build_program(_ir(make_loop(steps, "range"), *args), "trn2", rotation=False)
    assert fixed.total_us > 2 * times["range"]


def test_unrolled_tiles_share_one_rotating_placement():
    alloc = allocate(_ir(K.unrolled_copies, nt.tensor[[1024, 256], F32]), get_target("trn2"))
    xs = sorted(
        (p for p in alloc.placements.values() if p.tensor.name.split(".")[0] == "x"),
        key=lambda p: p.live[0],
    )
    assert len(xs) == 8
    first = xs[0]
    assert first.buffers == get_target("trn2").max_buffers
    assert [p.rotation for p in xs] == list(range(8))
    assert all((p.offset, p.buffers, p.rotations) == (first.offset, first.buffers, 8) for p in xs)
    assert all(alloc.leader[p.tensor.uid] == first.tensor.uid for p in xs)
    assert len([g for g in alloc.groups() if g.memory == "sbuf"]) == 2  # x and exp(x)
    assert alloc.rotation
    _assert_live_apart(alloc)


def test_members_live_together_take_different_buffers():
    # each add reads the previous add's result: two members of the add's line are live at
    # once, so the group keeps at least two buffers however short memory is
    tight = get_target("trn2").with_overrides(sbuf_bytes=5 * 1024)
    for target in (get_target("trn2"), tight):
        alloc = allocate(_ir(K.carried_sum, nt.tensor[[1024, 256], F32]), target)
        adds = [p for p in alloc.placements.values() if p.tensor.name.startswith("acc.")]
        assert len(adds) == 7 and all(p.rotations == 7 for p in adds)
        assert adds[0].buffers >= 2
        assert {p.lane for p in adds} == {0, 1}
        _assert_live_apart(alloc)
        assert all(p.end <= target.sbuf_bytes for p in alloc.placements.values())


def test_rotation_gives_way_when_it_does_not_fit():
    ir = _ir(K.helper_around_big, nt.tensor[[384, 512], F32])
    roomy = allocate(ir, get_target("trn2"))
    helper = [p for p in roomy.placements.values() if p.tensor.name.split(".")[0] == "t"]
    assert len(helper) == 2 and helper[0].rotations == 2 and roomy.rotation
    # in 2 KiB per partition the big tile leaves no room for the helper's rotating
    # placement, which would be live across it; one by one they fit
    two_k = get_target("trn2").with_overrides(sbuf_bytes=2048)
    alloc = allocate(ir, two_k)
    assert not alloc.rotation
    assert all(p.rotations == 1 and p.end <= 2048 for p in alloc.placements.values())
    _assert_live_apart(alloc)


def test_unrolled_matmuls_rotate_through_psum():
    ir = _ir(K.unrolled_matmuls, nt.tensor[[1024, 128], F32], nt.tensor[[128, 128], F32])
    alloc = allocate(ir, get_target("trn2"))
    ps = [p for p in alloc.placements.values() if p.memory == "psum"]
    assert len(ps) == 8 and all(p.rotations == 8 for p in ps)
    p = ps[0]
    assert p.buffers == get_target("trn2").max_buffers
    starts = [p.address(k) for k in range(p.buffers)]
    assert len(set(starts)) == p.buffers
    assert all(s // 2048 == (s + p.size - 1) // 2048 for s in starts)  # none straddles a bank
    _assert_live_apart(alloc)
