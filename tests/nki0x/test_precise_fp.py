"""``NKI_PRECISE_FP``: AWS's simulator stores bf16 and fp8 tensors rounded to their dtype by
default (``1``) and holds them as unrounded fp32 with ``0`` [reference/nki-0x.md §6.1].
Every kernel here runs on both simulators, which must agree bit for bit (conftest.py)."""

import inspect

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit import dtypes
from nkikit.errors import NkiError


@nki.jit
def add_in(a, b, dtype):
    """``a + b`` computed in fp32 and stored in ``dtype`` on chip and in HBM."""
    out = nl.ndarray(a.shape, dtype=dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    y = nl.ndarray(a.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    nisa.dma_copy(dst=y, src=b)
    z = nl.ndarray(a.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
    nisa.dma_copy(dst=out, src=z)
    return out


ONE = np.ones((128, 64), np.float32)
TINY = np.full((128, 64), 2.0**-10, np.float32)  # 1 + 2^-10 is not a bf16 (8 mantissa bits)


@pytest.mark.parametrize("sim", ["fast", "reference", "check"])
def test_default_rounds_bf16_on_write(monkeypatch, sim):
    monkeypatch.setenv("NKIKIT_SIM", sim)
    monkeypatch.delenv("NKI_PRECISE_FP", raising=False)
    out = add_in(ONE, TINY, nl.bfloat16)
    assert out.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), ONE)


@pytest.mark.parametrize("sim", ["fast", "reference", "check"])
def test_precise_fp_0_holds_bf16_unrounded_as_fp32(monkeypatch, sim):
    monkeypatch.setenv("NKIKIT_SIM", sim)
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    out = add_in(ONE, TINY, nl.bfloat16)
    assert out.dtype == np.float32  # the storage of the mode: no bf16 bits
    np.testing.assert_array_equal(out, ONE + TINY)


def test_precise_fp_0_does_not_saturate_fp8():
    big = np.full((128, 64), 1000.0, np.float32)  # past float8_e4m3's largest value, 240
    assert float(add_in(big, ONE, nl.float8_e4m3).astype(np.float32).max()) == 240.0
    with pytest.MonkeyPatch.context() as m:
        m.setenv("NKI_PRECISE_FP", "0")
        np.testing.assert_array_equal(add_in(big, ONE, nl.float8_e4m3), big + ONE)


def test_bf16_inputs_are_widened_exactly_and_fp16_stays_rounded(monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    a = np.full((128, 64), 1.5, ml_dtypes.bfloat16)
    out = add_in(a, TINY, nl.float16)  # fp16 is numpy's own type: still rounded (10 bits)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, np.float16(1.5 + 2.0**-10))
    out = add_in(a, TINY, nl.bfloat16)
    np.testing.assert_array_equal(out, np.float32(1.5 + 2.0**-10))


def test_one_kernel_switches_modes_between_calls(monkeypatch):
    """The fast path keeps one program per storage mode: a cached precise program never
    runs a wide call, nor the other way round."""
    for mode, want in [("1", ONE), ("0", ONE + TINY), ("1", ONE), ("0", ONE + TINY)]:
        monkeypatch.setenv("NKI_PRECISE_FP", mode)
        np.testing.assert_array_equal(add_in(ONE, TINY, nl.bfloat16).astype(np.float32), want)
    assert not dtypes.is_wide()  # the mode ends with the call


@nki.jit
def accumulate_into(acc, x):
    """``acc += x`` in place on a mutable bf16 argument."""
    a = nl.ndarray(acc.shape, dtype=acc.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=acc)
    nisa.dma_copy(dst=b, src=x)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=acc, src=a)
    return acc


def test_a_written_bf16_argument_gets_the_result_rounded_back(monkeypatch):
    """Held as fp32 while the kernel runs, a bf16 argument the kernel writes is the caller's
    bf16 array afterwards: the result is written back, rounded once."""
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    acc = np.ones((128, 64), ml_dtypes.bfloat16)
    x = np.full((128, 64), 2.0**-9 + 2.0**-12, np.float32)
    out = accumulate_into(acc, x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, 1 + x)
    assert acc.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(acc, (1 + x).astype(ml_dtypes.bfloat16))


def test_simulate_ranks_honours_the_mode(monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    (out,) = nki.simulate_ranks(add_in, [dict(a=ONE, b=TINY, dtype=nl.bfloat16)])
    np.testing.assert_array_equal(out, ONE + TINY)


def test_mx_quantization_packs_real_fp8_bits_in_either_mode(monkeypatch):
    """MX containers hold fp8 bits, which the mode does not widen."""

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # quantize_mx: NC-v4

    @nki.jit
    def quantize(x):
        data = nl.ndarray((32, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        scale = nl.ndarray((32, 16), dtype=nl.uint8, buffer=nl.sbuf)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.quantize_mx(dst=data, src=t, dst_scale=scale)
        out = nl.ndarray((32, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=data)
        return out

    x = np.random.default_rng(0).standard_normal((32, 64)).astype(ml_dtypes.bfloat16)
    precise = quantize(x)
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    np.testing.assert_array_equal(quantize(x), precise)


def test_reinterpreting_bf16_bits_is_refused_at_the_view(monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "0")

    @nki.jit
    def bits(x):
        t = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        u = t.view(nl.uint16)  # <-
        out = nl.ndarray(x.shape, dtype=nl.uint16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    lines, first = inspect.getsourcelines(bits)
    (i,) = [k for k, text in enumerate(lines) if text.rstrip().endswith("# <-")]
    with pytest.raises(NkiError, match="NKI_PRECISE_FP=0") as e:
        bits(np.ones((128, 64), ml_dtypes.bfloat16))
    assert e.value.name == "err_unsupported_api"
    assert e.value.loc.file == __file__ and e.value.loc.line == first + i
    monkeypatch.setenv("NKI_PRECISE_FP", "1")  # the same kernel runs in the default mode
    assert bits(np.ones((128, 64), ml_dtypes.bfloat16)).dtype == np.uint16


def test_an_unknown_value_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "yes")
    with pytest.raises(ValueError, match="NKI_PRECISE_FP='yes'"):
        add_in(ONE, TINY, nl.bfloat16)
