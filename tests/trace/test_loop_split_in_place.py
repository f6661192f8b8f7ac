"""Loop splits made in place: ``i % k`` / ``i // k`` of a rolled loop's variable and a fresh
PSUM region accumulated over a reduction loop split the loop while its first body copy is
traced, so the kernel function runs once per specialization -- trace-time side effects such
as a module-level address counter happen once -- and the IR is the split loop a re-trace
would give.  What the first copy cannot settle (the split loop's variable itself indexed
``% k`` again) still re-traces."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.ir.affine import LoopVar
from nkikit.ir.core import Loop, Op

P, F = 16, 32


def _loops(body) -> list[Loop]:
    out = []
    for s in body:
        if isinstance(s, Loop):
            out.append(s)
            out.extend(_loops(s.body))
    return out


class Counter:
    """A bump counter bumped at trace time (what a hand-written address allocator does)."""

    def __init__(self) -> None:
        self.calls = 0

    def bump(self) -> int:
        self.calls += 1
        return self.calls


def test_mod_in_helper_function_splits_once():
    """The loop variable reaches ``% 2`` through a helper function's argument, after
    statements that already used it: those are rewritten, the function runs once."""
    counter = Counter()

    @nki.jit
    def swap_pairs(x):
        counter.bump()
        n = x.shape[0] // P
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        slots = nl.ndarray((P, 2, F), dtype=x.dtype, buffer=nl.sbuf)

        def stage(i):
            slots[:, i % 2, :] = nl.load(x[nl.ds(i * P, P), :])

        for i in nl.sequential_range(n):
            scaled = nl.multiply(nl.load(x[nl.ds(i * P, P), :]), 3.0)
            stage(i)
            nl.store(out[nl.ds(i * P, P), :], value=nl.add(slots[:, i % 2, :], scaled))
        return out

    x = np.random.default_rng(0).standard_normal((6 * P, F)).astype(np.float32)
    np.testing.assert_allclose(swap_pairs(x), 4.0 * x, rtol=1e-6)
    assert counter.calls == 1
    ir = swap_pairs.ir(x)  # cached: no trace
    assert counter.calls == 1
    (loop,) = _loops(ir.body)
    assert (loop.var.trip, loop.var.kind) == (3, "sequential")
    loads = [
        s
        for s in loop.body
        if isinstance(s, Op) and s.prim == "dma_copy" and s.outs[0].tensor.buffer == "sbuf"
    ]
    # two loads per copy, two copies; every index is in the split loop's variable
    assert len(loads) == 4
    loop_syms = {sym for op in loads for sym in op.ins[0].syms if isinstance(sym, LoopVar)}
    assert loop_syms == {loop.var}


def test_remainder_iterations_after_in_place_split():
    counter = Counter()

    @nki.jit
    def parity(x):
        counter.bump()
        n = x.shape[0] // P
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(n):
            t = nl.load(x[nl.ds(i * P, P), :])
            sign = nl.ndarray((P, 2, F), dtype=x.dtype, buffer=nl.sbuf)
            sign[:, 0, :] = nl.multiply(t, 1.0)
            sign[:, 1, :] = nl.multiply(t, -1.0)
            nl.store(out[nl.ds(i * P, P), :], value=sign[:, i % 2, :])
        return out

    x = np.random.default_rng(1).standard_normal((5 * P, F)).astype(np.float32)
    got = parity(x)
    want = x.reshape(5, P, F) * np.array([1, -1, 1, -1, 1], np.float32)[:, None, None]
    np.testing.assert_array_equal(got, want.reshape(-1, F))
    assert counter.calls == 1
    (loop,) = _loops(parity.ir(x).body)
    assert loop.var.trip == 2  # 5 = 2 * 2 + 1 unrolled remainder iteration


@pytest.mark.parametrize("kt", [1, 3, 4])
def test_fresh_psum_reduction_splits_in_place(kt):
    """``psum[...] += nc_matmul`` into a fresh region over a reduction loop: its first
    iteration overwrites, the others add -- decided per copy of an in-place split."""
    counter = Counter()

    @nki.jit
    def matmul_k(a, b):
        counter.bump()
        out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(a.shape[0] // P):
            lhs = nl.load(a[nl.ds(k * P, P), :])
            rhs = nl.load(b[nl.ds(k * P, P), :])
            acc[...] += nisa.nc_matmul(lhs, rhs)
        nl.store(out, value=nl.copy(acc))
        return out

    rng = np.random.default_rng(2)
    a = rng.standard_normal((kt * P, P)).astype(np.float32)
    b = rng.standard_normal((kt * P, F)).astype(np.float32)
    np.testing.assert_allclose(matmul_k(a, b), a.T @ b, rtol=1e-4, atol=1e-4)
    assert counter.calls == 1


def test_split_variable_indexed_again_retraces():
    """``(i // 2) % 2``: the first copy gave out ``i // 2`` before it could know the loop
    needs a split by 4, so the kernel is traced again (split by 4 from the start)."""
    counter = Counter()

    @nki.jit
    def quarters(x):
        counter.bump()
        n = x.shape[0] // P
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.sequential_range(n):
            src = (i // 2) % 2 * 2 + i % 2 + i // 4 * 4
            nl.store(out[nl.ds(i * P, P), :], value=nl.load(x[nl.ds(src * P, P), :]))
        return out

    x = np.random.default_rng(3).standard_normal((8 * P, F)).astype(np.float32)
    np.testing.assert_array_equal(quarters(x), x)
    assert counter.calls == 2
    (loop,) = _loops(quarters.ir(x).body)
    assert loop.var.trip == 2


@pytest.mark.parametrize("loop", [range, nl.static_range])
def test_unrolled_loop_index_modulo_is_a_constant(loop):
    """A plain ``range`` / ``nl.static_range`` index is a Python int at trace time: ``% 2``
    and ``(i + 1) % 2`` are constants, no loop is split and nothing re-traces."""
    counter = Counter()

    @nki.jit
    def alternate(x):
        counter.bump()
        n = x.shape[0] // P
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        slots = nl.ndarray((P, 2, F), dtype=x.dtype, buffer=nl.sbuf)
        slots[:, 0, :] = nl.load(x[0:P, :])
        for i in loop(n - 1):
            slots[:, (i + 1) % 2, :] = nl.load(x[nl.ds((i + 1) * P, P), :])
            nl.store(
                out[nl.ds(i * P, P), :],
                value=nl.subtract(slots[:, (i + 1) % 2, :], slots[:, i % 2, :]),
            )
        nl.store(out[nl.ds((n - 1) * P, P), :], value=slots[:, (n - 1) % 2, :])
        return out

    x = np.random.default_rng(6).standard_normal((5 * P, F)).astype(np.float32)
    b = x.reshape(5, P, F)
    want = np.concatenate([b[1:] - b[:-1], b[-1:]]).reshape(-1, F)
    np.testing.assert_array_equal(alternate(x), want)
    assert counter.calls == 1
    assert _loops(alternate.ir(x).body) == []
