"""A jitted kernel called from inside another kernel is traced inline (a sub-kernel), in
both dialects."""

import numpy as np

import nkikit as nki
import nkikit.language as nl


@nki.jit
def double(t):
    return nl.multiply(t, 2.0)


@nki.jit
def outer(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], value=double(t))
    return out


def test_beta1_sub_kernel_is_inlined():
    x = np.random.default_rng(0).standard_normal((256, 32)).astype(np.float32)
    np.testing.assert_array_equal(outer(x), 2.0 * x)
    assert [op.prim for op, _ in outer.ir(x).ops()] == ["dma_copy", "tensor_scalar", "dma_copy"]
