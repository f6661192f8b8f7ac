"""Profile data model: instructions, JSON round trip, validation, repr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nkikit.profiler import (
    Instruction,
    Profile,
    TargetInfo,
    engine_label,
    engine_sort_key,
    is_dma_engine,
)
from nkikit.targets import get_target


def test_instruction_properties() -> None:
    mm = Instruction(1, "tensor", "MATMUL", 0, 10, flops=8, model_flops=8)
    tr = Instruction(2, "tensor", "TRANSPOSE", 10, 12, flops=4)
    ld = Instruction(3, "dma7", "DMA_LOAD", 0, 50, hbm_read_bytes=100, sbuf_write_bytes=100)
    cp = Instruction(4, "dma0", "DMA_COPY", 0, 50, sbuf_read_bytes=64, sbuf_write_bytes=64)
    assert mm.is_matmul and not mm.is_transpose and not mm.is_dma
    assert tr.is_transpose and not tr.is_matmul
    assert ld.is_dma and ld.transfer_bytes == 100 and ld.duration_ns == 50
    assert cp.transfer_bytes == 64
    assert not Instruction(5, "vector", "MATMUL_LIKE", 0, 1).is_matmul  # only TensorE matmuls


def test_engine_names() -> None:
    assert is_dma_engine("dma0") and is_dma_engine("dma15")
    assert not is_dma_engine("dma") and not is_dma_engine("tensor")
    assert [engine_label(e) for e in ("tensor", "gpsimd", "dma3", "dma")] == [
        "Tensor",
        "GpSimd",
        "DMA q3",
        "DMA",
    ]
    engines = ["dma10", "sync", "dma2", "tensor", "scalar", "gpsimd", "vector"]
    assert sorted(engines, key=engine_sort_key) == [
        "tensor",
        "vector",
        "scalar",
        "gpsimd",
        "sync",
        "dma2",
        "dma10",
    ]


def test_json_round_trip(paper_profile: Profile, tmp_path: Path) -> None:
    paper_profile.spill_bytes = 128
    paper_profile.meta = {"grid": [2, 1], "compiler": "nkikit 0.1", "shapes": {"a": [128, 512]}}
    path = paper_profile.to_json(tmp_path / "p.json")
    back = Profile.from_json(path)
    assert back == paper_profile
    assert back.instructions[2].deps == (0, 1) and isinstance(back.instructions[2].deps, tuple)
    assert back.summary == paper_profile.summary
    raw = json.loads(path.read_text())
    assert raw["format"] == "nkikit-profile" and raw["version"] == 1
    assert raw["instructions"]["fields"][:5] == ["id", "engine", "opcode", "start_ns", "end_ns"]


def test_from_dict_is_forward_compatible(paper_profile: Profile) -> None:
    d = paper_profile.to_dict()
    fields = d["instructions"]["fields"]
    # a newer writer added a column; an older one lacked "operands"
    drop = fields.index("operands")
    d["instructions"]["fields"] = [f for f in fields if f != "operands"] + ["future_field"]
    d["instructions"]["rows"] = [
        [*r[:drop], *r[drop + 1 :], "x"] for r in d["instructions"]["rows"]
    ]
    back = Profile.from_dict(d)
    assert [i.id for i in back.instructions] == [i.id for i in paper_profile.instructions]
    assert all(i.operands == "" for i in back.instructions)


def test_dict_round_trip_in_memory(paper_profile: Profile) -> None:
    assert Profile.from_dict(paper_profile.to_dict()) == paper_profile


def test_from_dict_rejects_other_formats(paper_profile: Profile) -> None:
    d = paper_profile.to_dict()
    with pytest.raises(ValueError, match="not an nkikit profile"):
        Profile.from_dict({**d, "format": "chrome-trace"})
    with pytest.raises(ValueError, match="newer"):
        Profile.from_dict({**d, "version": 99})


def test_target_round_trip() -> None:
    t = get_target("trn3").target_info()
    assert TargetInfo.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_repr_is_short(paper_profile: Profile) -> None:
    r = repr(paper_profile)
    assert r == "Profile(kernel='paper_kernel', target='paper', instructions=7, total_us=0.400)"


def test_validate_accepts_a_good_profile(paper_profile: Profile) -> None:
    paper_profile.validate()


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([("tensor", "MATMUL", 10, 5)], "ends"),
        ([("tensor", "MATMUL", 0, float("nan"))], "finite"),
        ([("vpu", "X", 0, 1)], "unknown engine 'vpu'"),
        ([("dma16", "DMA_LOAD", 0, 1)], "unknown engine 'dma16'"),
        ([("vector", "A", 0, 10), ("vector", "B", 5, 15)], "overlap"),
        ([("tensor", "MATMUL", 0, 1, dict(flops=1, model_flops=2))], "model_flops"),
        ([("vector", "A", 0, 10, dict(deps=(7,)))], "unknown id 7"),
        (
            [("vector", "A", 0, 10), ("scalar", "B", 5, 15, dict(deps=(0,)))],
            "before its dependency 0",
        ),
        ([("dma0", "DMA_LOAD", 0, 10, dict(hbm_read_bytes=-1))], "negative hbm_read_bytes"),
    ],
)
def test_validate_rejects(make_profile, rows, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_profile(rows).validate()


def test_validate_rejects_duplicate_ids(paper_target: TargetInfo) -> None:
    p = Profile(
        "k",
        paper_target,
        [Instruction(1, "vector", "A", 0, 1), Instruction(1, "scalar", "B", 0, 1)],
    )
    with pytest.raises(ValueError, match="duplicate id"):
        p.validate()


def test_validate_allows_overlapping_dma_on_one_queue(make_profile) -> None:
    make_profile([("dma0", "DMA_LOAD", 0, 10), ("dma0", "DMA_LOAD", 5, 15)]).validate()
