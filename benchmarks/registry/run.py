"""Registry latency: pulls from the cache and over loopback, and the torch op's per-call cost.

``python -m benchmarks.registry`` (or ``python benchmarks/registry/run.py``) starts a local hub
(nkikit.hub on 127.0.0.1), publishes the library's rmsnorm, and measures

  - first pull over loopback: a fresh process with an empty cache times `kernels.pull` (resolve,
    download, verify, import) - goal < 1 s;
  - pull from the cache: a fresh process with a warm cache (the build not yet imported), by
    version (a refs and a tree request) and by locked commit (no request) - goal < 50 ms; and repeated
    pulls in one process (verify again, reuse the imported module);
  - per-call overhead of the torch binding over calling the kernel on numpy arrays - goal
    < 30 µs. Measured on a stub kernel (same binding code, an entry that only allocates its
    output) so simulator noise does not drown the number; the real rmsnorm is shown too.

Results go to results.md next to this file (and stdout). Process start-up and imports are
outside the timed regions: each child process imports nkikit.kernels (and, unless noted,
huggingface_hub.hf_api and its HTTP client: once-per-process costs of ~0.4 s and ~60 ms) first,
then times only the pull; the "cold process" lines include those costs.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOALS = {"first_pull_ms": 1000.0, "cached_pull_ms": 50.0, "op_overhead_us": 30.0}

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from huggingface_hub.utils import disable_progress_bars
    from nkikit import kernels
    import numpy as np
    disable_progress_bars()
    url, cache, mode, preimport = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    if preimport:  # once-per-process costs, reported separately: the import (~0.4 s) and the
        from huggingface_hub import HfApi  # HTTP client, whose SSL context loads the CA store
        from huggingface_hub.utils import get_session
        get_session()
    # the bench's own loopback hub: trust is tied to an endpoint, so it is granted per call
    kw = dict(endpoint=url, cache_dir=cache, lockfile=False, trust_remote_code=True)
    if mode == "commit":
        kw["revision"] = sys.argv[5]
    else:
        kw["version"] = 1
    t0 = time.perf_counter()
    k = kernels.pull("nkikit/rmsnorm", **kw)
    first = time.perf_counter() - t0
    again = []
    for _ in range(20):
        t0 = time.perf_counter()
        kernels.pull("nkikit/rmsnorm", **kw)
        again.append(time.perf_counter() - t0)
    x = np.ones((4, 64), np.float32)
    assert k.rmsnorm(x, x[0]).shape == (4, 64)
    print(json.dumps({"first_s": first, "again_s": again, "hf_api_imported": "huggingface_hub.hf_api" in sys.modules}))
    """
)


def _child(url: str, cache: Path, mode: str, extra: str = "", preimport: bool = True) -> dict:
    args = [sys.executable, "-c", CHILD, url, str(cache), mode, "1" if preimport else "0"] + (
        [extra] if extra else []
    )
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def pull_latency(url: str, commit: str, work: Path, repeats: int = 5) -> dict:
    first, first_cold, cached_version, cached_cold, cached_commit, in_process = (
        [],
        [],
        [],
        [],
        [],
        [],
    )
    for i in range(repeats):
        cache = work / f"cache{i}"
        first.append(_child(url, cache, "version")["first_s"])  # empty cache
        first_cold.append(_child(url, work / f"cold{i}", "version", preimport=False)["first_s"])
        warm = _child(url, cache, "version")  # warm cache, fresh process
        cached_version.append(warm["first_s"])
        in_process.extend(warm["again_s"])
        cached_cold.append(_child(url, cache, "version", preimport=False)["first_s"])
        by_commit = _child(url, cache, "commit", commit, preimport=False)
        assert not by_commit["hf_api_imported"], "a pull from the cache by commit imported hf_api"
        cached_commit.append(by_commit["first_s"])
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    return {
        "first_pull_ms": ms(first),
        "first_pull_max_ms": 1e3 * max(first),
        "first_pull_cold_ms": ms(first_cold),
        "cached_pull_version_ms": ms(cached_version),
        "cached_pull_version_cold_ms": ms(cached_cold),
        "cached_pull_commit_ms": ms(cached_commit),
        "cached_pull_in_process_ms": ms(in_process),
    }


def _per_call(fn, args, n: int, rounds: int = 25) -> float:  # noqa: ANN001
    """Best per-call time over `rounds` rounds of n calls: the machine is shared, and the
    minimum is the estimate least disturbed by other processes."""
    for _ in range(min(50, n)):
        fn(*args)
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        best.append((time.perf_counter() - t0) / n)
    return min(best) * 1e6


def op_overhead(k) -> dict:  # noqa: ANN001
    import numpy as np
    import torch

    from nkikit.registry.manifest import FunctionSpec, Symbol
    from nkikit.registry.runtime import KernelFunction

    spec = FunctionSpec(
        name="stub",
        entry=Symbol("m", "stub"),
        inputs=("x", "weight"),
        attrs={"eps": 1e-6},
        dtypes=("float32",),
        example={"x": (128, 64), "weight": (64,)},
        outputs=1,
    )

    def stub(x, weight, eps=1e-6):  # noqa: ANN001, ANN202
        return np.empty_like(x)

    fn = KernelFunction(spec, stub, namespace="_nkikit_bench_stub")
    xn, wn = np.ones((128, 64), np.float32), np.ones(64, np.float32)
    xt, wt = torch.from_numpy(xn), torch.from_numpy(wn)
    op = fn.op
    res = {
        "stub_numpy_us": _per_call(fn.entry, (xn, wn), 2000),
        "stub_function_numpy_us": _per_call(fn, (xn, wn), 2000),
        "stub_function_torch_us": _per_call(fn, (xt, wt), 2000),
        "stub_dispatcher_op_us": _per_call(op, (xt, wt), 1000),
    }
    res["op_overhead_us"] = res["stub_function_torch_us"] - res["stub_numpy_us"]
    res["dispatcher_overhead_us"] = res["stub_dispatcher_op_us"] - res["stub_numpy_us"]
    # the real kernel, interleaved so drift hits both sides alike
    x, w = (
        np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32),
        np.ones(64, np.float32),
    )
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    entry = k.rmsnorm.entry
    bare, viatorch = [], []
    for _ in range(40):
        t0 = time.perf_counter()
        entry(x, w, eps=1e-6)
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        k.rmsnorm(tx, tw)
        viatorch.append(time.perf_counter() - t0)
    res["rmsnorm_numpy_us"] = 1e6 * statistics.median(bare)
    res["rmsnorm_torch_us"] = 1e6 * statistics.median(viatorch)
    return res


def main() -> int:
    from huggingface_hub.utils import disable_progress_bars

    from nkikit import kernels
    from nkikit.hub import running_hub

    disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="nkikit-bench-") as tmp:
        work = Path(tmp)
        with running_hub(work / "hub", reserved_namespaces=()) as url:
            pub = kernels.publish(
                ROOT / "kernels" / "rmsnorm", "nkikit/rmsnorm", endpoint=url, run_tests=False
            )
            pulls = pull_latency(url, pub.commit, work)
            k = kernels.pull(
                "nkikit/rmsnorm",
                version=1,
                endpoint=url,
                cache_dir=work / "cache0",
                lockfile=False,
                trust_remote_code=True,
            )
        calls = op_overhead(k)
    results = {**pulls, **calls}
    text = render(results)
    (HERE / "results.md").write_text(text)
    print(text)
    ok = (
        results["first_pull_ms"] < GOALS["first_pull_ms"]
        and results["cached_pull_version_ms"] < GOALS["cached_pull_ms"]
        and results["op_overhead_us"] < GOALS["op_overhead_us"]
    )
    return 0 if ok else 1


def render(r: dict) -> str:
    import numpy
    import torch

    def mark(value: float, goal: float) -> str:
        return "met" if value < goal else "MISSED"

    return "\n".join(
        [
            "# Registry latency (`python -m benchmarks.registry`)",
            "",
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f} (shared with other work), Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, torch {torch.__version__}; hub: nkikit.hub on 127.0.0.1; "
            f"kernel: library rmsnorm (torch-cpu build). Medians of 5 fresh processes unless noted; "
            f"{time.strftime('%Y-%m-%d')}.",
            "",
            "| measurement | value | goal |",
            "| --- | ---: | --- |",
            f"| first pull over loopback (empty cache: resolve, download, verify, import) | {r['first_pull_ms']:.1f} ms (max {r['first_pull_max_ms']:.1f}) | < 1000 ms, {mark(r['first_pull_ms'], GOALS['first_pull_ms'])} |",
            f"| first pull, cold process (+ hf_api import and HTTP client set-up) | {r['first_pull_cold_ms']:.1f} ms | < 1000 ms, {mark(r['first_pull_cold_ms'], GOALS['first_pull_ms'])} |",
            f"| pull from cache, by version (refs + tree requests, verify, import) | {r['cached_pull_version_ms']:.1f} ms | < 50 ms, {mark(r['cached_pull_version_ms'], GOALS['cached_pull_ms'])} |",
            f"| pull from cache, by version, cold process (+ hf_api import and HTTP client set-up) | {r['cached_pull_version_cold_ms']:.1f} ms | |",
            f"| pull from cache, by commit / lockfile (no request, no hf_api import; verify, import) | {r['cached_pull_commit_ms']:.1f} ms | < 50 ms, {mark(r['cached_pull_commit_ms'], GOALS['cached_pull_ms'])} |",
            f"| repeated pull in one process (refs + tree requests, verify, module reused; median of 100) | {r['cached_pull_in_process_ms']:.2f} ms | |",
            f"| torch call overhead over numpy, `k.fn(tensor)` (stub kernel) | {r['op_overhead_us']:.1f} µs | < 30 µs, {mark(r['op_overhead_us'], GOALS['op_overhead_us'])} |",
            f"| torch call overhead through the dispatcher, `torch.ops.ns.fn` (stub kernel) | {r['dispatcher_overhead_us']:.1f} µs | (autograd / compile path) |",
            "",
            "Per-call detail (best of 25 rounds):",
            "",
            "| call | µs |",
            "| --- | ---: |",
            f"| stub entry on numpy arrays (the baseline) | {r['stub_numpy_us']:.1f} |",
            f"| KernelFunction on numpy arrays (argument binding, dtype check) | {r['stub_function_numpy_us']:.1f} |",
            f"| KernelFunction on torch tensors (eager path: checks, tensor<->numpy) | {r['stub_function_torch_us']:.1f} |",
            f"| torch.ops custom op on torch tensors (dispatcher, Python custom_op) | {r['stub_dispatcher_op_us']:.1f} |",
            f"| library rmsnorm [128, 64] fp32 on numpy (simulator; median of 40) | {r['rmsnorm_numpy_us']:.0f} |",
            f"| library rmsnorm [128, 64] fp32 on torch tensors (median of 40) | {r['rmsnorm_torch_us']:.0f} |",
            "",
            "Eager calls that need no autograd take the direct path (no dispatcher); calls that need",
            "autograd, or that run under torch.compile / export / vmap / a dispatch mode, go through the",
            "registered custom op, whose fixed Python cost is the dispatcher line above.",
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
