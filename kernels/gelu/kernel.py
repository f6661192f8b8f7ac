"""GELU, exact (erf) or tanh-approximated, forward and backward, as ``torch.nn.functional.gelu``.

``x`` is [..., D]; leading dims are flattened to rows.  Rows go on the 128 partitions (one
``affine_range`` iteration per 128-row tile, the last tile masked) and the free axis is cut
into chunks of up to ``CHUNK`` columns (the last chunk masked): every DMA moves >= 2 KiB per
partition for realistic D while the SBUF working set stays small.

Forward: one ScalarE ``activation`` per chunk (``gelu`` or ``gelu_apprx_tanh``), written in the
I/O dtype.

Backward ``grad_x = g * gelu'(x)``:

* exact: ScalarE ``activation(gelu_dx)`` written in the I/O dtype, VectorE multiply by ``g``
  (all-bf16 fast path for bf16).
* tanh: with ``u = k0 (x + k1 x**3)`` and ``h = sigmoid(2u) = (1 + tanh u) / 2``,
  ``gelu'(x) = h * (1 + 2 k0 x (1 - h) (1 + 3 k1 x**2))``.  ScalarE: ``x**2``, the two affine
  maps of ``x**2`` (``tensor_scalar`` with two ops) and ``h``; GpSimd: ``x * p`` and ``x * q``;
  VectorE: ``(h - 1) r`` and ``(1 - w) h`` as two ``scalar_tensor_tensor``, and the final
  ``* g``.  Of the splits tried this is the fastest in the cost model (see README.md).
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
APPROXIMATIONS = ("none", "tanh")
CHUNK = 2048  # columns per tile: 8 KiB (fp32) / 4 KiB (bf16) per partition per DMA
_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715


@nki.jit
def gelu_kernel(x, approximate):
    """GELU of ``x`` [N, D]; ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    fc = min(d, CHUNK)
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(fc)[None, :]
    fn = nl.gelu_apprx_tanh if approximate == "tanh" else nl.gelu

    for t in nl.affine_range(math.ceil(n / pmax)):
        for c in nl.affine_range(math.ceil(d / fc)):
            rows = t * pmax + i_p
            cols = c * fc + i_f
            valid = (rows < n) & (cols < d)
            x_tile = nl.load(x[rows, cols], mask=valid)
            y = nisa.activation(op=fn, data=x_tile, dtype=x.dtype, mask=valid)
            nl.store(out[rows, cols], value=y, mask=valid)
    return out


@nki.jit
def gelu_backward_kernel(grad, x, approximate):
    """``grad * gelu'(x)`` for ``grad``, ``x`` [N, D]; returns [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    fc = min(d, CHUNK)
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(fc)[None, :]
    f32 = nl.float32
    gps = nisa.engine.gpsimd
    act = nisa.engine.scalar

    for t in nl.affine_range(math.ceil(n / pmax)):
        for c in nl.affine_range(math.ceil(d / fc)):
            rows = t * pmax + i_p
            cols = c * fc + i_f
            valid = (rows < n) & (cols < d)
            g_tile = nl.load(grad[rows, cols], mask=valid)
            x_tile = nl.load(x[rows, cols], mask=valid)
            if approximate == "tanh":
                # ScalarE: x^2, p = 1 + k1 x^2, q = 2 k0 (1 + 3 k1 x^2), h = sigmoid(2 k0 x p)
                x2 = nisa.activation(op=nl.square, data=x_tile, dtype=f32, mask=valid)
                p = nisa.tensor_scalar(
                    x2, nl.multiply, _K1, op1=nl.add, operand1=1.0, engine=act, mask=valid
                )
                q = nisa.tensor_scalar(
                    x2, nl.multiply, 6.0 * _K0 * _K1, op1=nl.add, operand1=2.0 * _K0,
                    engine=act, mask=valid,
                )  # fmt: skip
                # GpSimd: inner = x p (= x + k1 x^3), r = x q
                inner = nisa.tensor_tensor(
                    p, x_tile, nl.multiply, dtype=f32, engine=gps, mask=valid
                )
                r = nisa.tensor_tensor(q, x_tile, nl.multiply, dtype=f32, engine=gps, mask=valid)
                h = nisa.activation(
                    op=nl.sigmoid, data=inner, scale=2.0 * _K0, dtype=f32, mask=valid
                )
                # VectorE: w = (h - 1) r ; gelu'(x) = (1 - w) h
                w = nisa.scalar_tensor_tensor(
                    data=h, op0=nl.subtract, operand0=1.0, op1=nl.multiply, operand1=r,
                    dtype=f32, mask=valid,
                )  # fmt: skip
                dg = nisa.scalar_tensor_tensor(
                    data=w, op0=nl.subtract, operand0=1.0, reverse0=True, op1=nl.multiply,
                    operand1=h, dtype=x.dtype, mask=valid,
                )  # fmt: skip
                mul_engine = nisa.engine.vector
            else:
                dg = nisa.activation(op=nl.gelu_dx, data=x_tile, dtype=x.dtype, mask=valid)
                mul_engine = nisa.engine.vector
            # gelu'(x) is rounded to the I/O dtype once, so for bf16 the product runs on the
            # all-bf16 fast path (two roundings: within the bf16 tolerance, as torch's eager)
            y = nisa.tensor_tensor(
                dg, g_tile, nl.multiply, dtype=x.dtype, engine=mul_engine, mask=valid
            )
            nl.store(out[rows, cols], value=y, mask=valid)
    return out


def gelu(x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """GELU elementwise, as ``torch.nn.functional.gelu(x, approximate=...)``.

    ``approximate="none"``: ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``; ``"tanh"``:
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``.
    ``x``: any shape with at least one dimension, numpy array or CPU torch tensor of float32 or
    bfloat16.  Returns x's shape and dtype.  Raises ``ValueError`` for an unknown
    ``approximate`` and ``TypeError`` for an unsupported dtype.
    """
    shape, rows, d = _check("gelu", approximate, x)
    if rows == 0 or d == 0:
        return x.copy() if hasattr(x, "copy") else x.clone()
    return gelu_kernel(x.reshape((rows, d)), approximate).reshape(shape)


def gelu_backward(grad: np.ndarray, x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """Gradient of ``gelu``: ``grad * gelu'(x)`` (a 1-tuple, one gradient per input)."""
    shape, rows, d = _check("gelu_backward", approximate, x, grad)
    if rows == 0 or d == 0:
        return (x.copy() if hasattr(x, "copy") else x.clone(),)
    out = gelu_backward_kernel(grad.reshape((rows, d)), x.reshape((rows, d)), approximate)
    return (out.reshape(shape),)


def _check(fn: str, approximate: str, x: np.ndarray, *others: np.ndarray):
    if approximate not in APPROXIMATIONS:
        raise ValueError(
            f"{fn}: approximate must be one of {', '.join(map(repr, APPROXIMATIONS))}, "
            f"got {approximate!r}"
        )
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError(f"{fn}: x must have at least one dimension")
    for o in others:
        if tuple(o.shape) != shape:
            raise ValueError(f"{fn}: grad must have shape {shape}, got {tuple(o.shape)}")
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in (x, *others)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    return shape, math.prod(shape[:-1]), shape[-1]
