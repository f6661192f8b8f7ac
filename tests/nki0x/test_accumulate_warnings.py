"""``nc_matmul(accumulate=True)`` onto PSUM no matmul wrote is undefined on the hardware: onto
memory nothing wrote since its allocation on every NeuronCore, onto values a memset or copy
wrote on NeuronCore-v2/v3 [reference/nki-0x.md §6.2].  AWS's simulator warns; so does
nkikit, with an ``NkiWarning`` at the kernel's line."""

import inspect
import warnings

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiWarning


def _kernel(first: str):
    """A matmul into a PSUM tile with ``accumulate=True`` after ``first``: nothing, a memset,
    or a matmul (the one legal start); the accumulating matmul is on the line it returns."""

    @nki.jit
    def k(a):
        s = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        if first == "memset":
            nisa.memset(dst=acc, value=0.0)
        elif first == "matmul":
            nisa.nc_matmul(dst=acc, stationary=s, moving=s, accumulate=False)
        nisa.nc_matmul(dst=acc, stationary=s, moving=s, accumulate=True)  # <-
        r = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=acc)
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out

    lines, start = inspect.getsourcelines(k.func)
    (i,) = [j for j, text in enumerate(lines) if text.rstrip().endswith("# <-")]
    return k, start + i


def _run(first: str):
    k, line = _kernel(first)
    a = np.ones((128, 128), np.float32)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = k(a)
    return out, [w for w in got if issubclass(w.category, NkiWarning)], line


def test_accumulating_onto_unwritten_psum_warns_and_reads_the_poison():
    out, got, line = _run("nothing")
    assert len(got) == 1 and got[0].lineno == line and got[0].filename == __file__
    assert "nothing has written since it was allocated" in str(got[0].message)
    assert np.isnan(out).all()


@pytest.mark.parametrize(("target", "warns"), [("trn2", True), ("trn3", False)])
def test_accumulating_onto_a_memset_warns_on_nc_v2_v3(monkeypatch, target, warns):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    out, got, line = _run("memset")
    assert bool(got) is warns
    if warns:
        assert got[0].lineno == line and "NeuronCore-v2/v3" in str(got[0].message)
    np.testing.assert_array_equal(out, np.full((128, 128), 128.0, np.float32))


def test_accumulating_after_a_matmul_is_silent():
    out, got, _ = _run("matmul")
    assert got == []
    np.testing.assert_array_equal(out, np.full((128, 128), 256.0, np.float32))
