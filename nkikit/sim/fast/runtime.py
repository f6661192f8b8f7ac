"""What a compiled kernel runs with: the helpers generated code calls, and :class:`Program`.

Each helper does what one step of the reference interpreter does (``Interpreter.write``,
``indirect_index``, a rule with every element valid), with the same numpy calls in the same
order, minus the checks the compiler already proved unnecessary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import dtypes
from ...errors import NkiError, NkiInternalError
from ...ir.core import Kernel
from ...ir.prims import PrimError
from ..blas import one_blas_thread
from ..interp import Interpreter
from ..memory import reserve

# float dtypes numpy's own cast loop rounds exactly as ``dtypes.cast`` does
DIRECT_CAST = {dtypes.float32, dtypes.bfloat16, dtypes.float16}


# the reference's ``to_f32`` for a value read from memory (the same function: the same bits)
f32 = dtypes.to_f32


def prep(value: Any, shape: tuple[int, ...], size: int, dt: np.dtype) -> np.ndarray:
    """The value ``Interpreter.write`` stores: shaped like the access, rounded to ``dt``."""
    value = np.asarray(value)
    if value.shape != shape:
        if value.size != size:  # the reference's write raises too: a bug, not a broadcast
            raise PrimError(f"a rule produced {value.shape} for a {shape} destination")
        value = value.reshape(shape)
    value = dtypes.cast(value, dt)
    if dtypes.is_tf32(dt):
        value = value.astype(np.float32)
    return value


def write(view: np.ndarray, value: Any, shape: tuple[int, ...], size: int, dt: np.dtype) -> None:
    """The reference's ``Interpreter.write`` for an unmasked, in-bounds, precomputed view."""
    view[...] = prep(value, shape, size, dt)


def ind(axes: tuple, bases: tuple, d: int, rt: np.ndarray, shape: tuple[int, ...]) -> tuple:
    """The reference's ``indirect_index`` without a mask or bounds checks: per dimension the
    tile-axis part (a constant int array) plus the loop-dependent part, and along dimension
    ``d`` the index tile's values ``rt``."""
    idx = []
    for k, (ax, b) in enumerate(zip(axes, bases)):
        v = np.broadcast_to(np.asarray(ax + b, dtype=np.int64), shape)
        if k == d:
            v = v + np.broadcast_to(rt.astype(np.int64), shape)
        idx.append(v)
    return tuple(idx)


def last_rows(rows: np.ndarray) -> np.ndarray | None:
    """For a scatter of whole rows (``executors._rows_form``): None when no two runtime row
    indices are equal, else the partitions, ascending, whose row no later partition writes
    again.  Two partitions with one row index write the same elements, and the reference's
    scatter keeps the last write in element order (partition-major): the later partition's."""
    found, first_from_end = np.unique(rows[::-1], return_index=True)
    if found.size == rows.size:
        return None
    return np.sort(rows.size - 1 - first_from_end)


def strided_view(x: np.ndarray, spec: tuple, shape: tuple[int, ...]) -> np.ndarray:
    """The reference's ``Interpreter._strided``: from ``x`` (the tensor sliced from the
    tile's first element) the view whose tile axis k steps ``c`` elements along each tensor
    dimension d of ``spec``'s (k, d, c)."""
    strides = [0] * len(shape)
    xs = x.strides
    for k, d, c in spec:
        strides[k] += c * xs[d]
    return dtypes.as_strided(x, shape, strides)


def copy(view: np.ndarray, value: np.ndarray, dt: np.dtype) -> None:
    """``write`` for a value already of the destination's shape: same-dtype and plain
    float-to-float casts go straight into the destination (numpy's cast loop is the one
    ``astype`` uses, so the bits are the same)."""
    if value.shape != view.shape and value.size == view.size:
        # the result has the destination's elements in order, with unit dimensions elsewhere
        # (a keepdims reduction into a view that drops them): the verifier checked the count
        value = value.reshape(view.shape)
    if dt.metadata is None and (
        value.dtype == dt or (value.dtype == np.float32 and dt in DIRECT_CAST)
    ):
        np.copyto(view, value, casting="unsafe")
    else:
        write(view, value, view.shape, view.size, dt)


def bn_stats_all(x: np.ndarray) -> np.ndarray:
    """The reference's bn_stats rule with every element valid, without its mask copies:
    the same float64 operations on the same values in the same order."""
    x = x.reshape(x.shape[0], -1).astype(np.float64)
    p = x.shape[0]
    out = np.empty((p, 6), dtype=np.float64)
    for half in (0, 1):
        xs = x[:, half::2]
        n = np.full(p, xs.shape[1], dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = xs.sum(axis=1) / np.maximum(n, 1)
            m2 = ((xs - mean[:, None]) ** 2).sum(axis=1)
        out[:, 3 * half] = n
        out[:, 3 * half + 1] = mean
        out[:, 3 * half + 2] = m2
    return out


class Program:
    """A compiled kernel: ``run(args, seed)`` executes it.  ``source`` is the generated
    Python, ``n_fallback`` counts instructions left to the reference interpreter, and
    ``written_params`` names the parameters the kernel writes (arguments not named there are
    only read, so a caller need not copy them)."""

    def __init__(
        self,
        kernel: Kernel,
        source: str,
        namespace: dict,
        poison_at_start: dict[int, bool],
        n_fallback: int,
        written: set[int] | dict[int, Any] | None = None,
    ) -> None:
        self.kernel = kernel
        self.source = source
        self.poison_at_start = poison_at_start
        self.n_fallback = n_fallback
        # parameters some instruction writes: the only ones a caller must copy to protect
        # (``written``: the root uids of every op's outputs, when the compiler knows them)
        if written is None:
            written = set()
            for op, _ in kernel.ops():
                for o in op.outs:
                    written.add(o.tensor.root.uid)
        self.written_params = frozenset(t.name for t in kernel.params if t.uid in written)
        code = compile(source, f"<nkikit.sim.fast {kernel.name}>", "exec")
        exec(code, namespace)  # noqa: S102 - our own generated source
        self._fn = namespace["_kernel"]
        # what run() does before the program starts, precomputed: HBM buffers to create
        # (poisoned unless every element is written before any read) and constants
        self._param_uids = [t.uid for t in kernel.params]
        self._fresh = []
        self._consts = []
        for t in kernel.tensors:
            if t.base is None and t.kind in ("hbm", "output"):
                poison = poison_at_start.get(t.uid, True)
                fill = dtypes.poison_value(t.dtype) if poison else None
                self._fresh.append((t.uid, t.shape, dtypes.storage_dtype(t.dtype), fill))
            elif t.kind == "const":
                self._consts.append((t.uid, dtypes.widen(t.const_value)))
        self._outputs = list(kernel.outputs)
        self._fresh_bytes = sum(
            int(np.prod(shape, dtype=np.int64)) * dt.itemsize for _, shape, dt, _ in self._fresh
        )

    def run(
        self, args: list[np.ndarray], seed: int = 0, rank: int = 0, world=None
    ) -> list[np.ndarray]:
        reserve(self._fresh_bytes, "the kernel's HBM tensors", self.kernel.loc)
        mem: dict[int, np.ndarray] = dict(zip(self._param_uids, args))
        for uid, shape, dt, fill in self._fresh:
            mem[uid] = np.empty(shape, dt) if fill is None else np.full(shape, fill, dt)
        for uid, value in self._consts:
            mem[uid] = value
        interp = Interpreter(self.kernel, seed=seed, rank=rank, world=world)
        interp.mem = mem
        with one_blas_thread():  # see sim/blas.py: speed, and bits independent of the cores
            try:
                self._fn(mem, interp)
            except (NkiError, NkiInternalError, MemoryError):
                raise
            except Exception as e:  # a verified kernel must not fail in numpy: our bug
                # named as the reference interpreter names it (``Interpreter.exec_body``)
                raise NkiInternalError(
                    f"{self.kernel.loc}: the fast simulator failed on kernel "
                    f"{self.kernel.name}: {type(e).__name__}: {e}"
                ) from e
        # storage() follows reshapes: a kernel may return a reshaped view of a buffer
        return [interp.storage(t) for t in self._outputs]
