"""The Ray backend on a local 2-CPU cluster: the same results as the local backend, retries,
and no result lost when a worker process is killed mid-sweep.  Skipped without ``ray``
(``pip install 'nkikit[ray]'``); slow (starting a cluster takes ~10 s): ``pytest -m slow``."""

from __future__ import annotations

import pytest

from nkikit.tune import Sweep, Task
from nkikit.tune.ray_backend import _local_runtime_env, ray_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ray_available(), reason="ray is not installed: pip install ray"),
]


@pytest.fixture(scope="module")
def cluster():
    import ray

    ray.init(
        num_cpus=2,
        object_store_memory=200 * 1024**2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=_local_runtime_env(),  # the workers import tests/tune like this process
    )
    yield ray
    ray.shutdown()


def test_ray_gives_the_local_results(cluster):
    sweep = Sweep.grid("tune.kernels:square", x=range(20))
    local = sweep.run(progress=False)
    remote = sweep.run("ray", progress=False)
    assert remote.values_by_id() == local.values_by_id()
    assert list(remote) == list(local)  # in the sweep's order, whatever order they finished in


def test_ray_retries_a_failing_task_like_local(cluster, tmp_path):
    tasks = [
        Task("tune.kernels:fails_once", {"marker": str(tmp_path / "m"), "x": 1}),
        Task("tune.kernels:always_fails", {"x": 2}),
    ]
    results = Sweep(tasks).run("ray", retries=1, progress=False)
    ok, bad = results.values()
    assert ok.value == 2 and ok.attempts == 2
    assert bad.status == "error" and bad.error.startswith("ValueError: bad input 2")


def test_a_killed_worker_loses_nothing(cluster, tmp_path):
    marker = tmp_path / "killed"
    tasks = [Task("tune.kernels:square", {"x": i}) for i in range(10)]
    tasks.insert(5, Task("tune.kernels:dies_once", {"marker": str(marker), "x": 7}))
    store = tmp_path / "store"
    results = Sweep(tasks).run("ray", store=store, progress=False)
    assert marker.exists()  # a worker process was really killed by SIGKILL
    assert len(results) == 11 and not results.failed
    assert results[tasks[5].id].value == 70
    rerun = Sweep(tasks).run("ray", store=store, progress=False)  # all stored: nothing runs
    assert rerun.values_by_id() == results.values_by_id()


def test_an_autotuning_search_on_ray(cluster):
    from nkikit.tune.tasks import autotune_sweep, report_from_results
    from nkikit.typing import TensorSpec

    configs = [{"cols": 128}, {"cols": 512}, {"cols": 2048}, {"rows": 256}]
    sweep = autotune_sweep(
        "tune.kernels:scale_kernel", [TensorSpec((256, 4096), "float32")], configs
    )
    local = sweep.run(progress=False)
    remote = sweep.run("ray", progress=False)
    assert remote.values_by_id() == local.values_by_id()
    assert report_from_results(sweep, remote).best == {"cols": 2048}


def test_nkikit_test_on_ray(cluster, tmp_path, monkeypatch, capsys):
    from nkikit.cli import main

    from .test_sweep import _suite

    _suite(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["test", "--ray", "."]) == 1
    out = capsys.readouterr().out
    assert "FAIL test_bad.py" in out and "ok   test_good.py" in out
