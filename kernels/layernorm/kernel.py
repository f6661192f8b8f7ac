"""LayerNorm: ``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension.

Rows go on the 128 partitions (``affine_range`` over row tiles, last tile masked).  Per tile:

1. VectorE ``bn_stats`` on each chunk of up to 512 elements (its free-size limit), into one
   stats tile of 6 values per chunk; the ragged last chunk is masked.
2. VectorE ``bn_aggr``: combine the chunks into (mean, var) per row, numerically stable
   (Chan's parallel variance, no ``E[x^2] - E[x]^2`` cancellation).
3. ScalarE ``activation``: ``rstd = rsqrt(var + eps)`` (eps on the bias port).
4. VectorE ``scalar_tensor_tensor``: ``(x - mean) * weight`` (fp32).
5. VectorE ``scalar_tensor_tensor``: ``that * rstd + bias``, rounded once to x's dtype.

``weight`` and ``bias`` are loaded once and broadcast across the partitions before the loop.
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
MAX_D = 8192  # x, the fp32 intermediate, y and two broadcast parameter tiles must fit SBUF


@nki.jit
def layernorm_kernel(x, weight, bias, eps):
    """LayerNorm of the rows of ``x`` [N, D] with ``weight``/``bias`` [D]; returns [N, D]."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    chunk = min(d, nl.tile_size.bn_stats_fmax)
    n_chunks = math.ceil(d / chunk)

    i_p = nl.arange(pmax)[:, None]
    i_f = nl.arange(d)[None, :]
    i_one = nl.arange(1)[:, None]
    i_chunk = nl.arange(chunk)[None, :]
    i_stat = nl.arange(6)[None, :]

    # Loop invariants: the parameters broadcast to all partitions, eps as a (P, 1) bias operand.
    w_tile = nl.load(weight.reshape((1, d))[i_one, i_f]).broadcast_to((pmax, d))
    b_tile = nl.load(bias.reshape((1, d))[i_one, i_f]).broadcast_to((pmax, d))
    eps_tile = nl.full((pmax, 1), eps, dtype=nl.float32)

    for t in nl.affine_range(math.ceil(n / pmax)):
        rows = t * pmax + i_p
        valid = rows < n
        x_tile = nl.load(x[rows, i_f], mask=valid)

        stats = nl.ndarray((pmax, 6 * n_chunks), dtype=nl.float32)
        for c in nl.affine_range(n_chunks):
            cols = c * chunk + i_chunk
            # only the last chunk can be ragged; a mask the compiler can drop otherwise
            in_row = (valid & (cols < d)) if d % chunk else valid
            stats[i_p, c * 6 + i_stat] = nisa.bn_stats(
                x_tile[i_p, cols], mask=in_row, dtype=nl.float32
            )
        mean_var = nisa.bn_aggr(stats, mask=valid)
        mean = mean_var[i_p, 0]
        rstd = nisa.activation(op=nl.rsqrt, data=mean_var[i_p, 1], bias=eps_tile, mask=valid)

        xw = nisa.scalar_tensor_tensor(
            data=x_tile,
            op0=nl.subtract,
            operand0=mean,
            op1=nl.multiply,
            operand1=w_tile,
            dtype=nl.float32,
            mask=valid,
        )
        y = nisa.scalar_tensor_tensor(
            data=xw,
            op0=nl.multiply,
            operand0=rstd,
            op1=nl.add,
            operand1=b_tile,
            dtype=x.dtype,
            mask=valid,
        )
        nl.store(out[rows, i_f], value=y, mask=valid)
    return out


def layernorm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, eps: float = 1e-5
) -> np.ndarray:
    """LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``
    (population variance, as ``torch.nn.functional.layer_norm``).

    ``x``: [..., D] (leading dims flattened to rows); ``weight``, ``bias``: [D]; numpy arrays or
    CPU torch tensors, all float32 or all bfloat16; 1 <= D <= 8192.  Returns x's shape and dtype.
    Raises ``ValueError`` for mismatched shapes and ``TypeError`` for an unsupported or mixed dtype.
    """
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError("layernorm: x must have at least one dimension")
    d = shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if tuple(p.shape) != (d,):
            raise ValueError(
                f"layernorm: {name} must have shape ({d},) to match x {shape}, got {tuple(p.shape)}"
            )
    if not 1 <= d <= MAX_D:
        raise ValueError(f"layernorm: the last dimension must be in [1, {MAX_D}], got {d}")
    _check_dtypes("layernorm", x, weight, bias)
    rows = math.prod(shape[:-1])
    if rows == 0:  # nothing to normalize; an empty kernel launch is not legal
        return x.copy() if hasattr(x, "copy") else x.clone()
    y = layernorm_kernel(x.reshape((rows, d)), weight, bias, float(eps))
    return y.reshape(shape)


def _check_dtypes(fn: str, *arrays: np.ndarray) -> None:
    names = {dtypes.name(dtypes.as_dtype(a.dtype)) for a in arrays}
    if len(names) != 1 or not names <= set(DTYPES):
        raise TypeError(
            f"{fn}: inputs must all be one of {', '.join(DTYPES)}; got {', '.join(sorted(names))}"
        )
