"""``nkikit.nki.language``: NKI 0.x's ``nki.language`` (``import nkikit.nki.language as nl``).

Memories, dtypes, ``tile_size``, tensor creation (``nl.ndarray`` and friends: explicit
allocation, no initialisation), loops (plain Python ``range``: NKI 0.7 traces kernels with
Python, so every loop unrolls at trace time), launch queries, the ``op=`` constants and the
experimental high-level wrappers (``nl.load``, ``nl.add``, ``nl.exp``, ...), which lower to
``nki.isa`` instructions and return new SBUF tensors.
"""

from __future__ import annotations

import builtins
import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ... import dtypes as _dt
from ...errors import NkiError, SourceLoc, caller_loc
from ...ir.core import HBM_BUFFERS
from ...language.creation import Buffer, hbm, private_hbm, psum, sbuf, shared_hbm
from ...trace.builder import current
from ...trace.index import _range as _stepped_range  # a nonzero step, or a named error
from ...trace.instructions import flag as _flag
from ..tensor import NkiTensor, _index, got_type, require_tensor
from ..tensor import _row_major_cached as _row_major
from ..tensor import as_dtype as _as_dtype
from . import device_loops as _device_loops
from . import grids as _grids
from .dtypes import *  # noqa: F403
from .dtypes import bfloat16, float32, int32, uint8, uint16
from .grids import NkiBlockGrid as NkiBlockGrid
from .grids import NkiGrid as NkiGrid
from .grids import NkiTileGrid as NkiTileGrid
from .grids import alloc_blocks as alloc_blocks
from .grids import alloc_tiles as alloc_tiles
from .grids import blocks as blocks
from .grids import tiles as tiles

# NKI 0.x's names for the types of a memory and of a dtype (for annotations and isinstance)
MemoryRegion = Buffer
DType = np.dtype

if TYPE_CHECKING:
    from ...ir.core import Tensor

_BUFFERS = {b.name: b for b in (sbuf, psum, hbm, shared_hbm, private_hbm)}


def buffer_of(name: str) -> Buffer:
    return _BUFFERS[name]


def is_psum(buffer) -> bool:
    return _buffer_name(buffer) == "psum"


def is_sbuf(buffer) -> bool:
    return _buffer_name(buffer) == "sbuf"


def is_hbm(buffer) -> bool:
    return _buffer_name(buffer) in HBM_BUFFERS


def is_on_chip(buffer) -> bool:
    return _buffer_name(buffer) in ("sbuf", "psum")


def _buffer_name(buffer, loc: SourceLoc | None = None) -> str:
    if isinstance(buffer, Buffer):
        return buffer.name
    if isinstance(buffer, NkiTensor):
        return buffer.tensor.buffer
    raise NkiError(
        "err_invalid_argument",
        loc or caller_loc(),
        op="buffer",
        why=f"expected a memory (nl.sbuf, nl.psum, nl.shared_hbm, ...), got {buffer!r}",
    )


class _TileSize:
    """``nl.tile_size``: architecture limits of the target being traced for (the kernel's
    target; outside a trace ``NEURON_PLATFORM_TARGET_OVERRIDE``, else trn2), as Python ints."""

    @property
    def _target(self):
        from ...targets import default_target

        return default_target()

    pmax = property(lambda self: self._target.partitions)
    psum_bank_fmax = property(lambda self: self._target.psum_bank_fmax)
    psum_fmax = psum_bank_fmax  # the pre-0.4 name
    psum_bank_fmax_bytes = property(lambda self: self._target.psum_bank_fmax * 4)
    psum_num_banks = property(
        lambda self: self._target.psum_bytes // (self._target.psum_bank_fmax * 4)
    )
    gemm_stationary_fmax = property(lambda self: self._target.gemm_stationary_fmax)
    # 512 on every target: NKI 0.x's value, which the NKI samples' trn3 MX kernels use as the
    # moving tile (the NC-v4 verifier limit is larger) [reference/nki-0x.md §3.10]
    gemm_moving_fmax = property(lambda self: 512)
    bn_stats_fmax = property(lambda self: 512)  # [NKI 0.x ISA, bn_stats]
    sbuf_fmax_bytes = property(lambda self: self._target.sbuf_bytes)
    sbuf_fmax = property(lambda self: self._target.sbuf_bytes // 4)
    total_available_sbuf_size = sbuf_fmax_bytes
    sbuf_size_bytes = property(lambda self: self._target.sbuf_bytes * self._target.partitions)
    # AWS publishes no values for the minimum free-address alignments [reference/nki-0x.md
    # §3.10]: these are the ones nkikit's allocator places tiles at (compiler/allocate.py)
    sbuf_min_align = property(lambda self: self._target.sbuf_align)
    psum_min_align = property(lambda self: 4)

    def __repr__(self) -> str:
        return "nl.tile_size"


tile_size = _TileSize()


def _is_field_value(value: object) -> bool:
    """A class attribute NKI treats as a field: a plain immutable value (not a method,
    descriptor, class or mutable container)."""
    return value is None or isinstance(value, builtins.bool | int | float | str | tuple)


class NKIObject:
    """Base class of kernel-side classes (NKI 0.x).  As in NKI, a subclass is dataclass-like:
    without an ``__init__`` of its own (``@dataclass`` writes one), it is constructed from its
    annotated fields, positionally or by name, defaults taken from the class, and
    ``__post_init__`` runs afterwards.  A field given no value is None: NKI synthesises the
    constructor, and the NKI Library constructs such classes (even ``@dataclass`` ones) with
    fields left out, so every annotated field without a default gets the default None."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        annotations = cls.__dict__.get("__annotations__")
        if annotations is None:
            annotations = {}
            cls.__annotations__ = annotations
        for name in annotations:
            if name not in cls.__dict__:
                setattr(cls, name, None)
        # NKI synthesises the constructor from the class's attributes, annotated or not (the
        # NKI Library writes `section_idx = None` fields and constructs them by name); given
        # an annotation here, the stdlib `@dataclass` applied after this makes them fields too
        for name, value in list(cls.__dict__.items()):
            if name not in annotations and not name.startswith("_") and _is_field_value(value):
                annotations[name] = object

    def __init__(self, *args, **kwargs) -> None:
        names: list[str] = []
        for klass in reversed(type(self).__mro__):
            for n in klass.__dict__.get("__annotations__", {}):
                if n not in names:
                    names.append(n)
        if len(args) > len(names):
            raise TypeError(
                f"{type(self).__name__}() takes {len(names)} positional arguments but {len(args)} were given"
            )
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {k!r}")
            if k in values:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {k!r}")
            values[k] = v
        for n, v in values.items():
            object.__setattr__(self, n, v)
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()


def par_dim(n: int) -> int:
    """Beta-1's partition-dimension marker, kept for old kernels: in NKI 0.x the partition
    dimension is always dimension 0, so this is just ``n``."""
    return _index(n, "nl.par_dim", none=False)


# -- tensor creation --------------------------------------------------------------------------


def ndarray(shape, dtype, buffer=sbuf, name: str = "", address=None) -> NkiTensor:
    """A new, uninitialised tensor (fresh memory is poisoned: NaN for floats).  Dimension 0 of
    an SBUF/PSUM tensor is the partition dimension.  ``address=(partition, byte_offset)``
    places an on-chip tensor by hand (``Tensor.address``, bytes [reference/nki-0x.md §3]):
    PSUM tensors placed on the same bytes share them in the verifier's capacity rule."""
    loc = caller_loc()
    b = current("nl.ndarray")
    if type(name) is not str and name is not None:
        raise NkiError(
            "err_invalid_argument", loc, op="nl.ndarray", why=f"name must be a str, got {name!r}"
        )
    # a dtype with metadata (tfloat32) equals its plain one: only plain dtypes are remembered
    plain = address is None and not name and isinstance(dtype, np.dtype) and not dtype.metadata
    if plain:
        key = (shape, dtype, buffer)
        try:
            hit = _ON_CHIP.get(key)
        except TypeError:  # an unhashable shape (a list): not remembered; the checks name it
            plain, hit = False, None
        if hit is not None:  # an on-chip tile of a kind allocated before: checked then
            dims, dt, buf, strides = hit
            t = b.new_tensor(dims, dt, buf, loc=loc, fallback="buf")
            return NkiTensor._view(t, dims, strides, 0, None)
    if type(shape) is not tuple:
        if isinstance(shape, int | np.integer):
            shape = (shape,)
        if not isinstance(shape, tuple | list):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nl.ndarray",
                why=f"shape must be a tuple, got {shape!r}",
            )
    try:
        dims = tuple(map(int, shape))
    except (TypeError, ValueError, OverflowError):
        dims = None
    if dims != shape and (dims is None or dims != tuple(shape)):  # "4", 4.5, None: refused
        raise NkiError(
            "err_invalid_argument", loc, op="nl.ndarray", why=f"shape {shape!r} is not all ints"
        )
    if dims and (builtins.min(dims) <= 0 or builtins.max(dims) >= 1 << 32):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.ndarray",
            why=f"shape {dims} has a dimension <= 0 or >= 2**32",
        )
    buf = buffer.name if type(buffer) is Buffer else _buffer_name(buffer, loc)
    dt = _as_dtype(dtype, loc, "nl.ndarray")
    if buf in HBM_BUFFERS:
        from ..launch import allocate_hbm

        if address is not None:
            # NKI 0.7 takes (free_offset,) for HBM: a place in device memory, which only shows
            # where two placed tensors overlap
            raise NkiError(
                "err_unsupported_api",
                loc,
                api=f"nl.ndarray(address=...) on {buf}",
                why="nkikit gives every HBM tensor storage of its own, so a placed HBM tensor "
                "overlapping another is not modeled; leave address= to SBUF and PSUM tensors",
            )

        return NkiTensor.whole(allocate_hbm(b, dims, dt, buf, name, loc))
    if len(dims) < 2:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.ndarray",
            why=f"SBUF and PSUM tensors need at least 2 dimensions (partition, free), got {dims}",
        )
    t = b.new_tensor(dims, dt, buf, name=name or None, loc=loc, fallback="buf")
    if plain and len(_ON_CHIP) < _ON_CHIP_MAX:
        _ON_CHIP[key] = (dims, dt, buf, _row_major(dims))
    if address is not None:
        t.address = _address(address, loc)
        _placed_inside(t, int(address[0]), loc)
    return NkiTensor._view(t, t.shape, _row_major(t.shape), 0, None)  # NkiTensor.whole(t)


# (shape, dtype, buffer) of nl.ndarray calls that passed its checks for an on-chip tile ->
# (dimensions, dtype, buffer name, row-major strides): an unrolled kernel allocates the same
# few kinds of tile once per step
_ON_CHIP: dict[tuple, tuple] = {}
_ON_CHIP_MAX = 1 << 12


def _placed_inside(t: Tensor, partition: int, loc: SourceLoc) -> None:
    """A tensor ``nl.ndarray(address=(partition, byte_offset))`` placed lies inside its memory
    on the target being traced for: its partitions up to the last one, its bytes of each
    partition (``byte_offset`` on) within a partition of SBUF / PSUM (``Target.sbuf_bytes``,
    ``Target.psum_bytes``: 8 banks x 2 KiB) [reference/nki-0x.md §3.1-3.2];
    ``err_allocation_out_of_bounds`` at the kernel's line otherwise.  A PSUM tensor starts at
    a bank boundary (the compiler refuses any other placement [reference/nki-0x.md §3.2, MIG]):
    ``err_invalid_argument`` otherwise."""
    from ...targets import default_target

    target = default_target()
    bank = target.psum_bank_bytes
    if t.buffer == "psum" and t.address % bank:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.ndarray",
            why=f"a PSUM tensor starts at a bank boundary: address=(partition, byte_offset) "
            f"needs byte_offset a multiple of {bank} (one {bank // 1024} KiB bank), got "
            f"{t.address} (bank k starts at byte k * {bank})",
        )
    if partition + t.shape[0] > target.partitions:
        raise NkiError(
            "err_allocation_out_of_bounds",
            loc,
            what=f"{t.shape[0]} partitions from partition {partition} pass partition "
            f"{target.partitions}",
        )
    size = target.sbuf_bytes if t.buffer == "sbuf" else target.psum_bytes
    end = t.address + t.bytes_per_partition
    if end > size:
        raise NkiError(
            "err_allocation_out_of_bounds",
            loc,
            what=f"{t.name} at bytes [{t.address}, {end}) of each {t.buffer.upper()} "
            f"partition, which has {size} on {target.name}",
        )


def _address(address, loc) -> int:
    """The byte offset of ``address=(partition, byte_offset)`` (``err_invalid_argument`` for
    anything else)."""
    if (
        not isinstance(address, tuple | list)
        or len(address) != 2
        or not builtins.all(isinstance(a, int | np.integer) and a >= 0 for a in address)
    ):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.ndarray",
            why=f"address must be (partition, byte_offset) of non-negative ints, got {address!r}",
        )
    return int(address[1])


def zeros(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    return full(shape, 0, dtype, buffer=buffer, name=name)


def ones(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    return full(shape, 1, dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    from .. import isa

    t = ndarray(shape, dtype, buffer=buffer, name=name)
    isa.memset(t, fill_value)
    return t


def zeros_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    """A new tensor of ``x``'s shape filled with 0 (of a grid: a grid of its geometry)."""
    if isinstance(x, _grids.NkiGrid):
        return _grids.grid_like(x, dtype, buffer, name, 0)
    require_tensor(x, caller_loc(), "nl.zeros_like", "x")
    return zeros(
        x.shape,
        x.dtype if dtype is None else dtype,
        buffer=x.buffer if buffer is None else buffer,
        name=name,
    )


def ones_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    """A new tensor of ``x``'s shape filled with 1 (of a grid: a grid of its geometry)."""
    if isinstance(x, _grids.NkiGrid):
        return _grids.grid_like(x, dtype, buffer, name, 1)
    require_tensor(x, caller_loc(), "nl.ones_like", "x")
    return ones(
        x.shape,
        x.dtype if dtype is None else dtype,
        buffer=x.buffer if buffer is None else buffer,
        name=name,
    )


def empty_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    """A new uninitialised tensor of ``x``'s shape, dtype and buffer unless given (of a grid:
    new storage of its tile geometry, ``nl.alloc_tiles``/``alloc_blocks``)."""
    if isinstance(x, _grids.NkiGrid):
        return _grids.grid_like(x, dtype, buffer, name, None)
    require_tensor(x, caller_loc(), "nl.empty_like", "x")
    return ndarray(
        x.shape,
        x.dtype if dtype is None else dtype,
        buffer=x.buffer if buffer is None else buffer,
        name=name,
    )


def shared_constant(constant, dtype=None) -> NkiTensor:
    """A constant HBM tensor embedded in the kernel (a numpy array or a ``.npy`` path)."""
    from ...language.creation import shared_constant as beta1_constant

    try:
        value = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    except (OSError, ValueError) as e:
        raise NkiError(
            "err_invalid_argument", caller_loc(), op="nl.shared_constant", why=str(e)[:200]
        ) from None
    if value.dtype == object:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.shared_constant",
            why=f"the constant must be a numeric array or a .npy path, got {type(constant).__name__}",
        )
    # one constant builder for both dialects (dtype defaults, rounding, naming)
    return NkiTensor.whole(beta1_constant(value, dtype).tensor)


def shared_identity_matrix(n: int, dtype=uint8, dst=None) -> NkiTensor:
    """An ``n x n`` identity matrix in SBUF (a constant loaded once)."""
    from .. import isa

    n = _index(n, "nl.shared_identity_matrix", none=False)
    if n <= 0:
        raise NkiError(
            "err_invalid_argument", caller_loc(), op="nl.shared_identity_matrix", why=f"n={n}"
        )
    const = shared_constant(np.eye(n), dtype=dtype)
    out = dst if dst is not None else ndarray((int(n), int(n)), dtype, buffer=sbuf)
    isa.dma_copy(out, const)
    return out


# -- indexing ---------------------------------------------------------------------------------


class DynSlice:
    """``nl.ds(start, size)``: the slice ``start:start + size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start = int(start)
        self.size = int(size)

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


def ds(start, size) -> DynSlice:
    if not isinstance(start, int | np.integer):
        raise NkiError(
            "err_unsupported_api",
            caller_loc(),
            api="nl.ds with a runtime start",
            why="use .ap(scalar_offset=...) for a runtime offset",
        )
    size = _index(size, "nl.ds", none=False)
    if start < 0 or size < 0:
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.ds",
            why=f"start ({start}) and size ({size}) must be >= 0",
        )
    return DynSlice(start, size)


# -- loops and control flow ---------------------------------------------------------------------


def _range(*args, **kwargs) -> range:
    kwargs.pop("directives", None)
    kwargs.pop("multi_buffer", None)
    if kwargs:
        raise TypeError(f"unexpected keyword argument {next(iter(kwargs))!r}")
    args = tuple(a if type(a) is int else _index(a, "range", none=False) for a in args)
    if len(args) == 3:
        return _stepped_range(*args, "range")
    return builtins.range(*args)


def affine_range(*args, **kwargs) -> range:
    """NKI 0.7: an alias of Python ``range`` (the loop unrolls at trace time)."""
    return _range(*args, **kwargs)


def sequential_range(*args, **kwargs) -> range:
    """NKI 0.7: an alias of Python ``range``."""
    return _range(*args, **kwargs)


def static_range(*args, **kwargs) -> range:
    """NKI 0.7: an alias of Python ``range``."""
    return _range(*args, **kwargs)


range = affine_range  # noqa: A001 - the NKI Library uses nl.range


def dynamic_range(start, stop=None, step=1):
    """A hardware loop: with a register bound, one traced body run as many times as the
    registers say when the kernel runs (its induction value a register); with int bounds,
    unrolled like ``range`` (what it computes is the same)."""
    if stop is None:
        start, stop = 0, start
    _not_in_no_reorder("nl.dynamic_range", caller_loc())
    if _device_loops.is_register(start) or _device_loops.is_register(stop):
        return _device_loops.dynamic_range(start, stop, step, caller_loc())
    _trace_time_ints(start, stop, step)
    return _range(start, stop, step)


def fori_loop(lower, upper, body_fun, step: int = 1, unroll: bool = False) -> None:
    """``for i in range(lower, upper, step): body_fun(i)``: bounds ints (unrolled at trace
    time) or registers (a device loop whose trip count the kernel computes)."""
    _body_function(body_fun, "nl.fori_loop")
    unroll = _flag(unroll, "unroll", "fori_loop", caller_loc(), api="nl.fori_loop")
    if not unroll:
        _not_in_no_reorder("nl.fori_loop", caller_loc())
    if _device_loops.is_register(lower) or _device_loops.is_register(upper):
        if unroll:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="nl.fori_loop",
                why="unroll=True needs bounds known when the kernel is traced",
            )
        _device_loops.fori_loop(lower, upper, body_fun, step, caller_loc())
        return
    _trace_time_ints(lower, upper, step)
    for i in _stepped_range(int(lower), int(upper), int(step), "nl.fori_loop"):
        body_fun(i)


def while_loop(init, body_fun) -> None:
    """``r = init; while r != 0: r = body_fun(r)`` on the device (``init`` a register or an
    int; ``body_fun`` returns the register of the next condition)."""
    _body_function(body_fun, "nl.while_loop")
    _not_in_no_reorder("nl.while_loop", caller_loc())
    _device_loops.while_loop(init, body_fun, caller_loc())


def _body_function(body_fun, api: str) -> None:
    if not callable(body_fun):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=api,
            why=f"body_fun must be a function, got {type(body_fun).__name__}",
        )


def _trace_time_ints(*xs) -> None:
    for x in xs:
        if x is not None and not isinstance(x, int | np.integer):
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="loop",
                why="loop bounds must be ints or registers and the step an int known when "
                f"the kernel is traced, got {type(x).__name__}",
            )


@contextmanager
def no_reorder():
    """Keep program order inside the block.  The simulator runs in program order already; the
    cost model keeps it as written.  Dynamically scoped: a device loop (``nl.dynamic_range``,
    ``nl.fori_loop``, ``nl.while_loop``) started inside it, callees included, is refused
    (NKI wants the block inside the loop body) [reference/nki-0x.md §5]."""
    from ...trace.builder import maybe_current

    b = maybe_current()
    d = b.__dict__ if b is not None else {}
    d["_nki_no_reorder"] = d.get("_nki_no_reorder", 0) + 1
    try:
        yield
    finally:
        d["_nki_no_reorder"] -= 1


def _not_in_no_reorder(api: str, loc: SourceLoc) -> None:
    """``api`` (a device loop) may not start inside ``with nl.no_reorder():``."""
    from ...trace.builder import maybe_current

    b = maybe_current()
    if b is not None and b.__dict__.get("_nki_no_reorder", 0):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=api,
            why="a device loop cannot start inside `with nl.no_reorder():`; put the "
            "no_reorder block inside the loop body instead",
        )


def program_id(axis: int = 0) -> int | None:
    """The index of this program (logical core) along ``axis``: an int at trace time.
    ``None`` outside a kernel: no launch is known there (see ``program_ndim``)."""
    from ..launch import launch, launched

    if not launched():
        return None
    grid, pid = launch()
    axis = _index(axis, "nl.program_id", none=False)
    if not 0 <= axis < builtins.max(len(grid), 1):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.program_id",
            why=f"axis {axis} of a launch grid of {len(grid)} dimensions",
        )
    if not grid:
        from ...trace.builder import maybe_current

        b = maybe_current()
        if b is not None:  # read as 0: a hint if an output is left partly unwritten
            b.unlaunched_program_ids.add(int(axis))
        return 0
    return pid[int(axis)]


def num_programs(axes: int = 0) -> int | None:
    """The number of programs along ``axes`` (an int or several axes: their product) of the
    launch being traced; 1 for a kernel launched without a grid.  ``None`` outside a kernel
    (see ``program_ndim``)."""
    from ..launch import launch, launched

    if not launched():
        return None
    grid, _ = launch()
    many = isinstance(axes, tuple | list)
    for a in axes if many else (axes,):
        if not isinstance(a, int | np.integer) or isinstance(a, builtins.bool):
            why = f"axes must be an int or a tuple of ints, got {axes!r}"
        elif grid and not 0 <= a < len(grid):
            why = f"axis {a} is not an axis of the launch grid {grid}"
        else:
            continue
        raise NkiError("err_invalid_argument", caller_loc(), op="nl.num_programs", why=why)
    if many:
        return math.prod(grid[a] for a in axes) if grid else 1
    return grid[int(axes)] if grid else 1


def program_ndim() -> int | None:
    """The number of dimensions of the launch grid: 0 for a kernel launched without one.
    Outside a kernel (host code that prepares a kernel's configuration before launching it)
    no launch is known yet, and the three SPMD queries answer ``None`` ("unknown") rather
    than pretending to a grid: code that falls back on a value of its own
    (``nl.num_programs() or n``) then uses that value, and the kernel it launches sees the
    real grid."""
    from ..launch import launch, launched

    if not launched():
        return None
    return len(launch()[0])


def device_print(print_prefix: str, tensor: NkiTensor) -> None:
    """Print a tensor when the kernel runs (on the simulator: to stdout)."""
    from .. import isa

    isa._device_print(print_prefix, tensor, caller_loc())


# -- op constants and experimental wrappers -------------------------------------------------------
def random_seed(seed) -> None:
    """Seed the VectorE's random generator (``nisa.set_rng_seed``) from ``seed``, a ``[1, 1]``
    SBUF/PSUM tensor holding a 32-bit value; a Python int is rejected [nki-0x.md §3.2]."""
    if not isinstance(seed, NkiTensor):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="nl.random_seed",
            why=f"seed must be a [1, 1] SBUF/PSUM tensor of 32 bits, got {got_type(seed)}",
        )
    from ..isa import set_rng_seed

    set_rng_seed(seed)


def rand(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    """A new SBUF (or PSUM) tensor of uniform random numbers in ``[0, 1)`` (float ``dtype``)
    from the VectorE's generator, lowered as the reference says the compiler does
    [nki-0x.md §2]: on NeuronCore-v4 one ``nisa.rand2(dst, 0.0, 1.0)`` (24 random bits per
    value); before, ``nisa.rng`` into a uint16 tile scaled by 2^-16 (``nisa.tensor_scalar``),
    16 random bits per value.  Streams are deterministic per seed but are not the hardware's
    bits.  Errors: ``err_invalid_argument`` for an integer dtype or an HBM buffer."""
    from .. import isa
    from ._ops import multiply

    loc = caller_loc()
    dt = _as_dtype(dtype, loc, "nl.rand")
    buf = buffer.name if type(buffer) is Buffer else _buffer_name(buffer, loc)
    if not _dt.is_float(dt) or buf in HBM_BUFFERS:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nl.rand",
            why=f"makes a float SBUF or PSUM tensor, got dtype {_dt.name(dt)} in {buf}",
        )
    t = ndarray(shape, dt, buffer=buffer, name=name)
    if isa.get_nc_version().value >= 4:
        isa.rand2(dst=t, min=0.0, max=1.0)
        return t
    bits = ndarray(t.shape, uint16, buffer=sbuf)
    isa.rng(dst=bits)
    isa.tensor_scalar(dst=t, data=bits, op0=multiply, operand0=2.0**-16)
    return t


from ._ops import *  # noqa: E402, F403
from ._ops import OPS as _OPS  # noqa: E402

# NKI's name of the boolean dtype (the NKI Library's resolve_dtype_to_nki returns it), bound
# last: this module's own code says builtins.bool for Python's
from .dtypes import bool  # noqa: E402, A004

_ = (bfloat16, float32, int32)
# the dialect's names: not the modules and nkikit helpers this module works with
_INTERNAL = {
    "annotations", "builtins", "contextmanager", "math", "np", "TYPE_CHECKING", "device_loops",
    "grids", "HBM_BUFFERS", "NkiError", "SourceLoc", "buffer_of", "caller_loc", "current",
    "got_type", "require_tensor",
}  # fmt: skip
__all__ = [n for n in dir() if not n.startswith("_") and n not in _INTERNAL]
del _OPS
