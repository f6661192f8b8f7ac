"""NKI 0.x MX (NC-v4): quantize_mx and nc_matmul_mx against numpy models written here from
reference/nki-0x.md §4.5 / §4.11 (not from nkikit's own code), the x4 containers and
``view(dtype)`` / ``.ap(dtype=)``, and every rule rejecting a bad kernel at its own line.

The package conftest runs every kernel on both simulators (``NKIKIT_SIM=check``): each result
below is also the fast path's, bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nki0x_helpers import load as _load
from nki0x_helpers import rejects
from nki0x_helpers import store as _store

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit import dtypes

rng = np.random.default_rng(0)
E4M3, E5M2, E2M1 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn


@pytest.fixture(autouse=True)
def _trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


# -- numpy models (the reference's formulas, written independently) -------------------------------


def scale_partition(i: int) -> int:
    # scale row i (data partitions 8i..8i+7) at partition (i // 4) * 32 + i % 4 [§4.5]
    return (i // 4) * 32 + i % 4


def model_quantize(x: np.ndarray, elem, emax: int) -> tuple[np.ndarray, np.ndarray]:
    """(values (P, F) in ``elem``, biased scales (P/8, F/4)) per §4.11's docstring formula:
    X = 2^(floor(log2 amax) - (Emax - 1)), 2^-127 for an all-zero group, data = v / X."""
    p, f = x.shape
    x64 = x.astype(np.float64)
    scales = np.zeros((p // 8, f // 4), dtype=np.int64)
    vals = np.zeros_like(x64)
    for i in range(p // 8):
        for j in range(f // 4):
            g = x64[8 * i : 8 * i + 8, 4 * j : 4 * j + 4]
            amax = np.abs(g).max()
            e = 0 if amax == 0 else int(np.floor(np.log2(amax))) - (emax - 1) + 127
            scales[i, j] = e
            vals[8 * i : 8 * i + 8, 4 * j : 4 * j + 4] = g / 2.0 ** (e - 127)
    return vals.astype(elem), scales


def pack_fp8(v: np.ndarray) -> np.ndarray:
    # four consecutive fp8 values per little-endian uint32 (the samples' packing)
    return np.ascontiguousarray(v).view(np.uint32)


def pack_fp4(v: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(v).view(np.uint8) & 0xF
    bytes_ = b[..., 0::2] | (b[..., 1::2] << 4)
    return np.ascontiguousarray(bytes_).view(np.uint16)


def unpack(packed: np.ndarray, elem) -> np.ndarray:
    if elem is E2M1:
        b = np.ascontiguousarray(packed).view(np.uint8)
        nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)
        return nib.view(E2M1).astype(np.float64)
    return np.ascontiguousarray(packed).view(elem).astype(np.float64)


def model_matmul_mx(st, mv, st_scale, mv_scale, st_elem, mv_elem) -> np.ndarray:
    """dst[i, j] = sum_k sum_q S[k, i, q] M[k, j, q], each value times 2^(scale - 127) of
    its group, the scale of partition k read at partition scale_partition(k // 8) [§4.5]."""

    def deq(data, scale, elem):
        k = data.shape[0]
        v = unpack(data, elem).reshape(k, data.shape[1], 4)
        rows = np.array([scale_partition(p // 8) for p in range(k)])
        e = scale.astype(np.float64)[rows][:, : data.shape[1]]
        return v * (2.0 ** (e - 127))[:, :, None]

    return np.einsum("kiq,kjq->ij", deq(st, st_scale, st_elem), deq(mv, mv_scale, mv_elem))


def in_layout(rows: np.ndarray, partitions: int, fill: int) -> np.ndarray:
    tile = np.full((partitions, rows.shape[1]), fill, dtype=np.uint8)
    for i in range(rows.shape[0]):
        tile[scale_partition(i)] = rows[i]
    return tile


def mx_data(shape, elem) -> np.ndarray:
    """Random fp8/fp4 values, packed, with a few zeros and both signs."""
    v = (rng.standard_normal(shape) * 4).astype(elem)
    return pack_fp4(v) if elem is E2M1 else pack_fp8(v)


# -- kernels ------------------------------------------------------------------------------------


@nki.jit
def quantize_kernel(x, mx_dtype, scale_dtype, scale_parts):
    p, f = x.shape
    src = _load(x)
    data = nl.ndarray((p, f // 4), dtype=mx_dtype, buffer=nl.sbuf)
    scale = nl.ndarray((scale_parts, f // 4), dtype=scale_dtype, buffer=nl.sbuf)
    nisa.memset(dst=scale, value=7)
    nisa.quantize_mx(dst=data, src=src, dst_scale=scale)
    bits = nl.ndarray((p, f // 4), dtype=nl.uint32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=bits.ap([[f // 4, p], [1, f // 4]], dtype=mx_dtype), src=data)
    return bits, _store(scale)


@pytest.mark.parametrize(
    "mx_dtype, elem, emax", [("float8_e4m3fn_x4", E4M3, 8), ("float8_e5m2_x4", E5M2, 15)]
)
@pytest.mark.parametrize("p", [32, 64, 128])
def test_quantize_mx_follows_the_formula(mx_dtype, elem, emax, p):
    f = 64
    # groups of very different magnitudes, one all-zero group
    mag = 2.0 ** rng.integers(-20, 20, size=(p // 8, f // 4))
    x = rng.standard_normal((p, f)) * np.repeat(np.repeat(mag, 8, 0), 4, 1)
    x[0:8, 0:4] = 0.0
    x = x.astype(ml_dtypes.bfloat16)
    parts = 4 if p <= 32 else p
    bits, scale = quantize_kernel(x, getattr(nl, mx_dtype), nl.uint8, parts)
    want_vals, want_scale = model_quantize(x.astype(np.float32), elem, emax)
    np.testing.assert_array_equal(bits, pack_fp8(want_vals))
    np.testing.assert_array_equal(scale, in_layout(want_scale, parts, fill=7))


def test_quantize_mx_scales_as_e8m0_into_a_sliced_tile():
    # a scale tile shared by two quantizations: the second writes at partition offset 4
    p, f = 128, 32
    x = (rng.standard_normal((p, f)) * 3).astype(ml_dtypes.bfloat16)
    y = (rng.standard_normal((p, f)) / 5).astype(ml_dtypes.bfloat16)

    @nki.jit
    def k(x, y):
        scale = nl.ndarray((p, f // 4), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
        nisa.memset(dst=scale, value=1.0)
        qx = nl.ndarray((p, f // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        qy = nl.ndarray((p, f // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.quantize_mx(dst=qx, src=_load(x), dst_scale=scale)
        nisa.quantize_mx(dst=qy, src=_load(y), dst_scale=scale[4:p, :])
        return _store(scale.view(nl.uint8))

    scale = k(x, y)
    _, sx = model_quantize(x.astype(np.float32), E4M3, 8)
    _, sy = model_quantize(y.astype(np.float32), E4M3, 8)
    want = np.full((p, f // 4), 127, dtype=np.uint8)  # 1.0 in e8m0
    for i in range(p // 8):
        want[scale_partition(i)] = sx[i]
        want[4 + scale_partition(i)] = sy[i]
    np.testing.assert_array_equal(scale, want)


def test_mx_operands_may_be_strided_views_of_any_shape():
    # quantize_mx groups 4 consecutive free elements of the access (here a strided 3-D view),
    # and nc_matmul_mx takes 3-D operands and a 3-D dst: free elements in access order
    x = (rng.standard_normal((128, 4, 16)) * 2).astype(ml_dtypes.bfloat16)

    @nki.jit
    def k(x):
        t = _load(x)
        q = nl.ndarray((128, 2, 2), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        sc = nl.ndarray((128, 2, 2), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=sc, value=0)
        nisa.quantize_mx(dst=q, src=t[:, 1:4:2, 4:12], dst_scale=sc)
        acc = nl.ndarray((4, 1, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(acc, q, q, sc, sc)
        res = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        bits = nl.ndarray((128, 4), dtype=nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=bits.ap([[4, 128], [1, 4]], dtype=nl.float8_e5m2_x4), src=q)
        return bits, _store(sc), _store(res)

    bits, scale, res = k(x)
    src = x[:, 1:4:2, 4:12].reshape(128, 16).astype(np.float32)
    vals, rows = model_quantize(src, E5M2, 15)
    np.testing.assert_array_equal(bits, pack_fp8(vals))
    np.testing.assert_array_equal(scale.reshape(128, 4), in_layout(rows, 128, 0))
    want = model_matmul_mx(bits, bits, scale.reshape(128, 4), scale.reshape(128, 4), E5M2, E5M2)
    np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@nki.jit
def matmul_mx_kernel(st, st_scale, mv, mv_scale, st_dtype, mv_dtype, out_dtype):
    s = _load(st.view(st_dtype))
    v = _load(mv.view(mv_dtype))
    ss, vs = _load(st_scale), _load(mv_scale)
    acc = nl.ndarray((s.shape[1], v.shape[1]), dtype=out_dtype, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=s, moving=v, stationary_scale=ss, moving_scale=vs)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    return _store(res)


@pytest.mark.parametrize(
    "st_elem, mv_elem",
    [(E4M3, E4M3), (E5M2, E5M2), (E2M1, E2M1), (E2M1, E5M2), (E4M3, E2M1)],
)
@pytest.mark.parametrize("k", [32, 128])
def test_nc_matmul_mx_is_the_dequantized_matmul(st_elem, mv_elem, k):
    m, n = 32, 64
    st, mv = mx_data((k, 4 * m), st_elem), mx_data((k, 4 * n), mv_elem)
    parts = 4 if k <= 32 else k
    st_scale = in_layout(rng.integers(120, 134, (k // 8, m)).astype(np.uint8), parts, 0)
    mv_scale = in_layout(rng.integers(120, 134, (k // 8, n)).astype(np.uint8), parts, 0)
    name = {E4M3: "float8_e4m3fn_x4", E5M2: "float8_e5m2_x4", E2M1: "float4_e2m1fn_x4"}
    got = matmul_mx_kernel(
        st,
        st_scale,
        mv,
        mv_scale,
        getattr(nl, name[st_elem]),
        getattr(nl, name[mv_elem]),
        nl.float32,
    )
    want = model_matmul_mx(st, mv, st_scale, mv_scale, st_elem, mv_elem)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    got16 = matmul_mx_kernel(
        st,
        st_scale,
        mv,
        mv_scale,
        getattr(nl, name[st_elem]),
        getattr(nl, name[mv_elem]),
        nl.bfloat16,
    )
    np.testing.assert_allclose(got16, want, rtol=2**-7, atol=1e-3 * np.abs(want).max())


def test_quantize_then_matmul_mx_is_close_to_the_bf16_matmul():
    # A [512, 64] and B [512, 256] over a 512-long contraction: element q*128 + p of a column
    # is sub-element q of partition p (the MX layout [§4.5]), so the source tiles interleave
    kk, m, n = 512, 64, 256
    a = rng.standard_normal((kk, m)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)

    def interleave(x):  # [4 * 128, F] -> [128, F * 4]: out[p, 4f + q] = x[q * 128 + p, f]
        return np.ascontiguousarray(x.reshape(4, 128, -1).transpose(1, 2, 0).reshape(128, -1))

    @nki.jit
    def k(a, b):
        qa = nl.ndarray((128, m), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        qb = nl.ndarray((128, n), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        sa = nl.ndarray((128, m), dtype=nl.uint8, buffer=nl.sbuf)
        sb = nl.ndarray((128, n), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=qa, src=_load(a), dst_scale=sa)
        nisa.quantize_mx(dst=qb, src=_load(b), dst_scale=sb)
        acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=qa, moving=qb, stationary_scale=sa, moving_scale=sb)
        res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        return _store(res)

    got = k(interleave(a), interleave(b))
    exact = a.astype(np.float64).T @ b.astype(np.float64)
    # e4m3 keeps 3 mantissa bits: each product is within ~2^-3 relative, and the errors of
    # 512 terms mostly cancel; the bf16 matmul of the same data is the baseline
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert err < 0.05, err
    assert np.abs(got - exact).mean() < 0.05 * np.abs(exact).mean()


def test_matmul_mx_accumulates_across_calls():
    k_, m, n = 128, 16, 32
    st = [mx_data((k_, 4 * m), E4M3) for _ in range(3)]
    mv = [mx_data((k_, 4 * n), E5M2) for _ in range(3)]
    sc_s = in_layout(np.full((16, m), 127, np.uint8), 128, 0)
    sc_m = in_layout(np.full((16, n), 125, np.uint8), 128, 0)

    @nki.jit
    def k(s0, s1, s2, v0, v1, v2, ss, vs):
        ssb, vsb = _load(ss), _load(vs)
        acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
        for s, v in ((s0, v0), (s1, v1), (s2, v2)):
            nisa.nc_matmul_mx(
                dst=acc,
                stationary=_load(s.view(nl.float8_e4m3fn_x4)),
                moving=_load(v.view(nl.float8_e5m2_x4)),
                stationary_scale=ssb,
                moving_scale=vsb,
            )
        res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        return _store(res)

    got = k(*st, *mv, sc_s, sc_m)
    want = sum(model_matmul_mx(s, v, sc_s, sc_m, E4M3, E5M2) for s, v in zip(st, mv))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


# -- containers and views -----------------------------------------------------------------------


def test_pack_and_unpack_match_the_samples_layout():
    for dt, elem, pack in (
        (dtypes.float8_e4m3fn_x4, E4M3, pack_fp8),
        (dtypes.float8_e5m2_x4, E5M2, pack_fp8),
        (dtypes.float4_e2m1fn_x4, E2M1, pack_fp4),
    ):
        v = (rng.standard_normal((4, 16)) * 3).astype(elem)
        packed = dtypes.pack_x4(v.astype(np.float32), dt)
        np.testing.assert_array_equal(packed, pack(v))
        np.testing.assert_array_equal(dtypes.unpack_x4(packed, dt), v.astype(np.float32))


def test_view_reinterprets_bits_both_ways():
    x = rng.standard_normal((8, 16)).astype(np.float32)

    @nki.jit
    def k(x):
        t = _load(x)
        as_bytes = t.view(nl.uint8)  # (8, 64)
        back = as_bytes[:, 16:32].view(nl.float32)  # elements 4..7 of each row
        half = x.ap([[32, 8], [1, 32]], offset=0, dtype=nl.bfloat16)  # HBM, in bf16 units
        return _store(as_bytes), _store(back), _store(_load(half))

    b, back, half = k(x)
    assert b.shape == (8, 64) and half.shape == (8, 32)
    np.testing.assert_array_equal(b, x.view(np.uint8))
    np.testing.assert_array_equal(back, x[:, 4:8])
    np.testing.assert_array_equal(half.view(np.uint16), x.view(np.uint16))


# -- rejected kernels ---------------------------------------------------------------------------


BF = (rng.standard_normal((128, 64))).astype(ml_dtypes.bfloat16)


@nki.jit
def quantize_on(x):
    q = nl.ndarray((128, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((128, 16), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=_load(x), dst_scale=s)  # BAD
    return _store(s)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_mx_instructions_need_nc_v4(monkeypatch, target):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    err = rejects(quantize_on, "err_unsupported_instruction_on_target", BF)
    assert "trn3" in str(err)


@nki.jit
def quantize_fp32_src(x):
    src = _load(x)
    q = nl.ndarray((128, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((128, 16), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=src, dst_scale=s)  # BAD
    return _store(s)


@nki.jit
def quantize_to_fp4(x):
    q = nl.ndarray((128, 16), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((128, 16), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=_load(x), dst_scale=s)  # BAD
    return _store(s)


@nki.jit
def quantize_bf16_scale(x):
    q = nl.ndarray((128, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((128, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=_load(x), dst_scale=s)  # BAD
    return _store(s)


def test_bad_dtypes_are_rejected():
    rejects(quantize_fp32_src, "err_unsupported_dtype", BF.astype(np.float32))
    rejects(quantize_to_fp4, "err_unsupported_dtype", BF)
    rejects(quantize_bf16_scale, "err_unsupported_dtype", BF)


@nki.jit
def quantize_48_partitions(x):
    src = _load(x[0:48, :])
    q = nl.ndarray((48, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((48, 16), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=src, dst_scale=s)  # BAD
    return _store(s)


@nki.jit
def quantize_small_scale_tile(x):
    q = nl.ndarray((128, 16), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((16, 16), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=_load(x), dst_scale=s)  # BAD
    return _store(s)


@nki.jit
def quantize_odd_free(x):
    src = _load(x[:, 0:62])
    q = nl.ndarray((128, 15), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((128, 15), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=src, dst_scale=s)  # BAD
    return _store(s)


def test_bad_partitions_and_sizes_are_rejected():
    rejects(quantize_48_partitions, "err_invalid_argument", BF)
    err = rejects(quantize_small_scale_tile, "err_invalid_argument", BF)
    assert "at least 100" in str(err)
    rejects(quantize_odd_free, "err_invalid_argument", BF)


X4 = np.zeros((128, 64), dtype=np.uint32)
SC = np.full((128, 64), 127, dtype=np.uint8)


@nki.jit
def matmul_mx_wide_stationary(d, s):
    st = _load(d.view(nl.float8_e4m3fn_x4))
    big = nl.ndarray((128, 256), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    nisa.memset(dst=big, value=0)
    bs = nl.ndarray((128, 256), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=bs, value=127)
    acc = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.psum)
    ms = _load(s)
    nisa.nc_matmul_mx(acc, big, st, bs, ms)  # BAD
    return _store(_load(s))


@nki.jit
def matmul_mx_bf16_data(d, s):
    st = _load(d.view(nl.float8_e4m3fn_x4))
    wrong = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=wrong, value=0.0)
    acc = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
    sc = _load(s)
    nisa.nc_matmul_mx(acc, wrong, st, sc, sc)  # BAD
    return _store(_load(s))


@nki.jit
def matmul_mx_fp32_scale(d, s):
    st = _load(d.view(nl.float8_e4m3fn_x4))
    sc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=sc, value=1.0)
    acc = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(acc, st, st, sc, sc)  # BAD
    return _store(_load(s))


@nki.jit
def matmul_mx_scale_columns(d, s):
    st = _load(d.view(nl.float8_e4m3fn_x4))
    sc = _load(s)
    acc = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
    half = sc[:, 0:32]
    nisa.nc_matmul_mx(acc, st, st, half, sc)  # BAD
    return _store(sc)


def test_bad_matmul_mx_operands_are_rejected():
    rejects(matmul_mx_wide_stationary, "err_size_of_dimension_exceed_arch_limit", X4, SC)
    rejects(matmul_mx_bf16_data, "err_unsupported_dtype", X4, SC)
    rejects(matmul_mx_fp32_scale, "err_unsupported_dtype", X4, SC)
    rejects(matmul_mx_scale_columns, "err_invalid_argument", X4, SC)


@nki.jit
def x4_in_tensor_tensor(d, s):
    a = _load(d.view(nl.float8_e4m3fn_x4))
    o = nl.ndarray((128, 64), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=o, data1=a, data2=a, op=nl.add)  # BAD
    return _store(_load(s))


@nki.jit
def x4_dma_cast(d, s):
    a = _load(d.view(nl.float8_e4m3fn_x4))
    o = nl.ndarray((128, 64), dtype=nl.uint32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=a)  # BAD
    return o


@nki.jit
def x4_memset_nonzero(d, s):
    o = nl.ndarray((128, 64), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    nisa.memset(dst=o, value=1)  # BAD
    return _store(_load(s))


@nki.jit
def view_uneven(d, s):
    t = _load(s)
    u = t[:, 0:6].view(nl.float32)  # BAD
    return _store(u)


def test_mx_containers_are_only_moved_and_zeroed():
    rejects(x4_in_tensor_tensor, "err_unsupported_dtype", X4, SC)
    rejects(x4_dma_cast, "err_unsupported_dtype", X4, SC)
    rejects(x4_memset_nonzero, "err_unsupported_dtype", X4, SC)
    rejects(view_uneven, "err_invalid_argument", X4, SC)


def test_mx_ops_lower_and_cost_at_their_rates():
    # quantize_mx streams 4 source elements per partition per cycle (VectorE); nc_matmul_mx
    # takes a moving column (4 contraction values per row) per cycle, so its FLOPs per cycle
    # are 4x a bf16 matmul's [nki-0x.md §4.5, §4.11]
    from nkikit.compiler import lower as lowering
    from nkikit.compiler.allocate import allocate
    from nkikit.targets import get_target

    tgt = get_target("trn3")
    x = (rng.standard_normal((128, 4096))).astype(ml_dtypes.bfloat16)
    kq = quantize_kernel.ir(x, nl.float8_e4m3fn_x4, nl.uint8, 128)
    kinds = {k.opcode: k for k in lowering.lower(kq, tgt, allocate(kq, tgt)).kinds}
    assert kinds["QUANTIZE_MX"].cycles == 4096 / 4 + tgt.access_overhead_cycles
    km = matmul_mx_kernel.ir(X4, SC, X4, SC, nl.float8_e4m3fn_x4, nl.float8_e5m2_x4, nl.float32)
    mm = {k.opcode: k for k in lowering.lower(km, tgt, allocate(km, tgt)).kinds}["MATMUL_MX"]
    assert mm.cycles == 64  # max(min(64, M), N) with M = N = 64 containers
    assert mm.flops == 2 * (128 * 4) * 64 * 64
