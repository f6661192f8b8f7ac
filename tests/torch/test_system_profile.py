"""torch.profiler sees nkikit: a torch module mixing nkikit ops and plain torch ops, profiled
with the Neuron profiler config, gives one system trace (host, runtime, simulator and device
tracks, nested slices, launch flows, device times equal to the cost model's, host time without
the simulator's) and key averages that add up."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nkikit as nki  # noqa: E402
import nkikit.language as nl  # noqa: E402
from nkikit.compiler import launches  # noqa: E402
from nkikit.library.rmsnorm.kernel import (  # noqa: E402
    rmsnorm_backward_kernel,
    rmsnorm_kernel,
)
from nkikit.profiler.system import HOST_PID, RUNTIME_PID, SIM_PID  # noqa: E402
from nkikit.profiler.tracecheck import trace_problems  # noqa: E402
from nkikit.registry.manifest import load_manifest  # noqa: E402
from nkikit.registry.runtime import bind_functions  # noqa: E402
from nkikit.torch.profiler import NeuronConfig, NeuronProfiler, ProfileMode  # noqa: E402
from nkikit.typing import TensorSpec  # noqa: E402

LIBRARY = Path(__file__).resolve().parents[2] / "kernels"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROWS, D = 128, 256
NS = "sysprof_rmsnorm"


@nki.jit
def add_one(x):
    """A second kernel, called directly with torch tensors (not through a registry op)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.load(x), 1.0))
    return out


@pytest.fixture(scope="module")
def rmsnorm():  # noqa: ANN201
    fns = bind_functions("nkikit.library.rmsnorm", load_manifest(LIBRARY / "rmsnorm"), NS)
    return fns["rmsnorm"]


class Mixed(torch.nn.Module):
    """Linear (torch) -> RMSNorm (nkikit registry op) -> ReLU (torch) -> +1 (@nki.jit), + h."""

    def __init__(self, rmsnorm) -> None:  # noqa: ANN001
        super().__init__()
        self.lin = torch.nn.Linear(D, D)
        self.weight = torch.nn.Parameter(torch.ones(D))
        self.rmsnorm = rmsnorm

    def forward(self, x):  # noqa: ANN001, ANN201
        h = torch.relu(self.rmsnorm(self.lin(x), self.weight))
        return add_one(h.detach()) + h  # the kernel call has no autograd; h has


def modeled_us(kernel, *specs) -> float:  # noqa: ANN001
    return nki.profile_kernel(kernel, *specs).total_us


@pytest.fixture(scope="module", params=["no_grad", "grad"])
def profiled(request, rmsnorm, tmp_path_factory):  # noqa: ANN001, ANN201
    """Three forward calls under torch.profiler; eager without grad takes the fast path that
    skips the dispatcher, with grad the registered op (autograd)."""
    torch.manual_seed(0)
    model = Mixed(rmsnorm)
    x = torch.randn(ROWS, D)
    out_dir = tmp_path_factory.mktemp(f"sysprof-{request.param}")
    cfg = NeuronConfig(
        modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME, ProfileMode.CPU_UTIL],
        profile_output_dir=out_dir,
    )
    exporter = NeuronProfiler(cfg)
    grad = request.param == "grad"
    with torch.set_grad_enabled(grad):
        # warm up (TorchNeuron's advice too): kernels are traced and compiled on their first
        # profiled launch, so the window below holds cache hits only
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            model(x)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            record_shapes=True,
            on_trace_ready=exporter.export_trace,
        ) as prof:
            for _ in range(3):
                y = model(x)
            if grad:
                y.sum().backward()
    return exporter, prof, json.loads(exporter.files["trace"].read_text()), grad


def _procs(doc: dict) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def _threads(doc: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def _slices(doc: dict, pid: int) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


def test_trace_is_valid_and_nested(profiled) -> None:  # noqa: ANN001
    _, _, doc, _ = profiled
    assert trace_problems(doc, limit=10**6) == []


def test_tracks(profiled) -> None:  # noqa: ANN001
    _, _, doc, _ = profiled
    procs = _procs(doc)
    assert procs[HOST_PID].startswith("Host")
    assert procs[RUNTIME_PID] == "Neuron runtime (nkikit)"
    assert procs[SIM_PID].startswith("nkikit simulator")
    core = [p for p, n in procs.items() if n.startswith("NeuronCore 0")]
    assert len(core) == 1 and "modeled device clock" in procs[core[0]]
    names = set(_threads(doc).values())
    # DEVICE mode: the kernels' engine and DMA-queue tracks on the NeuronCore
    assert {"kernels", "Vector", "Scalar", "DMA q0"} <= names
    host_names = {e["name"] for e in _slices(doc, HOST_PID)}
    assert {"aten::linear", "aten::relu", f"{NS}::rmsnorm"} <= host_names
    assert not [n for n in host_names if n.startswith("nkikit.")]  # moved to their tracks


def test_kernels_on_the_device_clock_match_the_cost_model(profiled) -> None:  # noqa: ANN001
    exporter, _, doc, grad = profiled
    core_pid = next(p for p, n in _procs(doc).items() if n.startswith("NeuronCore 0"))
    kernels = [e for e in _slices(doc, core_pid) if e["tid"] == 1]
    backward = ["rmsnorm_backward_kernel"] if grad else []
    assert [e["name"] for e in kernels] == ["rmsnorm_kernel", "add_one"] * 3 + backward
    f32 = np.dtype("float32")
    x, w = TensorSpec((ROWS, D), f32), TensorSpec((D,), f32)
    want = {
        "rmsnorm_kernel": modeled_us(rmsnorm_kernel, x, w, 1e-6),
        "add_one": modeled_us(add_one, x),
        "rmsnorm_backward_kernel": modeled_us(rmsnorm_backward_kernel, x, x, w, 1e-6),
    }
    for e in kernels:
        assert e["dur"] == pytest.approx(want[e["name"]], abs=2e-3)
        assert e["args"]["device_us"] == pytest.approx(want[e["name"]], abs=2e-3)
    # in launch order, one after another, each at least the launch overhead after its launch
    launches_ = [e for e in _slices(doc, RUNTIME_PID) if e["name"].startswith("launch ")]
    assert len(launches_) == len(kernels)
    overhead = exporter.config.launch_overhead_us
    for k, (lo, ke) in enumerate(zip(launches_, kernels)):
        assert ke["ts"] >= lo["ts"] + overhead - 2e-3
        if k:
            prev = kernels[k - 1]
            assert ke["ts"] >= prev["ts"] + prev["dur"] - 2e-3


def test_flows_go_from_each_launch_to_its_kernel(profiled) -> None:  # noqa: ANN001
    _, _, doc, grad = profiled
    core_pid = next(p for p, n in _procs(doc).items() if n.startswith("NeuronCore 0"))
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "launch"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f" and e["cat"] == "launch"}
    assert len(starts) == len(ends) == 6 + grad
    launches_ = [e for e in _slices(doc, RUNTIME_PID) if e["name"].startswith("launch ")]
    kernels = [e for e in _slices(doc, core_pid) if e["tid"] == 1]
    for fid, s in starts.items():
        f = ends[fid]
        assert s["pid"] == RUNTIME_PID and f["pid"] == core_pid
        lo = next(e for e in launches_ if e["args"]["launch"] == fid - 1)
        ke = next(e for e in kernels if e["args"]["launch"] == fid - 1)
        assert lo["name"] == f"launch {ke['name']}"
        assert lo["ts"] <= s["ts"] <= lo["ts"] + lo["dur"]
        assert ke["ts"] <= f["ts"] <= ke["ts"] + ke["dur"]


def test_host_time_leaves_out_the_simulator(profiled, tmp_path: Path) -> None:  # noqa: ANN001
    _, prof, doc, grad = profiled
    raw_path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(raw_path))
    raw = [e for e in json.loads(raw_path.read_text())["traceEvents"] if e.get("ph") == "X"]
    sims = [e for e in raw if e["name"].startswith("nkikit.simulate ")]
    assert len(sims) == 6 + grad
    ops = [e for e in raw if e["name"] == f"{NS}::rmsnorm"]
    ours = [e for e in _slices(doc, HOST_PID) if e["name"] == f"{NS}::rmsnorm"]
    assert len(ops) == len(ours) == 3
    for op, mine in zip(sorted(ops, key=lambda e: e["ts"]), sorted(ours, key=lambda e: e["ts"])):
        inside = sum(
            s["dur"]
            for s in sims
            if op["ts"] <= s["ts"] and s["ts"] + s["dur"] <= op["ts"] + op["dur"]
        )
        assert inside > 0
        assert mine["dur"] == pytest.approx(op["dur"] - inside, abs=0.01)
    # the simulator's CPU time is on its own track, once per launch
    sim_track = _slices(doc, SIM_PID)
    assert [e["dur"] for e in sim_track] == pytest.approx(
        [s["dur"] for s in sorted(sims, key=lambda e: e["ts"])], abs=0.05
    )


def test_key_averages(profiled) -> None:  # noqa: ANN001
    exporter, _, doc, grad = profiled
    sp = exporter.last
    rows = {(d["kind"], d["name"]): d for d in sp.key_averages_dicts()}
    f32 = np.dtype("float32")
    rms_us = modeled_us(rmsnorm_kernel, TensorSpec((ROWS, D), f32), TensorSpec((D,), f32), 1e-6)
    add_us = modeled_us(add_one, TensorSpec((ROWS, D), f32))
    op = rows["op", f"{NS}::rmsnorm"]
    assert op["calls"] == 3 and op["fallbacks"] == 0 and op["kernels"] == ["rmsnorm_kernel"]
    assert op["device_total_us"] == pytest.approx(3 * rms_us, abs=1e-2)
    assert op["device_avg_us"] == pytest.approx(rms_us, abs=1e-2)
    k = rows["kernel", "rmsnorm_kernel"]
    assert k["calls"] == 3 and k["traced"] == 0 and k["compiled"] == 0  # warmed up before
    total = sum(r.device_us for r in sp.runs)
    assert total == pytest.approx(
        3 * (rms_us + add_us)
        + (rows["kernel", "rmsnorm_backward_kernel"]["device_total_us"] if grad else 0),
        abs=1e-2,
    )
    assert sp.device_total_us == pytest.approx(total)
    assert k["device_percent"] == pytest.approx(100 * 3 * rms_us / total, abs=0.01)
    relu = rows["op", "aten::relu"]
    assert relu["calls"] == relu["fallbacks"] == 3 and relu["device_total_us"] == 0
    if grad:  # the backward kernel ran through autograd: its op and kernel are there too
        assert rows["op", f"{NS}::rmsnorm_backward"]["calls"] == 1
        assert rows["kernel", "rmsnorm_backward_kernel"]["calls"] == 1
    # the same numbers in the JSON file and the trace's metadata
    saved = json.loads(exporter.files["key_averages"].read_text())
    assert saved["key_averages"] == sp.key_averages_dicts()
    assert doc["otherData"]["key_averages"] == sp.key_averages_dicts()
    text = sp.table_text()
    assert f"{NS}::rmsnorm" in text and "kernel rmsnorm_kernel" in text


def test_nothing_is_recorded_without_a_profiler(rmsnorm) -> None:  # noqa: ANN001
    x = torch.randn(ROWS, D)
    before = len(launches.RECENT)
    assert not launches.launches.active()
    rmsnorm(x, torch.ones(D))
    add_one(x)
    assert len(launches.RECENT) == before


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed")
def test_system_report_in_chromium(profiled, tmp_path: Path) -> None:  # noqa: ANN001
    exporter, _, _, _ = profiled
    page = exporter.files["html"]
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1600",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-3000:]
    body = next(line for line in dom.stdout.split(">") if "<body" in line)
    assert 'data-rendered="ok"' in body and "data-js-error" not in body, body
    assert 'data-hover="ok"' in body  # the lookup found the first kernel on the device row
    assert "Uncaught" not in dom.stderr
    # host rows, runtime, simulator, NeuronCore 0; engine tracks of the drill-downs
    assert int(body.split('data-tracks="')[1].split('"')[0]) >= 4
    assert int(body.split('data-engine-tracks="')[1].split('"')[0]) >= 3
    assert f"{NS}::rmsnorm" in dom.stdout and 'href="#k-rmsnorm_kernel"' in dom.stdout
    shot = tmp_path / "system_report.png"
    res = subprocess.run(
        [*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compiled_module_is_visible_with_device_time(rmsnorm, tmp_path: Path) -> None:  # noqa: ANN001
    """Under torch.compile the op runs from the compiled graph; its launches are recorded."""

    class Compiled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(D, D)
            self.weight = torch.nn.Parameter(torch.ones(D))

        def forward(self, x):  # noqa: ANN001, ANN201
            return torch.relu(rmsnorm(self.lin(x), self.weight))

    x = torch.randn(ROWS, D)
    rmsnorm(x, torch.ones(D))  # binds the op eagerly; the compiled graph calls it
    model = torch.compile(Compiled(), fullgraph=True)
    exporter = NeuronProfiler(NeuronConfig(profile_output_dir=tmp_path))
    with torch.no_grad():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            model(x)  # compiles the graph and the kernel
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=exporter.export_trace
        ):
            model(x)
            model(x)
    rows = {(d["kind"], d["name"]): d for d in exporter.last.key_averages_dicts()}
    f32 = np.dtype("float32")
    want = modeled_us(rmsnorm_kernel, TensorSpec((ROWS, D), f32), TensorSpec((D,), f32), 1e-6)
    op = rows["op", f"{NS}::rmsnorm"]
    assert op["calls"] == 2 and op["device_total_us"] == pytest.approx(2 * want, abs=1e-2)
    assert rows["kernel", "rmsnorm_kernel"]["calls"] == 2
