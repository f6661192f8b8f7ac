"""The gather-transpose kernels the ``dma_transpose`` tests share (``test_gather_transpose_*``):
rows of an HBM table picked by a uint32 SBUF index (``.ap(vector_offset=)``), transposed
into SBUF [nki-0x.md §4.3, "Indirect transpose"]."""

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl


@nki.jit
def gather_t(table, idx, n, dge=nisa.dge_mode.unknown, oob=nisa.oob_mode.error):
    """``(w, n)``: column i is row ``idx.T.flatten()[i]`` of the ``(rows, w)`` table; a row a
    skipped out-of-bounds index (``oob=skip``) leaves stays 0."""
    w = table.shape[1]
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    got = nl.ndarray((w, n), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=got, value=0.0)
    rows = table.ap(pattern=[[w, n], [1, w]], vector_offset=ix, indirect_dim=0)
    nisa.dma_transpose(dst=got, src=rows, axes=(1, 0), dge_mode=dge, oob_mode=oob)
    out = nl.ndarray((w, n), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


@nki.jit
def gather_t4(table, idx, n):
    """The 4-D form: ``n`` rows of the ``(rows, d1, d2, d3)`` table picked as in
    :func:`gather_t`, permuted by ``(3, 1, 2, 0)``: the gathered axis lands last."""
    _, d1, d2, d3 = table.shape
    ix = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ix, src=idx)
    got = nl.ndarray((d3, d1, d2, n), dtype=table.dtype, buffer=nl.sbuf)
    rows = table.ap(
        pattern=[[d1 * d2 * d3, n], [d2 * d3, d1], [d3, d2], [1, d3]],
        vector_offset=ix,
        indirect_dim=0,
    )
    nisa.dma_transpose(dst=got, src=rows, axes=(3, 1, 2, 0))
    out = nl.ndarray(got.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out
