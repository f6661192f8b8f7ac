"""A PSUM tensor whose blocks in use at once exceed PSUM is kept where it fits: the compiler
stages each instruction's region through PSUM/SBUF tiles and a private HBM tensor (spills
and refills), so the kernel runs, matches its reference on both simulators and profiles.
Tensors that fit stay in PSUM; one accumulated into is still rejected."""

from __future__ import annotations

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


def test_oversized_psum_tensor_is_spilled_and_matches():
    blocks = 12  # 12 blocks of 2 KiB per partition: more than 8 banks
    kernel = _scores(blocks)
    q, k = _inputs(blocks)
    got = kernel(q, k)
    np.testing.assert_allclose(got, 0.5 * (q.T @ k), rtol=1e-4, atol=1e-4)
    assert _buffer_of(kernel, (q, k), "s") == "private_hbm"
    ir = kernel.ir(q, k)
    prims = [op.prim for op, _ in ir.ops()]
    # matmul -> PSUM tile -> SBUF tile -> HBM, and a refill before the reading instruction
    assert prims.count("tensor_copy") == 1 and prims.count("nc_matmul") == 1
    assert nki.profile_kernel(kernel, q, k, target="trn2").total_us > 0


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
