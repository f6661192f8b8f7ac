"""Spilling: when SBUF cannot hold the live tiles even with one buffer each, a tile idle
across the fullest point is saved to HBM after one use and reloaded before the next; the
profile counts the bytes and warns.  A kernel that cannot fit even so is still an error, the
same one from the verifier and the allocator (they share ``nkikit/ir/residency.py``).  PSUM
is never spilled."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.compiler.allocate import allocate
from nkikit.compiler.build import build_program
from nkikit.errors import NkiError
from nkikit.ir.verify import verify
from nkikit.targets import get_target

from . import kernels as K

F32 = nl.float32
SPEC = nt.tensor[[768, 512], F32]
KEEP_BYTES = 128 * 256 * 4  # keep: [128, 256] fp32


def _small(sbuf_bytes: int):
    return get_target("trn2").with_overrides(sbuf_bytes=sbuf_bytes)


def _ids(program, word: str) -> list[int]:
    return [i for i in range(len(program)) if word in program.infos[program.sid[i]].opcode]


def test_no_spill_when_it_fits():
    program = build_program(K.spill_candidate.ir(SPEC), "trn2")
    assert program.meta["spills"] == [] and program.profile().summary["spill_bytes"] == 0


def test_idle_tile_is_saved_before_the_loop_and_reloaded_after():
    # 4 KiB per partition: the loop's tiles (2 KiB in, 2 KiB out) leave no room for keep
    ir = K.spill_candidate.ir(SPEC)
    alloc = allocate(ir, _small(4096))
    assert [sp.tensor.name for sp in alloc.spills] == ["keep"]
    keep = alloc.spills[0].tensor
    first, second = alloc.segments[keep.uid]
    assert first.live[1] < second.live[0]  # two SBUF lifetimes with the loop in between
    assert all(p.end <= 4096 for p in alloc.placements.values())

    program = build_program(ir, _small(4096))
    save, reload = _ids(program, "SPILL_SAVE"), _ids(program, "SPILL_RELOAD")
    assert len(save) == len(reload) == 16  # one 128-partition DMA each, over 16 queues
    assert min(program.start[i] for i in reload) >= max(program.end[i] for i in save)
    # the last use of keep (exp at @spill-reuse) waits for the reload
    uses = [
        i
        for i in range(len(program))
        if program.infos[program.sid[i]].opcode == "ACTIVATE"
        and program.infos[program.sid[i]].source.endswith(f":{K.line_of('# @spill-reuse')}")
    ]
    assert uses and min(program.start[i] for i in uses) >= max(program.end[i] for i in reload)

    prof = program.profile()
    assert prof.summary["spill_bytes"] == 2 * KEEP_BYTES  # saved once, reloaded once
    (warning,) = [w for w in prof.warnings if w["name"] == "spill"]
    assert warning["bytes"] == 2 * KEEP_BYTES
    assert warning["lines"] == [f"kernels.py:{K.line_of('# @spill-keep')}"]
    assert not [w for w in prof.warnings if w["name"] == "input_reload"]


def test_too_big_even_with_spilling_is_an_error():
    # 2 KiB: the exp of one 2 KiB tile needs 4 KiB at once, spilled or not
    with pytest.raises(NkiError) as e:
        allocate(K.spill_candidate.ir(SPEC), _small(2048))
    assert e.value.name == "err_sbuf_capacity_exceeded"
    msg = str(e.value)
    assert "big (2048 B" in msg and "keep" not in msg  # keep is spilled: not the problem


def test_verifier_and_allocator_agree_on_what_spilling_cannot_fit():
    ir = K.spill_candidate.ir(SPEC)
    verify(ir, _small(4096))  # over capacity, but keep can spill: legal
    allocate(ir, _small(4096))
    with pytest.raises(NkiError) as from_verify:
        verify(ir, _small(2048))
    with pytest.raises(NkiError) as from_allocate:
        allocate(ir, _small(2048))
    for e in (from_verify.value, from_allocate.value):
        assert e.name == "err_sbuf_capacity_exceeded"
        # the exp inside the loop needs big and its result at once: 4 KiB
        assert e.loc.line == K.line_of("nl.store(out[128 + i * 128 : 256 + i * 128, :], nl.exp(")
        assert "4096" in str(e) and "2048" in str(e)
    assert str(from_verify.value) == str(from_allocate.value)


@nki.jit
def over_sbuf(a):
    out = nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.shared_hbm)
    x0 = nl.load(a)
    x1 = nl.exp(x0)
    x2 = nl.exp(x1)
    x3 = nl.exp(x2)
    nl.store(out, value=nl.add(nl.add(x0, x1), nl.add(x2, x3)))
    return out


def test_kernel_over_sbuf_capacity_simulates_compiles_and_profiles_its_spills():
    # five 64 KiB tiles live at the first add: 320 KiB > trn2's 224 KiB per partition, but at
    # most three are in use at any instruction, so the idle ones are spilled as the Neuron
    # compiler would (x2 and x3 across the first add, x0 and that add's result across the
    # exps and the second add)
    a = np.random.default_rng(0).uniform(-1, 0, (128, 16384)).astype(np.float32)
    x1 = np.exp(a)
    x2 = np.exp(x1)
    np.testing.assert_allclose(over_sbuf(a), (a + x1) + (x2 + np.exp(x2)), rtol=1e-5)

    program = nki.compile(over_sbuf, a, target="trn2")
    assert {sp["tensor"] for sp in program.meta["spills"]} == {"x0", "x2", "x3", "add"}
    prof = program.profile()
    assert prof.summary["spill_bytes"] > 0
    (warning,) = [w for w in prof.warnings if w["name"] == "spill"]
    assert warning["bytes"] == prof.summary["spill_bytes"]
    src, start = inspect.getsourcelines(over_sbuf.func)
    assert warning["lines"] and all(
        start < int(w.split(":")[1]) < start + len(src) for w in warning["lines"]
    )


@nki.jit
def psum_over_capacity(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    ps = [nisa.nc_matmul(xs, ys) for _ in range(9)]  # @psum-nine
    acc = nl.copy(ps[0])
    for p in ps[1:]:
        acc = nl.add(acc, p)
    nl.store(out, value=acc)
    return out


def test_psum_is_never_spilled():
    # nine 2 KiB PSUM tiles, eight of them idle while the ninth is computed.  PSUM is not
    # spilled (it holds accumulation groups); the compiler places the results it chooses the
    # memory of elsewhere instead (nkikit/language/eviction.py): one of them lives in SBUF,
    # copied out of a PSUM tile, and the spiller never touches PSUM
    x, y = np.ones((128, 128), np.float32), np.ones((128, 512), np.float32)
    np.testing.assert_allclose(psum_over_capacity(x, y), 9 * (x.T @ y))
    ir = psum_over_capacity.ir(x, y)
    src, start = inspect.getsourcelines(psum_over_capacity.func)
    line = start + next(i for i, t in enumerate(src) if "@psum-nine" in t)
    results = [t for t in ir.tensors if t.loc and t.loc.line == line and t.buffer != "psum"]
    assert [t.buffer for t in results] == ["sbuf"]
    program = nki.compile(psum_over_capacity, x, y, target="trn2")
    assert all(sp["memory"] != "psum" for sp in program.meta["spills"] if "memory" in sp)


# ---------------------------------------------------------------------------------------------
# the verifier accepts exactly what the allocator can place


@nki.jit
def tile_program(a, program):
    """Straight-line tiles from ``program``: ("load", width), ("exp", i), ("add", i, j) make
    a tile from tiles ``i``, ``j`` made before; ("loop", i) reads tile ``i`` in a loop."""
    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    tiles = []
    for step in program:
        if step[0] == "load":
            tiles.append(nl.load(a[0:128, 0 : step[1]]))
        elif step[0] == "exp":
            tiles.append(nl.exp(tiles[step[1]]))
        elif step[0] == "add":
            x, y = tiles[step[1]], tiles[step[2]]
            w = min(x.shape[1], y.shape[1])
            tiles.append(nl.add(x[0:128, 0:w], y[0:128, 0:w]))
        else:
            for _ in nl.sequential_range(2):
                nl.store(out[0:128, 0:8], nl.exp(tiles[step[1]])[0:128, 0:8])
    acc = tiles[0][0:128, 0:64]
    for t in tiles[1:]:
        acc = nl.add(acc, t[0:128, 0:64])
    nl.store(out, acc)
    return out


@st.composite
def programs(draw) -> tuple:
    widths = st.sampled_from([64, 128, 256, 512, 1024])
    steps = [("load", draw(widths))]
    made = 1
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["load", "exp", "add", "loop"]))
        pick = st.integers(0, made - 1)
        if kind == "load":
            steps.append(("load", draw(widths)))
        elif kind == "exp":
            steps.append(("exp", draw(pick)))
        elif kind == "add":
            steps.append(("add", draw(pick), draw(pick)))
        else:
            steps.append(("loop", draw(pick)))
            continue
        made += 1
    return tuple(steps)


@settings(max_examples=40, deadline=None)
@given(programs(), st.sampled_from([4096, 6144, 8192, 12288]))
def test_verifier_accepts_exactly_what_the_allocator_places(program, sbuf_bytes):
    ir = tile_program.ir(np.zeros((128, 1024), np.float32), program)
    target = _small(sbuf_bytes)
    try:
        verify(ir, target)
    except NkiError as e:
        assert e.name == "err_sbuf_capacity_exceeded"
        with pytest.raises(NkiError) as again:
            allocate(ir, target)
        assert str(again.value) == str(e)
    else:
        alloc = allocate(ir, target)
        placed = [*alloc.placements.values(), *(q for s in alloc.segments.values() for q in s)]
        assert all(p.end <= sbuf_bytes for p in placed if p.memory == "sbuf")
