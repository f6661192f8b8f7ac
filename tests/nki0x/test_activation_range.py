"""ScalarE's ``sin`` and ``arctan`` are polynomials valid on one period with no range
reduction: outside it the hardware extrapolates (AWS's simulator gives sin(9.0) = 27.65)
[reference/nki-0x.md §4.16].  nkikit computes the exact function and warns at the line of the
instruction that read such an argument."""

import inspect
import warnings

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiWarning


@nki.jit
def activate(x, fn, scale):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y, op=fn, data=t, scale=scale)  # <-
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


LINE = next(
    start + i
    for lines, start in [inspect.getsourcelines(activate.func)]
    for i, text in enumerate(lines)
    if text.rstrip().endswith("# <-")
)


def _run(x, fn, scale=1.0):
    """The kernel's output and its NkiWarnings, one per simulator run (the conftest runs
    both; Python shows a warning once per line)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = activate(x, fn, scale)
    return out, [w for w in got if issubclass(w.category, NkiWarning)]


@pytest.mark.parametrize(
    ("fn", "ref", "bound"), [(nl.sin, np.sin, np.pi), (nl.arctan, np.arctan, np.pi / 2)]
)
def test_arguments_in_range_are_silent(fn, ref, bound):
    x = np.linspace(-bound, bound, 128 * 16, dtype=np.float32).reshape(128, 16) * 0.999
    out, got = _run(x, fn)
    assert got == []
    np.testing.assert_allclose(out, ref(x), rtol=1e-6, atol=1e-7)


def test_an_argument_past_pi_warns_at_the_instruction_and_is_computed_exactly():
    x = np.zeros((128, 16), np.float32)
    x[3, 5] = 9.0
    out, got = _run(x, nl.sin)
    assert got and {(w.filename, w.lineno, str(w.message)) for w in got} == {
        (__file__, LINE, str(got[0].message))
    }
    assert "sin read 9" in str(got[0].message) and "range reduction" in str(got[0].message)
    np.testing.assert_allclose(out[3, 5], np.sin(np.float32(9.0)), rtol=1e-6)


def test_fp32_pi_is_in_range():
    """A kernel that reduces its argument in fp32 (the NKI Library's RoPE:
    ``(x + pi) % 2pi - pi``) may land on fp32(pi), a hair above pi."""
    x = np.full((128, 16), np.float32(np.pi), np.float32)
    x[0] = -np.float32(np.pi)
    assert _run(x, nl.sin)[1] == []
    assert _run(np.nextafter(x, np.float32(9)), nl.sin)[1]


def test_the_range_applies_to_the_scaled_argument():
    x = np.full((128, 16), 1.0, np.float32)  # in range, but scale 4 makes it 4 > pi
    assert _run(x, nl.sin)[1] == []
    assert _run(x, nl.sin, 4.0)[1]
