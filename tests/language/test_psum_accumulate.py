"""Beta-1 ``psum[...] += matmul`` starts an accumulation group: the first matmul write to a PSUM
region no instruction wrote since its allocation overwrites, later ones add (the hardware's rule,
NKI 0.x's ``accumulate=None``).  A fresh ``nl.ndarray`` in PSUM accumulated into gives the
product; ``nl.zeros`` + ``+=`` adds to the zeros as before.  Every kernel here runs on both
simulators, which must agree bit for bit (``NKIKIT_SIM=check``)."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.ir.core import Loop

rng = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def both_simulators(monkeypatch):
    monkeypatch.setenv("NKIKIT_SIM", "check")


def _k_sum(acc, a, b, out):
    """acc += a[k].T @ b[k] over 4 row blocks in an affine_range, then store acc."""
    for k in nl.affine_range(4):
        acc += nisa.nc_matmul(
            nl.load(a[k * 128 : (k + 1) * 128, :]), nl.load(b[k * 128 : (k + 1) * 128, :])
        )
    nl.store(out, value=nl.copy(acc))
    return out


@nki.jit
def fresh_psum(a, b):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    return _k_sum(acc, a, b, out)


@nki.jit
def zeroed_psum(a, b):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    return _k_sum(acc, a, b, out)


def _matmuls(kernel, *args):
    return [op for op, _ in kernel.ir(*args).ops() if op.prim == "nc_matmul"]


def _inputs():
    return (
        rng.standard_normal((512, 128)).astype(np.float32),
        rng.standard_normal((512, 512)).astype(np.float32),
    )


def test_fresh_psum_accumulates_the_product():
    a, b = _inputs()
    got = fresh_psum(a, b)
    np.testing.assert_allclose(got, a.T @ b, rtol=1e-4, atol=1e-3)
    # the reduction loop is traced once per iteration: the first matmul overwrites
    assert [op.attrs["accumulate"] for op in _matmuls(fresh_psum, a, b)] == [
        False,
        True,
        True,
        True,
    ]


def test_zeros_then_accumulate_is_unchanged_and_equals_the_fresh_result():
    a, b = _inputs()
    mms = _matmuls(zeroed_psum, a, b)
    assert len(mms) == 1 and mms[0].attrs["accumulate"] is True  # one rolled matmul, adding
    np.testing.assert_array_equal(zeroed_psum(a, b), fresh_psum(a, b))


@nki.jit
def block_per_iteration(a, b):
    """Each iteration accumulates into its own block, twice: no loop needs splitting."""
    out = nl.ndarray((4, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((4, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(4):
        x = nl.load(a[k * 128 : (k + 1) * 128, :])
        y = nl.load(b[k * 128 : (k + 1) * 128, :])
        acc[k] += nisa.nc_matmul(x, y)
        acc[k] += nl.matmul(x, y, transpose_x=True)
        nl.store(out[k], value=nl.copy(acc[k]))
    return out


def test_a_region_moved_by_the_loop_stays_rolled():
    a, b = _inputs()
    want = np.stack(
        [2 * a[k * 128 : (k + 1) * 128].T @ b[k * 128 : (k + 1) * 128] for k in range(4)]
    )
    np.testing.assert_allclose(block_per_iteration(a, b), want, rtol=1e-4, atol=1e-3)
    ir = block_per_iteration.ir(a, b)
    loops = [s for s in ir.body if isinstance(s, Loop)]
    assert len(loops) == 1 and loops[0].var.trip == 4
    assert [op.attrs["accumulate"] for op in _matmuls(block_per_iteration, a, b)] == [False, True]


@nki.jit
def prologue_then_loop(a, b):
    """Block 0 accumulated before a loop that accumulates into blocks 1..3: the loop's blocks
    never meet block 0 (over every iteration), so they start fresh too."""
    out = nl.ndarray((4, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((4, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    x = nl.load(a[0:128, :])
    y = nl.load(b[0:128, :])
    acc[0] += nisa.nc_matmul(x, y)
    acc[0] += nisa.nc_matmul(x, y)
    nl.store(out[0], value=nl.copy(acc[0]))
    for j in nl.affine_range(3):
        acc[j + 1] += nisa.nc_matmul(x, y)
        nl.store(out[j + 1], value=nl.copy(acc[j + 1]))
    return out


def test_blocks_apart_over_all_iterations_start_fresh():
    a, b = _inputs()
    p = a[0:128].T @ b[0:128]
    got = prologue_then_loop(a, b)
    np.testing.assert_allclose(got, np.stack([2 * p, p, p, p]), rtol=1e-4, atol=1e-3)
    assert [op.attrs["accumulate"] for op in _matmuls(prologue_then_loop, a, b)] == [
        False,
        True,
        False,
    ]
