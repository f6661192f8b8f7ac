"""Running NKI kernels for device ops: array conversion, launch accounting, and the routes
that use library kernels (matmul family, embedding) and the data-movement kernels (cat,
clone/contiguous, device-to-device copies).

Every kernel here is launched through nkikit's normal ``@nki.jit`` call path, so a system
profile records each launch with its modeled device time (``nkikit.compiler.launches``).
Operands are handed to a kernel as C-contiguous numpy arrays of the device tensor's values;
relayouts the kernel's operand layout needs (the transposed left operand of the library matmul,
``lhsT`` [K, M]) are made on the host and not modeled: the hardware would fold them into the
load DMA's access pattern (or a DMA transpose) of the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..convert import from_numpy, to_numpy
from .device import NeuronTensor, storage, wrap
from .stats import device_stats

FLOATS = (torch.float32, torch.bfloat16)
MAX_K = 8192  # the library matmul's contraction limit (kernels/matmul: MAX_K)


def to_np(t: Any) -> np.ndarray:
    """The values of a device (or CPU) tensor as a C-contiguous numpy array (bf16 as
    ``ml_dtypes.bfloat16``)."""
    a = to_numpy(storage(t).detach().contiguous())
    return a if a.flags.c_contiguous else a.copy()  # (ascontiguousarray makes 0-d arrays 1-d)


def to_device(a: Any) -> NeuronTensor:
    """A numpy array (or CPU tensor) as a new device tensor."""
    if not isinstance(a, torch.Tensor):
        a = np.asarray(a)
        a = from_numpy(a if a.flags.c_contiguous else a.copy())
    return wrap(a)


def launch(op: str, kernel: str, fn: Callable, *args: Any, launches: int = 1, **kw: Any) -> Any:
    """``fn(*args, **kw)`` (which launches ``launches`` kernels), counted for ``op``."""
    out = fn(*args, **kw)
    device_stats().kernel(op, kernel, launches, spec_of(args))
    return out


def spec_of(arrays: Any) -> tuple:
    """The (shape, dtype name) signature of the arrays among ``arrays``."""
    return tuple((a.shape, str(a.dtype)) for a in arrays if isinstance(a, np.ndarray))


# -- matmul family (library matmul: lhsT.T @ rhs) ----------------------------------------------


def _mm_fits(*ts: Any) -> str | None:
    dt = {t.dtype for t in ts}
    if len(dt) != 1 or next(iter(dt)) not in FLOATS:
        return f"library matmul takes one dtype of float32/bfloat16, got {sorted(map(str, dt))}"
    k = ts[0].shape[-1]
    if not 1 <= k <= MAX_K:
        return f"library matmul takes 1 <= K <= {MAX_K}, got K={k}"
    if any(s == 0 for t in ts for s in t.shape):
        return "empty operand"
    return None


def _matmul_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from nkikit.library.matmul import matmul

    return np.asarray(matmul(np.ascontiguousarray(a.T), np.ascontiguousarray(b)))


def mm(a: Any, b: Any) -> Any:
    """aten::mm: one library matmul launch."""
    why = _mm_fits(a, b)
    if why:
        return why
    out = launch("mm.default", "matmul_kernel", _matmul_np, to_np(a), to_np(b))
    return to_device(out)


def bmm(a: Any, b: Any) -> Any:
    """aten::bmm: one library matmul launch per batch element (the library kernel is 2-D)."""
    why = _mm_fits(a, b)
    if why:
        return why
    an, bn = to_np(a), to_np(b)
    outs = [_matmul_np(an[i], bn[i]) for i in range(an.shape[0])]
    device_stats().kernel("bmm.default", "matmul_kernel", len(outs), spec_of((an, bn)))
    return to_device(np.stack(outs))


def addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """aten::addmm (``nn.Linear`` with a bias): the library matmul, then the bias add as a
    separate device op (a generated elementwise kernel when codegen takes it)."""
    if beta != 1 or alpha != 1:
        return "addmm with beta/alpha other than 1"
    out = mm(a, b)
    if isinstance(out, str):
        return out
    return out + bias


def embedding(weight: Any, indices: Any, padding_idx: int = -1, *_: Any) -> Any:
    """aten::embedding: one gather kernel (indirect DMA of table rows)."""
    from .movement import gather_rows

    if weight.dim() != 2 or indices.dtype not in (torch.int32, torch.int64):
        return "embedding takes a 2-D table and int32/int64 indices"
    ids = storage(indices)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0]):
        return "index out of range (torch raises the error on CPU)"
    out = launch("embedding.default", "gather_rows_kernel", gather_rows, to_np(weight), ids.numpy())
    return to_device(out)


# -- data movement -----------------------------------------------------------------------------


def _copy_fits(t: Any) -> str | None:
    from ..convert import TORCH_DTYPE_NAMES

    name = TORCH_DTYPE_NAMES.get(t.dtype)
    if name is None or name in ("float64", "int64", "bool", "uint16", "uint32"):
        return f"no DMA copy kernel for dtype {t.dtype} (not an NKI dtype)"
    return None


def clone(t: Any, *, memory_format: Any = None) -> Any:
    """aten::clone (also ``.contiguous()`` of a non-contiguous view): one DMA copy kernel that
    moves the tensor's bytes; the result is contiguous (torch's preserve_format keeps a
    non-overlapping dense layout, which the host then restores with a free restride)."""
    from .movement import dma_copy

    why = _copy_fits(t)
    if why:
        return why
    out = to_device(launch("clone.default", "dma_copy_kernel", dma_copy, to_np(t)))
    if memory_format in (None, torch.preserve_format) and not storage(t).is_contiguous():
        like = torch.empty_like(storage(t))
        like.copy_(storage(out))
        return wrap(like)
    return out


def cat(tensors: Any, dim: int = 0) -> Any:
    """aten::cat: one DMA copy kernel per (non-empty) input, each placing its input in the
    output."""
    from .movement import dma_copy

    for t in tensors:
        why = _copy_fits(t)
        if why:
            return why
    parts = [storage(t) for t in tensors]
    out = torch.cat(parts, dim)  # the layout; values are then written by the copies
    if out.numel() == 0:
        return wrap(out)
    d = dim % out.dim()
    offset = 0
    for t, p in zip(tensors, parts, strict=True):
        if p.dim() == 1 and p.numel() == 0:  # torch's legacy empty-1-D input: skipped
            continue
        n = p.shape[d]
        if p.numel():
            moved = launch("cat.default", "dma_copy_kernel", dma_copy, to_np(t))
            out.narrow(d, offset, n).copy_(from_numpy(moved))
        offset += n
    return wrap(out)


def copy_between(dst: Any, src: Any) -> Any:
    """aten::copy_ from a device tensor into a device tensor of the same dtype: one DMA copy
    kernel (a broadcast source is moved at its own size)."""
    from .movement import dma_copy

    why = _copy_fits(src)
    if why:
        return why
    moved = launch("copy_.default", "dma_copy_kernel", dma_copy, to_np(src))
    storage(dst).copy_(from_numpy(moved))
    return dst


# -- allocation and fills ----------------------------------------------------------------------


def _filled(op: str, like: torch.Tensor, value: Any) -> Any:
    from .movement import memset

    why = _copy_fits(like)
    if why:
        return why
    if isinstance(value, torch.Tensor):
        value = storage(value).item()
    out = launch(op, "memset_kernel", memset, to_np(like), value)
    return from_numpy(out)


def fill_(t: Any, value: Any, op: str = "fill_.Scalar") -> Any:
    """aten::fill_.Scalar / fill_.Tensor: one memset kernel writing the tensor."""
    out = _filled(op, storage(t), value)
    if isinstance(out, str):
        return out
    storage(t).copy_(out)
    return t


def zero_(t: Any) -> Any:
    """aten::zero_: one memset kernel."""
    return fill_(t, 0, "zero_.default")


def _alloc(like: Any, size: Any, dtype: Any, memory_format: Any = None) -> torch.Tensor:
    base = storage(like)
    if size is None:
        fmt = memory_format or torch.preserve_format
        return torch.empty_like(base, dtype=dtype or base.dtype, memory_format=fmt)
    return torch.empty(size, dtype=dtype or base.dtype)


def filled_like(op: str, value: Any) -> Callable[..., Any]:
    """aten::zeros_like / ones_like (``value``) and full_like: a new tensor by one memset."""

    def run(t, *rest, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        v = rest[0] if value is None else value
        out = _filled(op, _alloc(t, None, dtype), v)
        return out if isinstance(out, str) else wrap(out)

    return run


def new_filled(op: str, value: Any) -> Callable[..., Any]:
    """aten::new_zeros / new_ones (``value``) and new_full: a new tensor by one memset."""

    def run(t, size, *rest, dtype=None, layout=None, device=None, pin_memory=None):
        v = rest[0] if value is None else value
        out = _filled(op, _alloc(t, size, dtype), v)
        return out if isinstance(out, str) else wrap(out)

    return run


def empty_like(
    t, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
) -> NeuronTensor:
    """aten::empty_like: an allocation (no kernel; fresh device memory)."""
    return wrap(_alloc(t, None, dtype, memory_format))


def new_empty(t, size, *, dtype=None, layout=None, device=None, pin_memory=None) -> NeuronTensor:
    """aten::new_empty: an allocation (no kernel)."""
    return wrap(_alloc(t, size, dtype))


def new_empty_strided(
    t, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None
) -> NeuronTensor:
    """aten::new_empty_strided: an allocation (no kernel)."""
    return wrap(torch.empty_strided(size, stride, dtype=dtype or t.dtype))


# -- ops with two results, as two device ops -----------------------------------------------------


def values_and_indices(reduce: str, arg: str) -> Callable[..., Any]:
    """aten::max.dim / min.dim: ``(values, indices)`` as two device ops, ``amax`` (``amin``)
    and ``argmax`` (``argmin``) over the dim, each its own generated kernel."""

    def run(x: Any, dim: int, keepdim: bool = False) -> Any:
        from torch.return_types import max as max_result
        from torch.return_types import min as min_result

        values = getattr(torch.ops.aten, reduce).default(x, [dim], keepdim)
        indices = getattr(torch.ops.aten, arg).default(x, dim, keepdim)
        result = max_result if reduce == "amax" else min_result
        return result((values, indices))

    return run
