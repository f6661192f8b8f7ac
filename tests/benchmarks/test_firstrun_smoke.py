"""The first-run benchmark runs end to end at its tiny size and writes its tables."""

import json

from benchmarks.firstrun.run import main


def test_firstrun_benchmark_tiny(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["blas"] == "one thread" for r in rows] == [False, True]
    # 256 rows x 512 hidden: 2 row blocks x 4 K tiles x (gate, up)
    assert all(r["matmuls"] == 16 for r in rows)
    # bf16 output of an fp32-accumulated product: within bf16's rounding of the numpy result
    assert all(r["rel_err"] < 1e-2 for r in rows)
    assert "| 256 x 512 | 16 |" in (tmp_path / "results.md").read_text()
