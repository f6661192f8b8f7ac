"""The Beta-1 proxy tensor a kernel sees while it is traced: a view (Access) of an IR tensor.

Its operators and assignments are NKI Beta 1 semantics (``t[...] = x`` is a copy or a retarget,
``a + b`` is ``nl.add``), so it lives with the Beta-1 dialect; the tracer underneath knows
only accesses (``nkikit.trace``)."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import NkiError, caller_loc
from ..ir.core import Access, Tensor
from ..trace.builder import current, reshape_access, resolve
from ..trace.index import RuntimeIndex, index_access


class Tile:
    """A tensor or tile inside a traced kernel (NKI's ``nki.tensor``).

    Supports ``.shape``, ``.dtype``, indexing (basic slicing, ``nl.arange``/``nl.mgrid``
    indices, ``nl.ds``, and an SBUF tile of integers on the partition dimension of an HBM
    tensor: ``t[idx_tile, i_f]``, an indirect DMA access), assignment ``t[...] = value``,
    Python arithmetic operators
    (each one instruction), ``reshape`` (HBM tensors) and ``broadcast_to``.
    """

    __slots__ = ("_access",)
    __array_priority__ = 1000

    def __init__(self, access: Access) -> None:
        self._access = access

    @staticmethod
    def of(tensor: Tensor) -> Tile:
        return Tile(Access.whole(tensor))

    @property
    def access(self) -> Access:
        return resolve(self._access)

    @property
    def tensor(self) -> Tensor:
        return self.access.tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self._access.shape

    @property
    def dtype(self) -> np.dtype:
        return self.access.tensor.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def buffer(self) -> str:
        return self.access.tensor.buffer

    def __len__(self) -> int:
        return self.shape[0]

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        raise NkiError("err_ambiguous_tensor_truth_value", caller_loc())

    def __iter__(self):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op="iteration",
            why="tiles cannot be iterated in Python; loop with nl.affine_range over an index",
        )

    def __array__(self, dtype=None, copy=None):
        """The values the tile holds after the instructions traced so far
        (:mod:`nkikit.trace.peek`: for a look from ``print`` or ``breakpoint()``)."""
        from ..trace.peek import look

        return look(lambda loc: self.access, caller_loc(), dtype)

    def __repr__(self) -> str:
        a = self.access
        return f"Tile({a!r}, shape={self.shape}, dtype={dtypes.name(self.dtype)}, buffer={a.tensor.buffer})"

    # -- indexing ---------------------------------------------------------------------------
    def __getitem__(self, key) -> Tile:
        return Tile(index_access(self.access, _runtime_key(key)))

    def __setitem__(self, key, value) -> None:
        from . import ops as L

        dst = index_access(self.access, _runtime_key(key))
        b = current()
        loc = caller_loc()
        if isinstance(value, Tile):
            src = value.access
            if src == dst:
                return  # the tail of `t[...] += x`, already done in __iadd__
            if value._access.tensor.kind == "temp" and b.retarget(value._access.tensor, dst):
                return
            L.copy_into(dst, src, loc=loc)
        elif isinstance(value, int | float | np.integer | np.floating | bool):
            L.memset_into(dst, value, loc=loc)
        else:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="assignment",
                why=f"cannot assign a {type(value).__name__} to a tile",
            )

    def _accumulate(self, other, op: str) -> Tile:
        from . import ops as L

        return L.accumulate(self, other, op, loc=caller_loc())

    def __iadd__(self, other):
        return self._accumulate(other, "add")

    def __isub__(self, other):
        return self._accumulate(other, "subtract")

    def __imul__(self, other):
        return self._accumulate(other, "multiply")

    def __itruediv__(self, other):
        return self._accumulate(other, "divide")

    def __imax__(self, other):  # pragma: no cover - not a Python operator
        return self._accumulate(other, "maximum")

    # -- views ------------------------------------------------------------------------------
    def reshape(self, shape) -> Tile:
        """Reshape an HBM tensor (row-major, same number of elements)."""
        from .operands import shape_arg

        loc = caller_loc()
        shape = shape_arg(shape, loc, "reshape")
        a = self.access
        if not a.tensor.is_hbm or not a.is_whole:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reshape",
                why="only whole HBM tensors can be reshaped; index the result instead",
            )
        if int(np.prod(shape)) != int(np.prod(a.shape)):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="reshape",
                why=f"cannot reshape {a.shape} to {shape}",
            )
        b = current()
        t = Tensor(
            b.unique(f"{a.tensor.name}.reshape"),
            shape,
            a.tensor.dtype,
            a.tensor.buffer,
            kind=a.tensor.kind,
            loc=loc,
            base=a.tensor,
            mutable=a.tensor.mutable,
        )
        b.tensors.append(t)
        return Tile.of(t)

    def broadcast_to(self, shape) -> Tile:
        from . import ops as L

        return L.broadcast_to(self, shape)

    def view_as(self, shape) -> Tile | None:
        a = reshape_access(self.access, tuple(shape))
        return None if a is None else Tile(a)

    def astype(self, dtype) -> Tile:
        from . import ops as L

        return L.copy(self, dtype=dtype)

    def expand_dims(self, axis: int) -> Tile:
        """``nl.expand_dims(self, axis)``."""
        from . import ops as L

        return L.expand_dims(self, axis)

    def assert_shape(self, shape) -> Tile:
        """Return the tile when its shape is ``shape``; else ``err_invalid_argument``."""
        from .operands import shape_arg

        if shape_arg(shape, caller_loc(), "assert_shape") != self.shape:
            raise NkiError(
                "err_invalid_argument",
                caller_loc(),
                op="assert_shape",
                why=f"the tensor's shape is {list(self.shape)}, not {list(shape)}",
            )
        return self

    def view(self, dtype) -> Tile:
        """Not supported: reinterpreting a tensor's bytes as another dtype."""
        raise NkiError(
            "err_unsupported_api",
            caller_loc(),
            api="tensor.view(dtype)",
            why="bit casts are not simulated; convert with .astype(dtype)",
        )

    # -- arithmetic ---------------------------------------------------------------------------
    def _bin(self, other, name: str, reverse: bool = False):
        from . import ops as L

        fn = getattr(L, name)
        return fn(other, self) if reverse else fn(self, other)

    def __add__(self, o):
        return self._bin(o, "add")

    def __radd__(self, o):
        return self._bin(o, "add", True)

    def __sub__(self, o):
        return self._bin(o, "subtract")

    def __rsub__(self, o):
        return self._bin(o, "subtract", True)

    def __mul__(self, o):
        return self._bin(o, "multiply")

    def __rmul__(self, o):
        return self._bin(o, "multiply", True)

    def __truediv__(self, o):
        return self._bin(o, "divide")

    def __rtruediv__(self, o):
        return self._bin(o, "divide", True)

    def __pow__(self, o):
        return self._bin(o, "power")

    def __rpow__(self, o):
        return self._bin(o, "power", True)

    def __mod__(self, o):
        return self._bin(o, "mod")

    def __and__(self, o):
        return self._bin(o, "bitwise_and")

    def __or__(self, o):
        return self._bin(o, "bitwise_or")

    def __xor__(self, o):
        return self._bin(o, "bitwise_xor")

    def __lshift__(self, o):
        return self._bin(o, "left_shift")

    def __rshift__(self, o):
        return self._bin(o, "right_shift")

    def __lt__(self, o):
        return self._bin(o, "less")

    def __le__(self, o):
        return self._bin(o, "less_equal")

    def __gt__(self, o):
        return self._bin(o, "greater")

    def __ge__(self, o):
        return self._bin(o, "greater_equal")

    def __eq__(self, o):  # type: ignore[override]
        return self._bin(o, "equal")

    def __ne__(self, o):  # type: ignore[override]
        return self._bin(o, "not_equal")

    def __neg__(self):
        from . import ops as L

        return L.negative(self)

    def __abs__(self):
        from . import ops as L

        return L.abs(self)

    def __invert__(self):
        from . import ops as L

        return L.invert(self)


def _runtime_key(key):
    """Wrap the tiles of an index tuple as runtime (indirect) indices: ``t[idx_tile, i_f]``."""
    if isinstance(key, Tile):
        return RuntimeIndex(key.access)
    if isinstance(key, tuple) and any(isinstance(k, Tile) for k in key):
        return tuple(RuntimeIndex(k.access) if isinstance(k, Tile) else k for k in key)
    return key
