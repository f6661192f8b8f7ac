"""NKI data types as numpy dtypes (ml_dtypes for bf16 and fp8), promotion and rounding.

Engines compute in fp32 and round once when they write the destination; ``cast`` is that
rounding: round-to-nearest-even for floats (saturating for fp8), and round, saturate and
NaN -> 0 for integers.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

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
    return dt.kind == "f" or dt in (bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2)


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
    """What a fresh buffer holds: NaN for floats, a sentinel for integers."""
    if is_float(dt):
        return np.nan
    if dt == bool_:
        return True
    return np.iinfo(dt).max


def new_buffer(shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.full(shape, poison_value(dt), dtype=_storage(dt))


def _storage(dt: np.dtype) -> np.dtype:
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
    """Round an fp32 (or integer) array to ``dt`` once, as an engine writing its output does."""
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
    return x.astype(np.float32)
