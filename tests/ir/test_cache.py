"""The kernel caches are bounded by the kernels' ops, not by their number: a suite that
specializes one unrolled kernel for hundreds of shapes does not keep every IR alive."""

import numpy as np

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.ir.cache import KernelCache


def scaling_kernel(factor: float):
    """A fresh @nki.jit kernel (a cache of its own) returning ``factor * x``."""

    @nki.jit
    def scale(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
        nisa.dma_copy(dst=out, src=t)
        return out

    return scale


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
    double = scaling_kernel(2.0)

    double._cache.max_ops = 0  # keep only the newest specialization
    a, b = np.ones((4, 8), np.float32), np.ones((8, 8), np.float32)
    np.testing.assert_array_equal(double(a), 2 * a)
    np.testing.assert_array_equal(double(b), 2 * b)
    assert len(double._cache) == 1
    np.testing.assert_array_equal(double(a), 2 * a)  # traced again, same result
    assert double._cache.puts == 3


def test_every_cache_of_the_process_shares_one_ops_bound(monkeypatch):
    import nkikit.ir.cache as cache

    monkeypatch.setattr(cache, "DEFAULT_MAX_OPS", 10)
    first, second = KernelCache(max_ops=100), KernelCache(max_ops=100)
    first.put("a", 1, 4)
    second.put("b", 2, 4)
    assert first.get("a") == 1  # now second's "b" is the least recently used of the two
    second.put("c", 3, 4)  # 12 ops in all: "b" goes, though second is under its own bound
    assert second.get("b") is None and first.get("a") == 1 and second.get("c") == 3
    first.put("big", 4, 9)  # 17: the others go, the entry just put stays
    assert first.get("big") == 4 and first.get("a") is None and second.get("c") is None
    assert first.ops == 9 and second.ops == 0


def test_running_many_specializations_keeps_only_the_bounded_few_alive(monkeypatch):
    import gc

    import nkikit.ir.cache as cache
    from nkikit.ir.core import Kernel

    triple = scaling_kernel(3.0)

    def alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is Kernel and o.name == "scale")

    monkeypatch.setattr(cache, "DEFAULT_MAX_OPS", 0)  # each cache keeps what it just put
    for rows in range(1, 41):  # 40 specializations, each traced, compiled and run
        x = np.ones((rows, 8), np.float32)
        np.testing.assert_array_equal(triple(x), 3 * x)
    # the jit cache's and the fast path's newest entries: no global cache keyed by kernels
    # (world size, written parameters) keeps the other 39 alive
    assert alive() <= 2


def test_short_of_memory_every_cache_gives_back_all_but_the_entry_just_put(monkeypatch):
    import nkikit.ir.cache as cache

    first, second = KernelCache(max_ops=100), KernelCache(max_ops=100)
    first.put("a", 1, 4)
    second.put("b", 2, 4)
    monkeypatch.setattr(cache, "short_of_memory", lambda: True)
    first.put("c", 3, 4)
    assert first.get("c") == 3 and first.get("a") is None and second.get("b") is None


def test_a_dropped_kernel_is_freed_without_waiting_for_the_cyclic_collector(monkeypatch):
    # the fast path's code generator refers back to itself; emptied after it has built the
    # program, it no longer keeps the kernel in a cycle that only a full collection frees
    import gc

    import nkikit.ir.cache as cache
    from nkikit.ir.core import Kernel

    quadruple = scaling_kernel(4.0)

    monkeypatch.setattr(cache, "DEFAULT_MAX_OPS", 0)
    gc.collect()
    gc.disable()
    try:
        for rows in range(1, 11):
            quadruple(np.ones((rows, 8), np.float32))
        # tracked objects include the unreachable ones no collection has freed yet
        kept = sum(1 for o in gc.get_objects() if type(o) is Kernel and o.name == "scale")
    finally:
        gc.enable()
    assert kept <= 2
