"""The one torch <-> numpy converter (nkikit.torch.convert): every NKI dtype torch has, through
``@nki.jit`` called with CPU tensors, bit for bit, into outputs and mutable arguments."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nkikit as nki  # noqa: E402
import nkikit.language as nl  # noqa: E402
import nkikit.typing as nt  # noqa: E402
from nkikit.torch.convert import dtype_name, from_numpy, to_numpy, torch_dtype  # noqa: E402

# torch dtype -> values that are exact in it and exercise its range (as float64 or int)
_VALUES = {
    torch.float32: [0.0, -1.5, 3.25e-30, 1.0e30, 123456.789],
    torch.bfloat16: [0.0, -1.5, 3.0e-30, 1.0e30, 256.0],
    torch.float16: [0.0, -1.5, 6.1e-5, 65504.0, 0.1],
    torch.float8_e4m3fn: [0.0, -1.5, 448.0, 0.015625, 0.875],
    torch.float8_e5m2: [0.0, -1.5, 57344.0, 1.52587890625e-05, 0.75],
    torch.int8: [0, -128, 127, 5, -7],
    torch.int16: [0, -32768, 32767, 1234, -4321],
    torch.int32: [0, -(2**31), 2**31 - 1, 2**30 + 1, -123456789],
    torch.uint8: [0, 255, 128, 1, 77],
    torch.uint16: [0, 65535, 32768, 1, 4097],
    torch.uint32: [0, 2**32 - 1, 2**31 + 1, 1, 16777217],
    torch.bool: [True, False, True, True, False],
}
DTYPES = list(_VALUES)


def _tensor(dtype: torch.dtype, rows: int = 4) -> torch.Tensor:
    vals = (_VALUES[dtype] * rows * 2)[: rows * 8]
    if dtype.is_floating_point:
        return torch.tensor(vals, dtype=torch.float64).to(dtype).reshape(rows, 8)
    return torch.tensor(vals, dtype=torch.int64).to(dtype).reshape(rows, 8)


def _bits(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of a tensor, to compare values bit for bit (NaNs and -0.0 included)."""
    return t.contiguous().view(torch.uint8).numpy()


@nki.jit
def copy_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return out


@nki.jit
def double_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, value=nl.add(t, t))
    return out


@nki.jit
def fill_kernel(x, dst: nt.mutable_tensor):
    nl.store(dst, value=nl.load(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_through_a_kernel(dtype):
    x = _tensor(dtype)
    y = copy_kernel(x)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == x.shape
    np.testing.assert_array_equal(_bits(y), _bits(x))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2], ids=str
)
def test_a_kernel_computes_on_the_values(dtype):
    x = torch.tensor([[0.5, -1.5, 2.0, 0.25]] * 4, dtype=torch.float64).to(dtype)
    y = double_kernel(x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(_bits(y), _bits((x.double() * 2).to(dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_mutable_argument_is_written_back(dtype):
    x = _tensor(dtype)
    dst = torch.zeros(4, 8, dtype=dtype)
    fill_kernel(x, dst)
    np.testing.assert_array_equal(_bits(dst), _bits(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.int32], ids=str)
def test_non_contiguous_tensors_cross_by_value(dtype):
    x = _tensor(dtype, rows=8).t()  # (8, 8), strided
    assert not x.is_contiguous()
    np.testing.assert_array_equal(_bits(copy_kernel(x)), _bits(x))
    dst = torch.zeros(8, 8, dtype=dtype).t()  # written through a copy, then copied back
    fill_kernel(x, dst)
    np.testing.assert_array_equal(_bits(dst), _bits(x))


def test_tensors_that_require_grad_are_read_detached():
    x = torch.ones(4, 8, requires_grad=True)
    y = double_kernel(x)
    assert not y.requires_grad and torch.equal(y, torch.full((4, 8), 2.0))


def test_the_converter_shares_memory_where_it_can():
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.bool):
        t = _tensor(dtype)
        a = to_numpy(t)
        assert np.shares_memory(a, t.view(torch.uint8).numpy())
        back = from_numpy(a)
        assert back.dtype == dtype and back.data_ptr() == t.data_ptr()
        assert from_numpy(a, (a,)).data_ptr() != t.data_ptr()  # an input is never returned
    assert to_numpy(_tensor(torch.bfloat16)).dtype == ml_dtypes.bfloat16
    assert to_numpy(_tensor(torch.float8_e5m2)).dtype == ml_dtypes.float8_e5m2


def test_dtype_names_both_ways():
    for dtype in DTYPES:
        assert torch_dtype(dtype_name(dtype)) is dtype
    with pytest.raises(TypeError, match="no torch equivalent"):
        torch_dtype("float8_e4m3")  # NKI's legacy e4m3 (max 240) has no torch dtype


def test_tensors_on_another_device_are_refused():
    with pytest.raises(TypeError, match="move the tensor from meta to 'cpu'"):
        copy_kernel(torch.empty(4, 8, device="meta"))


def test_numpy_calls_do_not_import_torch():
    code = (
        "import sys, numpy as np, nkikit as nki, nkikit.language as nl\n"
        "@nki.jit\n"
        "def k(x):\n"
        "    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, value=nl.load(x))\n"
        "    return out\n"
        "assert (k(np.ones((4, 4), np.float32)) == 1).all()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
