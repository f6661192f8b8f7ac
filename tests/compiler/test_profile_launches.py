"""Profiling a Python function that launches several kernels (``nki.profile_launches`` and
``nkikit profile FILE::function --launches``), and the library's public functions through
``nkikit profile``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
from nkikit.cli import main
from nkikit.compiler import launches
from nkikit.profiler.tracecheck import trace_problems
from nkikit.typing import TensorSpec

LIBRARY = Path(__file__).resolve().parents[2] / "kernels"


@nki.jit
def add1(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.load(x), 1.0))
    return out


@nki.jit
def mul2(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(x), 2.0))
    return out


def two_kernels(x):
    return mul2(add1(x))


def test_each_launch_is_its_own_kernel() -> None:
    x = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    y, sp = nki.profile_launches(two_kernels, x)
    np.testing.assert_array_equal(y, (x + 1) * 2)
    assert [r.kernel for r in sp.runs] == ["add1", "mul2"]
    spec = TensorSpec((128, 512), np.dtype("float32"))
    for r, k in zip(sp.runs, (add1, mul2)):
        assert r.device_us == pytest.approx(nki.profile_kernel(k, spec).total_us)
    # in order on the device clock, each after its launch and the launch overhead
    a, b = sp.runs
    assert a.device_start >= a.launch_start + sp.launch_overhead_us - 1e-9
    assert b.device_start >= max(a.device_end, b.launch_start + sp.launch_overhead_us) - 1e-9
    rows = {(d["kind"], d["name"]): d for d in sp.key_averages_dicts()}
    call = rows["op", "two_kernels"]
    assert call["calls"] == 1 and call["kernels"] == ["add1", "mul2"] and call["fallbacks"] == 0
    assert call["device_total_us"] == pytest.approx(sp.device_total_us)
    assert trace_problems(sp.trace_events()) == []


def test_no_session_no_hook() -> None:
    assert not launches.launches.active()
    n = len(launches.RECENT)
    add1(np.zeros((128, 64), dtype=np.float32))
    assert len(launches.RECENT) == n


def test_cli_profiles_library_functions(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    src = str(LIBRARY / "rmsnorm" / "kernel.py")
    shapes = "x=2x128x256:bfloat16,weight=256:bfloat16"
    # the name the kernel card gives, as one traced kernel ...
    assert main(["profile", f"{src}::rmsnorm", "--args", shapes, "--out", str(tmp_path / "a")]) == 0
    assert "rmsnorm on trn2" in capsys.readouterr().out
    # ... and launch by launch
    out = tmp_path / "b"
    code = main(["profile", f"{src}::rmsnorm", "--args", shapes, "--launches", "--out", str(out)])
    assert code == 0
    assert "kernel rmsnorm_kernel" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {
        "system_trace.json",
        "key_averages.json",
        "system_report.html",
        "rmsnorm_kernel.nkikit.json",
    }
    doc = json.loads((out / "system_trace.json").read_text())
    assert trace_problems(doc) == []
    saved = json.loads((out / "key_averages.json").read_text())
    assert saved["launches"] == 1 and saved["device_total_us"] > 0
