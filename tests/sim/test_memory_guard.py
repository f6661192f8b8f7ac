"""The simulator's memory guard: a kernel whose HBM tensors do not fit in the memory the
process may still take is a named error at the kernel's line, before anything is allocated."""

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
from nkikit.errors import ErrSimulationOutOfMemory
from nkikit.sim import memory


@nki.jit
def big_output(x):
    out = nl.ndarray((4096, 8192), dtype=nl.float32, buffer=nl.shared_hbm)  # 128 MiB
    nl.store(out[0:128, 0:512], value=nl.load(x))
    return out


@pytest.mark.parametrize("sim", ["fast", "reference"])
def test_hbm_beyond_the_limit_is_a_named_error_at_the_kernel(monkeypatch, sim):
    monkeypatch.setenv("NKIKIT_SIM", sim)
    _, used, _ = memory.room()
    monkeypatch.setenv("NKIKIT_MEMORY_LIMIT_MB", str(used // 2**20 + 32))
    x = np.ones((128, 512), np.float32)
    with pytest.raises(ErrSimulationOutOfMemory) as e:
        big_output(x)
    assert e.value.name == "err_simulation_out_of_memory"
    assert e.value.loc.line == big_output.func.__code__.co_firstlineno
    assert e.value.fields["need_mb"] == 128
    assert e.value.fields["limit"] == "NKIKIT_MEMORY_LIMIT_MB"


def test_hbm_within_the_limit_runs(monkeypatch):
    _, used, _ = memory.room()
    monkeypatch.setenv("NKIKIT_MEMORY_LIMIT_MB", str(used // 2**20 + 1024))
    x = np.ones((128, 512), np.float32)
    out = big_output(x)
    assert out.shape == (4096, 8192) and np.array_equal(out[0:128, 0:512], x)


def test_room_is_the_tightest_limit(monkeypatch):
    _, used, _ = memory.room()
    monkeypatch.setenv("NKIKIT_MEMORY_LIMIT_MB", str(used // 2**20 + 100))
    left, _, which = memory.room()
    assert which == "NKIKIT_MEMORY_LIMIT_MB"
    assert 90 * 2**20 <= left <= 110 * 2**20
