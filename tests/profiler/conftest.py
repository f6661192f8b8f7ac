"""Fixtures for the profiler tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nkikit.profiler import Instruction, Profile, TargetInfo


@pytest.fixture
def paper_target() -> TargetInfo:
    """Round numbers so metrics can be worked out on paper: 1 TFLOP/s bf16, 100 GB/s HBM."""
    return TargetInfo(
        name="paper",
        tensor_peak_flops={"bf16": 1e12, "fp8": 2e12, "fp32": 0.25e12},
        hbm_bytes_per_s=1e11,
        engine_clock_hz={"tensor": 1e9, "vector": 1e9, "scalar": 1e9, "gpsimd": 1e9, "sync": 1e9},
        dma_queues=16,
    )


@pytest.fixture
def make_profile(paper_target: TargetInfo) -> Callable[..., Profile]:
    """``make_profile([(engine, opcode, start, end, {fields}), ...], spill_bytes=0)``.

    Ids are assigned in list order; ``source`` defaults to ``k.py:<id + 1>``.
    """

    def build(rows: list[tuple[Any, ...]], **kw: Any) -> Profile:
        instrs = []
        for k, row in enumerate(rows):
            engine, opcode, start, end, *rest = row
            fields = dict(rest[0]) if rest else {}
            fields.setdefault("source", f"k.py:{k + 1}")
            instrs.append(Instruction(k, engine, opcode, float(start), float(end), **fields))
        return Profile(kw.pop("kernel", "paper_kernel"), paper_target, instrs, **kw)

    return build


@pytest.fixture
def paper_profile(make_profile: Callable[..., Profile]) -> Profile:
    """A 400 ns kernel whose every metric is worked out in test_profile_metrics.py."""
    return make_profile(
        [
            (
                "dma0",
                "DMA_LOAD",
                0,
                100,
                dict(
                    hbm_read_bytes=4096,
                    sbuf_write_bytes=4096,
                    partitions=2,
                    elements=1024,
                    dtype="bf16",
                    tensor_name="a",
                    source="k.py:10",
                    source_text="a_t = nl.load(a)",
                ),
            ),
            (
                "dma1",
                "DMA_LOAD",
                50,
                150,
                dict(
                    hbm_read_bytes=8192,
                    sbuf_write_bytes=8192,
                    partitions=4,
                    elements=1024,
                    dtype="bf16",
                    tensor_name="b",
                    source="k.py:11",
                    source_text="b_t = nl.load(b)",
                ),
            ),
            (
                "tensor",
                "MATMUL",
                150,
                250,
                dict(
                    flops=100_000,
                    model_flops=100_000,
                    dtype="bf16",
                    psum_write_bytes=2048,
                    sbuf_read_bytes=4096,
                    deps=(0, 1),
                    source="k.py:12",
                    source_text="c = nisa.nc_matmul(a_t, b_t)",
                ),
            ),
            (
                "tensor",
                "TRANSPOSE",
                250,
                300,
                dict(
                    flops=20_000,
                    model_flops=0,
                    dtype="bf16",
                    deps=(2,),
                    source="k.py:13",
                    source_text="t = nisa.nc_transpose(c)",
                ),
            ),
            (
                "vector",
                "TENSOR_TENSOR",
                300,
                350,
                dict(
                    psum_read_bytes=2048,
                    sbuf_write_bytes=1024,
                    deps=(3,),
                    source="k.py:14",
                    source_text="d = t + 1",
                ),
            ),
            (
                "scalar",
                "ACTIVATE",
                300,
                340,
                dict(deps=(3,), source="k.py:15", source_text="e = nl.exp(t)"),
            ),
            (
                "dma2",
                "DMA_STORE",
                350,
                400,
                dict(
                    hbm_write_bytes=4096,
                    sbuf_read_bytes=4096,
                    partitions=128,
                    elements=16,
                    dtype="bf16",
                    tensor_name="out",
                    deps=(4, 5),
                    source="k.py:16",
                    source_text="nl.store(out, d)",
                ),
            ),
        ]
    )
