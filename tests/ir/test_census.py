"""``Kernel.census``: the op count, primitives and run-time loops of one walk, equal to what
the statement-by-statement definitions find (caches weigh kernels by it; the simulators
choose their path and world size by it)."""

import numpy as np

import nkikit.nki as nki
import nkikit.nki.collectives as ncc
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.ir.core import Loop
from nkikit.sim.ranks import world_size


@nki.jit
def rank_loop(x, groups):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)

    def body(i):
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=groups, op=nl.add)

    nl.fori_loop(0, ncc.rank_id(), body)  # a trip count known at run time
    return dst


@nki.jit
def tiles(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128 : (i + 1) * 128, :])
        nisa.activation(dst=t, op=nl.exp, data=t)
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=t)
    return out


def _by_walking(ir):
    ops = [op for op, _ in ir.ops()]
    device = any(isinstance(s, Loop) and s.device is not None for s, _ in ir.walk())
    return len(ops), frozenset(op.prim for op in ops), device


def test_census_counts_what_walking_the_statements_finds():
    x = np.ones((512, 64), np.float32)
    for ir in (tiles.ir(x), rank_loop.ir(x[:128], ncc.ReplicaGroup([[0, 1, 2]]))):
        c = ir.census()
        assert (c.ops, c.prims, c.device_loops) == _by_walking(ir)
        assert ir.census() is c  # computed once, kept with the kernel


def test_census_answers_the_simulators_questions():
    x = np.ones((128, 64), np.float32)
    ir = rank_loop.ir(x, ncc.ReplicaGroup([[0, 1, 2]]))
    assert ir.census().device_loops and "all_reduce" in ir.census().prims
    assert world_size(ir) == 3
    plain = tiles.ir(np.ones((256, 64), np.float32))
    assert not plain.census().device_loops and world_size(plain) == 1
