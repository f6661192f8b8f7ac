"""``NkiTensor.indirect``: NeuronCore-v4 tensor indirection in the NKI 0.x front end.

``t.indirect(index, num_elem=None)`` is a view of shape ``(P, num_elem)``: column ``i`` is the
column of ``t`` at the free-dimension offset the SBUF index tile gives for ``i`` at run time, the
same for every partition.  An instruction reads it (a gather) or writes it (a scatter); which
index element holds offset ``i`` depends on the engine that runs the instruction (snake order,
``nkikit/trace/indirection.py``), so the view's access stays *pending* until the emit layer
knows the engine.  Which operands of which instructions take an indirect view, and on which
target, is the primitives' records' and the verifier's (``ir/prims.Indirection``,
``ir/verify.rule_tensor_indirection``) [nki-0x.md §3.8].

Readings of what the reference leaves open (each refused with a named error where unsure):

- offsets count elements of the view's free dimensions, flattened row-major: a view with more
  than one free dimension is read as one row of its elements, so it must be contiguous (no
  steps, permutations or broadcasts) and an offset ``k`` is the view's ``k``-th element of a
  partition.  An offset outside ``[0, free size)`` is an ``err_tensor_access_out_of_bound``
  when the instruction runs (the simulators check every offset), never a read of a
  neighbouring column;
- the indirect view is the instruction's operand as ``.indirect`` made it: slicing or
  reshaping it afterwards is refused (the reference forbids slicing an indirect dimension);
- ``num_elem`` counts offsets (1 ... ``index.size``); how many the snake can read depends on
  the engine and is checked when the instruction is emitted;
- the index is a 2-D ``(P, K)`` SBUF tile of integers (any width: the documentation's examples
  use uint16) with the view's P partitions.
"""

from __future__ import annotations

import math

from .. import dtypes
from ..errors import NkiError, SourceLoc
from ..ir.affine import Affine, Axis
from ..ir.core import Access
from ..trace.indirection import PendingSnake, pending_access
from .tensor import (
    NkiTensor,
    _dtype_root,
    _flat_layout,
    _index,
    access_of,
    got_type,
    row_major,
)

_API = "NkiTensor.indirect"


def is_indirect_view(x: object) -> bool:
    """Whether ``x`` is a tensor-indirection view (``.indirect``)."""
    return type(x) is NkiTensor and x._indirect is not None and x._indirect[2] == "tensor"


def indirect_view(t: NkiTensor, index, num_elem, loc: SourceLoc) -> NkiTensor:
    """``t.indirect(index, num_elem)`` (see the module docstring), its rules checked at ``loc``."""
    root = _dtype_root(t._layout)
    if not t.on_chip:
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=_API,
            what=f"the indirect tensor {t.name!r}",
            allowed="SBUF or PSUM",
            got="HBM",
        )
    if t._indirect is not None:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"{_API} on a view with a runtime offset",
            why="call .indirect on the tensor (or a static view of it)",
        )
    if not t.is_contiguous():
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"{_API} on the strided view {t.get_pattern()}",
            why="offsets count the elements of a contiguous view; slice with step 1 and do "
            "not permute or broadcast before .indirect",
        )
    if not isinstance(index, NkiTensor):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=_API,
            why=f"index must be an SBUF tensor of integers, got {got_type(index)}",
        )
    if index.tensor.buffer != "sbuf":
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=_API,
            what=f"index {index.name!r}",
            allowed="SBUF",
            got=index.tensor.buffer.upper().replace("SHARED_", "").replace("PRIVATE_", ""),
        )
    if not dtypes.is_int(index.dtype) or index.dtype.kind == "b":
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op=_API,
            dtype=dtypes.name(index.dtype),
            why=f"index {index.name!r} holds free-dimension offsets: an integer tile "
            "(e.g. uint16 or int32)",
        )
    if index._indirect is not None or index.ndim != 2:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=_API,
            why=f"index must be a 2-D (P, K) tile of offsets, got a view of shape {index.shape}",
        )
    if index.shape[0] != t.shape[0]:
        raise NkiError(
            "err_num_partition_mismatch",
            loc,
            op=f"{_API} (index {index.name!r} and tensor {t.name!r})",
            a=index.shape[0],
            b=t.shape[0],
        )
    n = index.size if num_elem is None else _index(num_elem, _API, loc, none=False)
    if not 1 <= n <= index.size:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=_API,
            why=f"num_elem={n}: the index {index.shape} holds 1 to {index.size} offsets",
        )
    free = math.prod(t.shape[1:])
    row = math.prod(root.shape[1:]) if len(root.shape) > 1 else 1
    if t.offset % row + free > row:
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"{_API} on the access pattern {t.get_pattern()} (offset {t.offset})",
            why="the view leaves one partition's row of its tensor",
        )
    return NkiTensor._view(
        t._layout, (t.shape[0], n), (t.strides[0], 1), t.offset, (index, n, "tensor", t)
    )


def indirect_access(x: NkiTensor, loc: SourceLoc, what: str) -> Access:
    """The (pending) access of indirect view ``x`` as an instruction's operand ``what``: the
    data tensor as (partitions, free), from the view's first partition and first column, the
    offsets ``x``'s index gives along the free dimension (see ``trace/indirection.py``)."""
    index, n, _, base = x._indirect
    p = base.shape[0]
    free_shape = [d for d in x.shape[1:] if d != 1]
    free_strides = [s for d, s in zip(x.shape[1:], x.strides[1:]) if d != 1]
    if (
        x.shape[0] != p
        or x.offset != base.offset
        or math.prod(free_shape) != n
        or tuple(free_strides) != row_major(tuple(free_shape))
    ):
        raise NkiError(
            "err_unsupported_api",
            loc,
            api=f"a slice or reshape of an indirect view ({what})",
            why="apply .indirect() last, to the view the instruction should see",
        )
    root = _dtype_root(base._layout)
    layout = _flat_layout(root)
    p0, c0 = divmod(base.offset, layout.shape[1])
    idx = access_of(index, loc, f"{what} index")
    shape = tuple(x.shape) if len(x.shape) > 1 else (x.shape[0], 1)
    start = (Affine.of(Axis(0)) + p0, Affine((), c0))
    return pending_access(layout, shape, start, PendingSnake(idx, n), math.prod(base.shape[1:]))


def check_tensor_engine(
    prim: str,
    loc: SourceLoc,
    dst,
    moving,
    *,
    tiled: bool,
    is_transpose: bool = False,
    accumulate=None,
    inputs: tuple = (),
) -> None:
    """The TensorE rules of tensor indirection that the IR does not record: no tiling of the PE
    array (``tile_position`` / ``tile_size`` unset), no indirect ``moving`` of a transpose
    (``is_transpose=True``) [nki-0x.md §3.8, §4.5]; and ``accumulate=None`` into an indirect
    ``dst`` only while nothing was written to its PSUM tensor (the first-write-overwrites rule
    needs the elements written, which an indirect dst knows only at run time)."""
    views = (dst, moving, *inputs)
    if not any(is_indirect_view(v) for v in views):
        return
    if is_transpose and is_indirect_view(moving):
        raise NkiError(
            "err_indirect_operand_not_supported",
            loc,
            op=f"nisa.{prim}",
            operand="moving",
            why="a transpose (is_transpose=True) reads moving directly",
        )
    if tiled:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{prim}",
            why="tensor indirection uses the whole PE array: leave tile_position and "
            "tile_size unset",
        )
    if accumulate is None and is_indirect_view(dst):
        from .isa import _psum_writes

        if _psum_writes(dst.tensor):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{prim}",
                why=f"accumulate=None into an indirect dst: which elements of "
                f"{dst.name!r} it writes is known at run time only, and earlier writes to "
                "it exist; pass accumulate=True or False",
            )
