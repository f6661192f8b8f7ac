"""nkikit.language takes the documented Beta-1 arguments and swallows none: what used to
vanish into ``**kwargs`` (or was accepted and ignored, like ``mask=`` on ``nl.transpose``) now
works, or is rejected with an NKI error name at the kernel's line; an unknown keyword is
Python's TypeError at the kernel's line.  Bad kernels mark the offending line ``# BAD``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
from nkikit.language import creation, ops

rng = np.random.default_rng(3)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_no_language_function_swallows_keywords():
    names = [n for n in dir(nl) if not n.startswith("_")]
    checked = 0
    for name in names:
        fn = getattr(nl, name)
        if not inspect.isfunction(fn) or fn.__module__ not in (
            nl.__name__,
            ops.__name__,
            creation.__name__,
        ):
            continue
        kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, f"nl.{name} takes **kwargs"
        checked += 1
    assert checked > 60  # the elementwise ops, reductions, creation, memory, loops


# -- mask= on transposes is over the input's axes --------------------------------------------


@nki.jit
def masked_transposes(x):
    p, f = x.shape
    out = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    out_t = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.arange(p)[:, None], nl.arange(f)[None, :]
    keep = (ip >= 5) & (jf < f - 2)
    a = nl.zeros((f, p), dtype=x.dtype)
    a[...] = nl.copy(nl.transpose(nl.load(x)[ip, jf], mask=keep))
    nl.store(out, value=a)
    b = nl.zeros((f, p), dtype=x.dtype)
    b[...] = nl.load_transpose2d(x[ip, jf], mask=keep)
    nl.store(out_t, value=b)
    return out, out_t


def test_transpose_masks_keep_the_input_region_they_name():
    x = f32(64, 48)
    written = np.zeros((48, 64), bool)
    written[: 48 - 2, 5:] = True  # input rows >= 5, columns < f-2, seen transposed
    for got in masked_transposes(x):
        np.testing.assert_array_equal(got[written], x.T[written])
        # elsewhere the destination keeps what it had (zeros, or NaN-poisoned fresh PSUM)
        assert not np.isclose(got[~written], x.T[~written]).any()


# -- softmax / rms_norm: compute_dtype, axis ------------------------------------------------


@nki.jit
def softmax_in(x, dtype, compute_dtype):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    y = nl.softmax(nl.load(x), axis=1, dtype=dtype, compute_dtype=compute_dtype)
    nl.store(out, value=nl.copy(y, dtype=nl.float32))
    return out


def test_compute_dtype_is_the_same_setting_as_dtype():
    x = f32(32, 64)
    by_dtype = softmax_in(x, nl.bfloat16, None)
    np.testing.assert_array_equal(softmax_in(x, None, nl.bfloat16), by_dtype)
    np.testing.assert_array_equal(softmax_in(x, nl.bfloat16, nl.bfloat16), by_dtype)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(by_dtype, e / e.sum(1, keepdims=True), rtol=1e-2, atol=1e-3)


@nki.jit
def rms_norm_two_dtypes(x, w):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t, wt, n = nl.load(x), nl.load(w), x.shape[1]
    y = nl.rms_norm(t, wt, 1, n, dtype=nl.float32, compute_dtype=nl.bfloat16)  # BAD
    nl.store(out, value=y)
    return out


@nki.jit
def softmax_partial_axes(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.softmax(nl.load(x), axis=2))  # BAD
    return out


def test_dtype_conflicts_and_partial_axes_are_rejected(rejects):
    err = rejects(rms_norm_two_dtypes, "err_invalid_argument", f32(16, 32), f32(16, 32))
    assert "give one of them" in str(err)
    err = rejects(softmax_partial_axes, "err_unsupported_api", f32(16, 4, 8))
    assert "nl.softmax(axis=2)" in str(err) and "[16, 4, 8]" in str(err)


# -- mod / fmod take dtype positionally, as in NKI ---------------------------------------------


@nki.jit
def fmod_positional(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.fmod(nl.load(x), 3.0, nl.float32))
    return out


def test_fmod_takes_dtype_positionally():
    x = np.linspace(-7, 7, 64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(fmod_positional(x), np.fmod(x, 3.0), atol=1e-6)


# -- rejected arguments and creations --------------------------------------------------------


@nki.jit
def print_masked(x):
    t = nl.load(x)
    nl.device_print("t", t, mask=(nl.arange(4)[:, None] < 2))  # BAD
    return None


@nki.jit
def hbm_zeros(x):
    out = nl.zeros(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)  # BAD
    return out


@nki.jit
def transpose_3d(x):
    out = nl.ndarray((8, 8, 4), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load_transpose2d(x))  # BAD
    return out


def test_rejections_name_the_nki_error(rejects):
    err = rejects(print_masked, "err_unsupported_api", f32(4, 8))
    assert "nl.device_print(mask=)" in str(err)
    err = rejects(hbm_zeros, "err_hbm_tensor_with_init_value_not_supported", f32(4, 8))
    assert err.detail.startswith("nl.zeros: HBM tensors") and "nl.store" in err.detail
    err = rejects(transpose_3d, "err_exceed_max_supported_dimension", f32(4, 8, 8))
    assert "at most 2" in str(err)


# -- unknown keywords ---------------------------------------------------------------------------


@nki.jit
def load_misspelled(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x, msak=None))  # BAD
    return out


@nki.jit
def ndarray_misspelled(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, bufer=nl.shared_hbm)  # BAD
    return out


@nki.jit
def loop_misspelled(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 4, unroll=2):  # BAD
        nl.store(out[i * 4 : i * 4 + 4, :], value=nl.load(x[i * 4 : i * 4 + 4, :]))
    return out


@pytest.mark.parametrize(
    "kernel,word",
    [(load_misspelled, "msak"), (ndarray_misspelled, "bufer"), (loop_misspelled, "unroll")],
)
def test_unknown_keywords_are_type_errors_at_the_kernel_line(type_error_at_bad_line, kernel, word):
    e = type_error_at_bad_line(kernel, f32(8, 8))
    assert f"unexpected keyword argument '{word}'" in str(e)
