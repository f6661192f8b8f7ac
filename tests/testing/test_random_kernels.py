"""The random kernel fuzz (issue #12): random small Beta-1 kernels, legal and illegal, against
a numpy model (``nkikit.testing.random_kernels``).  Legal ones must match the model; illegal
ones must raise an NKI error at their bad line -- no internal exception, no silent run.

The default suite runs a bounded, deterministic sample (the ``ci`` profile: fixed seed); the
``slow`` suite runs fifteen times as many."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings

from nkikit.testing.profiles import register_profiles
from nkikit.testing.random_kernels import RandomKernel, check_random_kernel, random_kernels

register_profiles()
CI = settings.get_profile("ci")
DEFAULT_EXAMPLES = 200
SLOW_EXAMPLES = 3000


def _fuzz(n: int) -> collections.Counter:
    seen: collections.Counter = collections.Counter()

    @settings(CI, max_examples=n)
    @given(random_kernels())
    def run(case: RandomKernel) -> None:
        seen[check_random_kernel(case)] += 1

    run()
    return seen


def _exercised(seen: collections.Counter, n: int) -> None:
    # the sample holds legal kernels and rejections of several kinds, not one of them only
    assert sum(seen.values()) >= n // 2, seen
    assert seen["match"] >= n // 5, seen
    assert len(seen) >= 4, seen


def test_random_kernels_match_the_model_or_are_rejected_at_their_line():
    _exercised(_fuzz(DEFAULT_EXAMPLES), DEFAULT_EXAMPLES)


@pytest.mark.slow
def test_random_kernels_long_run():
    _exercised(_fuzz(SLOW_EXAMPLES), SLOW_EXAMPLES)


def test_a_generated_kernel_points_at_its_bad_line():
    # the check itself: a kernel whose bad line the model names wrongly fails the check
    import numpy as np

    a = np.ones((4, 8), np.float32)
    lines = [
        "def kernel(a):",
        "    out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)",
        "    t0 = nl.load(a[0:4, 0:8])",
        "    t_bad = nl.load(a[0:4, 0:9])",
        "    return out",
    ]
    good = RandomKernel(lines, [a], bad_line=4, errors=("err_tensor_access_out_of_bound",))
    assert check_random_kernel(good) == "err_tensor_access_out_of_bound"
    wrong = RandomKernel(lines, [a], bad_line=3, errors=("err_tensor_access_out_of_bound",))
    with pytest.raises(AssertionError, match="not 3"):
        check_random_kernel(wrong)
    silent = RandomKernel(lines[:3] + ["    nl.store(out, t0)", "    return out"], [a])
    silent.bad_line, silent.errors = 4, ("err_tensor_access_out_of_bound",)
    with pytest.raises(AssertionError, match="ran silently"):
        check_random_kernel(silent)
    legal = RandomKernel(lines[:3] + ["    nl.store(out, t0)", "    return out"], [a])
    legal.expected, legal.rtol = a.astype(np.float64) + 1, 1e-6
    with pytest.raises(AssertionError, match="mismatch"):
        check_random_kernel(legal)
