"""tensor_add against its numpy reference: hypothesis over shapes (ragged edge tiles in both
dimensions, N-D inputs) and every supported dtype, plus fixed examples, the tiled kernel's
row and column groups, the SPMD example's grid, the manifest and the error contract."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nkikit.testing import check_kernel, check_manifest, random_inputs
from nkikit.testing import strategies as nst

from . import kernel, reference


@given(
    shape=nst.shapes_2d(max_rows=3 * 128, max_free=1100),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_tensor_add_matches_reference(shape, dtype, seed):
    a, b = random_inputs([shape, shape], dtype, seed)
    check_kernel(kernel.tensor_add, reference.tensor_add, a, b, dtype=dtype)


@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple),
    dtype=nst.nki_dtypes(kernel.DTYPES),
    seed=nst.seeds(),
)
def test_tensor_add_any_rank(shape, dtype, seed):
    a, b = random_inputs([shape, shape], dtype, seed)
    check_kernel(kernel.tensor_add, reference.tensor_add, a, b, dtype=dtype)


@pytest.mark.parametrize("dtype", kernel.DTYPES)
@pytest.mark.parametrize("shape", [(128, 512), (256, 1024), (129, 513), (1, 1)])
def test_tensor_add_fixed_shapes(shape, dtype):
    a, b = random_inputs([shape, shape], dtype, seed=7)
    check_kernel(kernel.tensor_add, reference.tensor_add, a, b, dtype=dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float8_e5m2"])
@pytest.mark.parametrize(
    "shape",
    [
        (641, 100),  # 6 row tiles in groups of 4: the last group has two tiles past the end
        (130, 9000),  # column groups (9000 > 4 chunks for every dtype), ragged last chunk
        (5, 3),
    ],
)
def test_tensor_add_tiled_kernel_groups(shape, dtype):
    # the kernel directly, on views the wrapper would not pick (it uses [128, size/128] when
    # the size divides by 128); bf16 adds on the VectorE only, the others split with GpSimd
    a, b = random_inputs([shape, shape], dtype, seed=5)
    got = kernel.tensor_add_tiled_kernel(a, b)
    want = (a.astype(np.float64) + b.astype(np.float64)).astype(a.dtype)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_tensor_add_launches_the_tiled_kernel_once():
    from nkikit.trace.jit import JitKernel

    launches = []
    original = JitKernel.__call__

    def spy(self, *args, **kwargs):
        launches.append((self, tuple(x.shape for x in args)))
        return original(self, *args, **kwargs)

    a, b = random_inputs([(4, 64, 3), (4, 64, 3)], "float32", seed=6)
    JitKernel.__call__ = spy
    try:
        y = kernel.tensor_add(a, b)
    finally:
        JitKernel.__call__ = original
    np.testing.assert_array_equal(y, a + b)
    # 768 elements divide by 128: one launch on the contiguous [128, 6] view
    assert launches == [(kernel.tensor_add_tiled_kernel, ((128, 6), (128, 6)))]


def test_tensor_add_uses_one_program_per_tile():
    a, b = random_inputs([(300, 1100), (300, 1100)], "float32", seed=8)
    ir = kernel.tensor_add_kernel[3, 3].ir(a, b)
    assert ir.grid == (3, 3)
    np.testing.assert_array_equal(kernel.tensor_add_kernel[3, 3](a, b), a + b)


def test_tensor_add_fp8_saturates():
    big = np.full((2, 3), 300.0, np.float32)  # 288 in e4m3fn; 288 + 288 > 448, the max
    a = big.astype(kernel.dtypes.float8_e4m3fn)
    y = kernel.tensor_add(a, a)
    assert y.dtype == kernel.dtypes.float8_e4m3fn
    np.testing.assert_array_equal(y.astype(np.float32), 448.0)


def test_tensor_add_manifest():
    check_manifest(Path(__file__).parent, __package__)


def test_tensor_add_rejects_bad_inputs():
    with pytest.raises(ValueError, match="differ"):
        kernel.tensor_add(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="share one of"):
        kernel.tensor_add(np.zeros(3, np.float32), np.zeros(3, np.float16))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tensor_add_large(dtype):
    a, b = random_inputs([(2048, 4096), (2048, 4096)], dtype, seed=9)
    check_kernel(kernel.tensor_add, reference.tensor_add, a, b, dtype=dtype)
