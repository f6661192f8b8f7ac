"""Smoke test of the scale benchmark: two tiny sizes run end to end in their subprocesses
and write JSON and Markdown, and the rotation table shows the three loop forms alike.
Nothing here checks speed (``python -m benchmarks.scale`` measures it)."""

from __future__ import annotations

import json

from benchmarks.scale import run


def test_tiny_run_writes_results(tmp_path):
    run.main(["--tiny", "--sizes", "41,81", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["rows"]
    assert [r["ir_ops"] for r in rows] == [41, 81]
    for r in rows:
        for key in ("trace_s", "verify_s", "codegen_s", "first_run_s", "compile_s", "profile_s"):
            assert r[key] > 0
        assert r["instructions"] == 16 + 34 * r["steps"]
        assert r["matches_numpy"] is True
        assert r["peak_rss_mb"] > 0 and r["us_per_op"] > 0
    times = {(x["form"], x["rotation"]): x["modeled_us"] for x in data["rotation"]}
    rotated = [times[(f, True)] for f in ("range", "static_range", "affine_range")]
    assert max(rotated) <= 1.03 * min(rotated)
    assert times[("range", False)] > max(rotated)
    table = (tmp_path / "results.md").read_text()
    assert "| 41 |" in table and "| 81 |" in table and "`affine_range`" in table
