"""A failure inside a simulator on a verified kernel is nkikit's bug: both simulators name it
the same way, an NkiInternalError with the kernel's location, never a bare numpy error."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiInternalError
from nkikit.sim import fast, interp, rules


@nki.jit
def shuffle(x):
    a = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    d = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_stream_shuffle(dst=d, src=a, shuffle_mask=list(range(32)))
    out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=d)
    return out


@pytest.mark.parametrize("simulate", [fast.simulate, interp.simulate], ids=["fast", "reference"])
def test_a_simulator_bug_is_an_internal_error_naming_the_kernel(simulate, monkeypatch):
    x = np.ones((32, 16), np.float32)
    ir, _ = shuffle.specialize(x)

    def broken(op, ins, ctx):
        raise ValueError("could not broadcast")

    monkeypatch.setitem(rules.RULES, "nc_stream_shuffle", broken)
    with pytest.raises(NkiInternalError, match="ValueError: could not broadcast") as e:
        simulate(ir, [x])
    assert "test_internal_errors.py" in str(e.value)
