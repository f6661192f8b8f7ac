"""What NKI 0.x test kernels share: the moves they start and end with (a kernel argument into
an SBUF tile, a tile out to a new ``shared_hbm`` output, a PSUM tile evacuated to SBUF in
fp32), and ``rejects``: a bad kernel refused with a named error at its line marked ``# BAD``."""

import inspect
import os

import pytest

import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def load(x, dtype=None):
    """``x`` (an HBM tensor or view) copied into a new SBUF tile (converted to ``dtype``)."""
    t = nl.ndarray(x.shape, dtype=dtype or x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def store(t):
    """``t`` copied into a new ``shared_hbm`` output of its shape and dtype."""
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def evacuate(acc):
    """A PSUM tile copied to a new fp32 SBUF tile."""
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    return out


def bad_line(fn) -> int:
    """The line of ``fn`` marked ``# BAD`` (exactly one)."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if "# BAD" in text]
    assert len(hits) == 1
    return hits[0]


def rejects(kernel, name: str, *args, match: str | None = None) -> NkiError:
    """Call ``kernel(*args)``: it must raise the NkiError ``name`` (its message matching
    ``match``) located at the kernel's ``# BAD`` line."""
    with pytest.raises(NkiError, match=match) as info:
        kernel(*args)
    err = info.value
    assert err.name == name, str(err)
    assert os.path.abspath(err.loc.file) == os.path.abspath(inspect.getsourcefile(kernel.func))
    assert err.loc.line == bad_line(kernel.func), str(err)
    return err
