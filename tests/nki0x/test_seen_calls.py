"""Calls of a kind seen before (``nkikit.nki.isa._kind``): an unrolled kernel's repeated
``dma_copy`` / ``tensor_copy`` / ``nc_matmul`` / ``tensor_tensor`` / ``tensor_scalar`` /
``memset`` / ``nc_transpose`` / ``reciprocal`` / ``activation`` skip the checks their kind passed earlier in the
trace.  The IR is the same as when every call is checked, and what depends on the call's own
tensors -- an access's bounds, the first-write-overwrites rule, its warnings -- is still
decided per call, at the call's line."""

import warnings

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiWarning
from nkikit.nki import isa as isa_module
from tests.nki0x.nki0x_helpers import rejects, store


@nki.jit
def steps(a, w):
    """Repeated calls in the forms the memo takes and the ones it leaves to the checks: plain
    views, an engine choice, accumulate given and by the first-write rule, a free shape
    re-expressed, a dtype conversion, a priority."""
    p, f = w.shape[0], a.shape[1]
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    ws = nl.ndarray((p, p), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ws, src=w)
    for i in range(4):
        rows = slice(i * p, (i + 1) * p)
        t = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[rows, :], priority=i % 2)
        acc = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=ws, moving=t)
        nisa.nc_matmul(dst=acc, stationary=ws, moving=t)  # accumulates (first-write rule)
        nisa.nc_matmul(dst=acc, stationary=ws, moving=t, accumulate=True)
        res = nl.ndarray((p, f), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc, engine=nisa.engine.scalar if i % 2 else None)
        wide = nl.ndarray((p, 2, f // 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=wide, src=res)
        nisa.dma_copy(dst=out[rows, :], src=wide)
    return out


@nki.jit
def elementwise_steps(a):
    """The vector and scalar instructions the memo takes, with options of every type: an
    operator function, ints, floats (0.0 and -0.0), a numpy scalar, an engine."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(6):
        rows = slice(i * 128, (i + 1) * 128)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[rows, :])
        u = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(u, (0.0, -0.0)[i % 2])
        nisa.tensor_tensor(dst=u, data1=u, data2=t, op=(nl.add, nl.maximum)[i % 2])
        # equal as numbers, apart as options: 0.0 and -0.0, as floats and as numpy scalars
        zero = (0.0, -0.0, 0.0, -0.0, np.float32(0.0), np.float32(-0.0))[i]
        nisa.tensor_scalar(dst=u, data=u, op0=nl.multiply, operand0=zero)
        nisa.reciprocal(dst=u, data=u)
        nisa.activation(dst=u, op=nl.copy, data=u, scale=(1.0, 2.0)[i % 2])
        v = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=v, data=u)
        vs = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=vs, src=v)
        back = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=back, data=vs, engine=nisa.engine.tensor)
        w = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=w, src=back)
        nisa.dma_copy(dst=out[rows, :], src=w)
    return out


ARGS = (
    np.random.default_rng(0).standard_normal((512, 64), dtype=np.float32),
    np.random.default_rng(1).standard_normal((128, 128), dtype=np.float32),
)


@pytest.fixture
def appended(monkeypatch) -> list[str]:
    """The primitives of the ops appended as remembered calls, in order."""
    seen: list[str] = []
    real = isa_module._append
    monkeypatch.setattr(isa_module, "_append", lambda *a: seen.append(a[0]) or real(*a))
    return seen


def test_remembered_calls_give_the_ir_of_checked_calls(monkeypatch, appended):
    remembered = str(steps.ir(*ARGS))
    # of the loop's 32 calls, the DMAs in (two kinds: priority 0 and 1), the matmuls (two:
    # accumulate by the rule and given) and the evacuations (two engines) after each kind's
    # first call; the re-expressed copy and the DMA out of it are checked every time
    assert sorted(set(appended)) == ["dma_copy", "nc_matmul", "tensor_copy"]
    assert len(appended) == 2 + 10 + 2
    monkeypatch.setattr(isa_module, "CHECK_EVERY_CALL", True)
    appended.clear()
    checked = str(steps.ir(*ARGS))
    assert appended == []
    assert remembered == checked


def test_remembered_calls_compute_what_checked_calls_compute(monkeypatch):
    got = nki.simulate(steps)(*ARGS)
    monkeypatch.setattr(isa_module, "CHECK_EVERY_CALL", True)
    want = nki.simulate(steps)(*ARGS)
    np.testing.assert_array_equal(got, want)


def test_remembered_elementwise_calls_keep_each_options_value(monkeypatch, appended):
    a = np.abs(np.random.default_rng(2).standard_normal((768, 64), dtype=np.float32)) + 1
    remembered = str(elementwise_steps.ir(a))
    got = nki.simulate(elementwise_steps)(a)
    assert set(appended) == {
        "dma_copy",
        "memset",
        "tensor_tensor",
        "tensor_scalar",
        "nc_transpose",
        "reciprocal",
        "activation",
        "tensor_copy",
    }
    monkeypatch.setattr(isa_module, "CHECK_EVERY_CALL", True)
    assert str(elementwise_steps.ir(a)) == remembered
    want = nki.simulate(elementwise_steps)(a)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # 1 / (u * -0.0) is -inf where 1 / (u * 0.0) is +inf (u > 0): the zeros' signs were kept
    for step, sign in enumerate((1, -1, 1, -1, 1, -1)):
        assert np.all(np.isinf(got[128 * step : 128 * (step + 1)]))
        assert np.all(np.sign(got[128 * step : 128 * (step + 1)]) == sign), step


@nki.jit
def steps_out_of_bounds(a):
    """The same kind of DMA three times; the third reads past the end of ``a``."""
    for i in range(3):
        t = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[64, 64], [1, 64]], offset=i * 64 * 64))  # BAD
    return a


def test_a_remembered_kind_still_checks_each_access_bounds():
    rejects(
        steps_out_of_bounds,
        "err_tensor_access_out_of_bound",
        np.zeros((128, 64), np.float32),
    )


@nki.jit
def steps_partly_accumulated(w):
    """Matmuls of one kind into overlapping PSUM windows: the second window is half written
    by the first, so the first-write-overwrites rule has no one answer for it."""
    ws = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ws, src=w)
    acc = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
    for lo in (0, 64):
        nisa.nc_matmul(dst=acc[:, lo : lo + 128], stationary=ws, moving=ws)  # BAD
    return w


def test_a_remembered_matmul_still_applies_the_first_write_rule():
    rejects(
        steps_partly_accumulated,
        "err_unsupported_api",
        np.zeros((128, 128), np.float32),
        match="partly written",
    )


@nki.jit
def steps_accumulating_onto_nothing(w):
    """Two matmuls of one kind, each adding onto a fresh PSUM tile nothing wrote."""
    ws = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ws, src=w)
    for _ in range(2):
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=ws, moving=ws, accumulate=True)
        res = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
    return store(res)


def test_a_remembered_matmul_warns_per_call():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps_accumulating_onto_nothing.ir(np.zeros((128, 128), np.float32))
    onto_nothing = [
        w for w in caught if issubclass(w.category, NkiWarning) and "nothing" in str(w.message)
    ]
    assert len(onto_nothing) == 2


@nki.jit
def steps_then_bad_option(a):
    """A remembered kind of DMA with priority=1, then priority=True, which NKI refuses."""
    for i in range(2):
        t = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * 64 : (i + 1) * 64, :], priority=1)
    t = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[0:64, :], priority=True)  # BAD
    return a


def test_a_given_option_is_checked_on_its_own_kind():
    # True equals 1 and hashes like it: the option's type keeps the two kinds apart
    rejects(
        steps_then_bad_option,
        "err_invalid_argument",
        np.zeros((128, 64), np.float32),
        match="priority",
    )


@nki.jit
def nan_fills(a):
    """memsets of nan: every nan has one repr, so no kind of them is remembered."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(3):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(t, (float("nan"), np.float32("nan"), float("nan"))[i])
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=t)
    return out


def test_options_without_an_exact_key_are_checked_every_time(appended):
    got = nki.simulate(nan_fills)(np.zeros((384, 64), np.float32))
    assert "memset" not in appended and "dma_copy" in appended
    assert np.isnan(got).all()
