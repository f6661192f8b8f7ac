"""RMSNorm: ``y = x / sqrt(mean(x**2, axis=-1) + eps) * weight``.

Rows go on the 128 partitions, one tile of 128 rows per iteration of an ``affine_range`` loop
(row tiles are independent); the last tile is masked when the row count is not a multiple of
128.  Per tile, three compute instructions:

1. ScalarE ``activation_reduce``: square every element and sum along the free axis (fp32).
2. ScalarE ``activation``: ``rsqrt(sum * (1/D) + eps)``; the mean's scale and eps ride on the
   instruction's scale and bias, so no separate VectorE ops.
3. VectorE ``scalar_tensor_tensor``: ``(x * rstd) * weight``, rounded once to x's dtype.

``weight`` is loaded once and broadcast across the partitions (on the TensorE) before the loop.
"""

from __future__ import annotations

import math

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit import dtypes

# Entry points take numpy arrays or CPU torch tensors (annotated as numpy) and return the same kind.

DTYPES = ("float32", "bfloat16")
MAX_D = 8192  # x, x**2, y and the broadcast weight tiles must fit SBUF (192 KiB per partition)


@nki.jit
def rmsnorm_kernel(x, weight, eps):
    """RMSNorm of the rows of ``x`` [N, D] with ``weight`` [D]; returns [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax

    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(d)[None, :]
    i_one = nl.arange(1)[:, None]

    # Loop invariants: weight broadcast to all partitions, and eps as a (P, 1) bias operand.
    w_row = nl.load(weight.reshape((1, d))[i_one, i_f])
    w_tile = w_row.broadcast_to((pmax, d))
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)

    for t in nl.affine_range(math.ceil(n / pmax)):
        rows = t * pmax + i_p
        valid = rows < n
        x_tile = nl.load(x[rows, i_f], mask=valid)

        # sum(x**2) along the free axis; the squared tile itself is not needed
        sum_sq = nl.ndarray((pmax, 1), dtype=nl.float32)
        nisa.activation_reduce(
            op=nl.square, data=x_tile, reduce_op=nl.add, reduce_res=sum_sq, mask=valid
        )
        rstd = nisa.activation(op=nl.rsqrt, data=sum_sq, bias=eps_tile, scale=1.0 / d, mask=valid)
        y = nisa.scalar_tensor_tensor(
            data=x_tile,
            op0=nl.multiply,
            operand0=rstd,
            op1=nl.multiply,
            operand1=w_tile,
            dtype=x.dtype,
            mask=valid,
        )
        nl.store(out[rows, i_f], value=y, mask=valid)
    return out


def rmsnorm(x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    ``x``: [..., D] (any number of leading dims, flattened to rows); ``weight``: [D];
    numpy arrays or CPU torch tensors, both float32 or both bfloat16; 1 <= D <= 8192.
    Returns an array (tensor) of x's shape and dtype.  Raises ``ValueError`` for mismatched
    shapes and ``TypeError`` for an unsupported or mixed dtype.
    """
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError("rmsnorm: x must have at least one dimension")
    d = shape[-1]
    if tuple(weight.shape) != (d,):
        raise ValueError(
            f"rmsnorm: weight must have shape ({d},) to match x {shape}, got {tuple(weight.shape)}"
        )
    if not 1 <= d <= MAX_D:
        raise ValueError(f"rmsnorm: the last dimension must be in [1, {MAX_D}], got {d}")
    _check_dtypes("rmsnorm", x, weight)
    rows = math.prod(shape[:-1])
    if rows == 0:  # nothing to normalize; an empty kernel launch is not legal
        return x.copy() if hasattr(x, "copy") else x.clone()
    y = rmsnorm_kernel(x.reshape((rows, d)), weight, float(eps))
    return y.reshape(shape)


def _check_dtypes(fn: str, *arrays: np.ndarray) -> None:
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in arrays}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
