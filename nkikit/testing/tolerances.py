"""Per-dtype comparison tolerances for kernels checked against a numpy reference.

A kernel's error against a reference computed in float64 on the same (already rounded) inputs
has two sources:

* rounding on write: every engine computes in fp32 and rounds once to the destination dtype,
  so a kernel that keeps a few intermediates in its I/O dtype loses a few half-ulps of that
  dtype.  This part depends on the dtype only.
* fp32 arithmetic: accumulation order in reductions and matmuls, rsqrt/exp in fp32.  This part
  depends on what the kernel computes (``op_kind``) and is negligible next to the rounding of
  any dtype narrower than fp32.

``tolerance(dtype, op_kind)`` is the sum of the two.  The dtype part follows
``torch.testing.assert_close`` where torch has the dtype (fp32, fp16, bf16) and is derived from
the mantissa width elsewhere (tf32, fp8: two ulps relative, an absolute floor near the smallest
normal).  Integers compare exactly.  ``allclose`` semantics: ``|out - ref| <= atol + rtol*|ref|``.

The absolute parts assume inputs of unit scale (``random_inputs`` draws standard normals) and
matmul contractions up to a few thousand; for data of scale s, or much longer reductions, pass
an ``atol`` scaled accordingly.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import dtypes


class Tolerance(NamedTuple):
    """Relative and absolute tolerance for ``|out - ref| <= atol + rtol * |ref|``."""

    rtol: float
    atol: float

    def __add__(self, other: object) -> Tolerance:  # type: ignore[override]
        if not isinstance(other, Tolerance):
            return NotImplemented
        return Tolerance(self.rtol + other.rtol, self.atol + other.atol)

    def loosest(self, other: Tolerance) -> Tolerance:
        """The element-wise maximum: with mixed dtypes the loosest tolerance wins."""
        return Tolerance(max(self.rtol, other.rtol), max(self.atol, other.atol))


# Rounding part, by dtype name.  Values: rtol ~ two ulps (2**-mantissa_bits) except where torch's
# defaults are looser; atol covers results that cancel to (near) zero.
DTYPE_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(1.3e-6, 1e-5),  # torch default
    "tfloat32": Tolerance(2e-3, 1e-4),  # 10 mantissa bits: 2 ulps = 2**-9
    "bfloat16": Tolerance(1.6e-2, 1e-5),  # torch default (2 ulps of 7 mantissa bits)
    "float16": Tolerance(2e-3, 1e-5),  # 2 ulps of 10 mantissa bits (torch uses 1e-3: 1 ulp)
    "float8_e4m3": Tolerance(0.125, 2.0**-5),  # 3 mantissa bits; min normal 2**-6
    "float8_e4m3fn": Tolerance(0.125, 2.0**-5),
    "float8_e5m2": Tolerance(0.25, 2.0**-5),  # 2 mantissa bits
}

# fp32 arithmetic part, by what the kernel computes.
OP_KINDS: dict[str, Tolerance] = {
    # one ALU/activation per output element (add, multiply, copy, cast)
    "elementwise": Tolerance(0.0, 0.0),
    # exp, log, rsqrt, gelu ...: a few fp32 ulps from the function itself
    "transcendental": Tolerance(2e-6, 1e-6),
    # free-axis sums/max over up to ~10^4 elements in fp32 (sequential-order error ~ sqrt(n) ulps)
    "reduction": Tolerance(1e-5, 1e-5),
    # reduction + rsqrt + scale (rmsnorm, layernorm, softmax)
    "normalization": Tolerance(2e-5, 2e-5),
    # PSUM accumulation over K in fp32; results cancel towards zero, so atol grows too
    "matmul": Tolerance(2e-5, 1e-4),
}

_EXACT = Tolerance(0.0, 0.0)


def tolerance(dtype: object, op_kind: str = "elementwise") -> Tolerance:
    """The tolerance for comparing a kernel whose tiles are in ``dtype`` with a float64 reference.

    ``dtype``: an NKI dtype (numpy/ml_dtypes dtype, name such as ``"bfloat16"``).
    ``op_kind``: one of ``OP_KINDS`` (``elementwise``, ``transcendental``, ``reduction``,
    ``normalization``, ``matmul``).  Integer and bool dtypes are exact for every kind.
    Raises ``TypeError`` for a dtype NKI does not have and ``ValueError`` for an unknown kind.
    """
    if op_kind not in OP_KINDS:
        raise ValueError(f"unknown op_kind {op_kind!r}; expected one of {sorted(OP_KINDS)}")
    dt = dtypes.as_dtype(dtype)
    if dtypes.is_int(dt):
        return _EXACT
    name = dtypes.name(dt)
    if name not in DTYPE_TOLERANCES:  # pragma: no cover - every NKI float is in the table
        raise TypeError(f"no tolerance for dtype {name}")
    return DTYPE_TOLERANCES[name] + OP_KINDS[op_kind]


def loosest_tolerance(dts: list[object], op_kind: str = "elementwise") -> Tolerance:
    """The loosest ``tolerance`` over several dtypes (inputs and outputs of one kernel)."""
    tol = _EXACT
    for dt in dts:
        tol = tol.loosest(tolerance(dt, op_kind))
    return tol
