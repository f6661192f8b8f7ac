"""compile / profile_kernel, NKI's benchmark and profile decorators, the CLI, Program JSON."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import nkikit.language as nl
import nkikit.typing as nt
from nkikit.cli import main
from nkikit.compiler import Program, benchmark, compile, profile, profile_kernel
from nkikit.profiler import Profile
from nkikit.targets import ENV_VAR

from . import kernels as K

F32 = nl.float32
SPEC = nt.tensor[[128, 512], F32]


def test_compile_with_specs_and_arrays_agree():
    a = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    p1 = compile(K.load_act_store, SPEC, target="trn1")
    p2 = compile(K.load_act_store, a, target="trn1")
    assert isinstance(p1, Program) and p1.target.name == "trn1"
    assert p1.total_ns == p2.total_ns and len(p1) == len(p2)


def test_compile_accepts_a_plain_function():
    def add_one(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), 1.0))
        return out

    assert len(compile(add_one, SPEC, target="trn3")) > 0


def test_default_target_follows_the_environment(monkeypatch):
    assert compile(K.load_act_store, SPEC).target.name == "trn2"
    monkeypatch.setenv(ENV_VAR, "inf2")
    assert compile(K.load_act_store, SPEC).target.name == "trn1"


def test_profile_kernel():
    prof = profile_kernel(K.load_act_store, SPEC, target="trn2")
    assert isinstance(prof, Profile)
    assert prof.total_us == pytest.approx(compile(K.load_act_store, SPEC, target="trn2").total_us)
    prof.validate()
    act = [i for i in prof.instructions if i.opcode == "ACTIVATE"][0]
    assert act.source == f"kernels.py:{K.line_of('# @act')}"
    assert act.source_text.startswith("y = nl.exp(x)")
    assert prof.summary["bound_by"] in ("dma", "scalar")


def test_benchmark_with_abstract_args_returns_none():
    bench = benchmark(warmup=5, iters=10)(K.load_act_store)
    assert bench(SPEC) is None
    lat = bench.benchmark_result.nc_latency
    expected = compile(K.load_act_store, SPEC).total_us
    for p in (0, 1, 10, 25, 50, 90, 99, 100):
        assert lat.get_latency_percentile(p) == pytest.approx(expected)
    with pytest.raises(ValueError):
        lat.get_latency_percentile(101)


def test_benchmark_with_arrays_returns_simulated_outputs(tmp_path):
    a = np.random.default_rng(1).standard_normal((128, 512)).astype(np.float32)
    neff, trace = tmp_path / "k.neff", tmp_path / "k.ntff"
    bench = benchmark(
        K.load_act_store, save_neff_name=str(neff), save_trace_name=str(trace), target="trn1"
    )
    out = bench(a)
    np.testing.assert_allclose(out, np.exp(a), rtol=1e-5)
    assert bench.benchmark_result.nc_latency.get_latency_percentile(50) > 0
    assert Program.from_json(neff).total_ns == pytest.approx(bench.program.total_ns)
    assert "traceEvents" in json.loads(trace.read_text())


def test_benchmark_on_a_grid():
    spec = nt.tensor[[256, 512], F32]
    one = benchmark(K.spmd_exp)[1]
    one(nt.tensor[[128, 512], F32])
    two = benchmark(K.spmd_exp)[2]
    assert two(spec) is None
    # instances run one after another on one NeuronCore [PM]; the second one's loads
    # overlap the first one's compute and store
    assert (
        one.benchmark_result.total_us
        < two.benchmark_result.total_us
        < 2 * one.benchmark_result.total_us
    )
    a = np.random.default_rng(2).standard_normal((256, 512)).astype(np.float32)
    np.testing.assert_allclose(benchmark(K.spmd_exp)[2](a), np.exp(a), rtol=1e-5)


def test_profile_writes_trace_report_and_summary(tmp_path):
    prof = profile(working_directory=tmp_path, save_trace_name="run.ntff", target="trn2")(
        K.load_act_store
    )
    assert prof(SPEC) is None
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "file.program.json",
        "run.html",
        "run.json",
        "run.nkikit.json",
        "run_summary.json",
    ]
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["total_us"] == pytest.approx(prof.profile_result.total_us)
    assert "<html" in (tmp_path / "run.html").read_text().lower()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prof(SPEC)
    again = profile(
        K.load_act_store, working_directory=tmp_path, save_trace_name="run.ntff", overwrite=True
    )
    a = np.ones((128, 512), np.float32)
    np.testing.assert_allclose(again(a), np.exp(a), rtol=1e-6)


def test_profile_needs_a_working_directory():
    with pytest.raises(TypeError, match="working_directory"):
        profile(K.load_act_store)


def test_program_json_round_trip(tmp_path):
    p = compile(
        K.matmul_small,
        nt.tensor[[256, 256], nl.bfloat16],
        nt.tensor[[256, 512], nl.bfloat16],
        target="trn1",
    )
    text = p.to_json()
    q = Program.from_json(text)
    assert q.to_dict() == p.to_dict()
    assert q.target == p.target
    path = p.to_json(tmp_path / "p.json")
    r = Program.from_json(path)
    assert r.profile().to_dict() == p.profile().to_dict()
    d = json.loads(text)
    assert d["target"] == "trn1" and set(d["streams"]) >= {"tensor", "dma0"}
    # the PSUM evacuations are unassigned copies: VectorE or ScalarE, as the compiler balances
    assert {"vector", "scalar"} & set(d["streams"])
    stream = d["streams"]["tensor"]
    assert len(stream["id"]) == len(stream["deps"]) == 4  # 2 m tiles x 2 k tiles of matmuls
    with pytest.raises(ValueError):
        Program.from_dict({"format": "something-else"})


def test_cli(tmp_path, capsys):
    src = tmp_path / "my_kernel.py"
    src.write_text(
        textwrap.dedent("""
        import nkikit as nki
        import nkikit.language as nl

        @nki.jit
        def scale(a, factor=2.0):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.multiply(nl.load(a), factor))
            return out
    """)
    )
    out = tmp_path / "prof"
    code = main(
        [
            "profile",
            f"{src}::scale",
            "--args",
            "a=128x1024:bfloat16,factor=3.0",
            "--target",
            "trn1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert {p.name for p in out.iterdir()} == {
        "profile.json",
        "profile.nkikit.json",
        "profile.html",
        "profile_summary.json",
        "scale.program.json",
    }
    assert "scale on trn1" in capsys.readouterr().out
    assert (
        main(
            [
                "profile",
                f"{src}::scale",
                "--args",
                "128x1024:bfloat16",
                "--target",
                "tpu",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "valid targets" in capsys.readouterr().err
