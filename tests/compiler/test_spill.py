"""Spilling: when SBUF cannot hold the live tiles even with one buffer each, a tile idle
across the fullest point is saved to HBM after one use and reloaded before the next; the
profile counts the bytes and warns.  A kernel that cannot fit even so is still an error."""

from __future__ import annotations

import pytest

import nkikit.language as nl
import nkikit.typing as nt
from nkikit.compiler.allocate import allocate
from nkikit.compiler.build import build_program
from nkikit.errors import NkiError
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
