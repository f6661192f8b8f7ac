"""The IR text of NKI 0.x registers, device loops and collectives is stable: golden files under
tests/nki0x/golden/ (regenerate after an intended change with ``NKIKIT_UPDATE_GOLDEN=1``)."""

import os
from pathlib import Path

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.collectives as ncc
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

GOLDEN = Path(__file__).parent / "golden"


@nki.jit
def rank_loop(x, n):
    """A register-bound device loop over the first n rows, then an all-reduce of the sum."""
    w = x.shape[1]
    acc = nl.ndarray((1, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, 0.0)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    row = nl.ndarray((1, w), dtype=x.dtype, buffer=nl.sbuf)
    for i in nl.dynamic_range(0, nisa.register_alloc(s)):
        nisa.dma_copy(dst=row, src=x.ap([[w, 1], [1, w]], 0, scalar_offset=i, indirect_dim=0))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
    total = nl.ndarray((1, w), dtype=nl.float32, buffer=nl.sbuf)
    ncc.all_reduce(srcs=[acc], dsts=[total], replica_group=ncc.ReplicaGroup([[0, 1]]), op=nl.add)
    out = nl.ndarray((1, w), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=total)
    return out


@nki.jit
def countdown(n):
    """``while reg:`` and ``nl.while_loop`` around register loads."""
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n)
    reg = nisa.register_alloc(c)
    while reg:
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=1)
        nisa.register_load(reg, c)

    def body(r):
        nisa.register_load(r, c)
        return r

    nl.while_loop(reg, body)
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.register_store(out, ncc.rank_id())
    return out


@nki.jit
def unrolled_steps(a, w):
    """An unrolled load -> matmul -> evict -> store loop (the shape of benchmarks/nki0x) with
    the view forms the trace's fast paths take and leave: slices, an int index, a stepped
    slice, views of other free shapes, PSUM accumulation by the first-write rule, an engine
    choice, and a DMA between differently shaped views."""
    p, f = w.shape[0], a.shape[1]
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    ws = nl.ndarray((p, p), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ws, src=w)
    acc = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.psum)
    for i in range(3):
        rows = slice(i * p, (i + 1) * p)
        t = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[rows, :])
        nisa.nc_matmul(dst=acc, stationary=ws, moving=t)  # overwrites, then accumulates
        res = nl.ndarray((p, 2, f // 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc, engine=nisa.scalar_engine)
        nisa.dma_copy(dst=out[rows, :], src=res)
    half = nl.ndarray((p, f // 2), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=half, src=a[0:p, 0:f:2])
    row = nl.ndarray((1, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=a[p])
    return out


CASES = {
    "unrolled_steps": lambda: unrolled_steps.ir(
        np.zeros((384, 64), np.float32), np.zeros((128, 128), np.float32)
    ),
    "rank_loop": lambda: rank_loop.ir(np.zeros((8, 4), np.float32), np.zeros((1, 1), np.int32)),
    "countdown": lambda: countdown.ir(np.zeros((1, 1), np.int32)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ir_text_matches_golden(name):
    text = str(CASES[name]())
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("NKIKIT_UPDATE_GOLDEN") or not path.exists():
        path.write_text(text)
    assert text == path.read_text()
