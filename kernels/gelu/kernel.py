"""GELU, exact (erf) or tanh-approximated, forward and backward, as ``torch.nn.functional.gelu``.

``x`` is [..., D]; leading dims are flattened to rows.  Rows go on the 128 partitions and the
free axis is cut into column tiles; full tiles run in ``affine_range`` loops and the ragged
last row tile and column tile are peeled off with static sizes (``_for_tiles``), so no DMA
moves masked-out columns.

Forward: one ScalarE ``activation`` per tile of up to ``CHUNK`` columns (``gelu`` or
``gelu_apprx_tanh``), written in the I/O dtype.

Backward ``grad_x = g * gelu'(x)``:

* exact: ScalarE ``activation(gelu_dx)`` written in the I/O dtype, VectorE multiply by ``g``
  (all-bf16 fast path for bf16).
* tanh (the ScalarE has no table for its derivative): with ``inner = x (1 + k1 x^2)``,
  ``h = sigmoid(2 k0 inner)`` and ``hn = 1 - h``,
  ``gelu'(x) = h (1 + 2 k0 hn x (1 + 3 k1 x^2))`` and ``x (1 + 3 k1 x^2) = 3 inner - 2 x``.
  The work is spread over all five engines in 512-column units, one fp32 PSUM bank each, so
  that the VectorE products can read one operand from PSUM (N cycles instead of 2N) and the
  TensorE forms ``3 inner - 2 x`` there; see ``_tanh_backward_tiles``.
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
# tanh backward: units of one fp32 PSUM bank, in column tiles of at most about TANH_TILE_BYTES
# per partition (whole rows up to 12288 bf16 columns: long wavefronts, and the inputs and
# output of two row tiles plus the temporaries still fit SBUF)
UNIT = 512
TANH_TILE_BYTES = 24576
ROW_GROUP = 2  # tanh backward: row tiles whose units share one wavefront
RING = 6  # tanh backward: units in flight (temporaries and PSUM banks rotate through them)
_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715


@nki.jit
def gelu_kernel(x, approximate):
    """GELU of ``x`` [N, D]; ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    fn = nl.gelu_apprx_tanh if approximate == "tanh" else nl.gelu

    def body(r0s, r, c0, w):
        (r0,) = r0s
        i_r = nl.arange(r)[:, None]
        cols = c0 + nl.arange(w)[None, :]
        x_tile = nl.load(x[r0 + i_r, cols])
        y = nisa.activation(op=fn, data=x_tile, dtype=x.dtype)
        nl.store(out[r0 + i_r, cols], value=y)

    _for_tiles(n, d, min(d, CHUNK), body)
    return out


@nki.jit
def gelu_backward_kernel(grad, x, approximate):
    """``grad * gelu'(x)`` for ``grad``, ``x`` [N, D]; returns [N, D] in x's dtype."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    if approximate == "tanh":
        # column tiles of at most about TANH_TILE_BYTES per partition, whole UNIT-column units
        units = math.ceil(d / UNIT)
        fc = min(d, UNIT * math.ceil(units / math.ceil(d * x.itemsize / TANH_TILE_BYTES)))
        consts = _tanh_constants(x.dtype)

        def body(r0s, r, c0, w):
            _tanh_backward_tiles(grad, x, out, consts, [(r0, c0) for r0 in r0s], r, w)

        _for_tiles(n, d, fc, body, ROW_GROUP)
        return out

    def body(r0s, r, c0, w):
        (r0,) = r0s
        i_r = nl.arange(r)[:, None]
        cols = c0 + nl.arange(w)[None, :]
        g_tile = nl.load(grad[r0 + i_r, cols])
        x_tile = nl.load(x[r0 + i_r, cols])
        dg = nisa.activation(op=nl.gelu_dx, data=x_tile, dtype=x.dtype)
        # gelu'(x) is rounded to the I/O dtype once, so for bf16 the product runs on the
        # all-bf16 fast path (two roundings: within the bf16 tolerance, as torch's eager)
        y = nisa.tensor_tensor(dg, g_tile, nl.multiply, dtype=x.dtype)
        nl.store(out[r0 + i_r, cols], value=y)

    _for_tiles(n, d, min(d, CHUNK), body)
    return out


def _for_tiles(n, d, fc, body, group=1):
    """``body(row_starts, rows, first_col, cols)`` over [N, D] in 128 x ``fc`` tiles, ``group``
    row tiles per call: full tiles in ``affine_range`` loops; the leftover row tiles, the ragged
    last row tile and the ragged last column tile peeled off with static sizes (no masks, so no
    DMA moves masked-out columns)."""
    pmax = nl.tile_size.pmax

    def rows(r0s, r):
        for c in nl.affine_range(d // fc):
            body(r0s, r, c * fc, fc)
        if d % fc:
            body(r0s, r, d // fc * fc, d % fc)

    full = n // pmax
    for t in nl.affine_range(full // group):
        rows([(t * group + u) * pmax for u in range(group)], pmax)
    for u in range(full // group * group, full):
        rows([u * pmax], pmax)
    if n % pmax:
        rows([full * pmax], n % pmax)


def _tanh_constants(dtype):
    """Identity matrices for the TensorE steps: fp32 ``3 I`` (times an fp32 tile), and ``I``,
    ``-2 I`` in x's dtype (times x tiles; exact)."""
    pmax = nl.tile_size.pmax
    ident = nl.load(nl.shared_identity_matrix(pmax, dtype=nl.float32))
    three = nisa.tensor_scalar(ident, nl.multiply, 3.0, dtype=nl.float32)
    ident_x = nl.load(nl.shared_identity_matrix(pmax, dtype=dtype))
    neg_two = nisa.tensor_scalar(ident_x, nl.multiply, -2.0, dtype=dtype)
    return ident_x, three, neg_two


def _tanh_backward_tiles(grad, x, out, consts, origins, r, w):
    """``grad * gelu'(x)`` (tanh form) for rows ``r0 .. r0+r`` and columns ``c0 .. c0+w``.

    With ``inner = x (1 + k1 x^2)``, ``h = sigmoid(2 k0 inner)``, ``hn = 1 - h`` and
    ``r/(2 k0) = x (1 + 3 k1 x^2) = 3 inner - 2 x``:  ``gelu'(x) = h (1 + 2 k0 hn r/(2 k0))``.
    Every step runs on UNIT-column units (one fp32 PSUM bank), issued as a wavefront (unit j
    runs stage s at step j + s) so that each engine always has an independent unit to work on:

    0. TensorE ``x`` into PSUM (identity matmul); ScalarE ``x^2`` (fp32)
    1. GpSimd ``p = 1 + k1 x^2``
    2. VectorE ``inner = p * x`` (x read from PSUM: N cycles, not 2N)
    3. ScalarE ``h = sigmoid(2 k0 inner)`` (x's dtype), ``hn = sigmoid(-2 k0 inner)`` (fp32);
       TensorE ``3 inner - 2 x`` into the PSUM bank that held x
    4. VectorE ``v = hn * (3 inner - 2 x)`` (one operand in PSUM)
    5. GpSimd ``v1 = 1 + 2 k0 v``, rounded to x's dtype
    6. VectorE ``dg = v1 * h`` (all-16-bit fast path for bf16)
    7. GpSimd ``grad * dg``

    ``1 + 2 k0 v`` is where gelu' cancels (it crosses zero near x = -0.75), so everything up
    to it is fp32; the rounding of ``h`` and ``v1`` to bf16 costs relative, not absolute,
    accuracy (four bf16 roundings in all, within the bf16 tolerance).
    """
    ident_x, three, neg_two = consts
    f32 = nl.float32
    gps, vec = nisa.engine.gpsimd, nisa.engine.vector
    i_r = nl.arange(r)[:, None]
    i_rr = nl.arange(r)[None, :]
    i_w = nl.arange(w)[None, :]
    tiles = []
    for r0, c0 in origins:
        tiles.append(
            (
                r0,
                c0,
                nl.load(grad[r0 + i_r, c0 + i_w]),
                nl.load(x[r0 + i_r, c0 + i_w]),
                nl.ndarray((r, w), dtype=x.dtype),
            )
        )
    uw = min(UNIT, w)
    # temporaries rotate through RING slots (units in flight), one PSUM bank per slot
    ring = {
        name: [nl.ndarray((r, uw), dtype=dt) for _ in range(RING)]
        for name, dt in (("x2", f32), ("inner", f32), ("hn", f32), ("h", x.dtype),
                         ("v1", x.dtype), ("dg", x.dtype))
    }  # fmt: skip
    banks = [nl.ndarray((r, uw), dtype=f32, buffer=nl.psum) for _ in range(RING)]
    units = [
        (k * math.ceil(w / uw) + i, tile, u0, min(uw, w - u0))
        for k, tile in enumerate(tiles)
        for i, u0 in enumerate(range(0, w, uw))
    ]

    def stage(s, j, tile, u0, uw_):
        _, _, g_tile, x_tile, y = tile
        i_u = nl.arange(uw_)[None, :]
        xs = x_tile[i_r, u0 + i_u]

        def t(name):
            return ring[name][j % RING][i_r, i_u]

        ps = banks[j % RING][i_r, i_u]
        if s == 0:
            ps[...] = nisa.nc_matmul(ident_x[i_r, i_rr], xs)
            t("x2")[...] = nisa.activation(op=nl.square, data=xs, dtype=f32)
        elif s == 1:
            t("x2")[...] = nisa.tensor_scalar(
                t("x2"), nl.multiply, _K1, op1=nl.add, operand1=1.0, engine=gps
            )
        elif s == 2:
            t("inner")[...] = nisa.tensor_tensor(t("x2"), ps, nl.multiply, dtype=f32)
        elif s == 3:
            t("h")[...] = nisa.activation(
                op=nl.sigmoid, data=t("inner"), scale=2.0 * _K0, dtype=x.dtype
            )
            t("hn")[...] = nisa.activation(
                op=nl.sigmoid, data=t("inner"), scale=-2.0 * _K0, dtype=f32
            )
            ps[...] = nisa.nc_matmul(three[i_r, i_rr], t("inner"))
            ps += nisa.nc_matmul(neg_two[i_r, i_rr], xs)
        elif s == 4:
            t("hn")[...] = nisa.tensor_tensor(t("hn"), ps, nl.multiply, dtype=f32)
        elif s == 5:
            t("v1")[...] = nisa.tensor_scalar(
                t("hn"), nl.multiply, 2.0 * _K0, op1=nl.add, operand1=1.0, engine=gps,
                dtype=x.dtype,
            )  # fmt: skip
        elif s == 6:
            t("dg")[...] = nisa.tensor_tensor(t("v1"), t("h"), nl.multiply, engine=vec)
        else:
            y[i_r, u0 + i_u] = nisa.tensor_tensor(
                t("dg"), g_tile[i_r, u0 + i_u], nl.multiply, dtype=x.dtype, engine=gps
            )

    n_stages = 8
    for step in range(len(units) + n_stages - 1):
        for j, tile, u0, uw_ in units:
            if 0 <= step - j < n_stages:
                stage(step - j, j, tile, u0, uw_)
    for r0, c0, _, _, y in tiles:
        nl.store(out[r0 + i_r, c0 + i_w], value=y)


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
