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


# -- one table: what a kernel reads while traced is the target it specializes for ------------------

_GENERATIONS = [
    # override, canonical, nc_version, SBUF bytes/partition, moving fmax, PSUM tile fmax
    ("trn1", "trn1", nisa.nc_version.gen2, 192 * 1024, 512, 512),
    ("inf2", "trn1", nisa.nc_version.gen2, 192 * 1024, 512, 512),
    ("gen2", "trn1", nisa.nc_version.gen2, 192 * 1024, 512, 512),
    ("trn2", "trn2", nisa.nc_version.gen3, 224 * 1024, 512, 512),
    ("gen3", "trn2", nisa.nc_version.gen3, 224 * 1024, 512, 512),
    ("trn3", "trn3", nisa.nc_version.gen4, 256 * 1024, 4096, 4096),
    ("gen4", "trn3", nisa.nc_version.gen4, 256 * 1024, 4096, 4096),
]


def _probe():
    """A kernel that records what nl.tile_size and nisa.get_nc_version() say while traced."""
    seen: dict = {}

    @nki.jit
    def probe(x):
        seen["nc_version"] = nisa.get_nc_version()
        ts = nl.tile_size
        seen.update(
            pmax=ts.pmax,
            sbuf=ts.total_available_sbuf_size,
            moving=ts.gemm_moving_fmax,
            psum=ts.psum_fmax,
            bank=ts.psum_bank_fmax,
            banks=ts.psum_num_banks,
        )
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out

    return probe, seen


@pytest.mark.parametrize("override,name,version,sbuf,moving,psum", _GENERATIONS)
def test_tile_size_and_nc_version_follow_the_override_while_tracing(
    monkeypatch, override, name, version, sbuf, moving, psum
):
    monkeypatch.setenv(ENV_VAR, override)
    probe, seen = _probe()
    probe(np.ones((4, 4), np.float32))
    assert seen == {
        "nc_version": version,
        "pmax": 128,
        "sbuf": sbuf,
        "moving": moving,
        "psum": psum,
        "bank": 512,
        "banks": 8,
    }
    # outside a kernel they answer for the same target
    assert nisa.get_nc_version() is version
    assert nl.tile_size.total_available_sbuf_size == get_target(name).sbuf_bytes == sbuf
    assert repr(nl.tile_size) == f"nl.tile_size({name})"


def test_the_default_target_is_trn2_while_tracing(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    probe, seen = _probe()
    probe(np.ones((4, 4), np.float32))
    assert seen["nc_version"] is nisa.nc_version.gen3 and seen["sbuf"] == 224 * 1024


def test_a_kernel_is_traced_again_for_another_target(monkeypatch):
    probe, seen = _probe()
    x = np.ones((4, 4), np.float32)
    monkeypatch.setenv(ENV_VAR, "trn1")
    k1 = probe.ir(x)
    assert seen["sbuf"] == 192 * 1024
    monkeypatch.setenv(ENV_VAR, "trn3")
    k3 = probe.ir(x)
    assert seen["sbuf"] == 256 * 1024 and k3 is not k1
    monkeypatch.setenv(ENV_VAR, "trn1")
    assert probe.ir(x) is k1  # each target's trace is cached
    assert probe.specialize_for("gen4", x)[0] is k3  # an alias names the same specialization


def test_an_explicit_target_is_traced_for_whatever_the_environment_says(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "trn2")
    probe, seen = _probe()
    # nki.compile / nki.profile_kernel(..., target=) specialize this way
    probe.specialize_for("trn1", np.ones((4, 4), np.float32))
    assert seen["nc_version"] is nisa.nc_version.gen2 and seen["sbuf"] == 192 * 1024


def test_target_scope_nests_and_restores(monkeypatch):
    from nkikit.targets import default_target, target_scope

    monkeypatch.setenv(ENV_VAR, "trn2")
    with target_scope("trn1") as t1:
        assert default_target() is t1 and nl.tile_size.total_available_sbuf_size == 192 * 1024
        with target_scope("gen4"):
            assert nisa.get_nc_version() is nisa.nc_version.gen4
        assert default_target().name == "trn1"
    assert default_target().name == "trn2"
