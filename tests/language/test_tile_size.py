"""``nl.tile_size`` is the table of the target a kernel is traced for: a kernel tiled by it
emits the tiling that target allows, verifies for it, and computes the same result."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.ir.core import Loop
from nkikit.targets import ENV_VAR, get_target


@nki.jit
def matmul_by_tile_size(a, b):
    """a: [K, M] (K, M <= 128), b: [K, N]: one nc_matmul per gemm_moving_fmax columns of b."""
    k, m = a.shape
    n = b.shape[1]
    step = nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    at = nl.load(a)
    for j in nl.affine_range(n // step):
        cols = j * step + nl.arange(step)[None, :]
        acc = nisa.nc_matmul(at, nl.load(b[nl.arange(k)[:, None], cols]))
        nl.store(out[nl.arange(m)[:, None], cols], value=acc)
    return out


def _trips(kernel) -> list[int]:
    return [s.var.trip for s in kernel.body if isinstance(s, Loop)]


@pytest.mark.parametrize("target,trips", [("trn1", [8]), ("trn2", [8]), ("trn3", [1])])
def test_a_kernel_tiles_by_its_targets_sizes(monkeypatch, target, trips):
    monkeypatch.setenv(ENV_VAR, target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((64, 4096)).astype(np.float32)
    assert nl.tile_size.gemm_moving_fmax == get_target(target).gemm_moving_fmax
    assert _trips(matmul_by_tile_size.ir(a, b)) == trips  # 4096 columns: 8 x 512, or 1 x 4096
    np.testing.assert_allclose(matmul_by_tile_size(a, b), a.T @ b, rtol=1e-4, atol=1e-4)
