"""Seeded kernel inputs in NKI dtypes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .. import dtypes

Shape = tuple[int, ...]


def round_to(x: object, dtype: object) -> np.ndarray:
    """``x`` rounded to the NKI ``dtype`` once (round-to-nearest-even, fp8 saturating), as an
    engine writing that dtype would.  ``tfloat32`` comes back as float32 storage with the
    metadata-tagged tf32 dtype, so the simulator sees a tf32 argument."""
    dt = dtypes.as_dtype(dtype)
    a = np.asarray(x)
    if dtypes.is_float(dt):
        out = dtypes.cast(np.asarray(a, dtype=np.float32), dt)
        return out.astype(dt) if dtypes.is_tf32(dt) else out
    return dtypes.cast(a, dt)


def _is_shape(x: object) -> bool:
    return isinstance(x, tuple | list) and all(isinstance(s, int | np.integer) for s in x)


def random_inputs(
    shapes: Sequence[Shape] | Mapping[str, Shape] | Shape,
    dtype: object = "float32",
    seed: int = 0,
    *,
    scale: float = 1.0,
    distribution: str = "normal",
) -> list[np.ndarray] | dict[str, np.ndarray] | np.ndarray:
    """Random arrays of ``dtype``, reproducible from ``seed``.

    ``shapes``: a list of shapes (returns a list), a mapping ``name -> shape`` (returns a dict
    in the same order) or one shape, a tuple of ints (returns one array).
    Floats are ``scale`` times a standard normal (``distribution="normal"``) or uniform on
    ``[-scale, scale)`` (``"uniform"``), then rounded to ``dtype`` (fp8 saturates at its
    maximum).  Integers are uniform in [-8, 8] (unsigned: [0, 16]) and bools are fair coins, so
    integer kernels never overflow by accident.
    Raises ``TypeError`` for a dtype NKI does not have, ``ValueError`` for an unknown
    distribution.
    """
    if distribution not in ("normal", "uniform"):
        raise ValueError(f"distribution must be 'normal' or 'uniform', got {distribution!r}")
    dt = dtypes.as_dtype(dtype)
    rng = np.random.default_rng(seed)

    def one(shape: Shape) -> np.ndarray:
        shape = tuple(int(s) for s in shape)
        if dt == dtypes.bool_:
            return rng.integers(0, 2, size=shape).astype(bool)
        if dtypes.is_int(dt):
            lo = 0 if np.iinfo(dt).min == 0 else -8
            return rng.integers(lo, lo + 17, size=shape).astype(dt)
        if distribution == "normal":
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        else:
            x = rng.uniform(-scale, scale, size=shape).astype(np.float32)
        return round_to(x, dt)

    if isinstance(shapes, Mapping):
        return {name: one(s) for name, s in shapes.items()}
    if _is_shape(shapes):
        return one(shapes)  # type: ignore[arg-type]
    return [one(s) for s in shapes]  # type: ignore[union-attr]
