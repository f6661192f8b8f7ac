"""The IR text form is stable: golden files under tests/ir/golden/.

Regenerate after an intended change with ``NKIKIT_UPDATE_GOLDEN=1 pytest tests/ir/test_printer.py``.
"""

import os
from pathlib import Path

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt

GOLDEN = Path(__file__).parent / "golden"


@nki.jit
def rmsnorm_rows(a, g):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(a.shape[1])[None, :]
    g_tile = nl.load(g.reshape((1, g.shape[0]))[nl.arange(1)[:, None], jf])
    g_b = g_tile.broadcast_to((128, g.shape[0]))
    for i in nl.affine_range((a.shape[0] + 127) // 128):
        t = nl.load(a[i * 128 + ip, jf], mask=(i * 128 + ip < a.shape[0]))
        ss = nl.sum(nl.square(t), axis=[1])
        r = nl.rsqrt(ss / a.shape[1])
        y = nl.multiply(nl.multiply(t, r), g_b)
        nl.store(out[i * 128 + ip, jf], value=y, mask=(i * 128 + ip < a.shape[0]))
    return out


@nki.jit
def tiled_matmul(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(K // 128):
                a = nl.load(lhsT[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
                b = nl.load(rhs[k * 128 : (k + 1) * 128, n * 512 : (n + 1) * 512])
                acc += nisa.nc_matmul(a, b)
            nl.store(
                out[m * 128 : (m + 1) * 128, n * 512 : (n + 1) * 512],
                value=nl.copy(acc, dtype=out.dtype),
            )
    return out


@nki.jit
def gather_scatter(data, idx):
    n, v = data.shape
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(v)[None, :]
    it = nl.load(idx[i_p])
    rows = nl.load(data[it[i_p, 0], i_f], mask=(i_p < 60))
    nl.store(out[it, i_f], value=rows)
    nl.atomic_rmw(out[it, i_f], value=rows, op=np.add)
    return out


CASES = {
    "rmsnorm_rows": lambda: rmsnorm_rows.ir(
        nt.tensor[[300, 256], nl.float32], nt.tensor[[256], nl.float32]
    ),
    "tiled_matmul": lambda: tiled_matmul.ir(
        nt.tensor[[256, 256], nl.bfloat16], nt.tensor[[256, 1024], nl.bfloat16]
    ),
    "gather_scatter": lambda: gather_scatter.ir(
        nt.tensor[[128, 32], nl.float32], nt.tensor[[64], nl.int32]
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ir_text_matches_golden(name):
    text = str(CASES[name]())
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("NKIKIT_UPDATE_GOLDEN") or not path.exists():
        path.write_text(text)
    assert text == path.read_text()


def test_printing_is_deterministic_across_traces():
    a = np.zeros((300, 256), np.float32)
    g = np.zeros((256,), np.float32)
    rmsnorm_rows._cache.clear()
    first = str(rmsnorm_rows.ir(a, g))
    rmsnorm_rows._cache.clear()
    assert str(rmsnorm_rows.ir(a, g)) == first
