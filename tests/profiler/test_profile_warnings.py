"""Every warning rule: a case where it fires (naming the lines) and cases where it must not."""

from __future__ import annotations

import pytest

from nkikit.profiler import Profile


def names(p: Profile) -> list[str]:
    return [w["name"] for w in p.summary["warnings"]]


def only(p: Profile, name: str) -> dict:
    found = [w for w in p.summary["warnings"] if w["name"] == name]
    assert len(found) == 1, p.summary["warnings"]
    return found[0]


def test_paper_profile_warnings(paper_profile: Profile) -> None:
    # 37.5 % TensorE with a matmul, 1/6 of TensorE FLOPs are transposes, and the store moves
    # 4 KiB over 128 partitions (32 B each); nothing is > 90 % busy, nothing reloaded/spilled.
    assert names(paper_profile) == [
        "small_dma_transfers",
        "low_tensor_utilization",
        "transpose_flops",
    ]
    for w in paper_profile.summary["warnings"]:
        assert set(w) >= {"name", "message", "source", "lines"}
        assert w["source"] and w["lines"]
        assert w["source"] == ", ".join(w["lines"])
        assert all(line in w["message"] for line in w["lines"][:3])


# -- small DMA transfers ---------------------------------------------------------------------


def test_small_dma_fires_per_partition_and_total(make_profile) -> None:
    p = make_profile(
        [
            # 128 partitions x 256 B: 32 KiB in total but small per partition
            (
                "dma0",
                "DMA_LOAD",
                0,
                100,
                dict(hbm_read_bytes=32768, partitions=128, source="k.py:3"),
            ),
            (
                "dma1",
                "DMA_LOAD",
                0,
                100,
                dict(hbm_read_bytes=32768, partitions=128, source="k.py:3"),
            ),
            # 1 partition x 1 KiB: under 2 KiB in total
            ("dma2", "DMA_LOAD", 0, 100, dict(hbm_read_bytes=1024, partitions=1, source="k.py:7")),
            # big enough: 128 x 4 KiB
            (
                "dma3",
                "DMA_LOAD",
                0,
                100,
                dict(hbm_read_bytes=524288, partitions=128, source="k.py:9"),
            ),
        ]
    )
    w = only(p, "small_dma_transfers")
    assert w["count"] == 3
    assert w["counts"] == {"k.py:3": 2, "k.py:7": 1}
    assert w["lines"] == ["k.py:3", "k.py:7"]
    assert "3 of 4 DMA transfers" in w["message"]
    assert "k.py:3 (2 transfers)" in w["message"] and "k.py:7 (1 transfer)" in w["message"]
    assert "k.py:9" not in w["message"]


def test_small_dma_boundary_does_not_fire(make_profile) -> None:
    # exactly 512 B per partition and exactly 2 KiB in total is not small
    p = make_profile(
        [
            (
                "dma0",
                "DMA_LOAD",
                0,
                100,
                dict(hbm_read_bytes=2048, sbuf_write_bytes=2048, partitions=4),
            ),
            (
                "dma1",
                "DMA_STORE",
                0,
                100,
                dict(hbm_write_bytes=65536, sbuf_read_bytes=65536, partitions=128),
            ),
        ]
    )
    assert "small_dma_transfers" not in names(p)


# -- input reload ----------------------------------------------------------------------------


def test_input_reload_fires(make_profile) -> None:
    tile = dict(hbm_read_bytes=8192, tensor_name="w", hbm_offset=0, partitions=128, elements=32)
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 100, {**tile, "source": "k.py:20"}),
            ("dma1", "DMA_LOAD", 100, 200, {**tile, "source": "k.py:20"}),
            ("dma0", "DMA_LOAD", 200, 300, {**tile, "source": "k.py:20"}),
            ("dma1", "DMA_LOAD", 300, 400, {**tile, "hbm_offset": 8192, "source": "k.py:21"}),
        ]
    )
    w = only(p, "input_reload")
    assert w["tensor"] == "w"
    assert w["bytes"] == 16384
    assert w["times"] == 3
    assert w["lines"] == ["k.py:20"]  # the range read once (k.py:21) is not to blame
    assert "'w'" in w["message"] and "3 times" in w["message"] and "16.0 KiB" in w["message"]


def test_input_reload_one_warning_per_tensor(make_profile) -> None:
    a = dict(hbm_read_bytes=4096, tensor_name="a", partitions=128, elements=16)
    b = dict(hbm_read_bytes=8192, tensor_name="b", partitions=128, elements=32)
    p = make_profile(
        [("dma0", "DMA_LOAD", k * 10, k * 10 + 10, a if k % 2 else b) for k in range(4)]
    )
    ws = [w for w in p.summary["warnings"] if w["name"] == "input_reload"]
    assert [(w["tensor"], w["bytes"], w["times"]) for w in ws] == [("b", 8192, 2), ("a", 4096, 2)]


@pytest.mark.parametrize(
    "second",
    [
        dict(hbm_offset=4096),  # another tile of the same tensor
        dict(tensor_name="other"),  # same offset, other tensor
        dict(partitions=64, elements=32),  # same bytes and offset, other shape
        dict(hbm_read_bytes=0, hbm_write_bytes=4096),  # a write, not a read
        dict(tensor_name=""),  # not tied to a tensor
    ],
)
def test_input_reload_does_not_fire(make_profile, second: dict) -> None:
    first = dict(hbm_read_bytes=4096, tensor_name="a", hbm_offset=0, partitions=128, elements=16)
    p = make_profile(
        [("dma0", "DMA_LOAD", 0, 100, first), ("dma1", "DMA_LOAD", 0, 100, {**first, **second})]
    )
    assert "input_reload" not in names(p)
    assert p.summary["reload_bytes"] == 0


# -- low TensorE use -------------------------------------------------------------------------


def test_low_tensor_names_the_bound_engine_lines(make_profile) -> None:
    p = make_profile(
        [
            (
                "dma0",
                "DMA_LOAD",
                0,
                850,
                dict(hbm_read_bytes=1 << 20, partitions=128, source="k.py:4"),
            ),
            ("tensor", "MATMUL", 850, 1000, dict(flops=10, model_flops=10, source="k.py:6")),
        ]
    )
    # DMA 85 % active: saturated, so it is what keeps TensorE waiting
    w = only(p, "low_tensor_utilization")
    assert w["tensor_active_percent"] == pytest.approx(15.0)
    assert w["lines"] == ["k.py:4"]
    assert "15.0%" in w["message"] and "DMA" in w["message"]


def test_low_tensor_latency_bound_names_matmul_lines(make_profile) -> None:
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 100, dict(flops=10, model_flops=10, source="k.py:6")),
            ("vector", "TENSOR_COPY", 200, 280, dict(source="k.py:8")),
        ]
    )
    w = only(p, "low_tensor_utilization")
    assert w["lines"] == ["k.py:6"]
    assert p.summary["bound_by"] == "latency" and "dependencies" in w["message"]
    assert "latency_bound" not in names(p)  # the TensorE warning already says it


def test_low_tensor_does_not_fire_without_matmul(make_profile) -> None:
    p = make_profile([("vector", "TENSOR_TENSOR", 0, 100), ("dma0", "DMA_LOAD", 100, 1000)])
    assert "low_tensor_utilization" not in names(p)


def test_low_tensor_does_not_fire_for_broadcast_only_matmuls(make_profile) -> None:
    # a memory-bound kernel whose only TensorE work is a partition broadcast (no model FLOPs)
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 10, dict(flops=64, model_flops=0)),
            ("dma0", "DMA_LOAD", 10, 1000, dict(hbm_read_bytes=1 << 20, partitions=128)),
        ]
    )
    assert p.summary["matmul_instruction_count"] == 1
    assert "low_tensor_utilization" not in names(p)


def test_low_tensor_does_not_fire_when_busy(make_profile) -> None:
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 50, dict(flops=1, model_flops=1)),
            ("vector", "TENSOR_COPY", 50, 100),
        ]
    )
    assert p.summary["tensor_active_percent"] == 50.0
    assert "low_tensor_utilization" not in names(p)


# -- engine-bound hints ----------------------------------------------------------------------


def test_engine_bound_fires_for_vector(make_profile) -> None:
    p = make_profile(
        [
            ("vector", "TENSOR_TENSOR", k * 100, k * 100 + 100, dict(source=f"k.py:{30 + k % 2}"))
            for k in range(19)
        ]
        + [("scalar", "ACTIVATE", 1900, 2000, dict(source="k.py:40"))]
    )
    w = only(p, "engine_bound")
    assert w["engine"] == "vector"
    assert w["active_percent"] == pytest.approx(95.0)
    assert w["lines"] == ["k.py:30", "k.py:31"]
    assert "Vector" in w["message"] and "95.0%" in w["message"]


def test_engine_bound_fires_for_dma(make_profile) -> None:
    big = dict(hbm_read_bytes=1 << 20, partitions=128, source="k.py:2")
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 960, big),
            ("tensor", "MATMUL", 960, 1000, dict(flops=1, model_flops=1)),
        ]
    )
    ws = [w for w in p.summary["warnings"] if w["name"] == "engine_bound"]
    assert [w["engine"] for w in ws] == ["dma"]
    assert ws[0]["lines"] == ["k.py:2"] and "MBU" in ws[0]["message"]


def test_engine_bound_is_one_warning_for_the_busiest(make_profile) -> None:
    # VectorE 95 % and the DMA queues 98 % busy: one verdict (DMA), naming VectorE as busy too
    big = dict(hbm_read_bytes=1 << 22, partitions=128, source="k.py:2")
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 980, big),
            ("vector", "TENSOR_TENSOR", 0, 950, dict(source="k.py:5")),
            ("scalar", "ACTIVATE", 990, 1000),
        ]
    )
    ws = [w for w in p.summary["warnings"] if w["name"] == "engine_bound"]
    assert len(ws) == 1 and ws[0]["engine"] == "dma" and ws[0]["also_busy"] == ["vector"]
    assert "Vector 95.0% active too" in ws[0]["message"]
    assert p.summary["bound_by"] == "dma"


@pytest.mark.parametrize(
    ("reload", "small", "want"),
    [
        (True, False, "keep tiles in SBUF"),
        (False, True, "merge the 1 small transfers"),
        (False, False, "near the memory roofline"),
    ],
)
def test_dma_bound_advice_fits_the_kernel(make_profile, reload, small, want) -> None:
    # 2 MiB per 1000 ns at 100 GB/s is beyond the paper HBM: MBU high, so with nothing to fix
    # in the transfers the only advice left is to move fewer bytes
    load = dict(hbm_read_bytes=1 << 20, partitions=128, tensor_name="x", source="k.py:2")
    rows = [("dma0", "DMA_LOAD", 0, 500, load), ("dma1", "DMA_LOAD", 500, 980, dict(load))]
    if not reload:
        rows[1][4]["hbm_offset"] = 1 << 20
    if small:
        rows.append(("dma2", "DMA_LOAD", 980, 990, dict(hbm_read_bytes=64, partitions=1)))
    p = make_profile(rows)
    w = only(p, "engine_bound")
    assert want in w["message"]
    others = {"keep tiles in SBUF", "merge the 1 small transfers", "near the memory roofline"}
    for text in others - {want}:
        assert text not in w["message"]


def test_latency_bound_fires_when_nothing_is_saturated(make_profile) -> None:
    # one load, then one vector op waiting on it, then one store: nothing over 80 % busy
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 400, dict(hbm_read_bytes=1 << 20, partitions=128)),
            ("vector", "TENSOR_TENSOR", 400, 700, dict(source="k.py:9")),
            ("dma1", "DMA_STORE", 700, 1000, dict(hbm_write_bytes=1 << 20, partitions=128)),
        ]
    )
    s = p.summary
    assert s["busiest"] == "dma" and s["bound_by"] == "latency"
    w = only(p, "latency_bound")
    assert w["busiest"] == "dma" and "affine_range" in w["message"]
    assert "engine_bound" not in names(p)
    assert "bound by latency" in str(p)


@pytest.mark.parametrize(
    "rows",
    [
        # exactly 90 % is not > 90 %
        [("vector", "TENSOR_TENSOR", 0, 90), ("scalar", "ACTIVATE", 90, 100)],
        # vector 95 % but TensorE 60 % busy: the kernel is using TensorE fine
        [
            ("vector", "TENSOR_TENSOR", 0, 95),
            ("tensor", "MATMUL", 0, 60, dict(flops=1, model_flops=1)),
            ("scalar", "ACTIVATE", 95, 100),
        ],
    ],
)
def test_engine_bound_does_not_fire(make_profile, rows) -> None:
    assert "engine_bound" not in names(make_profile(rows))


# -- spills ----------------------------------------------------------------------------------


def test_spill_fires_and_names_spill_lines(make_profile) -> None:
    p = make_profile(
        [
            ("dma0", "DMA_SPILL_SAVE", 0, 100, dict(hbm_write_bytes=65536, source="k.py:50")),
            ("dma1", "DMA_SPILL_RELOAD", 100, 200, dict(hbm_read_bytes=65536, source="k.py:50")),
            ("vector", "TENSOR_COPY", 200, 300, dict(source="k.py:51")),
        ],
        spill_bytes=65536,
    )
    w = only(p, "spill")
    assert w["bytes"] == 65536 and w["lines"] == ["k.py:50"]
    assert "64.0 KiB" in w["message"]


def test_spill_does_not_fire_without_spill(paper_profile: Profile) -> None:
    assert "spill" not in names(paper_profile)


# -- transposes ------------------------------------------------------------------------------


def test_transpose_fires_above_ten_percent(make_profile) -> None:
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 100, dict(flops=890, model_flops=890)),
            ("tensor", "TRANSPOSE", 100, 110, dict(flops=110, source="k.py:60")),
        ]
    )
    w = only(p, "transpose_flops")
    assert w["percent"] == pytest.approx(11.0) and w["lines"] == ["k.py:60"]


def test_transpose_does_not_fire_at_ten_percent(make_profile) -> None:
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 100, dict(flops=900, model_flops=900)),
            ("tensor", "TRANSPOSE", 100, 110, dict(flops=100)),
        ]
    )
    assert "transpose_flops" not in names(p)


def test_healthy_kernel_has_no_warnings(make_profile) -> None:
    # TensorE 95 % busy with big DMAs that overlap: nothing to warn about.
    load = dict(hbm_read_bytes=1 << 20, partitions=128)
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 50, {**load, "tensor_name": "a", "hbm_offset": 0}),
            ("tensor", "MATMUL", 50, 1000, dict(flops=1e6, model_flops=1e6)),
            ("dma1", "DMA_LOAD", 60, 900, {**load, "tensor_name": "a", "hbm_offset": 1 << 20}),
        ]
    )
    assert p.summary["warnings"] == []
