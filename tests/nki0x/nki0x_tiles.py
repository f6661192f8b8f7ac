"""The moves NKI 0.x test kernels start and end with: a kernel argument into an SBUF tile, a
tile out to a new ``shared_hbm`` output, a PSUM tile evacuated to SBUF in fp32."""

import nkikit.nki.isa as nisa
import nkikit.nki.language as nl


def load(x, dtype=None):
    """``x`` (an HBM tensor or view) copied into a new SBUF tile (converted to ``dtype``)."""
    t = nl.ndarray(x.shape, dtype=dtype or x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def store(t):
    """``t`` copied into a new ``shared_hbm`` output of its shape and dtype."""
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def evacuate(acc):
    """A PSUM tile copied to a new fp32 SBUF tile."""
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    return out
