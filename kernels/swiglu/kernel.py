"""SwiGLU gate: ``y = silu(a) * b`` (forward) and its gradients (backward).

``a`` and ``b`` are [..., D]; leading dims are flattened to rows.  Rows go on the 128
partitions (one ``affine_range`` iteration per 128-row tile, the last tile masked) and the free
axis is cut into chunks (the last chunk masked): ``CHUNK_BYTES`` per partition in the forward,
``BWD_CHUNK`` columns in the backward (both autotuned), so the SBUF working set stays small.

Forward, per (row tile, column chunk): ScalarE ``activation(silu)`` (fp32 out), then VectorE
``tensor_tensor`` multiply with ``b``, rounded once to the I/O dtype.

Backward (``grad_a = g * b * silu'(a)``, ``grad_b = g * silu(a)``), per chunk: the ScalarE makes
``silu(a)`` and ``silu_dx(a)`` (two activations); the three products are split between the
VectorE (``g * b`` then ``* silu'(a)``) and the GpSimd (``g * silu(a)``) so no engine carries
more than two passes over the chunk.
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
# Columns per tile, autotuned on the trn2 model (benchmarks/autotune/swiglu_before.md: 32
# shapes, chunks of 512-8192 columns).  Forward: 4 KiB per partition per DMA in either dtype
# (fp32 at 1024 columns is 1.15-1.27x faster than the 2048 columns it had; bf16 keeps 2048).
# Backward: 512 columns (1.03-1.13x over 2048): three loads and two stores per chunk, and
# smaller chunks let the next chunk's loads start while the engines work on this one.
CHUNK_BYTES = 4096
BWD_CHUNK = 512


@nki.jit
def swiglu_kernel(a, b, chunk=0):
    """``silu(a) * b`` for ``a``, ``b`` [N, D] of one dtype; returns [N, D] in that dtype.
    ``chunk``: columns per tile (a meta-parameter; 0: ``CHUNK_BYTES`` per partition)."""
    n, d = a.shape
    out = nl.ndarray((n, d), dtype=a.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    fc = min(d, chunk or CHUNK_BYTES // a.itemsize)
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(fc)[None, :]

    for t in nl.affine_range(math.ceil(n / pmax)):
        for c in nl.affine_range(math.ceil(d / fc)):
            rows = t * pmax + i_p
            cols = c * fc + i_f
            valid = (rows < n) & (cols < d)
            a_tile = nl.load(a[rows, cols], mask=valid)
            b_tile = nl.load(b[rows, cols], mask=valid)
            s = nisa.activation(op=nl.silu, data=a_tile, dtype=nl.float32, mask=valid)
            y = nisa.tensor_tensor(s, b_tile, nl.multiply, dtype=a.dtype, mask=valid)
            nl.store(out[rows, cols], value=y, mask=valid)
    return out


@nki.jit
def swiglu_backward_kernel(grad, a, b, chunk=BWD_CHUNK):
    """Gradients of ``silu(a) * b``: returns ``(grad_a, grad_b)``, each [N, D] in a's dtype.
    ``chunk``: columns per tile (a meta-parameter)."""
    n, d = a.shape
    grad_a = nl.ndarray((n, d), dtype=a.dtype, buffer=nl.shared_hbm)
    grad_b = nl.ndarray((n, d), dtype=a.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    fc = min(d, chunk)
    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(fc)[None, :]

    for t in nl.affine_range(math.ceil(n / pmax)):
        for c in nl.affine_range(math.ceil(d / fc)):
            rows = t * pmax + i_p
            cols = c * fc + i_f
            valid = (rows < n) & (cols < d)
            g_tile = nl.load(grad[rows, cols], mask=valid)
            a_tile = nl.load(a[rows, cols], mask=valid)
            b_tile = nl.load(b[rows, cols], mask=valid)
            s = nisa.activation(op=nl.silu, data=a_tile, dtype=nl.float32, mask=valid)
            ds = nisa.activation(op=nl.silu_dx, data=a_tile, dtype=nl.float32, mask=valid)
            gb = nisa.tensor_tensor(g_tile, b_tile, nl.multiply, dtype=nl.float32, mask=valid)
            ga = nisa.tensor_tensor(gb, ds, nl.multiply, dtype=a.dtype, mask=valid)
            gs = nisa.tensor_tensor(
                g_tile, s, nl.multiply, dtype=a.dtype, engine=nisa.engine.gpsimd, mask=valid
            )
            nl.store(grad_a[rows, cols], value=ga, mask=valid)
            nl.store(grad_b[rows, cols], value=gs, mask=valid)
    return grad_a, grad_b


def swiglu(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SwiGLU gate ``silu(a) * b`` elementwise (``silu(x) = x * sigmoid(x)``).

    ``a``, ``b``: [..., D] of the same shape (leading dims flattened to rows), numpy arrays or
    CPU torch tensors, both float32 or both bfloat16.  Returns a's shape and dtype.
    Raises ``ValueError`` for mismatched shapes and ``TypeError`` for an unsupported or mixed
    dtype.
    """
    shape, rows, d = _check("swiglu", a, b)
    if rows == 0 or d == 0:
        return a.copy() if hasattr(a, "copy") else a.clone()
    return swiglu_kernel(a.reshape((rows, d)), b.reshape((rows, d))).reshape(shape)


def swiglu_backward(grad: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradients of ``swiglu``: ``(grad * b * silu'(a), grad * silu(a))``, each of a's shape
    and dtype (``silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x)))``)."""
    shape, rows, d = _check("swiglu_backward", a, b, grad)
    if rows == 0 or d == 0:
        empty = a.copy() if hasattr(a, "copy") else a.clone()
        return empty, empty
    ga, gb = swiglu_backward_kernel(
        grad.reshape((rows, d)), a.reshape((rows, d)), b.reshape((rows, d))
    )
    return ga.reshape(shape), gb.reshape(shape)


def _check(fn: str, a: np.ndarray, *others: np.ndarray) -> tuple[tuple[int, ...], int, int]:
    shape = tuple(a.shape)
    if len(shape) == 0:
        raise ValueError(f"{fn}: inputs must have at least one dimension")
    for o in others:
        if tuple(o.shape) != shape:
            raise ValueError(f"{fn}: all inputs must have shape {shape}, got {tuple(o.shape)}")
    names = {dtypes.name(dtypes.as_dtype(x.dtype)) for x in (a, *others)}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
    return shape, math.prod(shape[:-1]), shape[-1]
