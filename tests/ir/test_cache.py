"""The kernel caches are bounded by the kernels' ops, not by their number: a suite that
specializes one unrolled kernel for hundreds of shapes does not keep every IR alive."""

import numpy as np

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.ir.cache import KernelCache


def test_least_recently_used_entries_go_first_while_over_the_ops_bound():
    c = KernelCache(max_ops=10)
    c.put("a", 1, 4)
    c.put("b", 2, 4)
    assert c.get("a") == 1  # now "b" is the least recently used
    c.put("c", 3, 4)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3
    assert c.ops == 8 and len(c) == 2 and c.puts == 3


def test_the_newest_entry_stays_even_alone_over_the_bound():
    c = KernelCache(max_ops=10)
    c.put("a", 1, 4)
    c.put("big", 2, 50)
    assert c.get("big") == 2 and c.get("a") is None and c.ops == 50


def test_entry_count_bound_and_replacing_a_key():
    c = KernelCache(max_ops=1000, max_entries=2)
    for k in "abc":
        c.put(k, k, 1)
    assert len(c) == 2 and c.get("a") is None
    c.put("c", "again", 5)
    assert c.get("c") == "again" and c.ops == 6


def test_a_jit_kernel_retraces_what_its_cache_dropped():
    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    double._cache.max_ops = 0  # keep only the newest specialization
    a, b = np.ones((4, 8), np.float32), np.ones((8, 8), np.float32)
    np.testing.assert_array_equal(double(a), 2 * a)
    np.testing.assert_array_equal(double(b), 2 * b)
    assert len(double._cache) == 1
    np.testing.assert_array_equal(double(a), 2 * a)  # traced again, same result
    assert double._cache.puts == 3
