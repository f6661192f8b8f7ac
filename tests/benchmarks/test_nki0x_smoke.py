"""The NKI 0.x size benchmark runs end to end at tiny sizes and writes its tables."""

import json

from benchmarks.nki0x.run import main


def test_nki0x_benchmark_tiny(tmp_path):
    main(["--tiny", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["ir_ops"] for r in rows] == [97, 397]
    assert all(r["matches_numpy"] and r["instructions"] > r["ir_ops"] for r in rows)
    # the whole @nki.jit call is timed beside its stages
    assert all(r["call_s"] > 0 and r["cpu_s"]["call"] > 0 for r in rows)
    assert "| 397 |" in (tmp_path / "results.md").read_text()


def test_nki0x_benchmark_sizes_call_only(tmp_path):
    main(["--sizes", "41", "--call-only", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["ir_ops"] == 41 and row["matches_numpy"]
    assert "compile" not in row["cpu_s"] and row["instructions"] is None
    assert "| 41 |" in (tmp_path / "results.md").read_text()
