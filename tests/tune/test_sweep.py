"""Sweeps as data: content-addressed tasks, the local backend, retries, the result store, and an
autotuning search run as a sweep."""

from __future__ import annotations

import json

import pytest

from nkikit.tune import Sweep, Task
from nkikit.tune.cache import JsonStore, write_json_atomic
from nkikit.tune.tasks import autotune_sweep, report_from_results

SQUARE = "tune.kernels:square"


def test_a_task_is_addressed_by_its_content():
    a = Task(SQUARE, {"x": 3})
    assert a.id == Task(SQUARE, {"x": 3}).id
    assert a.id != Task(SQUARE, {"x": 4}).id
    assert Task.from_json(json.loads(json.dumps(a.to_json()))).id == a.id
    assert len(Sweep([a, Task(SQUARE, {"x": 3})])) == 1  # the same task runs once
    with pytest.raises(ValueError, match="module:function"):
        Task("no_colon", {})


def test_local_results_are_json_values_in_task_order():
    sweep = Sweep.grid(SQUARE, x=[3, 1, 2])
    results = sweep.run(progress=False)
    assert [r.value["square"] for r in results.values()] == [9, 1, 4]
    assert results[sweep.tasks[0].id].value["pair"] == [3, -3]  # a tuple, through JSON
    assert json.loads(json.dumps(results.to_json())) == results.to_json()


def test_a_transient_failure_is_retried(tmp_path):
    task = Task("tune.kernels:fails_once", {"marker": str(tmp_path / "m"), "x": 1})
    (r,) = Sweep([task]).run(retries=1, progress=False).values()
    assert r.ok and r.value == 2 and r.attempts == 2


def test_a_deterministic_failure_is_reported_not_raised():
    sweep = Sweep([Task("tune.kernels:always_fails", {"x": 5}), Task(SQUARE, {"x": 2})])
    results = sweep.run(retries=2, progress=False)
    (bad,) = results.failed
    assert bad.attempts == 3 and bad.error.startswith("ValueError: bad input 5")
    assert len(results.values_by_id()) == 1


def test_the_store_keeps_results_and_a_rerun_skips_them(tmp_path, monkeypatch):
    sweep = Sweep.grid(SQUARE, x=range(4))
    first = sweep.run(store=tmp_path, progress=False)
    assert len(JsonStore(tmp_path).keys()) == 4

    ran = []
    import nkikit.tune.sweep as sweep_mod

    real = sweep_mod.execute
    monkeypatch.setattr(sweep_mod, "execute", lambda t, r: ran.append(t) or real(t, r))
    bigger = Sweep.grid(SQUARE, x=range(6))
    second = bigger.run(store=tmp_path, progress=False)
    assert [t.inputs["x"] for t in ran] == [4, 5]  # only the new tasks ran
    assert {i: second[i].value for i in first} == first.values_by_id()


def test_an_atomic_write_replaces_a_torn_file(tmp_path):
    path = tmp_path / "e.json"
    path.write_text("{not json")
    assert JsonStore(tmp_path).get("e") is None  # unreadable reads as missing
    write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["e.json"]  # no temporary left behind


def test_an_autotuning_search_as_a_sweep():
    from nkikit.typing import TensorSpec

    configs = [{"cols": 128}, {"cols": 512}, {"cols": 2048}, {"rows": 256}]
    x = TensorSpec((256, 4096), "float32")
    sweep = autotune_sweep("tune.kernels:scale_kernel", [x], configs, target="trn2")
    assert sweep.tasks[0].inputs["args"] == [{"shape": [256, 4096], "dtype": "float32"}]
    results = sweep.run(progress=False)
    report = report_from_results(sweep, results)
    assert report.best == {"cols": 2048}
    assert report.pruned[0].rule == "err_num_partition_exceed_arch_limit"
    assert report.profile.total_us == pytest.approx(report.winner.total_us)


def _suite(folder):
    (folder / "test_good.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    (folder / "test_bad.py").write_text("def test_two():\n    assert 1 + 1 == 3\n")


@pytest.mark.slow  # two pytest processes: ~10 s each on a loaded 2-core machine
def test_a_test_suite_as_a_sweep(tmp_path, monkeypatch, capsys):
    from nkikit.cli import main

    _suite(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["test", "--sweep", "."]) == 1
    out = capsys.readouterr().out
    assert "FAIL test_bad.py: 1 failed" in out and "ok   test_good.py: 1 passed" in out
    assert "1 of 2 test files passed" in out


def test_a_test_sweep_takes_files_outside_its_rootdir(tmp_path):
    # `nkikit test --sweep` from any folder but the checkout tests the library, which is not
    # under the current folder: relative_to raised ValueError, shown as pathlib's line
    from nkikit.tune.tasks import pytest_matrix

    for folder in ("here", "elsewhere"):
        (tmp_path / folder).mkdir()
    _suite(tmp_path / "elsewhere")
    sweep = pytest_matrix([str(tmp_path / "elsewhere")], str(tmp_path / "here"))
    assert [t.inputs["files"] for t in sweep.tasks] == [
        [str(tmp_path / "elsewhere" / f)] for f in ("test_bad.py", "test_good.py")
    ]
