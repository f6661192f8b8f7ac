"""Smoke test of the simulator benchmark: the quick mode on one tiny size runs end to end and
writes its JSON and Markdown.  Nothing here checks speed (speed goals are measured by
``python -m benchmarks.sim``, never asserted in tests)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ml_dtypes")

from benchmarks.sim import run  # noqa: E402


def test_quick_tiny_run_writes_results(tmp_path):
    results = run.main(
        [
            "--quick",
            "--tiny",
            "--kernels",
            "rmsnorm,matmul",
            "--dtypes",
            "fp32,bf16",
            "--repeats",
            "1",
            "--no-triton",
            "--no-torch",
            "--no-overhead",
            "--out",
            str(tmp_path),
        ]
    )
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["mode"] == "tiny"
    rows = data["rows"]
    assert [(r["kernel"], r["dtype"]) for r in rows] == [
        ("rmsnorm", "fp32"),
        ("rmsnorm", "bf16"),
        ("matmul", "fp32"),
        ("matmul", "bf16"),
    ]
    for r in rows:
        assert r["fast_equals_reference"] is True
        for key in ("cold_s", "warm_s", "ref_s", "numpy_s", "trace_verify_s"):
            assert r[key] > 0
        assert r["peak_fast_bytes"] > 0 and r["io_bytes"] > 0
        assert r["triton_s"] is None and r["triton_note"]
    table = (tmp_path / "results.md").read_text()
    assert "| rmsnorm |" in table and "| matmul |" in table
    assert results["rows"] == rows or len(results["rows"]) == len(rows)


def test_markdown_marks_extrapolated_triton():
    row = {
        "kernel": "softmax",
        "size": "8x8",
        "dtype": "fp32",
        "cold_s": 0.2,
        "warm_s": 0.1,
        "ref_s": 0.3,
        "numpy_s": 0.1,
        "torch_s": None,
        "triton_s": 50.0,
        "triton_extrapolated": True,
        "triton_note": "extrapolated from 4x4",
        "peak_fast_bytes": 10,
        "io_bytes": 10,
        "fast_equals_reference": True,
        "ir_ops": 3,
        "trace_verify_s": 0.001,
        "fast_compile_s": 0.001,
    }
    meta = {
        "mode": "full",
        "repeats": 1,
        "threads": 1,
        "loadavg_end": (0, 0, 0),
        "machine": {"cpu": "x", "cores": 2, "numpy": "2", "blas": [], "loadavg_start": (0, 0, 0)},
    }
    md = run.render_markdown({"meta": meta, "rows": [row]})
    assert "(extrap.)" in md and "500×" in md
