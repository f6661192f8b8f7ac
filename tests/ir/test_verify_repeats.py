"""The verifier checks an op whose signature (everything but its index constants) passed
before only for bounds (nkikit/ir/verify.py, ``_Walk.body``): repeated ops that differ in
what a rule reads are still checked in full, and each is rejected at its own line."""

from __future__ import annotations

import os

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
from nkikit.errors import NkiError

HERE = os.path.abspath(__file__)


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


def rejected(kernel, name: str, *args) -> NkiError:
    with pytest.raises(NkiError) as info:
        kernel.ir(*args)
    err = info.value
    assert err.name == name, str(err)
    assert os.path.abspath(err.loc.file) == HERE, str(err)
    assert "# BAD" in err.loc.text, str(err)
    return err


@nki.jit
def unrolled_store_past_the_end(a):
    out = nl.ndarray((128, 4000), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(8):  # the last of 8 identical stores but for the offset leaves `out`
        tile = nl.mgrid[0:128, 0:512]
        nl.store(out[tile.p, i * 512 + tile.x], value=0.0)  # BAD
    return out


def test_a_repeated_op_is_still_checked_for_bounds():
    err = rejected(unrolled_store_past_the_end, "err_tensor_access_out_of_bound", f32(1, 1))
    assert "4095" in str(err) and "4000" in str(err)


@nki.jit
def unrolled_write_into_input(a):
    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    for i in range(2):  # the same store, into the output and then into the input
        dst = out if i == 0 else a
        nl.store(dst, value=t)  # BAD
    return out


def test_a_repeated_op_into_another_kind_of_tensor_is_checked_in_full():
    rejected(unrolled_write_into_input, "err_cannot_update_immutable_parameter", f32(128, 64))


@nki.jit
def loop_writes_outer_buffer(a):
    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    outer = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    for _i in nl.affine_range(4):
        inner = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(2):  # the same copy into a buffer of the loop, then one outside it
            dst = inner if j == 0 else outer
            dst[...] = nl.load(a)  # BAD
        nl.store(out, value=inner)
    return out


def test_a_repeated_op_into_a_buffer_of_another_scope_is_checked_in_full():
    rejected(loop_writes_outer_buffer, "err_unexpected_output_dependencies", f32(128, 64))
