"""Summary metrics checked against numbers worked out by hand (see paper_profile in conftest).

paper_profile, 400 ns on a 1 TFLOP/s (bf16), 100 GB/s target:
  DMA   dma0 [0,100) 4 KiB read, dma1 [50,150) 8 KiB read, dma2 [350,400) 4 KiB write
        → union 150 + 50 = 200 ns = 50 %; queues 25 %, 25 %, 12.5 %
  Tensor MATMUL [150,250) 100 kFLOP useful, TRANSPOSE [250,300) 20 kFLOP → 150 ns = 37.5 %
  Vector [300,350) = 12.5 %, Scalar [300,340) = 10 %
  capacity 1e12 x 400e-9 = 400 kFLOP → MFU 25 %, HFU 30 %
  HBM 16 KiB over 1e11 x 400e-9 = 40 kB → MBU 40.96 %
"""

from __future__ import annotations

import pytest

from nkikit.profiler import Profile, TargetInfo, dtype_class
from nkikit.profiler.columns import merge_intervals, union_ns
from nkikit.targets import get_target


def test_total_time(paper_profile: Profile) -> None:
    s = paper_profile.summary
    assert paper_profile.total_ns == 400.0
    assert paper_profile.total_us == pytest.approx(0.4)
    assert s["total_ns"] == 400.0 and s["total_us"] == pytest.approx(0.4)


def test_flops_utilization(paper_profile: Profile) -> None:
    s = paper_profile.summary
    assert s["model_flops"] == 100_000
    assert s["hardware_flops"] == 120_000
    assert s["transpose_flops"] == 20_000
    assert s["transpose_flops_percent"] == pytest.approx(100 / 6)
    assert s["matmul_dtype"] == "bf16"
    assert s["peak_flops_per_s"] == 1e12
    assert s["mfu"] == pytest.approx(0.25)
    assert s["hfu"] == pytest.approx(0.30)
    assert s["mfu_percent"] == pytest.approx(25.0)
    assert s["hfu_percent"] == pytest.approx(30.0)


def test_memory_bandwidth(paper_profile: Profile) -> None:
    s = paper_profile.summary
    assert s["hbm_read_bytes"] == 12288
    assert s["hbm_write_bytes"] == 4096
    assert s["hbm_bytes"] == 16384
    assert s["mbu"] == pytest.approx(16384 / 40_000)
    assert s["mbu_percent"] == pytest.approx(40.96)
    assert s["achieved_hbm_bytes_per_s"] == pytest.approx(16384 / 400e-9)
    assert s["sbuf_read_bytes"] == 8192
    assert s["sbuf_write_bytes"] == 4096 + 8192 + 1024
    assert s["psum_read_bytes"] == 2048
    assert s["psum_write_bytes"] == 2048
    assert s["mm_arithmetic_intensity"] == pytest.approx(100_000 / 16384)


def test_engine_activity(paper_profile: Profile) -> None:
    s = paper_profile.summary
    assert s["tensor_active_percent"] == pytest.approx(37.5)
    assert s["vector_active_percent"] == pytest.approx(12.5)
    assert s["scalar_active_percent"] == pytest.approx(10.0)
    assert s["gpsimd_active_percent"] == 0.0
    assert s["sync_active_percent"] == 0.0
    assert s["dma_active_percent"] == pytest.approx(50.0)
    assert s["engine_active_percent"] == pytest.approx(
        {"tensor": 37.5, "vector": 12.5, "scalar": 10.0, "gpsimd": 0.0, "sync": 0.0, "dma": 50.0}
    )
    q = s["dma_queue_active_percent"]
    assert list(q) == [f"dma{k}" for k in range(16)]
    assert q["dma0"] == pytest.approx(25.0)
    assert q["dma1"] == pytest.approx(25.0)
    assert q["dma2"] == pytest.approx(12.5)
    assert all(q[f"dma{k}"] == 0.0 for k in range(3, 16))
    # DMA is the busiest at 50 %, not saturated: the kernel waits on dependencies
    assert s["busiest"] == "dma"
    assert s["bound_by"] == "latency" == paper_profile.bound_by


def test_counts_and_dma_stats(paper_profile: Profile) -> None:
    s = paper_profile.summary
    assert s["instruction_count"] == 7
    assert s["instruction_count_by_engine"] == {
        "tensor": 2,
        "vector": 1,
        "scalar": 1,
        "gpsimd": 0,
        "sync": 0,
        "dma": 3,
    }
    assert s["tensor_instruction_count"] == 2
    assert s["vector_instruction_count"] == 1
    assert s["scalar_instruction_count"] == 1
    assert s["gpsimd_instruction_count"] == 0
    assert s["sync_instruction_count"] == 0
    assert s["matmul_instruction_count"] == 1
    assert s["transpose_instruction_count"] == 1
    assert s["dma_transfer_count"] == 3
    assert s["dma_bytes"] == 16384
    assert s["dma_transfer_average_bytes"] == pytest.approx(16384 / 3)
    assert s["reload_bytes"] == 0
    assert s["useful_read_percent"] == 100.0
    assert s["spill_bytes"] == 0


def test_summary_is_cached_and_json_safe(paper_profile: Profile) -> None:
    import json

    assert paper_profile.summary is paper_profile.summary
    json.dumps(paper_profile.summary, allow_nan=False)


def test_brief_example_two_busy_windows(make_profile) -> None:
    # Tensor busy 0-100 and 200-300 of a 400 ns kernel is 50 % active.
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 100, dict(flops=1.0, model_flops=1.0)),
            ("tensor", "MATMUL", 200, 300, dict(flops=1.0, model_flops=1.0)),
            ("sync", "EVENT_SEMAPHORE", 0, 400),
        ]
    )
    assert p.summary["tensor_active_percent"] == pytest.approx(50.0)
    assert p.summary["sync_active_percent"] == pytest.approx(100.0)
    assert p.summary["bound_by"] == "sync"


def test_active_is_union_not_sum(make_profile) -> None:
    # Overlapping DMA transfers on different queues count once for dma_active_percent.
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 200, dict(hbm_read_bytes=1 << 20)),
            ("dma1", "DMA_LOAD", 100, 300, dict(hbm_read_bytes=1 << 20)),
            ("dma1", "DMA_LOAD", 250, 320, dict(hbm_read_bytes=1 << 20)),
            ("vector", "TENSOR_COPY", 350, 400),
        ]
    )
    s = p.summary
    assert s["dma_active_percent"] == pytest.approx(80.0)
    assert s["dma_queue_active_percent"]["dma0"] == pytest.approx(50.0)
    assert s["dma_queue_active_percent"]["dma1"] == pytest.approx(55.0)


def test_total_is_span_when_not_starting_at_zero(make_profile) -> None:
    p = make_profile([("vector", "TENSOR_COPY", 1000, 1100), ("scalar", "ACTIVATE", 1100, 1200)])
    assert p.total_ns == 200.0
    assert p.summary["vector_active_percent"] == pytest.approx(50.0)


def test_dominant_matmul_dtype_sets_peak(make_profile) -> None:
    # 300 FLOPs in fp8 outweigh 100 in bf16: the fp8 peak (2 TFLOP/s) is the denominator.
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 100, dict(flops=100, model_flops=100, dtype="bfloat16")),
            ("tensor", "MATMUL", 100, 200, dict(flops=300, model_flops=300, dtype="float8_e4m3")),
        ]
    )
    s = p.summary
    assert s["matmul_dtype"] == "fp8"
    assert s["peak_flops_per_s"] == 2e12
    assert s["mfu"] == pytest.approx(400 / (2e12 * 200e-9))


def test_only_tensor_flops_count(make_profile) -> None:
    p = make_profile(
        [
            ("tensor", "MATMUL", 0, 100, dict(flops=1000, model_flops=1000)),
            ("vector", "TENSOR_TENSOR", 0, 100, dict(flops=5000)),
        ]
    )
    assert p.summary["hardware_flops"] == 1000


def test_input_reload_metric(make_profile) -> None:
    load = dict(hbm_read_bytes=4096, tensor_name="w", hbm_offset=0, partitions=128, elements=16)
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 100, load),
            ("dma1", "DMA_LOAD", 100, 200, load),
            ("dma2", "DMA_LOAD", 200, 300, load),
            ("dma3", "DMA_LOAD", 300, 400, {**load, "hbm_offset": 4096}),
        ]
    )
    s = p.summary
    assert s["reload_bytes"] == 8192
    assert s["useful_read_percent"] == pytest.approx(100 * (16384 - 8192) / 16384)


def test_empty_profile(paper_target: TargetInfo) -> None:
    p = Profile("empty", paper_target, [])
    s = p.summary
    assert p.total_ns == 0.0
    assert s["mfu"] == s["hfu"] == s["mbu"] == 0.0
    assert s["bound_by"] is None
    assert s["warnings"] == []
    assert s["dma_transfer_average_bytes"] == 0.0
    assert p.per_line() == []


def test_per_line(paper_profile: Profile) -> None:
    lines = paper_profile.per_line()
    # engine-time: 100+100+100+50+50+40+50 = 490 ns
    by_src = {ln.source: ln for ln in lines}
    assert [ln.source for ln in lines][:3] == ["k.py:10", "k.py:11", "k.py:12"]
    assert by_src["k.py:12"].time_ns == 100.0
    assert by_src["k.py:12"].share == pytest.approx(100 / 490)
    assert by_src["k.py:12"].code == "c = nisa.nc_matmul(a_t, b_t)"
    assert by_src["k.py:12"].engines == {"tensor": 100.0}
    assert by_src["k.py:12"].main_engine == "tensor"
    assert by_src["k.py:15"].time_ns == 40.0
    assert sum(ln.share for ln in lines) == pytest.approx(1.0)
    assert all(ln.count == 1 for ln in lines)
    assert paper_profile.per_line() is lines  # cached


def test_per_line_merges_engines(make_profile) -> None:
    p = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 100, dict(source="k.py:5")),
            ("vector", "TENSOR_COPY", 100, 130, dict(source="k.py:5")),
            ("vector", "TENSOR_COPY", 130, 160, dict(source="")),
        ]
    )
    ln = p.per_line()
    assert ln[0].source == "k.py:5" and ln[0].time_ns == 130 and ln[0].count == 2
    assert ln[0].engines == {"vector": 30.0, "dma0": 100.0}
    assert ln[1].source == "<unknown>"


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("float16", "bf16"),
        ("tf32", "bf16"),
        ("float32", "fp32"),
        ("fp32", "fp32"),
        ("float8_e4m3", "fp8"),
        ("float8e5m2", "fp8"),
        ("fp8_e4m3", "fp8"),
        ("mxfp8", "fp8"),
        ("", "bf16"),
    ],
)
def test_dtype_class(name: str, cls: str) -> None:
    assert dtype_class(name) == cls


def test_interval_union() -> None:
    s, e = merge_intervals([5, 0, 1, 3, 7], [6, 2, 3, 4, 7])
    assert (s.tolist(), e.tolist()) == ([0, 5], [4, 6])  # touching merge, empty dropped
    assert union_ns([0, 2, 20], [10, 3, 25]) == 15
    assert union_ns([], []) == 0


def test_target_presets() -> None:
    t2 = get_target("trn2").target_info()
    bf16 = 128 * 128 * 2 * 2.4e9
    assert t2.tensor_peak_flops == pytest.approx({"bf16": bf16, "fp8": 2 * bf16, "fp32": bf16 / 4})
    assert t2.engine_clock_hz["vector"] == 0.96e9
    assert t2.dma_queues == 16
    t1 = get_target("trn1").target_info()
    assert t1.tensor_peak_flops["bf16"] == pytest.approx(91.75e12, rel=1e-3)
    assert t1.tensor_peak_flops["fp8"] == t1.tensor_peak_flops["bf16"]
    t3 = get_target("trn3").target_info()
    assert t3.tensor_peak_flops["fp8"] == pytest.approx(4 * t3.tensor_peak_flops["bf16"])
    # Per-core share of chip HBM: 820 GB/s over 2 cores, 2.9 TB/s and 4.9 TB/s over 8.
    assert (t1.hbm_bytes_per_s, t2.hbm_bytes_per_s, t3.hbm_bytes_per_s) == pytest.approx(
        (410e9, 362.5e9, 612.5e9)
    )
    assert t2.peak_flops("int4") == t2.tensor_peak_flops["bf16"]
    with pytest.raises(ValueError, match="unknown target"):
        get_target("trn9").target_info()
