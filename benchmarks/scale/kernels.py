"""The unrolled kernels the scale benchmark compiles: a Python ``for`` loop (unrolled by the
tracer) of load -> matmul -> copy -> store steps, and the same loop written with
``nl.static_range`` and ``nl.affine_range`` (the rotation comparison).

``make_unrolled(steps, blocks)`` walks ``blocks`` row blocks of its input over and over, so
that a million instructions need only ``blocks`` x 64 KiB of input: step ``i`` reads and
writes block ``i % blocks``.  Each step is 4 IR ops (a DMA load, a TensorE matmul into PSUM,
a VectorE copy out of PSUM, a DMA store) after one load of the stationary matrix.
"""

from __future__ import annotations

import nkikit as nki
import nkikit.language as nl

P = 128  # rows per block: one tile of partitions
F = 128  # columns: a 128 x 128 fp32 tile, one PSUM bank's half


def ops_for(steps: int) -> int:
    """IR ops of ``make_unrolled(steps, ...)``: the stationary load plus 4 per step."""
    return 1 + 4 * steps


def steps_for(ops: int) -> int:
    """The step count whose kernel has about ``ops`` IR ops."""
    return max(1, round((ops - 1) / 4))


def make_unrolled(steps: int, blocks: int):
    """A kernel ``(a: [blocks*128, 128] f32, w: [128, 128] f32) -> out`` with ``steps``
    unrolled steps; ``out[block b] = (w.T @ a[block b])`` for the last step on block b."""

    @nki.jit
    def unrolled(a, w):
        out = nl.ndarray((blocks * P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        wt = nl.load(w)
        for i in range(steps):
            b = i % blocks
            x = nl.load(a[b * P : (b + 1) * P, :])
            p = nl.matmul(wt, x, transpose_x=True)
            y = nl.copy(p, dtype=nl.float32)
            nl.store(out[b * P : (b + 1) * P, :], y)
        return out

    return unrolled


def make_loop(steps: int, form: str):
    """The rotation comparison: ``steps`` steps over distinct blocks of ``a`` ([steps*128,
    128] f32), as a ``range`` (``form="range"``), ``nl.static_range`` or ``nl.affine_range``
    loop.  The three compile to the same 16 + 34 * steps instructions."""
    loop = {"range": range, "static_range": nl.static_range, "affine_range": nl.affine_range}[form]

    @nki.jit
    def steps_kernel(a, w):
        out = nl.ndarray((steps * P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        wt = nl.load(w)
        for i in loop(steps):
            x = nl.load(a[i * P : (i + 1) * P, :])
            p = nl.matmul(wt, x, transpose_x=True)
            y = nl.copy(p, dtype=nl.float32)
            nl.store(out[i * P : (i + 1) * P, :], y)
        return out

    return steps_kernel
