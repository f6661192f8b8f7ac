"""``np.asarray(tile)`` inside an NKI 0.x kernel: the values after the instructions traced so
far (nkikit.trace.peek), for a look from ``print`` or ``breakpoint()``; a named error where
there is no one answer; the call's own run and its arguments are unchanged by a look."""

import ml_dtypes
import numpy as np
import pytest

import nkikit
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
import nkikit.typing as nt
from nkikit.errors import NkiError

seen: list[np.ndarray] = []


@pytest.fixture(autouse=True)
def _clear():
    seen.clear()


@nki.jit
def scale_in_steps(a):
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    seen.append(np.asarray(t))
    for _ in range(2):  # a Python loop unrolls: each look sees its own point
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        seen.append(np.asarray(t[:, 1:3]))
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_look_sees_the_values_where_the_trace_stands():
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = scale_in_steps(a)
    np.testing.assert_array_equal(seen[0], a)
    np.testing.assert_array_equal(seen[1], 3 * a[:, 1:3])
    np.testing.assert_array_equal(seen[2], 9 * a[:, 1:3])
    np.testing.assert_array_equal(out, 9 * a)


def test_a_bf16_tile_is_seen_as_stored():
    a = (np.arange(8, dtype=np.float32).reshape(2, 4) / 3).astype(ml_dtypes.bfloat16)
    scale_in_steps(a)
    assert seen[1].dtype == ml_dtypes.bfloat16
    expect = (a[:, 1:3].astype(np.float32) * 3).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(seen[1], expect)


@nki.jit
def bump_in_place(x):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=x, src=t)
    seen.append(np.asarray(x))
    return x


def test_a_look_leaves_the_callers_arrays_to_the_call():
    x = np.zeros((2, 4), np.float32)
    bump_in_place(x)
    np.testing.assert_array_equal(seen[0], np.ones((2, 4)))
    np.testing.assert_array_equal(x, np.ones((2, 4)))  # written once, by the call


@nki.jit
def look_inside_a_device_loop(a, n):
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    count = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=count, src=n)
    trips = nisa.register_alloc(0)
    nisa.register_load(trips, count)
    for _ in nl.dynamic_range(trips):  # a loop that runs on the device
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        np.asarray(t)  # the look
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def look(a):
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    np.asarray(t)  # the look
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _refused(call, why):
    with pytest.raises(NkiError) as e:
        call()
    assert e.value.name == "err_invalid_argument"
    assert why in str(e.value) and "nl.device_print" in str(e.value)
    assert "# the look" in str(e.value)  # at the user's line


def test_where_there_is_no_one_answer_the_look_is_a_named_error():
    a = np.ones((2, 4), np.float32)
    n = np.array([[2]], np.int32)
    _refused(lambda: look_inside_a_device_loop(a, n), "inside a loop or an SPMD launch")
    _refused(lambda: look[2](a), "inside a loop or an SPMD launch")
    spec = nt.tensor[[2, 4], nl.float32]
    _refused(lambda: nkikit.profile_kernel(look, spec), "shapes alone")


@nkikit.jit
def beta1_steps(a):
    import nkikit.language as nl1

    t = nl1.load(a)
    seen.append(np.asarray(t))
    u = nl1.multiply(t, 2.0)
    seen.append(np.asarray(u))
    out = nl1.ndarray(a.shape, dtype=a.dtype, buffer=nl1.shared_hbm)
    nl1.store(out, u)
    return out


def test_a_beta1_tile_can_be_looked_at_too():
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(beta1_steps(a), 2 * a)
    np.testing.assert_array_equal(seen[0], a)
    np.testing.assert_array_equal(seen[1], 2 * a)
