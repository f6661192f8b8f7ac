"""PSUM tensors that do not fit PSUM together are kept where they fit, as the compiler places
automatically allocated tensors: language-level results and ``nl.ndarray(buffer=nl.psum)``
move to SBUF (TensorE results copied out of a PSUM tile), a tensor too big for that to a
private HBM tensor (stores and refills), so the kernel runs, matches its reference on both
simulators and profiles.  Kernels that fit stay as written; a tensor accumulated into is
still rejected."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import NkiError

P, N = 128, 512
rng = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def both_simulators(monkeypatch):
    monkeypatch.setenv("NKIKIT_SIM", "check")


def _scores(blocks: int, accumulate_again: bool = False):
    """Write ``blocks`` bank-sized PSUM blocks in one loop nest, read them in the next:
    every block is live between the nests."""

    @nki.jit
    def scores(q, k):
        out = nl.ndarray((blocks * P, N), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((blocks, nl.par_dim(P), N), dtype=nl.float32, buffer=nl.psum)
        kt = nl.load(k)
        for i in nl.affine_range(blocks):
            s[i] = nisa.nc_matmul(nl.load(q[:, nl.ds(i * P, P)]), kt)
        if accumulate_again:
            for i in nl.affine_range(blocks):
                s[i] += nisa.nc_matmul(nl.load(q[:, nl.ds(i * P, P)]), kt)
        for i in nl.affine_range(blocks):
            row = nisa.tensor_scalar(data=s[i], op0=nl.multiply, operand0=0.5)
            nl.store(out[nl.ds(i * P, P), :], value=row)
        return out

    return scores


def _inputs(blocks: int):
    q = rng.standard_normal((P, blocks * P)).astype(np.float32)
    k = rng.standard_normal((P, N)).astype(np.float32)
    return q, k


def _buffer_of(kernel, args, name: str) -> str:
    (t,) = [t for t in kernel.ir(*args).tensors if t.name == name]
    return t.buffer


@pytest.mark.parametrize("blocks,memory", [(12, "sbuf"), (40, "private_hbm")])
def test_oversized_psum_tensor_moves_and_matches(blocks, memory):
    """12 blocks of 2 KiB per partition exceed 8 banks but fit SBUF easily; 40 (80 KiB)
    take more than a quarter of an SBUF partition and go to HBM."""
    kernel = _scores(blocks)
    q, k = _inputs(blocks)
    got = kernel(q, k)
    np.testing.assert_allclose(got, 0.5 * (q.T @ k), rtol=1e-4, atol=1e-4)
    assert _buffer_of(kernel, (q, k), "s") == memory
    prims = [op.prim for op, _ in kernel.ir(q, k).ops()]
    # matmul -> PSUM tile -> copy out (then, for HBM, a store and a refill before the reader)
    assert prims.count("tensor_copy") == 1 and prims.count("nc_matmul") == 1
    assert nki.profile_kernel(kernel, q, k, target="trn2").total_us > 0


@nki.jit
def many_results(a, b):
    """Twelve ``nl.matmul`` results live at once, summed afterwards."""
    out = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.shared_hbm)
    ta = nl.load(a)
    results = []
    for i in range(12):
        results.append(nl.matmul(ta, nl.load(b[:, nl.ds(i * N, N)]), transpose_x=True))
    total = nl.copy(results[0])
    for r in results[1:]:
        total = nl.add(total, r)
    nl.store(out, value=total)
    return out


def test_language_level_results_leave_psum_when_too_many_are_live():
    a = rng.standard_normal((P, P)).astype(np.float32)
    b = rng.standard_normal((P, 12 * N)).astype(np.float32)
    want = sum(a.T @ b[:, i * N : (i + 1) * N] for i in range(12))
    np.testing.assert_allclose(many_results(a, b), want, rtol=1e-4, atol=1e-3)
    ir = many_results.ir(a, b)
    results = [t for t in ir.tensors if re.fullmatch(r"matmul(\.\d+)?", t.name)]
    moved = [t for t in results if t.buffer == "sbuf"]
    assert len(results) == 12 and 0 < len(moved) < 12  # only as many as needed
    assert nki.profile_kernel(many_results, a, b, target="trn2").total_us > 0


def test_psum_tensor_that_fits_stays_in_psum():
    blocks = 4
    kernel = _scores(blocks)
    q, k = _inputs(blocks)
    np.testing.assert_allclose(kernel(q, k), 0.5 * (q.T @ k), rtol=1e-4, atol=1e-4)
    assert _buffer_of(kernel, (q, k), "s") == "psum"


def test_accumulated_oversized_psum_is_still_rejected():
    blocks = 12
    kernel = _scores(blocks, accumulate_again=True)
    with pytest.raises(NkiError) as info:
        kernel.ir(*_inputs(blocks))
    assert info.value.name == "err_psum_total_capacity_exceeded"
