"""``Kernel.census``: the op count, primitives and run-time loops of one walk, equal to what
the statement-by-statement definitions find (caches weigh kernels by it; the simulators
choose their path and world size by it).  A kernel with a run-time loop and collectives:
tests/nki0x/test_collectives.py."""

import numpy as np

import nkikit as nki
import nkikit.language as nl
from nkikit.ir.core import Loop
from nkikit.sim.ranks import world_size


@nki.jit
def exp_rows(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0] // 128):  # a rolled loop: its body once in the IR
        for j in nl.affine_range(a.shape[1] // 64):
            t = nl.load(a[i * 128 : (i + 1) * 128, j * 64 : (j + 1) * 64])
            nl.store(out[i * 128 : (i + 1) * 128, j * 64 : (j + 1) * 64], value=nl.exp(t))
    return out


def by_walking(ir) -> tuple[int, frozenset[str], bool]:
    """What ``census`` counts, by the statement-by-statement walk."""
    ops = [op for op, _ in ir.ops()]
    device = any(isinstance(s, Loop) and s.device is not None for s, _ in ir.walk())
    return len(ops), frozenset(op.prim for op in ops), device


def test_census_counts_a_rolled_loop_body_once():
    ir = exp_rows.ir(np.ones((512, 256), np.float32))
    assert any(isinstance(s, Loop) for s in ir.body)
    c = ir.census()
    assert (c.ops, c.prims, c.device_loops) == by_walking(ir)
    assert c.ops == 3 and not c.device_loops  # load, exp, store
    assert ir.census() is c  # computed once, kept with the kernel
    assert world_size(ir) == 1
