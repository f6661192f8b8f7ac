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


CASES = {
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
