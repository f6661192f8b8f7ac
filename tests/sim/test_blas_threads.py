"""Both simulators run with one BLAS thread (``nkikit/sim/blas.py``), set for the run and
restored after it, also when ranks (threads) and nested runs overlap."""

import threading

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.sim import blas


def _blas_threads() -> list[int]:
    return [lib.get_num_threads() for lib in blas._blas()]


@pytest.fixture
def two_blas_threads():
    """numpy's BLAS at two threads for the test, whatever the machine has."""
    ctl = ThreadpoolController()
    with ctl.limit(limits=2, user_api="blas"):
        if not _blas_threads() or set(_blas_threads()) != {2}:
            pytest.skip("numpy's BLAS here cannot be set to two threads")
        yield


@nki.jit
def matmul_kernel(a, b):
    out = nl.ndarray((64, 96), dtype=nl.float32, buffer=nl.shared_hbm)
    at = nl.load(a)
    bt = nl.load(b)
    ps = nisa.nc_matmul(at, bt)
    nl.store(out, value=nl.copy(ps))
    return out


@pytest.mark.parametrize("sim", ["fast", "reference"])
def test_a_run_has_one_blas_thread_and_restores_it(monkeypatch, two_blas_threads, sim):
    monkeypatch.setenv("NKIKIT_SIM", sim)
    seen: list[list[int]] = []
    orig = np.matmul

    def spy(*args, **kwargs):
        seen.append(_blas_threads())
        return orig(*args, **kwargs)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 96)).astype(np.float32)
    monkeypatch.setattr(np, "matmul", spy)
    out = matmul_kernel(a, b)
    monkeypatch.setattr(np, "matmul", orig)
    assert seen and all(set(s) == {1} for s in seen)  # every tile matmul ran on one thread
    assert set(_blas_threads()) == {2}  # restored
    with blas.one_blas_thread():
        want = np.matmul(a.T, b, dtype=np.float32)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_overlapping_entries_restore_once_the_last_exits(two_blas_threads):
    """A rank's thread enters while the caller's thread holds the setting, and exits first."""
    inside = threading.Event()
    release = threading.Event()
    during: list[list[int]] = []

    def other_rank():
        with blas.one_blas_thread():
            inside.set()
            release.wait(10)
            during.append(_blas_threads())

    with blas.one_blas_thread():
        t = threading.Thread(target=other_rank)
        t.start()
        assert inside.wait(10)
        release.set()
        t.join(10)
        assert set(_blas_threads()) == {1}  # the rank's exit did not restore it
    assert during and set(during[0]) == {1}
    assert set(_blas_threads()) == {2}
