"""The NKI 0.x size benchmark runs end to end at tiny sizes and writes its tables."""

import json

from benchmarks.nki0x.run import main


def test_nki0x_benchmark_tiny(tmp_path):
    main(["--tiny", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["ir_ops"] for r in rows] == [97, 397]
    assert all(r["matches_numpy"] and r["instructions"] > r["ir_ops"] for r in rows)
    assert "| 397 |" in (tmp_path / "results.md").read_text()
