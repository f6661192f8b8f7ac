"""nkikit.targets: the one table of generations (verifier limits, allocator sizes, cost model),
aliases, the default target and the environment override."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import NkiError
from nkikit.ir.verify import verify
from nkikit.targets import ENV_VAR, TARGETS, UnknownTargetError, default_target_name, get_target


def test_three_generations_with_their_clocks():
    assert set(TARGETS) == {"trn1", "trn2", "trn3"}
    assert get_target("trn1").clock("tensor") == 2.8e9  # [A2]
    assert get_target("trn2").clock("vector") == 0.96e9  # [A3]
    assert get_target("trn3").clock("vector") == 1.2e9  # [A4]
    assert get_target("trn1").sbuf_bytes == 192 * 1024
    assert get_target("trn2").sbuf_bytes == 224 * 1024
    for t in TARGETS.values():
        assert t.psum_banks * t.psum_bank_bytes == t.psum_bytes == 16 * 1024
        assert t.dma_queues == 16


def test_peak_flops_follow_the_array_and_clock():
    t1 = get_target("trn1")
    assert t1.tensor_peak_flops["bf16"] == pytest.approx(128 * 128 * 2 * 2.8e9)  # ~92 TFLOPS [A2]
    assert t1.tensor_peak_flops["fp32"] == pytest.approx(t1.tensor_peak_flops["bf16"] / 4)
    t2 = get_target("trn2")
    assert t2.tensor_peak_flops["fp8"] == pytest.approx(
        2 * t2.tensor_peak_flops["bf16"]
    )  # 158 vs 79 [A3]
    info = t2.target_info()
    assert info.name == "trn2" and info.dma_queues == 16
    assert info.engine_clock_hz["tensor"] == 2.4e9
    assert info.hbm_bytes_per_s == pytest.approx(2.9e12 / 8)


@pytest.mark.parametrize(
    "alias,name",
    [
        ("trn1", "trn1"),
        ("inf2", "trn1"),
        ("gen2", "trn1"),
        ("trn2", "trn2"),
        ("gen3", "trn2"),
        ("trn3", "trn3"),
        ("GEN4", "trn3"),
    ],
)
def test_aliases(alias, name):
    assert get_target(alias).name == name


def test_unknown_target_lists_the_valid_ones():
    with pytest.raises(UnknownTargetError) as e:
        get_target("trn9")
    msg = str(e.value)
    assert "trn9" in msg and "trn1" in msg and "trn2" in msg and "trn3" in msg and "inf2" in msg
    assert isinstance(e.value, ValueError)


def test_default_is_trn2():
    assert default_target_name() == "trn2"
    assert get_target(None).name == "trn2"


@pytest.mark.parametrize(
    "value,name",
    [
        ("trn1", "trn1"),
        ("inf2", "trn1"),
        ("gen2", "trn1"),
        ("gen3", "trn2"),
        ("trn3", "trn3"),
        ("gen4", "trn3"),
    ],
)
def test_env_override_selects_the_default(monkeypatch, value, name):
    monkeypatch.setenv(ENV_VAR, value)
    assert get_target(None).name == name
    assert get_target("trn2").name == "trn2"  # an explicit target wins


def test_bad_env_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "tpu")
    with pytest.raises(UnknownTargetError, match=f"{ENV_VAR}='tpu'.*trn1"):
        get_target(None)


def test_overrides_make_a_copy():
    t = get_target("trn1")
    small = t.with_overrides(sbuf_bytes=1024)
    assert small.sbuf_bytes == 1024 and t.sbuf_bytes == 192 * 1024
    assert t.cycles_ns("tensor", 2.8e3) == pytest.approx(1000.0)


@nki.jit
def wide_matmul(a, b):
    """One nc_matmul with 1024 moving columns: over the NC-v2/v3 limit, legal on NC-v4."""
    out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b))
    nl.store(out, value=acc)
    return out


def test_the_verifier_reads_its_limits_from_the_same_table():
    a = np.ones((128, 128), np.float32)
    b = np.ones((128, 1024), np.float32)
    kernel, _ = wide_matmul.specialize_for("trn3", a, b)  # traced, verified for trn3 only
    assert get_target("trn2").gemm_moving_fmax == 512
    assert get_target("trn3").gemm_moving_fmax == 4096
    verify(kernel, "trn3")
    with pytest.raises(NkiError) as info:
        verify(kernel, "trn2")
    assert "512" in str(info.value)
    slim = get_target("trn3").with_overrides(gemm_moving_fmax=512)
    with pytest.raises(NkiError):
        verify(kernel, slim)


def test_the_verifier_default_follows_the_environment_override(monkeypatch):
    a, b = np.ones((128, 128), np.float32), np.ones((128, 1024), np.float32)
    kernel, _ = wide_matmul.specialize_for("trn3", a, b)
    monkeypatch.setenv(ENV_VAR, "trn3")
    verify(kernel)
    monkeypatch.setenv(ENV_VAR, "trn1")
    with pytest.raises(NkiError):
        verify(kernel)
