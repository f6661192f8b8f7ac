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
* tanh (the ScalarE has no table for its derivative): ``gelu'(x) = h (1 - A w)`` with
  ``h = sigmoid(z)``, ``A = silu(-z)`` (both ScalarE), ``z = 2 k0 x (1 + k1 x^2)`` and
  ``w = 3 - 2 / (1 + k1 x^2)``; see ``_tanh_backward_tiles``.  Every instruction is
  elementwise (nothing sums over partitions), spread over the VectorE, ScalarE and GpSimd in
  wavefront units, the VectorE products reading one operand from PSUM where they can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit import dtypes

# Entry points take numpy arrays or CPU torch tensors (annotated as numpy) and return the same kind.

DTYPES = ("float32", "bfloat16")
APPROXIMATIONS = ("none", "tanh")
CHUNK = 2048  # columns per tile: 8 KiB (fp32) / 4 KiB (bf16) per partition per DMA
BANK = 512  # fp32 columns of one PSUM bank


@dataclass(frozen=True)
class TanhTuning:
    """How the tanh backward is laid out for one I/O dtype (see ``_tanh_backward_tiles``)."""

    unit: int  # columns per wavefront unit (PSUM steps split it into BANK-column pieces)
    ring: int  # units in flight: temporaries and PSUM banks rotate through this many slots
    tile_bytes: int  # about this many bytes per partition per column tile of g, x and out
    row_group: int  # row tiles whose units share one wavefront
    w_on: str  # per unit (cycled): engine of w = 3 - 2/p, "g" GpSimd or "v" VectorE


# Found by sweeping the trn2 model at [4096, 11008] and [4096, 4096].  bf16: 1024-column units
# halve the per-instruction overhead of the steps outside PSUM; fp32: smaller tiles leave SBUF
# for a second set of buffers, so the loads of the next tiles overlap the compute.
TANH_TUNING = {
    2: TanhTuning(unit=1024, ring=4, tile_bytes=24576, row_group=2, w_on="gvv"),
    4: TanhTuning(unit=512, ring=4, tile_bytes=12288, row_group=2, w_on="g"),
}
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
        tune = TANH_TUNING[x.itemsize]
        # column tiles of at most about tile_bytes per partition, whole units
        units = math.ceil(d / tune.unit)
        fc = min(d, tune.unit * math.ceil(units / math.ceil(d * x.itemsize / tune.tile_bytes)))
        one = _ones_column()

        def body(r0s, r, c0, w):
            _tanh_backward_tiles(grad, x, out, one, tune, [(r0, c0) for r0 in r0s], r, w)

        _for_tiles(n, d, fc, body, tune.row_group)
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


def _ones_column():
    """A (P, 1) fp32 column of ones: the ScalarE bias of ``m = 1 - v`` (an activation bias
    is a per-partition vector)."""
    pmax = nl.tile_size.pmax
    one = nl.ndarray((pmax, 1), dtype=nl.float32)
    one[...] = nisa.memset((pmax, 1), 1.0, dtype=nl.float32)
    return one


def _tanh_backward_tiles(grad, x, out, one, tune, origins, r, w):
    """``grad * gelu'(x)`` (tanh form) for rows ``r0 .. r0+r`` and columns ``c0 .. c0+w``.

    With ``u = k0 (x + k1 x^3)``, ``z = 2u``, ``h = sigmoid(z)`` and ``hn = sigmoid(-z)``:
    ``gelu'(x) = h (1 + hn R)``, ``R = 2 k0 x (1 + 3 k1 x^2)``.  With ``p = 1 + k1 x^2``,
    ``R = z w`` for ``w = (1 + 3 k1 x^2) / p = 3 - 2 / p``, and the ScalarE's ``silu(-z)`` is
    ``-z hn``, so ``gelu'(x) = h (1 - A w)`` with ``A = silu(-z)``.  Every instruction is
    elementwise (no engine sums over partitions): a non-finite input stays in its own output.

    The steps run on ``tune.unit``-column units, issued as a wavefront (unit j runs step s at
    program position j + s) so that each in-order engine always has an independent unit:

    0. GpSimd ``p' = x^2 + 1/k1`` (= p / k1; the 1/k1 folds into the ScalarE scales)
    1. GpSimd ``inner' = p' x`` (fp32); GpSimd or VectorE ``w = 3 - (2/k1) / p'``
    2. ScalarE ``h = sigmoid(2 k0 k1 inner')`` (x's dtype) and ``A = silu(-2 k0 k1 inner')``
       (fp32, straight into a PSUM bank)
    3. VectorE ``v = A w`` (A read from PSUM: N cycles, not 2N), in place
    4. ScalarE ``m = 1 - v`` (from PSUM)
    5. VectorE ``dg = m h``; 6. VectorE ``grad * dg``

    ``1 - v`` is where gelu' cancels (it crosses zero near x = -0.75), so everything up to it
    is fp32.  For bf16, ``h`` and ``m`` are rounded to bf16 after it (relative, not absolute,
    error) and steps 5-6 take the all-16-bit fast path; for fp32, ``m`` and ``dg`` stay in
    the PSUM bank so that steps 5-6 read one operand from PSUM.  ``inner'`` overflows fp32 for
    ``|x| >= 7.0e12``: such an element's output is NaN (torch: ``grad`` or 0 up to 1.8e19).
    """
    f32 = nl.float32
    gps, vec = nisa.engine.gpsimd, nisa.engine.vector
    chain = x.itemsize == 4  # fp32: m and dg stay in PSUM
    i_r = nl.arange(r)[:, None]
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
    uw = min(tune.unit, w)
    names = [("p", f32), ("inner", f32), ("w", f32), ("h", x.dtype)]
    if not chain:
        names += [("m", x.dtype), ("dg", x.dtype)]
    ring = {name: [nl.ndarray((r, uw), dtype=dt) for _ in range(tune.ring)] for name, dt in names}
    banks = [
        [nl.ndarray((r, min(BANK, uw - b0)), dtype=f32, buffer=nl.psum) for b0 in range(0, uw, BANK)]
        for _ in range(tune.ring)
    ]  # fmt: skip
    units = [
        (k * math.ceil(w / uw) + i, tile, u0, min(uw, w - u0))
        for k, tile in enumerate(tiles)
        for i, u0 in enumerate(range(0, w, uw))
    ]
    zk = 2.0 * _K0 * _K1  # z = zk * inner'

    def stage(s, j, tile, u0, n):
        _, _, g_tile, x_tile, y = tile
        slot = j % tune.ring
        xs = x_tile[i_r, u0 + nl.arange(n)[None, :]]

        def t(name, b0=0, m=n):
            return ring[name][slot][i_r, b0 + nl.arange(m)[None, :]]

        def ps(b0, m):
            return banks[slot][b0 // BANK][i_r, nl.arange(m)[None, :]]

        def cols(b0, m):
            return u0 + b0 + nl.arange(m)[None, :]

        pieces = [(b0, min(BANK, n - b0)) for b0 in range(0, n, BANK)]
        if s == 0:
            t("p")[...] = nisa.tensor_scalar(
                xs, nl.power, 2.0, op1=nl.add, operand1=1.0 / _K1, engine=gps, dtype=f32
            )
        elif s == 1:
            t("inner")[...] = nisa.tensor_tensor(t("p"), xs, nl.multiply, engine=gps, dtype=f32)
            t("w")[...] = nisa.tensor_scalar(
                t("p"), nl.divide, -2.0 / _K1, reverse0=True, op1=nl.add, operand1=3.0,
                engine=gps if _pick(tune.w_on, j) == "g" else vec, dtype=f32,
            )  # fmt: skip
        elif s == 2:
            t("h")[...] = nisa.activation(op=nl.sigmoid, data=t("inner"), scale=zk, dtype=x.dtype)
            for b0, m in pieces:
                ps(b0, m)[...] = nisa.activation(
                    op=nl.silu, data=t("inner", b0, m), scale=-zk, dtype=f32
                )
        elif s == 3:
            for b0, m in pieces:
                ps(b0, m)[...] = nisa.tensor_tensor(ps(b0, m), t("w", b0, m), nl.multiply)
        elif s == 4:
            for b0, m in pieces:
                dst = ps(b0, m) if chain else t("m", b0, m)
                dst[...] = nisa.activation(
                    op=nl.copy, data=ps(b0, m), scale=-1.0, bias=one[i_r, 0], dtype=dst.dtype
                )
        elif s == 5:
            if chain:
                for b0, m in pieces:
                    ps(b0, m)[...] = nisa.tensor_tensor(ps(b0, m), t("h", b0, m), nl.multiply)
            else:
                t("dg")[...] = nisa.tensor_tensor(t("m"), t("h"), nl.multiply)
        elif chain:
            for b0, m in pieces:
                y[i_r, cols(b0, m)] = nisa.tensor_tensor(
                    ps(b0, m), g_tile[i_r, cols(b0, m)], nl.multiply, dtype=x.dtype
                )
        else:
            y[i_r, cols(0, n)] = nisa.tensor_tensor(
                t("dg"), g_tile[i_r, cols(0, n)], nl.multiply, dtype=x.dtype
            )

    n_stages = 7
    for step in range(len(units) + n_stages - 1):
        for j, tile, u0, n in units:
            if 0 <= step - j < n_stages:
                stage(step - j, j, tile, u0, n)
    for r0, c0, _, _, y in tiles:
        nl.store(out[r0 + i_r, c0 + i_w], value=y)


def _pick(pattern: str, j: int) -> str:
    return pattern[j % len(pattern)]


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
