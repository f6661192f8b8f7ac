"""NKI data types as numpy dtypes (ml_dtypes for bf16 and fp8), promotion and rounding.

Engines compute in fp32 and round once when they write the destination; ``cast`` is that
rounding: round-to-nearest-even for floats (saturating for fp8), and round, saturate and
NaN -> 0 for integers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import as_strided as _as_strided

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
# tf32 is stored as fp32 whose mantissa is rounded to 10 bits; the metadata tells them apart.
tfloat32 = np.dtype(np.float32, metadata={"nki": "tfloat32"})
# The MX (microscaling) scale type: an unsigned 8-bit exponent, value 2^(e - 127), NaN = 0xFF
# [reference/nki-0x.md §3.11].
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
# MX data containers: four fp8 values in 32 bits, four fp4 values in 16 bits; only
# quantize_mx / nc_matmul_mx compute on them, copies move their bits [nki-0x.md §3.11].
# Structured dtypes so that each is a dtype of its own (``==`` and dict keys tell them from
# uint32 / uint16); memory holds them as their container integer (``storage_dtype``).
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", np.uint32)])
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", np.uint32)])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", np.uint16)])

_NAMES = {
    bool_: "bool",
    int8: "int8",
    int16: "int16",
    int32: "int32",
    uint8: "uint8",
    uint16: "uint16",
    uint32: "uint32",
    float16: "float16",
    float32: "float32",
    bfloat16: "bfloat16",
    float8_e4m3: "float8_e4m3",
    float8_e4m3fn: "float8_e4m3fn",
    float8_e5m2: "float8_e5m2",
    float8_e8m0fnu: "float8_e8m0fnu",
    float8_e4m3fn_x4: "float8_e4m3fn_x4",
    float8_e5m2_x4: "float8_e5m2_x4",
    float4_e2m1fn_x4: "float4_e2m1fn_x4",
}
_BY_NAME = {name: dt for dt, name in _NAMES.items()} | {"tfloat32": tfloat32, "bool_": bool_}
SUPPORTED = tuple(_NAMES) + (tfloat32,)
_SUPPORTED_IDS = frozenset(id(dt) for dt in SUPPORTED)


def is_tf32(dt: np.dtype) -> bool:
    return dt.metadata is not None and dt.metadata.get("nki") == "tfloat32"


def as_dtype(x: object) -> np.dtype:
    """Normalize a dtype given as numpy/ml_dtypes type, string or torch dtype."""
    if id(x) in _SUPPORTED_IDS:  # one of the dtype objects above (nl.float32, ...): as is
        return x  # type: ignore[return-value]
    if isinstance(x, np.dtype):
        dt = x
    elif isinstance(x, str):
        if x not in _BY_NAME:
            raise TypeError(f"unknown dtype {x!r}; NKI dtypes are {sorted(_BY_NAME)}")
        return _BY_NAME[x]
    elif type(x).__module__ == "torch":
        name = str(x).removeprefix("torch.")
        return as_dtype({"bool": "bool_"}.get(name, name))
    else:
        try:
            dt = np.dtype(x)  # type: ignore[arg-type]
        except TypeError as e:
            raise TypeError(f"{x!r} is not a dtype") from e
    if dt not in SUPPORTED and not is_tf32(dt):
        if dt == np.float64:
            raise TypeError("float64 is not an NKI dtype; use float32")
        if dt == np.int64:
            raise TypeError("int64 is not an NKI dtype; use int32")
        raise TypeError(f"{dt} is not an NKI dtype")
    return dt


def name(dt: np.dtype) -> str:
    if dt.metadata is not None and is_tf32(dt):
        return "tfloat32"
    # not ``_NAMES.get(dt, str(dt))``: str() of a dtype costs microseconds, paid per op
    n = _NAMES.get(dt)
    return str(dt) if n is None else n


def is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in (
        bfloat16,
        float8_e4m3,
        float8_e4m3fn,
        float8_e5m2,
        float8_e8m0fnu,
    )


def is_int(dt: np.dtype) -> bool:
    return dt.kind in "iub"


def _float_rank(dt: np.dtype) -> int:
    return {
        float8_e4m3: 1,
        float8_e4m3fn: 1,
        float8_e5m2: 1,
        float16: 2,
        bfloat16: 2,
        float32: 3,
    }.get(dt, 3)


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """NKI type promotion: (float, int) -> float; mixed floats of equal width widen."""
    if a == b:
        return a
    if is_float(a) and not is_float(b):
        return a
    if is_float(b) and not is_float(a):
        return b
    if is_float(a) and is_float(b):
        ra, rb = _float_rank(a), _float_rank(b)
        if ra != rb:
            return a if ra > rb else b
        # fp16 with bf16 -> fp32; e4m3 with e5m2 -> bf16
        return float32 if ra == 2 else bfloat16
    if {a, b} == {int32, uint32}:
        return float32
    return np.promote_types(a, b)


def scalar_dtype(value: object) -> np.dtype:
    """Weak type of a Python scalar: bool -> uint8, int -> int32, float -> float32."""
    if isinstance(value, bool | np.bool_):
        return uint8
    if isinstance(value, int | np.integer):
        return int32
    return float32


def poison_value(dt: np.dtype) -> float | int:
    """What a fresh buffer holds: NaN for floats, a sentinel for integers (all bits set for
    MX containers: four fp8 NaNs).  AWS's simulator fills integers with 4 [reference/nki-0x.md
    §6.4]; the dtype's largest value instead makes a runtime index read from an unwritten
    tile fail its bounds check rather than quietly pick row 4."""
    if dt in _X4:
        return np.iinfo(_X4[dt][1]).max
    if is_float(dt):
        return np.nan
    if dt == bool_:
        return True
    return np.iinfo(dt).max


def new_buffer(shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.full(shape, poison_value(dt), dtype=_storage(dt))


# -- NKI_PRECISE_FP=0 ------------------------------------------------------------------------
# AWS's simulator stores bf16 and fp8 tensors as ml_dtypes arrays (NKI_PRECISE_FP=1, its
# default since NKI 0.4); with NKI_PRECISE_FP=0 it holds them as fp32, written without
# rounding or saturation [reference/nki-0x.md §6.1].  ``wide_storage`` switches the simulators
# to that storage for the duration of one run: ``storage_dtype`` and ``cast`` are the only
# places the simulators learn how a dtype is stored and rounded.  fp16 is numpy's own type
# and stays rounded; the MX scale type (e8m0) and the x4 containers hold bits, not values.
WIDENED = frozenset({bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2})
_wide = False


@contextmanager
def wide_storage(on: bool = True) -> Iterator[None]:
    """While active (``on``), the simulators hold bf16 and fp8 tensors as unrounded fp32
    (``NKI_PRECISE_FP=0``).  Process-wide: the ranks of one run share it."""
    global _wide
    saved, _wide = _wide, on
    try:
        yield
    finally:
        _wide = saved


def is_wide() -> bool:
    """Whether bf16 / fp8 tensors are held as unrounded fp32 now (``wide_storage``)."""
    return _wide


def widen(a: np.ndarray) -> np.ndarray:
    """``a`` as the simulators store it now: an fp32 copy of a bf16 / fp8 array under
    ``wide_storage``, else ``a`` itself."""
    return a.astype(float32) if _wide and a.dtype in WIDENED else a


def _storage(dt: np.dtype) -> np.dtype:
    if dt.names is not None:  # an MX container
        return _X4[dt][1]
    if _wide and dt in WIDENED:
        return float32
    return float32 if is_tf32(dt) else dt


def storage_dtype(dt: np.dtype) -> np.dtype:
    return _storage(dt)


_FP8_MAX = {float8_e4m3: 240.0, float8_e4m3fn: 448.0, float8_e5m2: 57344.0}


def round_tf32(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # round-to-nearest-even on the 13 dropped mantissa bits
    lsb = (bits >> 13) & 1
    rounded = (bits + 0x0FFF + lsb) & np.uint32(0xFFFFE000)
    keep = ~np.isfinite(x)
    out = rounded.view(np.float32)
    return np.where(keep, x, out).astype(np.float32)


def cast(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Round an fp32 (or integer) array to ``dt`` once, as an engine writing its output does.
    An MX container is never converted (DMA and copies move its bits [nki-0x.md §3.11]): the
    value must already be container bits (a memset of 0 passes zeros).  Under
    ``wide_storage`` bf16 and fp8 values stay unrounded fp32."""
    if _wide and dt in WIDENED:  # NKI_PRECISE_FP=0: held as fp32, nothing rounded
        return np.asarray(x, dtype=float32)
    return round_to(x, dt)


def round_to(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``cast`` whatever the storage mode: the values ``dt`` can hold (MX containers pack
    real fp8 bits under ``NKI_PRECISE_FP=0`` too)."""
    if dt.names is not None:  # an MX container (the only structured dtypes): cheap to ask
        return np.asarray(x).astype(_X4[dt][1])
    if is_tf32(dt):
        return round_tf32(np.asarray(x, dtype=np.float32))
    if x.dtype == dt:
        return x
    if dt in _FP8_MAX:
        lim = _FP8_MAX[dt]
        xf = np.asarray(x, dtype=np.float32)
        return np.clip(xf, -lim, lim).astype(dt)
    if is_float(dt):
        if x.dtype == np.float64:
            x = x.astype(np.float32)
        return x.astype(dt)
    if dt == bool_:
        return np.asarray(x) != 0
    if is_float(x.dtype):
        info = np.iinfo(dt)
        xf = np.asarray(x, dtype=np.float64)
        xf = np.nan_to_num(np.rint(xf), nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(xf, info.min, info.max).astype(dt)
    info = np.iinfo(dt)
    return np.clip(x, info.min, info.max).astype(dt)


def as_strided(x: np.ndarray, shape: tuple[int, ...], strides) -> np.ndarray:
    """numpy's ``as_strided`` for every dtype of the simulators' memory.  numpy rebuilds the
    view from ``__array_interface__``, whose type string it cannot read back for some
    ml_dtypes types (``float8_e5m2`` reports ``'<f1'``): those go through the unsigned
    integer of their width, which views the same bytes."""
    if x.dtype.isbuiltin == 1 or x.dtype.kind == "V":  # numpy's own, or read back as bytes
        return _as_strided(x, shape, strides)
    word = np.dtype(f"u{x.dtype.itemsize}")
    return _as_strided(x.view(word), shape, strides).view(x.dtype)


def to_f32(x: np.ndarray) -> np.ndarray:
    """Widen to fp32 for computation (engines compute in fp32)."""
    dt = x.dtype
    if dt == np.float32:
        return x
    if dt == bfloat16:
        # a bf16 value is the top half of the fp32 with the same bits: widening by a shift
        # gives exactly ``astype``'s bits (every one of the 65536 patterns, NaNs included)
        # in ``astype``'s layout, at about twice its speed
        u = x.view(np.uint16).astype(np.uint32)
        u <<= 16
        return u.view(np.float32)
    lut = _WIDEN_8BIT.get(dt)
    if lut is not None and isinstance(x, np.ndarray):
        # an 8-bit float has 256 patterns: a table of ``astype``'s own results, read by
        # ``take`` into an array laid out as ``astype`` lays it out (same bits, ~4x faster)
        out = np.empty_like(x, dtype=np.float32)
        np.take(lut, x.view(np.uint8), out=out)
        return out
    return x.astype(np.float32)


# the fp32 value of every bit pattern of each 8-bit float (fp8 operands of matmuls, MX data)
_WIDEN_8BIT = {
    dt: np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
    for dt in (float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu)
}


# ---------------------------------------------------------------------------------------------
# MX containers: packing and unpacking (the only place that knows the bit layout)

# container dtype -> (element dtype, storage integer, values per container)
_X4: dict[np.dtype, tuple[np.dtype, np.dtype, int]] = {
    float8_e4m3fn_x4: (float8_e4m3fn, uint32, 4),
    float8_e5m2_x4: (float8_e5m2, uint32, 4),
    float4_e2m1fn_x4: (np.dtype(ml_dtypes.float4_e2m1fn), uint16, 4),
}


def is_x4(dt: np.dtype) -> bool:
    """Whether ``dt`` is an MX container (``float8_e4m3fn_x4``, ``float8_e5m2_x4``,
    ``float4_e2m1fn_x4``)."""
    return dt in _X4


def x4_element(dt: np.dtype) -> np.dtype:
    """The ml_dtypes type of the values an MX container holds (e.g. ``float8_e5m2``)."""
    return _X4[dt][0]


def pack_x4(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Pack ``values`` (``[..., 4 * n]``, any float dtype; rounded to the element type, fp8
    saturating) into ``[..., n]`` containers of ``dt``, as storage integers.  Value ``4j + q``
    of a row is sub-element ``q`` of container ``j``: byte ``q`` (fp8) or nibble ``q`` (fp4),
    counted from the least significant bits -- the layout of the NKI samples' MX golden model
    (``mx_cpu_utils.pack_mx_data_into_x4``: fp8 viewed as little-endian uint32, fp4 two per
    byte, low nibble first)."""
    elem, store, k = _X4[dt]
    v = np.asarray(values)
    if v.shape[-1] % k:
        raise ValueError(f"pack_x4: last dimension {v.shape[-1]} is not a multiple of {k}")
    if elem.itemsize == 1 and elem in _FP8_MAX:
        q = round_to(np.asarray(v, dtype=np.float32), elem)
    else:
        q = np.asarray(v, dtype=np.float32).astype(elem)
    bits = np.ascontiguousarray(q).view(np.uint8).astype(store)
    if elem.itemsize == 1 and elem in _FP8_MAX:
        width = 8
    else:
        width, bits = 4, bits & 0xF
    grouped = bits.reshape(*v.shape[:-1], v.shape[-1] // k, k)
    out = np.zeros(grouped.shape[:-1], dtype=store)
    for q_ in range(k):
        out |= grouped[..., q_] << store.type(width * q_)
    return out


def unpack_x4(packed: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The values of ``[..., n]`` containers of ``dt`` (storage integers or ``dt`` itself) as
    fp32 ``[..., 4 * n]`` (the inverse of :func:`pack_x4`)."""
    elem, store, k = _X4[dt]
    bits = np.asarray(packed)
    if bits.dtype != store:
        bits = bits.view(store)
    width = 8 if elem.itemsize == 1 and elem in _FP8_MAX else 4
    mask = store.type((1 << width) - 1)
    parts = [(bits >> store.type(width * q)) & mask for q in range(k)]
    codes = np.stack(parts, axis=-1).astype(np.uint8)
    vals = codes.view(elem).astype(np.float32)
    return vals.reshape(*bits.shape[:-1], bits.shape[-1] * k)


def alias_storage(base: np.ndarray, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Memory of a tensor that views ``base`` (a C-contiguous storage array) in ``shape`` and
    dtype ``dt``: a reshape, or a bit reinterpretation when the storage dtypes differ
    (``NkiTensor.view(dtype)``, ``.ap(dtype=...)``)."""
    sd = _storage(dt)
    if base.dtype == sd:
        return base.reshape(shape)
    return base.reshape(-1).view(sd).reshape(shape)
