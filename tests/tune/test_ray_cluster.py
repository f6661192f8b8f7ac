"""A simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head and two worker
nodes, each its own raylet and object store, on this machine): a sweep survives losing a whole
node mid-sweep.  Skipped without ``ray``; slow (``pytest -m slow``)."""

from __future__ import annotations

import threading
import time

import pytest

from nkikit.tune import Sweep
from nkikit.tune.ray_backend import _local_runtime_env, ray_available, run_ray

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ray_available(), reason="ray is not installed: pip install ray"),
]


def test_a_sweep_survives_a_lost_node(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    mem = 80 * 1024**2
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": mem, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1, object_store_memory=mem)
        doomed = cluster.add_node(num_cpus=1, object_store_memory=mem)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, runtime_env=_local_runtime_env(), log_to_driver=False)
        starts = tmp_path / "starts"
        starts.mkdir()
        lost: list[str] = []

        def kill_when_running() -> None:
            # remove the node as soon as a task is running on it (tasks take 3 s)
            while not lost:
                for f in starts.iterdir():
                    if f.read_text() == doomed.node_id:
                        lost.append(f.name.split("-")[0])
                        break
                time.sleep(0.02)
            cluster.remove_node(doomed)  # its raylet and workers are killed, tasks and all

        killer = threading.Thread(target=kill_when_running, daemon=True)
        killer.start()
        sweep = Sweep.grid(
            "tune.kernels:slow_square", x=range(8), seconds=[3.0], starts=[str(starts)]
        )
        done: list = []
        run_ray(sweep.tasks, 0, done.append, worker_retries=3)
        killer.join()
        assert sorted(r.value for r in done) == sorted(x * x for x in range(8))
        assert all(r.ok for r in done)
        # the task that was running on the lost node started again elsewhere
        reruns = [f for f in starts.iterdir() if f.name.split("-")[0] == lost[0]]
        assert len(reruns) == 2
    finally:
        ray.shutdown()
        cluster.shutdown()
