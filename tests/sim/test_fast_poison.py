"""Fresh tiles the fast path fills with poison: bf16 and fp8 storage through an unsigned
view with the poison's bit pattern, a tile's fp32 shadow with the poison widened -- the same
bits the reference's fresh buffers and widening copies hold."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.sim import fast, interp, same_bits


@nki.jit
def half_written_read_often(x):
    """A tile of x's dtype with only its first 32 columns written, then read whole four
    times (so the fast path keeps an fp32 shadow of it): the other columns read as poison."""
    t = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
    out = nl.ndarray((4 * 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(4):
        r = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.exp, data=t, scale=float(i + 1))
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=r)
    return out


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float16])
def test_poison_and_its_shadow_hold_the_references_bits(dtype):
    x = np.linspace(-1, 1, 128 * 64).reshape(128, 64).astype(dtype)
    k = half_written_read_often
    ir = k._trace(k.bind((x,), {}), "trn2")
    prog = fast.compile_kernel(ir)
    got = prog.run([x])
    ref = interp.simulate(ir, [x])
    assert all(same_bits(a, b) for a, b in zip(got, ref))
    assert np.isnan(got[0][:, 32:]).all() and not np.isnan(got[0][:, :32]).any()
    if np.dtype(dtype) != np.float16:  # ml_dtypes storage: filled by bit pattern
        assert ".view(" in prog.source and ").fill(" in prog.source
