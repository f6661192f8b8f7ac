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
    # ... and the kernel's own arithmetic (its tile matmuls alone); how it compares with the
    # first run is a timing, which belongs to the benchmark's tables, not to a test
    assert all(r["matmul_cpu_s"] > 0 for r in rows)
    md = (tmp_path / "results.md").read_text()
    assert "| 397 |" in md and "matmuls alone" in md


def test_nki0x_benchmark_sizes_call_only(tmp_path):
    main(["--sizes", "41", "--call-only", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["ir_ops"] == 41 and row["matches_numpy"]
    assert "compile" not in row["cpu_s"] and row["instructions"] is None
    assert "| 41 |" in (tmp_path / "results.md").read_text()


def test_nki0x_benchmark_compares_rerolled_and_unrolled_traces(tmp_path):
    """A size past the re-rolling threshold, then the same kernel kept as traced: the same
    instructions and results, held in a few statements against thousands."""
    main(["--sizes", "2400", "--call-only", "--compare-unrolled", "--out", str(tmp_path)])
    rolled, flat = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert rolled["rerolled"] and not flat["rerolled"]
    assert rolled["ir_ops"] == flat["ir_ops"] == 2397
    assert rolled["matches_numpy"] and flat["matches_numpy"]
    assert rolled["statements"] < 200 < 4000 < flat["statements"]
    assert "(as traced)" in (tmp_path / "results.md").read_text()
