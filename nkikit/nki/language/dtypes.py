"""``nki.language.dtypes``: NKI 0.x data types.  Each is a numpy dtype (AWS documents
``nki.language.bfloat16 = dtype(bfloat16)``), so they work as dict keys and compare with
numpy's."""

from ... import dtypes as _dt

bool_ = _dt.bool_
bool = _dt.bool_  # noqa: A001 - the NKI Library uses nl.bool
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, float32, bfloat16, tfloat32 = _dt.float16, _dt.float32, _dt.bfloat16, _dt.tfloat32
float8_e4m3, float8_e4m3fn, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e4m3fn, _dt.float8_e5m2

# MX (microscaling) types: the scale type and the containers of packed values, only for
# quantize_mx / nc_matmul_mx (nkikit/dtypes.py packs and unpacks them)
float8_e4m3fn_x4, float8_e5m2_x4 = _dt.float8_e4m3fn_x4, _dt.float8_e5m2_x4
float4_e2m1fn_x4, float8_e8m0fnu = _dt.float4_e2m1fn_x4, _dt.float8_e8m0fnu

__all__ = [
    "bool_",
    "int8",
    "int16",
    "int32",
    "uint8",
    "uint16",
    "uint32",
    "float16",
    "float32",
    "bfloat16",
    "tfloat32",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fn_x4",
    "float8_e5m2_x4",
    "float4_e2m1fn_x4",
    "float8_e8m0fnu",
]
