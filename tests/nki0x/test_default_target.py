"""With no target named, an NKI 0.x kernel is traced for trn3, as AWS's 0.x simulator on a
machine with no Neuron chip; a Beta-1 kernel for trn2; the environment names one for both."""

import numpy as np
import pytest

import nkikit
import nkikit.isa as nisa1
import nkikit.language as nl1
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

seen: list = []


@nki.jit
def copy_0x(x):
    seen.append(nisa.get_nc_version())
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


@nkikit.jit
def copy_beta1(x):
    seen.append(nisa1.get_nc_version())
    out = nl1.ndarray(x.shape, dtype=x.dtype, buffer=nl1.shared_hbm)
    nl1.store(out, nl1.load(x))
    return out


@pytest.fixture(autouse=True)
def _no_target_named(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    monkeypatch.delenv("NKI_NC_VERSION", raising=False)
    seen.clear()


X = np.ones((4, 8), np.float32)


def test_each_dialect_has_its_own_default_target():
    copy_0x(X)
    copy_beta1(X)
    assert [v.name for v in seen] == ["gen4", "gen3"]
    assert copy_0x.default_target() == "trn3" and copy_beta1.default_target() == "trn2"
    assert nkikit.profile_kernel(copy_0x, X).target.name == "trn3"
    assert nkikit.profile_kernel(copy_beta1, X).target.name == "trn2"


def test_the_environment_names_the_target_of_both(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    copy_0x(X)
    assert seen[-1].name == "gen3"
    assert nkikit.profile_kernel(copy_0x, X).target.name == "trn2"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    copy_beta1(X)
    assert seen[-1].name == "gen2"
