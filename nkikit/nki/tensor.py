"""``NkiTensor``: the NKI 0.x tensor, a strided view of HBM or on-chip storage.

A view is ``(storage, shape, strides, offset)``: element ``(i0, ..., ik)`` of the view is
element ``offset + sum(strides[j] * ij)`` of the storage's row-major elements [NKI 0.x
language guide, "NkiTensor"].  Slicing (with steps), integer indexing, ``reshape``, the view
methods (``slice``, ``select``, ``permute``, ``broadcast``, ...) and raw access patterns
(``.ap``) all make new views; nothing is copied and no instruction is emitted.

When an instruction uses a view, ``access_of`` turns it into the IR's ``Access`` (one affine
index per storage dimension, in the view's tile axes), so the IR, the verifier, both
simulators and the compiler see the same accesses the Beta-1 front end produces.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import dtypes
from ..errors import NkiError, SourceLoc, caller_loc
from ..ir.affine import Affine, Axis
from ..ir.core import ON_CHIP, Access, Tensor
from ..trace.builder import current


def identity(n: int, dtype=np.float32) -> np.ndarray:
    """``nki.tensor.identity(n, dtype)``: an ``n x n`` identity matrix as a host array (for
    ``nl.shared_constant``)."""
    return dtypes.cast(np.eye(int(n), dtype=np.float32), dtypes.as_dtype(dtype))


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return tuple(strides)


@functools.lru_cache(maxsize=4096)
def _row_major_cached(shape: tuple[int, ...]) -> tuple[int, ...]:
    return row_major(shape)


_new = object.__new__


class NkiTensor:
    """A tensor inside a traced NKI 0.x kernel (``nl.ndarray`` and every view of one).

    Attributes known at trace time: ``shape``, ``dtype``, ``buffer``, ``strides`` and
    ``offset`` (in elements of the storage), ``ndim``, ``size``, ``name``.  Dimension 0 of an
    on-chip (SBUF/PSUM) tensor is the partition dimension; its stride is the storage's free
    size, and no view may step over partitions.
    """

    __slots__ = ("_layout", "shape", "strides", "offset", "_indirect", "_access")
    __array_priority__ = 1000

    def __init__(
        self,
        layout: Tensor,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int = 0,
        indirect: tuple | None = None,
    ) -> None:
        # ``layout`` is the IR tensor the view is described against: the allocated tensor, or
        # a reshape of it (same storage, another row-major shape) that indexes more simply.
        self._layout = layout
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        # (index NkiTensor, dimension) of a runtime vector/scalar offset (``.ap(vector_offset=)``)
        self._indirect = indirect
        # the IR access of this view, made by the first instruction that uses it (a view is
        # not changed once an instruction has used it)
        self._access: Access | None = None

    @staticmethod
    def _view(layout: Tensor, shape: tuple, strides: tuple, offset: int, indirect) -> NkiTensor:
        """``NkiTensor(...)`` for arguments that are already tuples of Python ints (the view
        methods' own results): an unrolled kernel makes a view per instruction operand."""
        v = _new(NkiTensor)
        v._layout = layout
        v.shape = shape
        v.strides = strides
        v.offset = offset
        v._indirect = indirect
        v._access = None
        return v

    @staticmethod
    def whole(t: Tensor) -> NkiTensor:
        shape = t.shape
        return NkiTensor._view(t, shape, _row_major_cached(shape), 0, None)

    # -- attributes ------------------------------------------------------------------------
    @property
    def tensor(self) -> Tensor:
        """The IR tensor that owns the storage."""
        return self._layout.root

    @property
    def dtype(self) -> np.dtype:
        return self._layout.dtype

    @property
    def buffer(self):
        """The memory region (``nl.sbuf``, ``nl.shared_hbm``, ...).  A kernel argument reads
        as ``nl.hbm`` when the kernel is launched without a grid and as ``nl.shared_hbm`` on an
        LNC grid, as AWS's simulator wraps arguments (nkikit keeps arguments in shared HBM
        either way) [reference/nki-0x.md §2, simulator execution model]."""
        from .language import buffer_of, hbm
        from .launch import launch

        root = self._layout.root
        if root.kind == "input" and not launch()[0]:
            return hbm
        return buffer_of(root.buffer)

    @property
    def name(self) -> str:
        return self._layout.root.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def on_chip(self) -> bool:
        return self._layout.root.buffer in ON_CHIP

    @property
    def data(self) -> NkiTensor:
        """The tensor itself: a grid's ``.data`` is its operand (``nl.tiles``), and NKI 0.7
        code writes ``.data`` on the tensors it allocates for grid tiles too."""
        return self

    def __len__(self) -> int:
        return self.shape[0]

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return (
            f"NkiTensor({self.name}, shape={self.shape}, dtype={dtypes.name(self.dtype)}, "
            f"buffer={self._layout.root.buffer})"
        )

    def __bool__(self) -> bool:
        # a tensor is an object at trace time: `if params.index:` asks whether one was given
        # (NKI 0.x tensors have no elementwise comparison operators that could make this
        # read a value; the NKI Library relies on it)
        return True

    def __iter__(self):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="iteration",
            why="a tensor has no values while the kernel is traced; loop over range(n) and index",
        )

    def __array__(self, dtype=None, copy=None):
        """The values the tensor holds after the instructions traced so far
        (:mod:`nkikit.trace.peek`: for a look from ``print`` or ``breakpoint()``)."""
        from ..trace.peek import look

        return look(lambda loc: access_of(self, loc, "numpy conversion"), caller_loc(), dtype)

    def _with(self, shape, strides, offset=None) -> NkiTensor:
        return NkiTensor._view(
            self._layout,
            tuple(int(n) for n in shape),
            tuple(int(n) for n in strides),
            self.offset if offset is None else int(offset),
            self._indirect,
        )

    def _storage_size(self) -> int:
        return math.prod(_dtype_root(self._layout).shape)

    def _free_storage(self) -> int:
        """Elements per partition of the on-chip storage (the partition stride)."""
        root = _dtype_root(self._layout)
        return math.prod(root.shape[1:]) if len(root.shape) > 1 else 1

    # -- indexing ----------------------------------------------------------------------------
    def __getitem__(self, key) -> NkiTensor:
        # the user's line is looked up only for an error (an unrolled kernel indexes per
        # instruction): caller_loc() finds the same frame from any depth inside nkikit
        if type(key) is not tuple:
            key = (key,)
        ndim = len(self.shape)
        for k in key:
            if k is Ellipsis:
                pos = next(i for i, k in enumerate(key) if k is Ellipsis)
                fill = ndim - (len(key) - 1)
                key = key[:pos] + (slice(None),) * fill + key[pos + 1 :]
                break
        if len(key) > ndim:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="indexing",
                why=f"{len(key)} indices for a tensor of {ndim} dimensions {self.shape}",
            )
        on_chip = self._layout.root.buffer in ON_CHIP
        if len(key) < ndim:
            key = key + (_ALL,) * (ndim - len(key))
        shape: list[int] = []
        strides: list[int] = []
        offset = self.offset
        for d, (k, n, s) in enumerate(zip(key, self.shape, self.strides)):
            tk = type(k)
            if tk is slice:
                start, stop, step = k.start, k.stop, k.step
                if start is None and stop is None and step is None:  # ``:``
                    shape.append(n)
                    strides.append(s)
                    continue
            elif tk is int:
                start = None
            else:
                if _DynSlice is None:
                    _load_dynslice()
                if tk is _DynSlice:
                    k = slice(k.start, k.start + k.size)
                else:
                    k = _as_slice_or_int(k, None)
                if type(k) is int:
                    start = None
                else:
                    start, stop, step = k.start, k.stop, k.step
            if type(k) is int:
                i = k + n if k < 0 else k
                if not 0 <= i < n:
                    raise NkiError(
                        "err_tensor_access_out_of_bound",
                        caller_loc(),
                        tensor=self.name,
                        dim=d,
                        index=k,
                        size=n,
                    )
                offset += i * s
                if on_chip and d == 0:
                    shape.append(1)  # on-chip tensors keep the partition dimension
                    strides.append(s)
                continue
            if not (
                (start is None or type(start) is int)
                and (stop is None or type(stop) is int)
                and (step is None or type(step) is int)
            ):
                start, stop, step = (_index(v, "indexing") for v in (start, stop, step))
            step = 1 if step is None else step
            if step <= 0:
                raise NkiError(
                    "err_invalid_argument",
                    caller_loc(),
                    op="indexing",
                    why=f"slice step must be positive, got {step}",
                )
            start = 0 if start is None else start
            stop = n if stop is None else stop
            if start < 0:
                start += n
            if stop < 0:
                stop += n
            if start < 0 or stop > n or start > stop:
                raise NkiError(
                    "err_tensor_access_out_of_bound",
                    caller_loc(),
                    tensor=self.name,
                    dim=d,
                    index=max(stop - 1, start),
                    size=n,
                )
            if step == 1:
                shape.append(stop - start)
                strides.append(s)
            else:
                if on_chip and d == 0:
                    raise NkiError(
                        "err_invalid_argument",
                        caller_loc(),
                        op="indexing",
                        why="the partition dimension cannot be stepped; partitions are contiguous",
                    )
                shape.append(max(0, -(-(stop - start) // step)))
                strides.append(s * step)
            offset += start * s
        if on_chip and len(shape) < 2:
            # an on-chip view keeps at least one free dimension (the last one, size 1)
            shape.append(1)
            strides.append(1)
        if not shape:
            shape, strides = [1], [1]
        return NkiTensor._view(self._layout, tuple(shape), tuple(strides), offset, self._indirect)

    def __setitem__(self, key, value) -> None:
        from .isa import _copy_into

        _copy_into(self[key], value, caller_loc())

    # -- view methods ----------------------------------------------------------------------------
    def is_contiguous(self) -> bool:
        """Row-major dense over the free dimensions (on-chip: the partition stride is ignored)."""
        start = 1 if self.on_chip else 0
        expect = 1
        for n, s in reversed(list(zip(self.shape[start:], self.strides[start:]))):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def is_indirect(self) -> bool:
        return self._indirect is not None

    def get_pattern(self) -> list[list[int]]:
        """``[[stride, count], ...]`` in dimension order."""
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def reshape(self, *shape) -> NkiTensor:
        """The same elements in a new row-major shape (no copy).  The view must be contiguous
        (on-chip: over its free dimensions, and ``shape[0]`` keeps the partition count)."""
        loc = caller_loc()
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        if not isinstance(shape, tuple):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reshape",
                why=f"the shape must be a tuple of ints, got {type(shape).__name__}",
            )
        shape = _resolve_shape(
            tuple(_index(s, "reshape", loc, none=False) for s in shape), self.size, loc
        )
        if math.prod(shape) != self.size:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reshape",
                why=f"cannot reshape {self.shape} ({self.size} elements) to {shape}",
            )
        if self.on_chip:
            if not shape or shape[0] != self.shape[0]:
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="reshape",
                    why=f"an on-chip reshape keeps the partition dimension ({self.shape[0]}), got {shape}",
                )
            if not self.is_contiguous():
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="reshape",
                    why=f"the view {self.get_pattern()} is not contiguous; reshape before slicing",
                )
            free = row_major(shape[1:])
            strides = (self.strides[0], *free) if len(shape) > 1 else (self.strides[0],)
            view = self._with(shape, strides)
            free_storage = self._free_storage()
            if (
                self.offset == 0
                and self.strides[0] == free_storage
                and math.prod(shape[1:]) == free_storage
            ):
                # the whole storage seen in another shape (every free element of every
                # partition, not a leading part of each row): index against that shape
                droot = _dtype_root(self._layout)
                if shape[0] == droot.shape[0]:
                    view._layout = _layout_alias(droot, shape)
            return view
        if not self.is_contiguous():
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reshape",
                why=f"the view {self.get_pattern()} is not contiguous; reshape before slicing",
            )
        view = self._with(shape, row_major(shape))
        if self.offset == 0 and self.size == self._storage_size():
            view._layout = _layout_alias(_dtype_root(self._layout), shape)
        return view

    def view(self, dtype) -> NkiTensor:
        """The same bytes seen as ``dtype`` (NKI's ``view`` / ``reinterpret_cast``; no copy,
        no instruction).  The last dimension is scaled by the ratio of the element sizes
        (fp32 -> uint8: x4, uint8 -> fp32: /4) and must be contiguous; going to a larger
        element, its size, the other strides and the offset must divide by the ratio
        [reference/nki-0x.md §3.5].  Not after a runtime (vector/scalar) offset."""
        loc = caller_loc()
        dt = as_dtype(dtype, loc, "view")
        if dtypes.name(dt) == dtypes.name(self.dtype):
            return self
        if self._indirect is not None:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="view",
                why="a view with a runtime offset (.ap(vector_offset=/scalar_offset=)) cannot "
                "be reinterpreted; call .view(dtype) first",
            )
        i0, i1 = self.dtype.itemsize, dt.itemsize
        shape, strides = list(self.shape), list(self.strides)
        if shape[-1] != 1 and strides[-1] != 1:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="view",
                why=f"the last dimension of {self.get_pattern()} must be contiguous (step 1) "
                f"to reinterpret {dtypes.name(self.dtype)} as {dtypes.name(dt)}",
            )
        if i0 >= i1:
            r = i0 // i1
            shape[-1] *= r
            strides = [s * r for s in strides[:-1]] + [1]
            offset = self.offset * r
        else:
            k = i1 // i0
            if shape[-1] % k or any(s % k for s in strides[:-1]) or self.offset % k:
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="view",
                    why=f"{dtypes.name(self.dtype)} {self.shape} (pattern {self.get_pattern()}, "
                    f"offset {self.offset}) does not split into whole {dtypes.name(dt)} "
                    f"elements of {i1} bytes: the last dimension, the steps and the offset "
                    f"must divide by {k}",
                )
            shape[-1] //= k
            strides = [s // k for s in strides[:-1]] + [1]
            offset = self.offset // k
        layout = _dtype_alias(self._layout.root, dt, loc)
        return NkiTensor._view(layout, tuple(shape), tuple(strides), offset, None)

    reinterpret_cast = view

    def _dim(self, dim, op: str, extra: int = 0, partition: bool = True) -> int:
        """``dim`` (negative from the end) as an index of ``ndim + extra`` dimensions; on
        chip, ``partition=False`` refuses dimension 0.  Else ``err_invalid_argument``."""
        n = len(self.shape) + extra
        if type(dim) is not int:
            dim = _index(dim, op, none=False)
        if not -n <= dim < n:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op=op,
                why=f"dimension {dim} is out of range for {n} dimensions",
            )
        dim = dim + n if dim < 0 else dim
        if dim == 0 and not partition and self._layout.root.buffer in ON_CHIP:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op=op,
                why="an on-chip tensor keeps its partition dimension (dimension 0)",
            )
        return dim

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        dim = self._dim(dim, "slice")
        if type(start) is int and type(end) is int and start >= end:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="slice",
                why=f"start ({start}) must be below end ({end})",
            )
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index) -> NkiTensor:
        dim = self._dim(dim, "select")
        if not isinstance(index, int | np.integer):
            if isinstance(index, float | str | bool) or index is None:
                _index(index, "select", none=False)
            return self._dynamic_select(dim, index, caller_loc())
        if not 0 <= index < self.shape[dim] or (dim == 0 and self.on_chip):
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="select",
                why=f"index {index} of dimension {dim} (size {self.shape[dim]}); an on-chip "
                "tensor keeps its partition dimension",
            )
        shape = list(self.shape)
        strides = list(self.strides)
        offset = self.offset + int(index) * strides[dim]
        if len(shape) > (2 if self.on_chip else 1):
            del shape[dim], strides[dim]
        else:  # as indexing: an HBM view keeps 1 dimension, an on-chip one 2 (reference §3.4)
            shape[dim] = 1
        return self._with(shape, strides, offset)

    def _whole(self) -> bool:
        """Whether this view is its whole storage in row-major order (what ``.ap`` with a
        runtime offset measures its rows in)."""
        return (
            self.offset == 0
            and self.size == self._storage_size()
            and tuple(self.strides) == row_major(self.shape)
        )

    def _dynamic_select(self, dim: int, index, loc: SourceLoc) -> NkiTensor:
        """``t.select(dim, idx)`` with a runtime (1, 1) index: ``.ap(scalar_offset=idx,
        indirect_dim=dim)`` with dimension ``dim`` dropped from the pattern."""
        if not self._whole():
            raise NkiError(
                "err_unsupported_api",
                loc,
                api="NkiTensor.select with a runtime index on a view",
                why="select on the whole tensor (or a reshape of it), or use "
                ".ap(scalar_offset=...) for a runtime offset",
            )
        pattern = [[st, n] for d, (st, n) in enumerate(zip(self.strides, self.shape)) if d != dim]
        return self.ap(pattern, offset=0, scalar_offset=index, indirect_dim=dim)

    def indirect(self, index, num_elem=None) -> NkiTensor:
        """NeuronCore-v4 tensor indirection: a ``(P, num_elem)`` view whose column ``i`` is
        the column of this on-chip tensor at the free offset ``index`` (a ``(P, K)`` SBUF
        integer tile) gives for ``i`` in the snake order of the engine that runs the
        instruction; ``num_elem`` defaults to ``index.size`` (``nkikit/nki/indirection.py``)."""
        from .indirection import indirect_view

        return indirect_view(self, index, num_elem, caller_loc())

    def vector_select(self, dim: int, vector_offset) -> NkiTensor:
        """Partition ``p`` of the result reads row ``vector_offset[p]`` of this HBM tensor
        (``.ap(vector_offset=..., indirect_dim=0)`` with this tensor's pattern); the result has
        ``vector_offset.shape[0]`` rows."""
        loc = caller_loc()
        if dim != 0:
            raise NkiError(
                "err_unsupported_api",
                loc,
                api=f"NkiTensor.vector_select(dim={dim}, ...)",
                why="a vector offset indexes rows (dim=0)",
            )
        require_tensor(vector_offset, loc, "vector_select", "vector_offset")
        if not self._whole():
            raise NkiError(
                "err_unsupported_api",
                loc,
                api="NkiTensor.vector_select on a view",
                why="call it on the whole tensor (or a reshape of it)",
            )
        rows = vector_offset.shape[0]
        pattern = [[self.strides[0], rows]] + [
            [st, n] for st, n in zip(self.strides[1:], self.shape[1:])
        ]
        return self.ap(pattern, offset=0, vector_offset=vector_offset, indirect_dim=0)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> NkiTensor:
        """einops-style: split the grouped names of ``src_pattern`` (sizes from
        ``fixed_sizes``, one inferred per group), reorder to ``dst_pattern`` and merge its
        groups; a view, no instruction."""
        loc = caller_loc()
        if fixed_sizes is not None and not isinstance(fixed_sizes, dict):
            raise NkiError(
                "err_invalid_argument", loc, op="rearrange", why="fixed_sizes is a dict of sizes"
            )
        fixed = dict(fixed_sizes or {})

        def bad(why: str) -> NkiError:
            return NkiError("err_invalid_argument", loc, op="rearrange", why=why)

        def names(pattern) -> list[list[str]]:
            if not isinstance(pattern, tuple | list) or not all(
                isinstance(g, str | tuple | list) for g in pattern
            ):
                raise bad(f"pattern {pattern!r} is a tuple of names (str) or tuples of names")
            groups = [[g] if isinstance(g, str) else list(g) for g in pattern]
            if not all(isinstance(n, str) for g in groups for n in g):
                raise bad(f"pattern {pattern!r} holds names (str) or tuples of names")
            return groups

        src, dst = names(src_pattern), names(dst_pattern)
        if len(src) != self.ndim:
            raise bad(f"{src_pattern!r} names {len(src)} dimensions, the tensor has {self.ndim}")
        flat = [n for g in src for n in g]
        if len(set(flat)) != len(flat) or sorted(flat) != sorted(n for g in dst for n in g):
            raise bad(f"{dst_pattern!r} must use each name of {src_pattern!r} exactly once")
        t = self
        for d in reversed(range(len(src))):
            g = src[d]
            if len(g) == 1:
                continue
            unknown = [n for n in g if n not in fixed]
            if len(unknown) > 1:
                raise bad(f"group {tuple(g)!r} needs sizes for all but one of its names")
            t = t.reshape_dim(d, tuple(fixed.get(n, -1) for n in g))
        t = t.permute(tuple(flat.index(n) for g in dst for n in g))
        start = [0]
        for g in dst:
            start.append(start[-1] + len(g))
        for i in reversed(range(len(dst))):
            if len(dst[i]) > 1:
                t = t.flatten_dims(start[i], start[i + 1] - 1)
        return t

    def permute(self, dims) -> NkiTensor:
        if not isinstance(dims, tuple | list):
            dims = (dims,)
        dims = tuple(_index(d, "permute", none=False) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="permute",
                why=f"{dims} is not a permutation of {self.ndim} dimensions",
            )
        if self.on_chip and dims[0] != 0:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="permute",
                why="an on-chip tensor keeps the partition dimension first (dims[0] == 0)",
            )
        return self._with([self.shape[d] for d in dims], [self.strides[d] for d in dims])

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        dim = self._dim(dim, "broadcast", partition=False)
        size = _index(size, "broadcast", none=False)
        if size < 1:
            raise NkiError(
                "err_invalid_argument", caller_loc(), op="broadcast", why=f"size {size} < 1"
            )
        if self.shape[dim] != 1:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="broadcast",
                why=f"dimension {dim} has size {self.shape[dim]}, not 1",
            )
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = size, 0
        return self._with(shape, strides)

    def expand_dim(self, dim: int) -> NkiTensor:
        dim = self._dim(dim, "expand_dim", extra=1, partition=False)
        shape, strides = list(self.shape), list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, 0)
        return self._with(shape, strides)

    def squeeze_dim(self, dim: int) -> NkiTensor:
        dim = self._dim(dim, "squeeze_dim", partition=False)
        if self.shape[dim] != 1:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="squeeze_dim",
                why=f"dimension {dim} has size {self.shape[dim]}, not 1",
            )
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return self._with(shape, strides)

    def reshape_dim(self, dim: int, shape) -> NkiTensor:
        dim = self._dim(dim, "reshape_dim")
        loc = caller_loc()
        if not isinstance(shape, tuple | list):
            shape = (shape,)
        parts = tuple(_index(s, "reshape_dim", loc, none=False) for s in shape)
        parts = _resolve_shape(parts, self.shape[dim], loc)
        if (
            math.prod(parts) != self.shape[dim]
            or min(parts, default=0) < 1
            or (dim == 0 and self.on_chip and parts[0] != self.shape[0])
        ):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reshape_dim",
                why=f"cannot split dimension {dim} of size {self.shape[dim]} into {parts} "
                "(on chip, the partition count stays first)",
            )
        inner = row_major(parts)
        new_shape = list(self.shape[:dim]) + list(parts) + list(self.shape[dim + 1 :])
        new_strides = (
            list(self.strides[:dim])
            + [self.strides[dim] * s for s in inner]
            + list(self.strides[dim + 1 :])
        )
        return self._with(new_shape, new_strides)

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        start_dim = self._dim(start_dim, "flatten_dims", partition=False)
        end_dim = self._dim(end_dim, "flatten_dims")
        if start_dim > end_dim:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="flatten_dims",
                why=f"start_dim {start_dim} is after end_dim {end_dim}",
            )
        # size-1 dimensions have no stride that matters; the others must nest exactly
        dims = [d for d in range(start_dim, end_dim + 1) if self.shape[d] != 1]
        for d, e in zip(dims, dims[1:]):
            if self.strides[d] != self.strides[e] * self.shape[e]:
                raise NkiError(
                    "err_invalid_argument",
                    caller_loc(),
                    op="flatten_dims",
                    why=f"dimensions {start_dim}..{end_dim} of {self.get_pattern()} are not contiguous",
                )
        n = math.prod(self.shape[start_dim : end_dim + 1])
        inner = self.strides[dims[-1]] if dims else 1
        shape = list(self.shape[:start_dim]) + [n] + list(self.shape[end_dim + 1 :])
        strides = list(self.strides[:start_dim]) + [inner] + list(self.strides[end_dim + 1 :])
        return self._with(shape, strides)

    def ap(
        self,
        pattern,
        offset: int | None = None,
        scalar_offset=None,
        vector_offset=None,
        indirect_dim: int = 0,
        dtype=None,
    ) -> NkiTensor:
        """A raw access pattern over this tensor's storage: ``pattern`` is ``[[step, count],
        ...]`` outermost first; element ``(i0, ...)`` is storage element ``offset + sum(step_j *
        i_j)``.  The view's own shape and strides are ignored (``.ap`` does not compose);
        ``offset=None`` keeps the view's offset.  On-chip, the first pair addresses partitions
        and its step must be the storage's free size."""
        loc = caller_loc()
        if dtype is not None and dtypes.name(as_dtype(dtype, loc, "ap")) != dtypes.name(self.dtype):
            # the storage seen as ``dtype``: the pattern and offset count its elements [APS]
            dt = as_dtype(dtype, loc, "ap")
            layout = _dtype_alias(self._layout.root, dt, loc)
            if offset is None:
                nbytes = self.offset * self.dtype.itemsize
                if nbytes % dt.itemsize:
                    raise NkiError(
                        "err_invalid_argument",
                        loc,
                        op="ap",
                        why=f"the view's offset ({nbytes} bytes) is not a whole number of "
                        f"{dtypes.name(dt)} elements; pass offset=",
                    )
                offset = nbytes // dt.itemsize
            base = NkiTensor._view(layout, (1,), (1,), 0, None)
            return base.ap(pattern, offset, scalar_offset, vector_offset, indirect_dim)
        pairs = _pattern_pairs(pattern, loc, "ap")
        if not pairs:
            raise NkiError("err_invalid_argument", loc, op="ap", why="empty access pattern")
        strides = tuple(p[0] for p in pairs)
        shape = tuple(p[1] for p in pairs)
        base = self.offset if offset is None else _index(offset, "ap", loc)
        if base < 0:
            raise NkiError(
                "err_invalid_argument", loc, op="ap", why=f"offset must be >= 0, got {base}"
            )
        if self.on_chip and shape[0] > 1 and strides[0] != self._free_storage():
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="ap",
                why=(
                    f"the partition step of an on-chip access pattern must be the free size "
                    f"of {self.name} ({self._free_storage()}), got {strides[0]}"
                ),
            )
        view = NkiTensor(_dtype_root(self._layout), shape, strides, base)
        if scalar_offset is not None or vector_offset is not None:
            if scalar_offset is not None and vector_offset is not None:
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="ap",
                    why="scalar_offset and vector_offset are mutually exclusive",
                )
            index = vector_offset if vector_offset is not None else scalar_offset
            kind = "vector" if vector_offset is not None else "scalar"
            if kind == "scalar" and not isinstance(index, NkiTensor):
                from .isa.registers import VirtualRegister

                if isinstance(index, VirtualRegister):
                    # the register's (or NkiScalar's) one-element SBUF tile holds its value
                    index = index.value_tile(loc, ".ap(scalar_offset=...)")
            if not isinstance(index, NkiTensor):
                raise NkiError(
                    "err_unsupported_api",
                    loc,
                    api=f".ap({kind}_offset=...)",
                    why="the offset must be an SBUF tensor of integers or a register",
                )
            indirect_dim = _index(indirect_dim, "ap", loc, none=False)
            if not 0 <= indirect_dim < len(self.shape) or (kind == "vector" and indirect_dim):
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="ap",
                    why=f"indirect_dim {indirect_dim} of a {len(self.shape)}-D tensor (a "
                    "vector_offset indexes dimension 0 only)",
                )
            if kind == "scalar" and self.on_chip:
                _check_on_chip_offset(self, indirect_dim, loc)
            view._indirect = (index, indirect_dim, kind, self.shape)
        return view


def _check_on_chip_offset(base: NkiTensor, dim: int, loc: SourceLoc) -> None:
    """``base.ap(..., scalar_offset=..., indirect_dim=dim)`` on SBUF/PSUM: the offset moves
    along a free dimension, never the partition dimension [nki-0x.md §3.7].  (Its int32 rule
    [§3.6 "0.7 scalar restrictions"] holds already: nkikit has no 64-bit integer dtype.)"""
    root = _dtype_root(base._layout)
    if dim == 0 or base.shape[0] != root.shape[0]:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="ap scalar_offset",
            why=f"on {root.buffer.upper()} a runtime offset moves along a free dimension "
            f"(indirect_dim >= 1 of a tensor whose dimension 0 is its {root.shape[0]} "
            f"partitions), got indirect_dim={dim} of {tuple(base.shape)}",
        )


_ALL = slice(None)
_DynSlice = None  # nl.ds's class, imported on first use (nkikit.nki.language imports this)


def _load_dynslice() -> None:
    global _DynSlice
    from .language import DynSlice

    _DynSlice = DynSlice


def _as_slice_or_int(k, loc: SourceLoc | None):
    """``k`` as a slice or a Python int (``loc``: the user's line, None to look it up)."""
    from .language import DynSlice

    if isinstance(k, slice):
        return k
    if isinstance(k, DynSlice):
        return slice(k.start, k.start + k.size)
    if isinstance(k, bool):
        raise NkiError(
            "err_invalid_argument",
            loc or caller_loc(),
            op="indexing",
            why="cannot index with a bool",
        )
    if isinstance(k, int | np.integer):
        return int(k)
    raise NkiError(
        "err_invalid_argument",
        loc or caller_loc(),
        op="indexing",
        why=f"cannot index with {type(k).__name__} {k!r}; use ints, slices or nl.ds",
    )


def _index(v, op: str, loc: SourceLoc | None = None, none: bool = True) -> int | None:
    """``v`` as a Python int (None stays None): a bound, size or offset given at trace time.
    Anything else (a float, a string, a tensor) is ``err_invalid_argument`` at ``loc``."""
    if type(v) is int or (v is None and none):
        return v
    if (
        v is not None
        and not isinstance(v, bool | np.bool_ | float | str)
        and hasattr(v, "__index__")
    ):
        try:
            return v.__index__()
        except TypeError:  # an array of more than one element
            pass
    raise NkiError(
        "err_invalid_argument",
        loc or caller_loc(),
        op=op,
        why=f"expected an integer, got {type(v).__name__} {v!r}"[:200],
    )


def _pattern_pairs(pattern, loc: SourceLoc, op: str) -> list[tuple[int, int]]:
    """An access pattern ``[[step, count], ...]`` as int pairs (each count >= 1)."""
    if isinstance(pattern, list | tuple) and all(
        isinstance(p, list | tuple) and len(p) == 2 for p in pattern
    ):
        pairs = [(_index(p[0], op, loc), _index(p[1], op, loc)) for p in pattern]
        if all(n >= 1 for _, n in pairs):
            return pairs
    raise NkiError(
        "err_invalid_argument",
        loc,
        op=op,
        why=f"the pattern must be a list of [step, count] pairs with counts >= 1, got {pattern!r}"[
            :300
        ],
    )


def as_dtype(dtype, loc: SourceLoc, op: str) -> np.dtype:
    """``dtypes.as_dtype`` with its refusal as ``err_unsupported_dtype`` at ``loc``."""
    try:
        return dtypes.as_dtype(dtype)
    except TypeError as e:
        raise NkiError(
            "err_unsupported_dtype", loc, op=op, dtype=repr(dtype)[:80], why=str(e)[:200]
        ) from None


def _resolve_shape(shape: tuple[int, ...], size: int, loc: SourceLoc) -> tuple[int, ...]:
    if shape.count(-1) > 1:
        raise NkiError("err_invalid_argument", loc, op="reshape", why="at most one -1 dimension")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise NkiError(
                "err_invalid_argument", loc, op="reshape", why=f"cannot infer -1 in {shape}"
            )
        shape = tuple(size // known if s == -1 else s for s in shape)
    return shape


def _layout_alias(root: Tensor, shape: tuple[int, ...]) -> Tensor:
    """An IR tensor viewing ``root``'s storage with another row-major shape (cached)."""
    shape = tuple(shape)
    if shape == root.shape:
        return root
    b = current("reshape")
    cache = b.__dict__.setdefault("_nki_layouts", {})
    key = (root.uid, shape)
    t = cache.get(key)
    if t is None:
        t = Tensor(
            b.unique(f"{root.name}.reshape"),
            shape,
            root.dtype,
            root.buffer,
            kind=root.kind,
            loc=root.loc,
            base=root,
            mutable=root.mutable,
            scope=root.scope,
        )
        b.tensors.append(t)
        cache[key] = t
    return t


def _dtype_root(layout: Tensor) -> Tensor:
    """The tensor whose row-major elements a view over ``layout`` counts: the storage root,
    or the dtype view of it (``view(dtype)``) that ``layout`` reshapes."""
    t = layout
    while t.base is not None and dtypes.name(t.dtype) == dtypes.name(t.base.dtype):
        t = t.base
    return t


def _dtype_alias(root: Tensor, dt: np.dtype, loc: SourceLoc) -> Tensor:
    """An IR tensor viewing storage root ``root``'s bytes as ``dt`` (cached): on-chip
    ``(partitions, bytes per partition / size of dt)``, in HBM the root's shape with its last
    dimension rescaled (or flat when it does not divide)."""
    if dtypes.name(dt) == dtypes.name(root.dtype):
        return root
    i0, i1 = root.dtype.itemsize, dt.itemsize
    if root.buffer in ON_CHIP:
        rows = root.shape[0]
        nbytes = (math.prod(root.shape[1:]) if len(root.shape) > 1 else 1) * i0
        shape = (rows, nbytes // i1)
    else:
        nbytes = math.prod(root.shape) * i0
        last = root.shape[-1] * i0 if root.shape else i0
        shape = (*root.shape[:-1], last // i1) if last % i1 == 0 else (nbytes // i1,)
    if nbytes % i1:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="view",
            why=f"{root.name} holds {nbytes} bytes{' per partition' if root.buffer in ON_CHIP else ''}, "
            f"not a whole number of {dtypes.name(dt)} elements ({i1} bytes)",
        )
    b = current("view")
    cache = b.__dict__.setdefault("_nki_layouts", {})
    key = (root.uid, "dtype", dtypes.name(dt))
    t = cache.get(key)
    if t is None:
        t = Tensor(
            b.unique(f"{root.name}.{dtypes.name(dt)}"),
            shape,
            dt,
            root.buffer,
            kind=root.kind,
            loc=loc,  # where the bits are first reinterpreted (the storage is root's)
            base=root,
            mutable=root.mutable,
            scope=root.scope,
        )
        b.tensors.append(t)
        cache[key] = t
    return t


def _flat_layout(root: Tensor) -> Tensor:
    """The storage as ``(P, free)`` (on-chip) or ``(n,)`` (HBM): every strided view of it has
    an affine index in this shape."""
    if root.buffer in ON_CHIP:
        shape = (root.shape[0], math.prod(root.shape[1:]) if len(root.shape) > 1 else 1)
    else:
        shape = (math.prod(root.shape),)
    return _layout_alias(root, shape)


def _decompose(t: Tensor, shape, strides, offset) -> tuple[Affine, ...] | None:
    """Per-dimension affine indices of the strided view in ``t``'s row-major shape, or None
    when the view does not stay inside one dimension of ``t`` per term."""
    return _decompose_dims(t.shape, tuple(shape), tuple(strides), offset)


@functools.lru_cache(maxsize=1 << 16)
def _decompose_dims(dims, shape, strides, offset) -> tuple[Affine, ...] | None:
    # cached: an unrolled loop makes the same views again and again (the Affines are
    # immutable, so accesses may share them)
    plan = _term_plan(dims, tuple(shape), tuple(strides))
    if plan is None:
        return None
    st, terms, spans = plan
    out = []
    rem = offset
    for d, s in enumerate(st):
        const, rem = divmod(rem, s)
        if const < 0 or const + spans[d] >= dims[d]:
            return None
        out.append(Affine(terms[d], const))
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def _term_plan(dims: tuple[int, ...], shape: tuple[int, ...], strides: tuple[int, ...]):
    """Which storage dimension each view axis steps along (with its coefficient), and how far
    each storage dimension's index reaches: the part of a decomposition that does not depend
    on the offset, shared by the views a loop makes with the same shape at other offsets."""
    st = row_major(dims)
    terms: list[list] = [[] for _ in dims]
    spans = [0] * len(dims)
    for j, (n, s) in enumerate(zip(shape, strides)):
        if s == 0:
            continue  # a broadcast axis reads the same element
        if s < 0:
            return None
        for d, sd in enumerate(st):
            if s % sd == 0:
                c = s // sd
                if n == 1 and terms[d]:
                    break  # a unit axis adds nothing where another axis already steps
                # a unit axis still names its dimension (as a Beta-1 slice does), so a view
                # of a whole tensor is the whole tensor to every layer
                terms[d].append((_axis(j), 1 if n == 1 else c))
                spans[d] += c * (n - 1)
                break
    return st, tuple(tuple(x) for x in terms), tuple(spans)


def _axis(k: int) -> Axis:
    return _AXES[k] if k < len(_AXES) else Axis(k)


_AXES = tuple(Axis(k) for k in range(16))


def access_of(x: NkiTensor, loc: SourceLoc, what: str = "operand") -> Access:
    """The IR access of a view (see the module docstring)."""
    if type(x) is not NkiTensor:
        require_tensor(x, loc, what, "the operand")
    got = x._access
    if got is not None:
        return got
    if 0 in x.shape:
        raise empty_operand(x, loc, what)
    if x._indirect is not None:
        return _indirect_access(x, loc, what)
    layout = x._layout
    root = layout if layout.base is None else _dtype_root(layout)
    shape, strides, offset = x.shape, x.strides, x.offset  # tuples of ints (see _view)
    index = _decompose_dims(layout.shape, shape, strides, offset)
    if index is None or offset < 0:
        size = math.prod(root.shape)
        span_hi = offset + sum(s * (n - 1) for n, s in zip(shape, strides))
        if offset >= 0 and span_hi < size and min(strides, default=0) < 0:
            # in bounds, but walking backwards: not an out-of-bounds access
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=what,
                why=f"the access pattern {x.get_pattern()} of {root.name} has a negative "
                "step; nkikit models access patterns with steps >= 0",
            )
        if offset < 0 or span_hi >= size or min(strides, default=0) < 0:
            raise NkiError(
                "err_tensor_access_out_of_bound",
                loc,
                tensor=root.name,
                dim=0,
                index=span_hi,
                size=size,
            )
    if index is None and layout is not root:
        layout = root
        index = _decompose(layout, shape, strides, offset)
    if index is None:
        layout = _flat_layout(root)
        index = _decompose(layout, shape, strides, offset)
    if index is None:
        # on-chip: a view that steps across partitions cannot be expressed
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=what,
            why=f"the access pattern {x.get_pattern()} (offset {x.offset}) of {root.name} "
            "does not keep partitions contiguous",
        )
    if len(shape) < 2 and root.buffer in ON_CHIP:
        shape = (shape[0], 1)  # a size-1 trailing axis adds no index term
    x._access = acc = Access(layout, shape, index)
    return acc


def not_a_tensor(what: str, x) -> str:
    """Why ``x``, given where an instruction takes a tensor, is refused (a tile grid: its
    ``.data`` is the operand)."""
    return f"{what} must be a tensor (nl.ndarray or a view of one), got {got_type(x)}"


def got_type(x) -> str:
    """``x``'s type name for a refusal, with the hint a tile grid needs: a grid has a shape
    of its own, so an instruction takes its ``.data``."""
    from .language.grids import NkiGrid

    hint = "; an instruction takes a grid's .data" if isinstance(x, NkiGrid) else ""
    return f"{type(x).__name__}{hint}"


def empty_operand(x: NkiTensor, loc: SourceLoc, what: str) -> NkiError:
    """The refusal of a view with no elements (``t[:, 0:0]``) as an instruction's operand:
    an access pattern counts at least one element per dimension, so such a view may be made
    but not read or written (``err_invalid_argument`` at ``loc``, naming ``what``)."""
    return NkiError(
        "err_invalid_argument",
        loc,
        op=what,
        why=f"the view of {x.tensor.name} has shape {x.shape}, no elements; an instruction "
        "reads and writes at least one element per dimension",
    )


def require_tensor(x, loc: SourceLoc, op: str, what: str) -> None:
    """The one refusal of a non-tensor (a tile grid among them) where ``op``
    (``"nisa.tensor_reduce"``, ``"nl.sum"``) takes tensor ``what``: ``err_invalid_argument``
    at ``loc``, the kernel's line.  The operand helpers of ``nisa``, ``nl`` and ``ncc`` and
    ``access_of`` all end here; the per-operand ones of the trace path (``access_of``,
    ``_tiles``, ``_dst_chip``, ``_dma_pair``) call it only once ``type(x) is not NkiTensor``."""
    if not isinstance(x, NkiTensor):
        raise NkiError("err_invalid_argument", loc, op=op, why=not_a_tensor(what, x))


def _indirect_access(x: NkiTensor, loc: SourceLoc, what: str) -> Access:
    """``.ap(vector_offset=idx, indirect_dim=0)``: partition ``p`` of the access reads row
    ``idx[p]`` of the HBM tensor (the IR's indirect DMA access)."""
    index, dim, kind, base_shape = x._indirect
    if kind == "tensor":  # NkiTensor.indirect: free offsets of an on-chip tensor
        from .indirection import indirect_access

        return indirect_access(x, loc, what)
    root = _dtype_root(x._layout)
    if kind == "scalar":
        return _scalar_offset_access(x, index, dim, base_shape, loc, what)
    if root.buffer in ON_CHIP:
        # a vector offset indexes HBM rows of a DMA only [nki-0x.md §3.6, §3.7]
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=what,
            what="a vector_offset access",
            allowed="HBM",
            got=root.buffer,
        )
    if dim != 0:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f".ap(vector_offset=..., indirect_dim={dim})",
            why="a vector offset indexes rows (indirect_dim=0)",
        )
    # rows of the HBM tensor: the storage as (rows, row size), the row size that of the tensor
    # ``.ap`` was called on (a reshape of the argument indexes rows of its own shape); the
    # pattern's first step is ignored [nki-0x.md §3.6 "vector_offset"]
    base_shape = tuple(base_shape)
    if math.prod(base_shape) != math.prod(root.shape):
        base_shape = root.shape  # ``.ap`` on a slice: the storage's own rows
    row = math.prod(base_shape[1:]) if len(base_shape) > 1 else 1
    size = math.prod(root.shape)
    if row == 0 or size % row:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=".ap(vector_offset=...) on a view",
            why=f"rows of {tuple(base_shape)} do not tile {root.name}; call .ap on the whole "
            "tensor (or a reshape of it)",
        )
    layout = _layout_alias(root, (size // row, row))
    inner = NkiTensor(layout, (1, *x.shape[1:]), (row, *x.strides[1:]), x.offset)
    direct = _decompose(layout, inner.shape, inner.strides, inner.offset)
    if direct is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=what,
            why=f"the access pattern {x.get_pattern()} does not stay within one row of {root.name}",
        )
    # the inner view has one partition: an axis-0 term in its index is that partition's step,
    # which the runtime row index replaces (partition p reads row idx[p], not p + idx[p])
    direct = tuple(a.substitute({_AXES[0]: Affine.of(0)}) for a in direct)
    idx = access_of(index, loc, "vector_offset")
    shape = tuple(x.shape) if len(x.shape) > 1 else (x.shape[0], 1)
    if idx.shape[0] != shape[0] or idx.free_size != 1:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"{what} vector_offset",
            why=f"the index tensor must be ({shape[0]}, 1), one row index per partition; got {idx.shape}",
        )
    # the index's free axes have extent 1: pin them to 0, so that renaming the tile axes (a
    # gather-transpose's) cannot make a column of a wider index tile walk them
    pinned = {_AXES[k]: Affine.of(0) for k in range(1, len(idx.shape))}
    idx_index = tuple(a.substitute(pinned) for a in idx.index)
    idx_acc = Access(idx.tensor, (shape[0],) + (1,) * (len(shape) - 1), idx_index)
    return Access(layout, shape, direct, idx_acc, 0)


def _scalar_offset_access(
    x: NkiTensor, index: NkiTensor, dim: int, base_shape, loc: SourceLoc, what: str
) -> Access:
    """``.ap(pattern, offset, scalar_offset=t, indirect_dim=d)``: the access starts
    ``t * prod(base.shape[d + 1:])`` elements later, ``t`` the runtime value of a (1, 1) SBUF
    tensor and ``base`` the tensor ``.ap`` was called on [nki-0x.md §3.6].  In the IR: the
    static pattern's index in ``base``'s shape, plus the runtime value along dimension d
    (an indirect access the simulator bounds-checks when it runs).  HBM or on-chip (checked
    by ``_check_on_chip_offset`` where ``.ap`` is called)."""
    root = _dtype_root(x._layout)
    if index.size != 1:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"{what} scalar_offset",
            why=f"the offset must be a (1, 1) tensor, got {index.shape}",
        )
    base_shape = tuple(base_shape)
    if math.prod(base_shape) != math.prod(root.shape) or not 0 <= dim < len(base_shape):
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=".ap(scalar_offset=...) on a view",
            why="call .ap on the whole tensor (or a reshape of it)",
        )
    layout = _layout_alias(root, base_shape)
    direct = _decompose(layout, x.shape, x.strides, x.offset)
    if direct is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=what,
            why=f"the access pattern {x.get_pattern()} does not stay inside {base_shape}",
        )
    idx = access_of(index, loc, "scalar_offset")
    shape = tuple(x.shape)
    idx_acc = Access(idx.tensor, (1,) * len(shape), idx.index)
    return Access(layout, shape, direct, idx_acc, dim)
