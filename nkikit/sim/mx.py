"""MX (OCP microscaling) numerics of NC-v4's ``quantize_mx`` and ``nc_matmul_mx``.

A *group* is 8 partitions x 4 consecutive values (32 values) sharing one scale, an 8-bit
biased exponent ``e`` (``float8_e8m0fnu`` or uint8) standing for ``2^(e - 127)``.  Data
lives in containers of 4 values (``nkikit.dtypes.pack_x4`` / ``unpack_x4``); the scale of
data partitions ``8i .. 8i + 7`` sits at partition ``(i // 4) * 32 + i % 4`` of the scale
tile (``nkikit.ir.prims.mx_scale_rows``) [reference/nki-0x.md §4.5, §4.11].
"""

from __future__ import annotations

import numpy as np

from .. import dtypes

# largest exponent of each quantized type: the "Emax" of the quantize_mx formula [nki-0x.md
# §4.11]
_EMAX = {"float8_e4m3fn_x4": 8, "float8_e5m2_x4": 15}
# X = 2^(floor(log2 amax) - (Emax - HEADROOM)): 1 is NKI 0.5+'s instruction docstring (2x the
# OCP sample scale, so the largest values round without saturating), which nkikit follows as
# reference/nki-0x.md §4.11 says; 0 would be the OCP sample algorithm of the docs' CPU golden
# (``quantize_mx_golden``), which the NKI Library's test goldens use too
HEADROOM = 1
_NAN_SCALE = 255  # e8m0's NaN


def scale_row(i: int) -> int:
    """Partition of the scale tile holding the scale of data partitions ``8i .. 8i + 7``."""
    return (i // 4) * 32 + i % 4


def _scale_bits(scale: np.ndarray) -> np.ndarray:
    """Biased exponents (int64) of a scale array held as uint8 or float8_e8m0fnu."""
    s = np.asarray(scale)
    if s.dtype != np.uint8:
        s = s.view(np.uint8)
    return s.astype(np.int64)


def quantize(src: np.ndarray, dst_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``src`` ``(P, F)`` (P a multiple of 8, F of 4) quantized for ``dst_dtype``
    (``float8_e4m3fn_x4`` or ``float8_e5m2_x4``): the containers ``(P, F / 4)`` (storage
    integers) and the biased scale exponents ``(P / 8, F / 4)`` (uint8), as the instruction
    docstring of NKI 0.5+ has it [nki-0x.md §4.11]:

    ``amax = max |v|`` over the group; ``X = 2^(floor(log2 amax) - (Emax - 1))`` (Emax 8 for
    e4m3fn, 15 for e5m2); an all-zero group gets ``X = 2^-127``; each value becomes ``v / X``
    rounded to the fp8 type (to nearest even; fp8 saturates as every nkikit cast does).  This
    is twice the scale of the OCP sample algorithm that the NKI docs' CPU golden
    (``quantize_mx_golden``) still uses (the documented discrepancy; nkikit follows the
    docstring).  The exponent is clamped to e8m0's range [0, 254]; a group holding a NaN or an
    infinity gets the NaN scale (255) and NaN values (not documented: a choice).
    """
    x = np.asarray(src, dtype=np.float32)
    p, f = x.shape
    groups = np.abs(x).reshape(p // 8, 8, f // 4, 4)
    with np.errstate(invalid="ignore"):
        amax = groups.max(axis=(1, 3))
    finite = np.isfinite(amax)
    _, e2 = np.frexp(np.where(finite & (amax > 0), amax, 1.0).astype(np.float32))
    # frexp: amax = m * 2^e2 with m in [0.5, 1), so floor(log2 amax) = e2 - 1
    biased = (e2.astype(np.int64) - 1) - (_EMAX[dtypes.name(dst_dtype)] - HEADROOM) + 127
    biased = np.clip(biased, 0, 254)
    biased = np.where(amax == 0, 0, biased)
    biased = np.where(finite, biased, _NAN_SCALE)
    factor = np.ldexp(np.float32(1.0), (biased - 127).astype(np.int32)).astype(np.float32)
    factor = np.where(biased == _NAN_SCALE, np.float32(np.nan), factor)
    per_value = np.repeat(np.repeat(factor, 8, axis=0), 4, axis=1)
    with np.errstate(invalid="ignore"):
        q = x / per_value
    return dtypes.pack_x4(q, dst_dtype), biased.astype(np.uint8)


def place_scales(tile: np.ndarray, rows: np.ndarray, as_dtype: np.dtype) -> np.ndarray:
    """``tile`` (the scale tile's old value) with scale row ``i`` of ``rows`` (uint8 biased
    exponents) written at partition ``scale_row(i)``, in ``as_dtype``'s bits."""
    out = np.array(tile, copy=True).reshape(tile.shape[0], -1)
    bits = rows.view(as_dtype) if as_dtype != np.uint8 else rows
    for i in range(rows.shape[0]):
        out[scale_row(i)] = bits[i]
    return out


def dequantize(data: np.ndarray, scale: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Containers ``data`` ``(P, n)`` of ``dtype`` with their scale tile ``scale`` as fp32
    values ``(P, n, 4)``: each value times ``2^(e - 127)`` of its group (NaN for e = 255)."""
    p, n = data.shape
    vals = dtypes.unpack_x4(data, dtype).reshape(p, n, 4)
    e = _scale_bits(scale).reshape(scale.shape[0], -1)[:, :n]
    rows = e[[scale_row(k // 8) for k in range(p)]]
    factor = np.ldexp(np.float32(1.0), (rows - 127).astype(np.int32)).astype(np.float32)
    factor = np.where(rows == _NAN_SCALE, np.float32(np.nan), factor)
    return vals * factor[:, :, None]


def matmul(
    stationary: np.ndarray,
    moving: np.ndarray,
    stationary_scale: np.ndarray,
    moving_scale: np.ndarray,
    stationary_dtype: np.dtype,
    moving_dtype: np.dtype,
) -> np.ndarray:
    """``dst[i, j] = sum over partitions k and packed values q of S[k, i, q] * M[k, j, q]``,
    S and M the dequantized operands (the NKI docs' golden model, ``nc_matmul_mx_golden``
    [nki-0x.md §4.5]), accumulated in fp32 as the TensorE does."""
    s = dequantize(stationary, stationary_scale, stationary_dtype)  # (K, M, 4)
    m = dequantize(moving, moving_scale, moving_dtype)  # (K, N, 4)
    k = s.shape[0]
    s2 = s.transpose(0, 2, 1).reshape(k * 4, s.shape[1])
    m2 = m.transpose(0, 2, 1).reshape(k * 4, m.shape[1])
    return np.matmul(s2.T, m2, dtype=np.float32)
