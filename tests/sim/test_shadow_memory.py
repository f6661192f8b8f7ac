"""The fast path's fp32 shadows of narrow tiles (``plan_shadows``) live as long as their
tiles: they share an arena laid out as the tiles' own, so an unrolled kernel that widens a
fresh bf16 tile per block holds one block's shadow at a time, not one per block."""

import re

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.sim import check_simulate
from nkikit.sim.fast import compile_kernel

P, N, BLOCKS, USES = 128, 512, 12, 4


@nki.jit
def reuse_per_block(x, w):
    out = nl.ndarray((BLOCKS * P, N), dtype=nl.float32, buffer=nl.shared_hbm)
    xs = nl.ndarray((P, P), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    for b in range(BLOCKS):
        # a fresh bf16 weight tile per block (computed, so not a view of HBM), read by
        # several matmuls: shadowed
        wf = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=wf, src=w[b * P : (b + 1) * P, :])
        ws = nl.ndarray((P, N), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=ws, data=wf, op0=nl.multiply, operand0=0.5)
        acc = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.psum)
        for _ in range(USES):
            nisa.nc_matmul(dst=acc, stationary=xs, moving=ws)
        res = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[b * P : (b + 1) * P, :], src=res)
    return out


@pytest.fixture
def args():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((P, P)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((BLOCKS * P, N)).astype(np.float32)
    return x, w


def test_shadows_share_memory_across_blocks(args):
    ir = reuse_per_block.ir(*args)
    source = compile_kernel(ir).source
    m = re.search(r"sarena = np\.empty\((\d+), np\.uint8\)", source)
    assert m is not None, "the per-block weight tiles are expected to be shadowed"
    # every block's shadow would be BLOCKS * P * N * 4 bytes; the shared arena holds a few
    assert int(m.group(1)) < BLOCKS * P * N * 4 // 3


def test_shadowed_kernel_is_bit_identical_to_the_reference(args):
    ir = reuse_per_block.ir(*args)
    (got,) = check_simulate(ir, list(args))  # raises SimulatorMismatch on any difference
    x = args[0].astype(np.float32)
    ws = (0.5 * args[1]).astype(ml_dtypes.bfloat16).astype(np.float32)  # rounded on write
    want = np.concatenate([USES * (x.T @ ws[b * P : (b + 1) * P]) for b in range(BLOCKS)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
