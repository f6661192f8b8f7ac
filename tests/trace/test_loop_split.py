"""``i % k`` and ``i // k`` of a rolled loop's variable: the trace splits the loop
(``i = k*j + r``, the body traced once per ``r``, unrolled remainder iterations) so every
index stays affine; what no split can make affine is still ``err_non_affine_index``."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
from nkikit.errors import NkiError
from nkikit.ir.core import Loop

P, F = 8, 16
RANGES = {"affine": nl.affine_range, "sequential": nl.sequential_range}


def _blocks(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n * P, F)).astype(np.float32)


def _loops(body) -> list[Loop]:
    """Every IR loop of ``body``, outermost first."""
    out = []
    for s in body:
        if isinstance(s, Loop):
            out.append(s)
            out.extend(_loops(s.body))
    return out


@nki.jit
def interleave(x, k, kind):
    """Block ``i`` of ``x`` goes to block ``(i % k) * m + i // k`` (m = ceil(n / k)): a
    permutation, so an affine_range's iterations write distinct blocks."""
    n = x.shape[0] // P
    m = -(-n // k)
    out = nl.ndarray((k * m * P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in RANGES[kind](n):
        t = nl.load(x[i * P : (i + 1) * P, :])
        dst = (i % k) * m + i // k
        nl.store(out[nl.ds(dst * P, P), :], value=nl.multiply(t, 2.0))
    return out


def _interleave_ref(x: np.ndarray, k: int) -> tuple[np.ndarray, list[int]]:
    n = x.shape[0] // P
    m = -(-n // k)
    out = np.full((k * m * P, F), np.nan, np.float32)
    rows = []
    for i in range(n):
        d = (i % k) * m + i // k
        out[d * P : (d + 1) * P] = 2.0 * x[i * P : (i + 1) * P]
        rows.extend(range(d * P, (d + 1) * P))
    return out, rows


@pytest.mark.parametrize("kind", ["affine", "sequential"])
@pytest.mark.parametrize("n,k", [(6, 2), (7, 2), (7, 3), (2, 3), (9, 4)])
def test_mod_and_floordiv_split_the_loop(monkeypatch, kind, n, k):
    monkeypatch.setenv("NKIKIT_SIM", "check")  # both simulators, bit-identical
    x = _blocks(n)
    got = interleave(x, k, kind)
    want, rows = _interleave_ref(x, k)
    np.testing.assert_array_equal(got[rows], want[rows])

    ir = interleave.ir(x, k, kind)
    loops = _loops(ir.body)
    if n >= k:  # one rolled loop of n // k iterations, of the kind the kernel asked for
        assert [(lp.var.trip, lp.var.kind) for lp in loops] == [(n // k, kind)]
        assert sum(1 for s in loops[0].body if getattr(s, "prim", None) == "dma_copy") == 2 * k
    else:  # fewer iterations than k: all of them are the unrolled remainder
        assert loops == []
    # one store per body copy in the loop, one per remainder iteration
    stores = [op for op, _ in ir.ops() if op.outs[0].tensor.kind == "output"]
    assert len(stores) == k * (n // k > 0) + n % k


@nki.jit
def prefetch(x, k):
    """Hand double (k-fold) buffering in a sequential loop, as the attention tutorial's v9:
    block i + 1 is loaded into slot (i + 1) % k while slot i % k is read."""
    n = x.shape[0] // P
    out = nl.ndarray(((n - 1) * P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((P, k, F), dtype=x.dtype, buffer=nl.sbuf)
    buf[:, 0, :] = nl.load(x[0:P, :])
    for i in nl.sequential_range(n - 1):
        buf[:, (i + 1) % k, :] = nl.load(x[nl.ds((i + 1) * P, P), :])
        s = nl.add(buf[:, i % k, :], buf[:, (i + 1) % k, :])
        nl.store(out[nl.ds(i * P, P), :], value=s)
    return out


@pytest.mark.parametrize("n,k", [(5, 2), (6, 2), (7, 3)])
def test_hand_multi_buffering_in_a_sequential_loop(monkeypatch, n, k):
    monkeypatch.setenv("NKIKIT_SIM", "check")
    x = _blocks(n, seed=1)
    got = prefetch(x, k)
    b = x.reshape(n, P, F)
    np.testing.assert_array_equal(got, (b[:-1] + b[1:]).reshape(-1, F))
    (loop,) = _loops(prefetch.ir(x, k).body)
    assert loop.var.kind == "sequential" and loop.var.trip == (n - 1) // k


@nki.jit
def nested(x, n, m):
    """Outer affine loop over i, inner sequential loop over j; the source block depends on
    ``(i + j) % 2`` (both loops split) and on ``j // 2``."""
    out = nl.ndarray((n * m * P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(n):
        for j in nl.sequential_range(m):
            src = i * 4 + (i + j) % 2 + 2 * (j // 2 % 2)
            t = nl.load(x[nl.ds(src * P, P), :])
            nl.store(out[nl.ds((i * m + j) * P, P), :], value=t)
    return out


@pytest.mark.parametrize("n,m", [(4, 4), (3, 5), (5, 3)])
def test_nested_loops_split_each_variable(monkeypatch, n, m):
    monkeypatch.setenv("NKIKIT_SIM", "check")
    x = _blocks(4 * n, seed=2)
    got = nested(x, n, m)
    b = x.reshape(-1, P, F)
    want = np.stack([b[i * 4 + (i + j) % 2 + 2 * (j // 2 % 2)] for i in range(n) for j in range(m)])
    np.testing.assert_array_equal(got, want.reshape(-1, F))
    kinds = {lp.var.kind for lp in _loops(nested.ir(x, n, m).body)}
    assert kinds <= {"affine", "sequential"} and "affine" in kinds


def test_loop_without_mod_is_not_split():
    x = _blocks(4)

    @nki.jit
    def plain(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            nl.store(out[nl.ds(i * P, P), :], value=nl.load(x[nl.ds(i * P, P), :]))
        return out

    (loop,) = _loops(plain.ir(x).body)
    assert loop.var.trip == 4 and loop.var.name == "i"


# -- what no loop split makes affine ------------------------------------------------------------


def _bad_line(fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    (hit,) = [start + n for n, text in enumerate(lines) if "# BAD" in text]
    return hit


@nki.jit
def arange_mod(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(F)[None, :]
    for i in nl.affine_range(2):
        t = nl.load(x[(i_p + 1) % 2, i_f])  # BAD
        nl.store(out[i * P + i_p, i_f], value=t)
    return out


@nki.jit
def product(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        for j in nl.affine_range(2):
            t = nl.load(x[nl.ds((i * j) * P, P), :])  # BAD
            nl.store(out[nl.ds((2 * i + j) * P, P), :], value=t)
    return out


@pytest.mark.parametrize(
    "kernel,expr", [(arange_mod, "(a0 + 1) % 2"), (product, "i * j")], ids=["arange", "product"]
)
def test_non_affine_index_still_rejected(kernel, expr):
    x = _blocks(4)
    with pytest.raises(NkiError) as info:
        kernel.ir(x)
    err = info.value
    assert err.name == "err_non_affine_index", str(err)
    assert expr in str(err)
    assert os.path.abspath(err.loc.file) == os.path.abspath(__file__)
    assert err.loc.line == _bad_line(kernel.func)


def test_each_specialization_splits_from_its_own_trace():
    """The split happens in place: the function runs once per specialization (trace-time side
    effects happen once, as on NKI), and a later specialization is split for its own indices
    alone, not for earlier ones'."""
    traces = []

    @nki.jit
    def counted(x, k):
        traces.append(k)  # a trace-time side effect: runs once per trace
        n = x.shape[0] // P
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.sequential_range(n):
            t = nl.load(x[nl.ds((i // k * k + (k - 1 - i % k)) * P, P), :])
            nl.store(out[nl.ds(i * P, P), :], value=t)
        return out

    x = _blocks(12)
    for k, trips in [(2, 6), (3, 4)]:
        got = counted(x, k)
        np.testing.assert_array_equal(
            got.reshape(-1, k, P, F), x.reshape(-1, k, P, F)[:, ::-1]
        )  # blocks reversed within each group of k
        (loop,) = _loops(counted.ir(x, k).body)
        assert loop.var.trip == trips
    assert traces == [2, 3]
