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


def test_the_kernel_caches_give_their_memory_back_before_the_guard_says_no(monkeypatch):
    import nkikit.ir.cache as cache

    rooms = iter([(0, 0, "ulimit -v"), (1 << 40, 0, "ulimit -v")])  # short, then room
    given = []
    monkeypatch.setattr(memory, "room", lambda: next(rooms))
    monkeypatch.setattr(cache, "give_back", lambda keep=None: given.append(keep))
    memory.reserve(1 << 30, "a test's HBM tensors", None)  # no error: the caches made room
    assert given == [None]


def test_short_of_memory_under_a_quarter_of_the_limit_left(monkeypatch):
    from nkikit import memory as process

    _, used, _ = memory.room()
    monkeypatch.setenv("NKIKIT_MEMORY_LIMIT_MB", str(used // 2**20 + 16))  # 16 MiB left
    assert process.short_of_memory()
    # 1 GiB held, 3 GiB of the machine available, no other limit: exactly a quarter left
    monkeypatch.delenv("NKIKIT_MEMORY_LIMIT_MB")
    monkeypatch.setattr(process, "_status_kb", lambda field: 2**20)
    monkeypatch.setattr(process, "_available_bytes", lambda: 3 * 2**30)
    inf = process.resource.RLIM_INFINITY
    monkeypatch.setattr(process.resource, "getrlimit", lambda what: (inf, inf))
    assert not process.short_of_memory()
    monkeypatch.setattr(process, "_available_bytes", lambda: 2**30 // 4)
    assert process.short_of_memory()
