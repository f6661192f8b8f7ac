"""Seeded kernel inputs in NKI dtypes, and the inputs a manifest function declares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import dtypes

if TYPE_CHECKING:
    from ..registry.manifest import FunctionSpec

Shape = tuple[int, ...]
Bounds = tuple[float, float]

# Host-only integer dtypes an input may have (torch's and numpy's index dtype); no NKI kernel
# computes in them, but entry points accept them (see nkikit.registry.manifest.HOST_DTYPES).
_HOST_INTS = {"int64": np.dtype(np.int64)}


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


def _as_dtype(dtype: object) -> np.dtype:
    if isinstance(dtype, str) and dtype in _HOST_INTS:
        return _HOST_INTS[dtype]
    if not isinstance(dtype, str) and np.dtype(dtype) == np.int64:  # type: ignore[call-overload]
        return _HOST_INTS["int64"]
    return dtypes.as_dtype(dtype)


def _per_array(value: Any, n: int, names: list[str] | None, what: str, is_one: Any) -> list[Any]:
    """`value` for each of n arrays: one value for all, a sequence (one each) or a mapping by
    name (only when the shapes were given by name)."""
    if is_one(value):
        return [value] * n
    if isinstance(value, Mapping):
        if names is None:
            raise ValueError(f"{what} given by name needs the shapes given by name")
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{what} names {unknown}, which are not among the shapes {names}")
        return [value.get(k) for k in names]
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{what} has {len(values)} entries for {n} shapes")
    return values


def random_inputs(
    shapes: Sequence[Shape] | Mapping[str, Shape] | Shape,
    dtype: object = "float32",
    seed: int = 0,
    *,
    scale: float = 1.0,
    distribution: str = "normal",
    bounds: Bounds | Sequence[Bounds | None] | Mapping[str, Bounds | None] | None = None,
) -> list[np.ndarray] | dict[str, np.ndarray] | np.ndarray:
    """Random arrays, reproducible from ``seed``.

    ``shapes``: a list of shapes (returns a list), a mapping ``name -> shape`` (returns a dict
    in the same order) or one shape, a tuple of ints (returns one array).
    ``dtype``: an NKI dtype (or ``int64``, the host index dtype) for every array, or one per
    array: a sequence in the order of ``shapes``, or a mapping by name when ``shapes`` is one.
    ``bounds``: ``(low, high)`` for every array, or per array as ``dtype`` (None: no bounds);
    values are then uniform in ``[low, high)`` (integers for an integer dtype).
    Without bounds, floats are ``scale`` times a standard normal (``distribution="normal"``) or
    uniform on ``[-scale, scale)`` (``"uniform"``), then rounded to the dtype (fp8 saturates at
    its maximum); integers are uniform in [-8, 8] (unsigned: [0, 16]) so integer kernels never
    overflow by accident, and bools are fair coins.
    Raises ``TypeError`` for a dtype NKI does not have, ``ValueError`` for an unknown
    distribution, per-array arguments that do not match ``shapes``, or empty bounds (an integer
    range needs an integer in it).
    """
    if distribution not in ("normal", "uniform"):
        raise ValueError(f"distribution must be 'normal' or 'uniform', got {distribution!r}")
    rng = np.random.default_rng(seed)
    if _is_shape(shapes) and not isinstance(shapes, Mapping):
        shape_list: list[Shape] = [tuple(shapes)]  # type: ignore[arg-type]
        names = None
    elif isinstance(shapes, Mapping):
        names = list(shapes)
        shape_list = [tuple(s) for s in shapes.values()]
    else:
        names = None
        shape_list = [tuple(s) for s in shapes]  # type: ignore[union-attr]
    n = len(shape_list)
    dts = [
        _as_dtype(d)
        for d in _per_array(
            dtype, n, names, "dtype", lambda v: isinstance(v, str) or not _is_collection(v)
        )
    ]
    bnds = _per_array(bounds, n, names, "bounds", _is_bounds)

    def one(shape: Shape, dt: np.dtype, b: Bounds | None) -> np.ndarray:
        shape = tuple(int(s) for s in shape)
        if dt == dtypes.bool_:
            if b is not None:
                raise ValueError("a bool array takes no bounds")
            return rng.integers(0, 2, size=shape).astype(bool)
        if dt.kind in "iu" or dtypes.is_int(dt):
            if b is None:
                lo, hi = (0, 17) if np.iinfo(dt).min == 0 else (-8, 9)
            else:
                lo, hi = int(np.ceil(b[0])), int(np.ceil(b[1]))
                if not lo < hi:
                    raise ValueError(f"bounds {tuple(b)} hold no integer")
            return rng.integers(lo, hi, size=shape).astype(dt)
        if b is not None:
            if not b[0] < b[1]:
                raise ValueError(f"bounds {tuple(b)} are empty")
            x = rng.uniform(b[0], b[1], size=shape).astype(np.float32)
            # rounding to a narrow dtype can reach high itself: keep the interval half-open
            return _below(round_to(x, dt), b[0], b[1])
        if distribution == "normal":
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        else:
            x = rng.uniform(-scale, scale, size=shape).astype(np.float32)
        return round_to(x, dt)

    arrays = [one(s, d, b) for s, d, b in zip(shape_list, dts, bnds)]
    if isinstance(shapes, Mapping):
        return dict(zip(shapes, arrays))
    if names is None and _is_shape(shapes):
        return arrays[0]
    return arrays


def _is_collection(v: object) -> bool:
    return isinstance(v, Mapping | list | tuple)


def _is_bounds(v: object) -> bool:
    return v is None or (
        isinstance(v, tuple | list)
        and len(v) == 2
        and all(isinstance(x, int | float | np.number) and not isinstance(x, bool) for x in v)
    )


def _below(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``a`` with values rounded up to ``hi`` moved to the largest representable value below."""
    if not (a.astype(np.float64) >= hi).any():
        return a
    below = np.nextafter(np.asarray(hi, a.dtype), np.asarray(lo, a.dtype))
    return np.where(a.astype(np.float64) >= hi, below, a).astype(a.dtype)


def example_inputs(
    spec: FunctionSpec,
    dtype: str | None = None,
    seed: int = 0,
    *,
    shapes: Sequence[Shape] | Mapping[str, Shape] | None = None,
    input_dtypes: Mapping[str, str] | None = None,
    scale: float = 1.0,
) -> list[np.ndarray]:
    """Random inputs for a manifest function, in its input order, as its manifest declares them.

    ``dtype``: the variant (one of ``spec.dtypes``; default the first): inputs without an
    ``input_dtypes`` entry get it, the others their first declared dtype (``input_dtypes``
    overrides that per input name, e.g. ``{"targets": "int64"}``).  ``shapes``: one per input
    (in order, or by name); default the manifest example.  Inputs with a declared ``ranges``
    entry are drawn uniformly from it, its shape references resolved against these shapes
    (e.g. class indices in ``[0, logits.shape[1])``); the rest as ``random_inputs`` draws them.
    Raises ``ValueError`` for shapes that do not match the inputs, ``ManifestError`` for a
    range that is empty at these shapes.
    """
    names = list(spec.inputs)
    if shapes is None:
        by_name = {n: tuple(spec.example[n]) for n in names}
    elif isinstance(shapes, Mapping):
        if set(shapes) != set(names):
            raise ValueError(f"{spec.name}: shapes must be given for exactly the inputs {names}")
        by_name = {n: tuple(shapes[n]) for n in names}
    else:
        if len(shapes) != len(names):
            raise ValueError(f"{spec.name}: {len(shapes)} shapes for the inputs {names}")
        by_name = {n: tuple(s) for n, s in zip(names, shapes)}
    overrides = dict(input_dtypes or {})
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"{spec.name}: input_dtypes names {unknown}, not inputs {names}")
    dts = {n: overrides.get(n) or spec.input_dtype(n, dtype) for n in names}
    bounds = {n: spec.input_range(n, by_name) for n in names}
    out = random_inputs(by_name, dts, seed, scale=scale, bounds=bounds)
    return [out[n] for n in names]  # type: ignore[index]
