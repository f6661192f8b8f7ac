"""SBUF/PSUM allocation: disjointness, PSUM banks, multi-buffering, capacity errors."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.compiler.allocate import allocate
from nkikit.errors import NkiError
from nkikit.targets import get_target

from . import kernels as K

F32 = nl.float32
BF16 = nl.bfloat16


def _placements(kernel, *specs, target="trn2"):
    ir = kernel.ir(*specs)
    alloc = allocate(ir, get_target(target) if isinstance(target, str) else target)
    return alloc, {p.tensor.name: p for p in alloc.placements.values()}


def _overlap(p, q) -> bool:
    """True when any buffer of p and any buffer of q share a byte of a partition."""
    if p.memory != q.memory:
        return False
    if not (p.partition < q.partition + q.partitions and q.partition < p.partition + p.partitions):
        return False
    for i in range(p.buffers):
        for j in range(q.buffers):
            a, b = p.address(i), q.address(j)
            if a < b + q.size and b < a + p.size:
                return True
    return False


def test_live_together_means_disjoint():
    _, pl = _placements(K.two_live, nt.tensor[[128, 512], F32], nt.tensor[[128, 512], F32])
    names = [n for n in pl if pl[n].memory == "sbuf"]
    assert {"x", "y"} <= set(names)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not _overlap(pl[a], pl[b]), (a, b)
    for p in pl.values():
        assert p.offset % 64 == 0 and p.end <= get_target("trn2").sbuf_bytes


def test_disjoint_lifetimes_share_memory():
    alloc, pl = _placements(K.two_phases, nt.tensor[[512, 256], F32])
    first, second = pl["first"], pl["second"]
    assert first.buffers == second.buffers == 4
    assert first.offset == second.offset  # sibling loops reuse the same bytes
    assert alloc.overlap(first.tensor, second.tensor)


def test_multi_buffering_by_loop_kind():
    _, pl = _placements(K.buffering, nt.tensor[[1024, 64], F32])
    assert pl["top"].buffers == 1  # top level: one instance
    assert pl["many"].buffers == 4  # affine_range(8): up to max_buffers
    assert pl["pair"].buffers == 2  # affine_range(2): one per iteration
    assert pl["seq"].buffers == 2  # sequential_range: double buffered
    many = pl["many"]
    assert [many.address(k) for k in range(4)] == [many.offset + k * many.size for k in range(4)]


def test_fewer_buffers_when_memory_is_short():
    # each tile is 64 fp32 = 256 B per partition; the loops run one after another, so their
    # tiles share memory and only the four buffers of 'many' compete for 768 bytes
    small = get_target("trn2").with_overrides(sbuf_bytes=3 * 256)
    _, pl = _placements(K.buffering, nt.tensor[[1024, 64], F32], target=small)
    assert pl["many"].buffers == 3
    assert pl["pair"].buffers == 2 and pl["seq"].buffers == 2
    assert all(p.end <= 3 * 256 for p in pl.values())


def test_psum_tiles_stay_inside_one_bank():
    _, pl = _placements(K.psum_tiles, nt.tensor[[128, 128], BF16], nt.tensor[[128, 512], BF16])
    psum = [p for p in pl.values() if p.memory == "psum"]
    assert {p.tensor.name for p in psum} == {"big", "mid", "small"}
    assert pl["big"].offset % 2048 == 0 and pl["big"].size == 2048
    assert pl["small"].size == 512  # 400 B padded to a power of two
    for p in psum:
        for k in range(p.buffers):
            lo = p.address(k)
            assert lo // 2048 == (lo + p.size - 1) // 2048, p
            assert lo % min(p.size, 2048) == 0
    for i, a in enumerate(psum):
        for b in psum[i + 1 :]:
            assert not _overlap(a, b)


def test_small_partition_tiles_use_quadrants():
    # seven live 32-partition tiles of 1 KiB fit in 2 KiB per partition only by using all
    # four partition quadrants [A2]
    tiny = get_target("trn2").with_overrides(sbuf_bytes=2048)
    _, pl = _placements(K.quadrants, nt.tensor[[128, 256], F32], target=tiny)
    assert {p.partition for p in pl.values()} == {0, 32, 64, 96}
    assert all(p.partitions == 32 and p.end <= 2048 for p in pl.values())
    for i, a in enumerate(pl.values()):
        for b in list(pl.values())[i + 1 :]:
            if a.live[0] <= b.live[1] and b.live[0] <= a.live[1]:
                assert not _overlap(a, b)


def test_over_capacity_names_tensors_sizes_and_lines():
    tiny = get_target("trn2").with_overrides(sbuf_bytes=3 * 1024)
    ir = K.two_live.ir(nt.tensor[[128, 512], F32], nt.tensor[[128, 512], F32])
    with pytest.raises(NkiError) as e:
        allocate(ir, tiny)
    err = e.value
    assert err.name == "err_sbuf_capacity_exceeded"
    msg = str(err)
    assert f"x (2048 B, kernels.py:{K.line_of('# @x')})" in msg
    assert f"y (2048 B, kernels.py:{K.line_of('# @y')})" in msg
    assert "3072" in msg


def test_psum_over_capacity():
    one_bank = get_target("trn2").with_overrides(psum_bytes=2048)
    ir = K.psum_tiles.ir(nt.tensor[[128, 128], BF16], nt.tensor[[128, 512], BF16])
    with pytest.raises(NkiError) as e:
        allocate(ir, one_bank)
    assert e.value.name == "err_psum_total_capacity_exceeded"
    assert "big (2048 B" in str(e.value)


def test_fully_optimized_matmul_fits_with_double_buffers():
    from benchmarks.calibration.matmul_kernels import matmul_fully_blocked

    _, pl = _placements(
        matmul_fully_blocked,
        nt.tensor[[8192, 4096], BF16],
        nt.tensor[[8192, 8192], BF16],
        target="trn1",
    )
    assert pl["partial"].buffers == 1  # 64 KiB: no room for a second copy
    assert pl["b_blk"].buffers == 2 and pl["a_blk"].buffers == 2
    assert pl["acc"].buffers == 4 and pl["acc"].memory == "psum"
    assert max(p.end for p in pl.values() if p.memory == "sbuf") <= 192 * 1024


def _first_fit_by_start(items, mode, total_partitions):
    """The specification of the sweep: items in program order, each at the lowest aligned
    offset clearing every placed item it conflicts with (live at the same time, or in
    pipelined mode of the same outermost loop), compared with every placed item."""
    from nkikit.compiler.allocate import _align, _starts

    order = sorted(range(len(items)), key=lambda k: (items[k].group.lo, -items[k].footprint))
    placed, result = [], [None] * len(items)
    for i in order:
        it, g = items[i], items[i].group
        best = None
        for pstart in _starts(it.partitions, total_partitions):
            rects = sorted(
                (off, off + fp)
                for j, (p, ps, off, fp) in placed
                if (
                    items[j].group.hi >= g.lo
                    or (mode == "pipelined" and g.scope != -1 and items[j].group.scope == g.scope)
                )
                and p < pstart + it.partitions
                and pstart < p + ps
            )
            off = 0
            for lo, hi in rects:
                if off + it.footprint <= lo:
                    break
                off = max(off, _align(hi, it.align))
            if best is None or off < best[1]:
                best = (pstart, off)
        placed.append((i, (best[0], it.partitions, best[1], it.footprint)))
        result[i] = best
    return result


def test_sweep_fit_is_first_fit_in_program_order():
    import random

    from nkikit.compiler.allocate import _groups, _Info, _Item, _sweep_fit
    from nkikit.ir.affine import LoopVar
    from nkikit.ir.core import Tensor

    rng = random.Random(7)
    loops = [LoopVar(f"i{k}", 4, "affine") for k in range(2)]
    for _ in range(200):
        items = []
        for k in range(rng.randint(1, 30)):
            # two rolled loops over points [20, 60) and [60, 100); top-level tensors start
            # outside them and, used inside one, live to its end
            scope = rng.choice([(), (), (loops[0],), (loops[1],)])
            if scope:
                start = 20 + 40 * loops.index(scope[0])
                lo = rng.randint(start, start + 39)
                hi, end = rng.randint(lo, start + 39), start + 39
            else:
                lo = rng.choice([*range(0, 20), *range(100, 130)])
                hi = lo + rng.randint(0, 60)
                hi = next((s + 39 for s in (20, 60) if s <= hi < s + 40), hi)
                end = hi
            p = rng.choice([128, 100, 64, 48, 32, 16])
            t = Tensor(f"t{k}", (p, 8), np.dtype(np.float32), "sbuf", scope=scope)
            g = _groups([_Info(t, lo, hi, 1, False, end)], False)[0]
            n = rng.randint(1, 4)
            items.append(_Item(g, rng.choice([64, 128, 256, 512]), 64, n, p, n))
        for mode in ("pipelined", "static"):
            assert _sweep_fit(items, mode, 128)[0] == _first_fit_by_start(items, mode, 128)


def test_thousands_of_tiles_without_rotation_stay_apart():
    # more tiles than the biggest-first pass takes: only the program-order sweep places them
    from nkikit.compiler.allocate import _VECTOR_FIT_MAX

    steps = _VECTOR_FIT_MAX // 2 + 100
    ir = K.unrolled_copies.ir(nt.tensor[[steps * 128, 64], F32])
    alloc = allocate(ir, get_target("trn2"), rotation=False)
    ps = sorted(alloc.placements.values(), key=lambda p: p.live[0])
    assert len(ps) == 2 * steps > _VECTOR_FIT_MAX
    for i, p in enumerate(ps):
        for q in ps[i + 1 :]:
            if q.live[0] > p.live[1]:
                break
            assert not _overlap(p, q), (p.tensor.name, q.tensor.name)


def _user_and_auto_psum(auto_blocks: int):
    """Seven bank-sized blocks of a PSUM tensor placed in banks 0-6 by the user (aliasing
    modulo 7 for more blocks), and ``auto_blocks`` bank-sized blocks allocated automatically."""

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((1 + auto_blocks, 128, 512), dtype=F32, buffer=nl.shared_hbm)
        at = nki.compiler.psum.mod_alloc(base_bank=0, num_bank_tiles=(7,))
        user = nl.ndarray((14, nl.par_dim(128), 512), dtype=F32, buffer=at)
        auto = nl.ndarray((auto_blocks, nl.par_dim(128), 512), dtype=F32, buffer=nl.psum)
        ta = nl.load(a)
        tb = nl.load(b)
        user[9] = nisa.nc_matmul(ta, tb)
        for i in range(auto_blocks):  # every block written before any is read: all live
            auto[i] = nisa.nc_matmul(ta, tb)
        nl.store(out[0], value=nl.copy(user[9]))
        for i in range(auto_blocks):
            nl.store(out[1 + i], value=nl.copy(auto[i]))
        return out

    return kernel


def test_user_allocated_psum_keeps_its_banks_and_auto_psum_goes_above():
    a = nt.tensor[[128, 128], F32]
    b = nt.tensor[[128, 512], F32]
    alloc, by_name = _placements(_user_and_auto_psum(1), a, b)
    user, auto = by_name["user"], by_name["auto"]
    assert (user.offset, user.size, user.buffers) == (0, 7 * 2048, 1)
    assert auto.offset == 7 * 2048 and auto.end <= 8 * 2048
    assert alloc.used["psum"] == 8 * 2048
    # two more banks do not fit above bank 6: the automatic tensor leaves PSUM for SBUF
    # (nkikit/language/eviction.py), the user's keeps its banks
    alloc, by_name = _placements(_user_and_auto_psum(2), a, b)
    assert by_name["auto"].memory == "sbuf"
    assert (by_name["user"].memory, by_name["user"].offset) == ("psum", 0)


@nki.jit
def blocks_one_iteration_at_a_time(a, b):
    """A 16-bank PSUM tensor whose block i is written and read in iteration i only."""
    out = nl.ndarray((16, 128, 512), dtype=F32, buffer=nl.shared_hbm)
    acc = nl.ndarray((16, nl.par_dim(128), 512), dtype=F32, buffer=nl.psum)
    ta = nl.load(a)
    for i in nl.affine_range(16):
        acc[i] = nisa.nc_matmul(ta, nl.load(b[:, nl.ds(i * 512, 512)]))
        nl.store(out[i], value=nl.copy(acc[i]))
    return out


@nki.jit
def blocks_read_by_a_later_loop(a, b):
    """The same tensor with its blocks read by a second loop: all 16 banks live at once."""
    out = nl.ndarray((16, 128, 512), dtype=F32, buffer=nl.shared_hbm)
    acc = nl.ndarray((16, nl.par_dim(128), 512), dtype=F32, buffer=nl.psum)
    ta = nl.load(a)
    for i in nl.affine_range(16):
        acc[i] = nisa.nc_matmul(ta, nl.load(b[:, nl.ds(i * 512, 512)]))
    for i in nl.affine_range(16):
        nl.store(out[i], value=nl.copy(acc[i]))
    return out


def test_psum_blocks_live_one_iteration_at_a_time_take_one_block():
    a = nt.tensor[[128, 128], F32]
    b = nt.tensor[[128, 16 * 512], F32]
    _, by_name = _placements(blocks_one_iteration_at_a_time, a, b)
    assert by_name["acc"].size == 2048  # one bank-sized block per buffer, not sixteen
    # all 16 banks live at once cannot fit PSUM: the compiler keeps the tensor in SBUF
    # (nkikit/language/eviction.py), each block copied out of a PSUM tile
    acc = next(t for t in blocks_read_by_a_later_loop.ir(a, b).tensors if t.name == "acc")
    assert acc.buffer == "sbuf"


def test_psum_blocks_in_use_names_the_tensor_and_its_blocks():
    from nkikit.ir.residency import psum_blocks_in_use

    a = nt.tensor[[128, 128], F32]
    b = nt.tensor[[128, 16 * 512], F32]
    ir = blocks_one_iteration_at_a_time.ir(a, b)
    acc = next(t for t in ir.tensors if t.name == "acc")
    assert psum_blocks_in_use(ir) == {acc.uid: 1}


@nki.jit
def unrolled_copies_of_a_block(a, b):
    """Blocks 2j and 2j + 1 in two unrolled copies of the body: disjoint groups, one at a time."""
    out = nl.ndarray((8, 128, 512), dtype=F32, buffer=nl.shared_hbm)
    acc = nl.ndarray((8, nl.par_dim(128), 512), dtype=F32, buffer=nl.psum)
    ta = nl.load(a)
    for j in nl.affine_range(4):
        for r in range(2):
            acc[2 * j + r] = nisa.nc_matmul(ta, nl.load(b[:, nl.ds((2 * j + r) * 512, 512)]))
            nl.store(out[2 * j + r], value=nl.copy(acc[2 * j + r]))
    return out


@nki.jit
def blocks_revisited_by_an_outer_loop(a, b):
    """An outer loop that does not move the blocks: counted whole (a block may carry over)."""
    out = nl.ndarray((4, 128, 512), dtype=F32, buffer=nl.shared_hbm)
    acc = nl.ndarray((4, nl.par_dim(128), 512), dtype=F32, buffer=nl.psum)
    ta = nl.load(a)
    for _o in nl.sequential_range(2):
        for i in nl.affine_range(4):
            acc[i] = nisa.nc_matmul(ta, nl.load(b[:, nl.ds(i * 512, 512)]))
            nl.store(out[i], value=nl.copy(acc[i]))
    return out


def test_psum_block_groups():
    from nkikit.ir.residency import psum_blocks_in_use

    a = nt.tensor[[128, 128], F32]
    b = nt.tensor[[128, 8 * 512], F32]
    ir = unrolled_copies_of_a_block.ir(a, b)
    assert list(psum_blocks_in_use(ir).values()) == [1]
    assert psum_blocks_in_use(blocks_revisited_by_an_outer_loop.ir(a, b)) == {}
