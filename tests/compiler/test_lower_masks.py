"""Masked ops count only the elements their mask keeps: bytes (and so MBU and DMA time) of a
masked ragged tile equal those of the same tile peeled to its real size."""

from __future__ import annotations

import pytest

import nkikit as nki
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.compiler import compile
from nkikit.compiler.lower import mask_fraction

F32 = nl.float32


@nki.jit
def copy_rows_masked(x):
    """Rows in tiles of 128; the last tile masked to the rows that exist."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    for t in nl.affine_range((n + 127) // 128):
        rows = t * 128 + i_p
        tile = nl.load(x[rows, i_f], mask=rows < n)
        nl.store(out[rows, i_f], value=tile, mask=rows < n)
    return out


@nki.jit
def copy_rows_peeled(x):
    """The same copy with the ragged last tile peeled to its real size."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(d)[None, :]

    def piece(r0, k):
        i_k = nl.arange(k)[:, None]
        nl.store(out[r0 + i_k, i_f], value=nl.load(x[r0 + i_k, i_f]))

    for t in nl.affine_range(n // 128):
        piece(t * 128, 128)
    if n % 128:
        piece(n // 128 * 128, n % 128)
    return out


@nki.jit
def first_columns(x, keep):
    """A free-axis mask: only the first ``keep`` columns of each row move."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    nl.store(out[i_p, i_f], value=nl.load(x[i_p, i_f], mask=i_f < keep), mask=i_f < keep)
    return out


def test_a_masked_ragged_tile_moves_only_the_rows_that_exist():
    spec = nt.tensor[[300, 512], F32]
    masked = compile(copy_rows_masked, spec, target="trn2").profile().summary
    peeled = compile(copy_rows_peeled, spec, target="trn2").profile().summary
    assert masked["hbm_read_bytes"] == masked["hbm_write_bytes"] == 300 * 512 * 4
    assert peeled["hbm_read_bytes"] == 300 * 512 * 4
    # and moving fewer bytes takes less DMA time than three whole tiles
    whole = compile(copy_rows_masked, nt.tensor[[384, 512], F32], target="trn2").profile().summary
    assert masked["total_us"] < whole["total_us"]


def test_an_unmasked_multiple_of_128_is_unchanged():
    s = compile(copy_rows_masked, nt.tensor[[256, 512], F32], target="trn2").profile().summary
    assert s["hbm_read_bytes"] == 256 * 512 * 4


def test_a_free_axis_mask_counts_the_kept_columns():
    s = compile(first_columns, nt.tensor[[128, 512], F32], 100, target="trn2").profile().summary
    assert s["hbm_read_bytes"] == s["hbm_write_bytes"] == 128 * 100 * 4


def test_mask_fraction_averages_over_the_loop():
    kernel = copy_rows_masked.ir(nt.tensor[[300, 512], F32])
    loop = next(s for s in kernel.body if hasattr(s, "body"))
    load = next(op for op in loop.body if getattr(op, "prim", "") == "dma_copy")
    assert mask_fraction(load) == pytest.approx(300 / 384)
