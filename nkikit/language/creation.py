"""Buffers, tensor creation, loops and SPMD queries of ``nki.language``."""

from __future__ import annotations

import re

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.core import Tensor
from ..trace.builder import current, maybe_current
from ..trace.index import Index, int_arg, program_index
from ..trace.loops import rolled_loop
from .operands import ParDim, dtype_arg, shape_arg
from .tile import Tile


class Buffer:
    """A memory: ``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ``nl.shared_hbm``, ``nl.private_hbm``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def auto_alloc(self) -> Buffer:
        return self


sbuf = Buffer("sbuf")
psum = Buffer("psum")
hbm = Buffer("hbm")
shared_hbm = Buffer("shared_hbm")
private_hbm = Buffer("private_hbm")
# NKI 0.x names this type ``nl.MemoryRegion`` (an Enum there): each memory is also its
# attribute (``nl.MemoryRegion.sbuf is nl.sbuf``), with the Enum's ``value``
for _memory in (sbuf, psum, hbm, shared_hbm, private_hbm):
    setattr(Buffer, _memory.name, _memory)
Buffer.value = property(lambda self: self.name)  # type: ignore[attr-defined]


def par_dim(n: int) -> ParDim:
    """Mark the partition dimension in a buffer shape: ``(nblocks, nl.par_dim(128), 512)``."""
    return ParDim(int_arg(n, "nl.par_dim", "n"))


def _buffer_name(buffer: object, loc: SourceLoc) -> str:
    if buffer is None:
        return "sbuf"
    if isinstance(buffer, Buffer):
        return buffer.name
    if isinstance(buffer, str) and buffer in ("sbuf", "psum", "hbm", "shared_hbm", "private_hbm"):
        return buffer
    from .compiler import Allocation

    if isinstance(buffer, Allocation):
        return buffer.memory
    raise NkiError("err_invalid_argument", loc, op="ndarray", why=f"unknown buffer {buffer!r}")


def ndarray(shape, dtype, *, buffer=None, name: str = "") -> Tile:
    """A new, uninitialized tensor.  ``shape`` may contain ``nl.par_dim(n)`` to mark the
    partition dimension (default: the first).  Fresh memory is poisoned (NaN) in simulation."""
    return ndarray_at(shape, dtype, buffer, name, caller_loc())


def ndarray_at(shape, dtype, buffer, name: str, loc: SourceLoc) -> Tile:
    """``nl.ndarray`` for the user's line ``loc`` (creation functions built on it)."""
    b = current("nl.ndarray")
    if not isinstance(name, str):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.ndarray",
            why=f"name must be a str, got {type(name).__name__} {name!r}",
        )
    if not isinstance(shape, tuple | list):
        shape = (shape,)
    par_axis = next((i for i, s in enumerate(shape) if isinstance(s, ParDim)), 0)
    dims = shape_arg(shape, loc, "nl.ndarray")
    buf = _buffer_name(buffer, loc)
    dt = dtype_arg(dtype, loc, "nl.ndarray")
    if buf in ("hbm", "shared_hbm", "private_hbm"):
        if b.loops and buf == "shared_hbm":
            raise NkiError("err_shared_hbm_must_in_kernel_level", loc)
        t = Tensor(
            b.unique(name) if name else b.name_for(loc, "hbm"),
            dims,
            dt,
            buf,
            kind="hbm",
            loc=loc,
            scope=tuple(b.loops),
        )
        b.tensors.append(t)
        return Tile.of(t)
    t = b.new_tensor(dims, dt, buf, name=name or None, par_axis=par_axis, loc=loc, fallback="buf")
    if not isinstance(buffer, Buffer | str | None):  # a direct allocation: check and record it
        from .compiler import check_allocation, record

        t.user_span = check_allocation(buffer, dims, par_axis, dt.itemsize, loc)
        record(t.uid, buffer)
    return Tile.of(t)


def zeros(shape, dtype, *, buffer=None, name: str = "") -> Tile:
    """A tensor filled with zeros (a memset instruction)."""
    from .ops import fill_at

    return fill_at(shape, 0.0, dtype, buffer, name, caller_loc(), "nl.zeros")


def ones(shape, dtype, *, buffer=None, name: str = "") -> Tile:
    """A tensor filled with ones (a memset instruction)."""
    from .ops import fill_at

    return fill_at(shape, 1.0, dtype, buffer, name, caller_loc(), "nl.ones")


def _like(a: object, api: str) -> Tile:
    """The tile argument ``a`` of ``nl.<api>_like`` (``err_invalid_argument`` otherwise)."""
    if not isinstance(a, Tile):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=f"nl.{api}_like",
            why=f"a must be a tile, got {type(a).__name__}",
        )
    return a


def zeros_like(a: Tile, dtype=None, *, buffer=None, name: str = "") -> Tile:
    a = _like(a, "zeros")
    return zeros(a.shape, a.dtype if dtype is None else dtype, buffer=buffer, name=name)


def ones_like(a: Tile, dtype=None, *, buffer=None, name: str = "") -> Tile:
    a = _like(a, "ones")
    return ones(a.shape, a.dtype if dtype is None else dtype, buffer=buffer, name=name)


def empty_like(a: Tile, dtype=None, *, buffer=None, name: str = "") -> Tile:
    a = _like(a, "empty")
    return ndarray_at(a.shape, a.dtype if dtype is None else dtype, buffer, name, caller_loc())


def shared_constant(constant, dtype=None) -> Tile:
    """A constant HBM tensor baked into the kernel."""
    loc = caller_loc()
    b = current("nl.shared_constant")
    value = np.asarray(constant)
    dt = (
        dtype_arg(dtype, loc, "nl.shared_constant")
        if dtype is not None
        else dtype_arg(
            {np.dtype(np.float64): np.float32, np.dtype(np.int64): np.int32}.get(
                value.dtype, value.dtype
            ),
            loc,
            "nl.shared_constant (the constant's dtype)",
        )
    )
    t = Tensor(
        b.name_for(loc, "const"),
        value.shape,
        dt,
        "shared_hbm",
        kind="const",
        loc=loc,
        const_value=dtypes.cast(value.astype(np.float32) if dtypes.is_float(dt) else value, dt),
    )
    b.tensors.append(t)
    return Tile.of(t)


def shared_identity_matrix(n: int, dtype=dtypes.uint8) -> Tile:
    """An n x n identity matrix in HBM."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.shared_identity_matrix",
            why=f"n must be a positive int, got {n!r}"[:200],
        )
    return shared_constant(np.eye(int(n)), dtype=dtype)


# ---------------------------------------------------------------------------------------------
# loops

_FOR = re.compile(r"^\s*for\s+([A-Za-z_]\w*)\s+in\b")


def _range_args(api: str, start, stop, step) -> tuple[int, int, int]:
    """A loop's ``(start, stop, step)`` as ints (``stop=None``: ``range(start)``); a value
    that is not an int, or a zero step, is ``err_invalid_argument`` naming the argument."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = (
        int_arg(v, api, n) for v, n in ((start, "start"), (stop, "stop"), (step, "step"))
    )
    if step == 0:
        raise NkiError("err_invalid_argument", caller_loc(), op=api, why="step must not be 0")
    return start, stop, step


class _Range:
    def __init__(self, kind: str, start, stop=None, step=1) -> None:
        self.kind = kind
        self.start, self.stop, self.step = _range_args(f"nl.{kind}_range", start, stop, step)
        self.trip = len(range(self.start, self.stop, self.step))

    def __len__(self) -> int:
        return self.trip

    def __iter__(self):
        b = maybe_current()
        if b is None:  # outside a kernel: behave like range()
            yield from range(self.start, self.stop, self.step)
            return
        if self.trip == 0:
            return
        loc = caller_loc()
        m = _FOR.match(loc.text)
        name = m.group(1) if m else "i"
        for value in rolled_loop(b, self.kind, self.trip, self.start, self.step, name, loc):
            yield Index(value)


def _directives(directives: object) -> None:
    from .compiler import check_directives

    check_directives(directives)


def affine_range(start, stop=None, step=1, *, directives=None) -> _Range:
    """A parallel loop: iterations must be independent (except for accumulations).
    ``directives``: ``nki.compiler.no_reorder()`` / ``multi_buffer(n)`` (checked; see
    :mod:`nkikit.language.compiler`)."""
    _directives(directives)
    return _Range("affine", start, stop, step)


def sequential_range(start, stop=None, step=1, *, directives=None) -> _Range:
    """A loop whose iterations may depend on each other; kept rolled."""
    _directives(directives)
    return _Range("sequential", start, stop, step)


def static_range(start, stop=None, step=1, *, directives=None) -> range:
    """A loop unrolled while the kernel is traced."""
    _directives(directives)
    return range(*_range_args("nl.static_range", start, stop, step))


# ---------------------------------------------------------------------------------------------
# SPMD


def _grid_axis(axis: object, grid: tuple[int, ...], api: str) -> int:
    """``axis`` as an axis of the launch grid ``grid`` (a kernel launched without a grid is
    one instance of a 1-D grid); ``err_invalid_argument`` naming it otherwise -- never a
    silent 0 for an axis the launch does not have."""
    if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=api,
            why=f"axis must be an int, got {type(axis).__name__} {axis!r}",
        )
    shape = grid or (1,)
    if not 0 <= int(axis) < len(shape):
        launch = f"the launch grid {list(grid)}" if grid else "a launch without a grid"
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=api,
            why=f"axis {int(axis)} is outside {launch} (axes 0 to {len(shape) - 1}); launch "
            "the kernel as kernel[g0, g1, ...](...) to give it more grid axes",
        )
    return int(axis)


def program_id(axis: int) -> Index:
    """The index of this kernel instance along launch-grid ``axis``."""
    b = current("nl.program_id")
    k = _grid_axis(axis, b.grid, "nl.program_id")
    if not b.grid:  # launched without a grid: one instance
        b.unlaunched_program_ids.add(k)
        return Index(program_index(0).affine * 0)
    return program_index(k)


def num_programs(axes: int | None = None) -> int:
    """The number of kernel instances along ``axes`` (an axis or a tuple of axes; None: all)
    of the launch grid."""
    b = current("nl.num_programs")
    grid = b.grid or (1,)
    if axes is None:
        return int(np.prod(grid))
    items = axes if isinstance(axes, tuple | list) else (axes,)
    return int(np.prod([grid[_grid_axis(a, b.grid, "nl.num_programs")] for a in items]))


def program_ndim() -> int:
    return len(current("nl.program_ndim").grid)


class nc:  # noqa: N801 - NKI's name
    """``nl.nc(n)``: shard a grid dimension over n physical NeuronCores (simulated serially)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)


class spmd_dim(int):  # noqa: N801 - NKI's name
    """``nl.spmd_dim(size, nl.nc(2))``: a launch-grid dimension; its size is what counts here."""

    def __new__(cls, size, *rest):
        total = int(size)
        for r in rest:
            total *= r.n if isinstance(r, nc) else int(r)
        return int.__new__(cls, total)
