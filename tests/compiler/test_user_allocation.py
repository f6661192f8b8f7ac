"""Direct allocation (``nki.compiler.sbuf`` / ``psum`` ``mod_alloc``) is honoured by the
allocator: a user's tensor keeps its address (one buffer, never spilled), nkikit's own
placements stay clear of it (above the user spans, or below them when that range is larger),
and a span past the SBUF of the target compiled for is ``err_allocation_out_of_bounds`` at the
user's line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nkikit as nki
import nkikit.compiler as ncc
import nkikit.language as nl
from nkikit.compiler.allocate import allocate
from nkikit.errors import NkiError
from nkikit.targets import get_target

P, F = 128, 256
BASE = 4096  # bytes into each partition


def _kernel(base: int):
    @nki.jit
    def scaled_sum(x, y):
        out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        where = ncc.sbuf.mod_alloc(base_addr=base)
        placed = nl.ndarray((P, F), dtype=nl.float32, buffer=where)  # USER
        placed[...] = nl.load(x)
        other = nl.load(y)  # placed by nkikit
        total = nl.add(placed, nl.multiply(other, 2.0))
        nl.store(out, value=total)
        return out

    return scaled_sum


def _inputs():
    rng = np.random.default_rng(4)
    return tuple(rng.standard_normal((P, F)).astype(np.float32) for _ in range(2))


def _user_line(kernel) -> int:
    lines, start = inspect.getsourcelines(kernel.func)
    (hit,) = [start + n for n, text in enumerate(lines) if "# USER" in text]
    return hit


def test_user_address_is_kept_and_others_stay_clear():
    kernel = _kernel(BASE)
    x, y = _inputs()
    np.testing.assert_allclose(kernel(x, y), x + 2 * y, rtol=1e-6)
    ir = kernel.ir(x, y)
    alloc = allocate(ir, get_target("trn2"))
    by_name = {p.tensor.name: p for p in alloc.placements.values()}
    user = by_name["placed"]
    assert (user.memory, user.offset, user.size, user.buffers) == ("sbuf", BASE, F * 4, 1)
    end = BASE + F * 4
    for name, p in by_name.items():
        if name != "placed" and p.memory == "sbuf":
            assert p.offset >= end, (name, p.offset)
    assert nki.profile_kernel(kernel, x, y, target="trn2").total_us > 0


def test_automatic_tensors_go_below_a_user_span_near_the_top():
    base = get_target("trn2").sbuf_bytes - F * 4  # the last bytes of each partition
    kernel = _kernel(base)
    x, y = _inputs()
    np.testing.assert_allclose(kernel(x, y), x + 2 * y, rtol=1e-6)
    alloc = allocate(kernel.ir(x, y), get_target("trn2"))
    by_name = {p.tensor.name: p for p in alloc.placements.values()}
    assert by_name["placed"].offset == base
    for name, p in by_name.items():
        if name != "placed" and p.memory == "sbuf":
            assert p.end <= base, (name, p.offset, p.end)


def test_user_span_past_the_compiled_targets_sbuf_is_rejected():
    """Traced for trn2 (224 KiB per partition) at an address trn1 (192 KiB) does not have."""
    base = 200 * 1024
    kernel = _kernel(base)
    ir = kernel.ir(*_inputs())  # fits trn2, the default target
    with pytest.raises(NkiError) as info:
        allocate(ir, get_target("trn1"))
    err = info.value
    assert err.name == "err_allocation_out_of_bounds"
    assert err.loc.line == _user_line(kernel)
    assert "trn1" in str(err)


def test_force_auto_alloc_drops_the_user_address():
    kernel = ncc.force_auto_alloc(_kernel(BASE))
    x, y = _inputs()
    np.testing.assert_allclose(kernel(x, y), x + 2 * y, rtol=1e-6)
    ir = kernel.ir(x, y)
    (placed,) = [t for t in ir.tensors if t.name == "placed"]
    assert placed.user_span is None
    by_name = {p.tensor.name: p for p in allocate(ir, get_target("trn2")).placements.values()}
    assert by_name["placed"].offset != BASE
