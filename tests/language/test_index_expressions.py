"""Index expressions are complete wherever the Beta-1 language takes one: ``nisa.iota``,
``nisa.affine_select`` predicates, ``mask=`` and access indices accept sums and scalar multiples
of aranges, loop variables of every enclosing loop, program ids and constants."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

BLOCKS = 4


@nki.jit
def every_form(a):
    grid = nl.num_programs(0)
    out = nl.ndarray((grid * a.shape[0], a.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    pid = nl.program_id(0)
    for i in nl.affine_range(2):
        for j in nl.affine_range(2):
            ip, jf = nl.mgrid[0:128, 0:64]
            io = nisa.iota(3 * i + 2 * j + pid * 5 + ip + jf * 2 + 7, dtype=nl.float32)
            sel = nisa.affine_select((i * 128 + ip) - (jf + j * 3 + pid) > 0, io, 0.0)
            t = nl.load(a[(2 * i + j) * 128 + ip, jf], mask=(i * 2 + j + pid < BLOCKS))
            r = nl.add(t, sel, mask=(jf + j * 64 < 100 + pid))
            row = pid * BLOCKS * 128 + (2 * i + j) * 128 + ip
            nl.store(out[row, jf], value=r, mask=(i * 2 + j + pid < BLOCKS))
    return out


def expected(a: np.ndarray, pid: int) -> np.ndarray:
    """NaN where the kernel writes nothing (masked off: the output keeps its poison)."""
    p, f = np.meshgrid(np.arange(128), np.arange(64), indexing="ij")
    want = np.full(a.shape, np.nan, np.float32)
    for i in range(2):
        for j in range(2):
            if i * 2 + j + pid >= BLOCKS:
                continue
            io = 3 * i + 2 * j + 5 * pid + p + 2 * f + 7
            sel = np.where((i * 128 + p) - (f + 3 * j + pid) > 0, io, 0.0)
            blk = a[(2 * i + j) * 128 : (2 * i + j + 1) * 128]
            want[(2 * i + j) * 128 : (2 * i + j + 1) * 128] = np.where(
                f + 64 * j < 100 + pid, blk + sel, np.nan
            )
    return want


@pytest.mark.parametrize("grid", [1, 2])
def test_loop_variables_program_ids_and_constants_in_every_index(grid):
    a = np.random.default_rng(0).random((BLOCKS * 128, 64)).astype(np.float32)
    got = every_form[grid](a)
    want = np.concatenate([expected(a, pid) for pid in range(grid)])
    written = ~np.isnan(want)
    np.testing.assert_allclose(got[written], want[written], rtol=1e-6)
    assert nki.profile_kernel(every_form[grid], a, target="trn2").total_us > 0
