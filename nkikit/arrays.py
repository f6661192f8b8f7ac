"""The arrays a kernel is called with, and their crossing to numpy and back.

A kernel argument is a numpy array, a CPU torch tensor or a :class:`TensorSpec` (shape and
dtype, no data: for tracing and profiling).  The simulator takes C-contiguous numpy arrays;
this module is the one converter between them, used by ``@nki.jit`` (both dialects) and the
torch custom ops (``nkikit.torch``).  It imports torch only when it is handed a tensor, so it
sits at the bottom of the package (next to ``dtypes``) and torch stays optional.

Torch's bfloat16 and fp8 types have no numpy equivalent that numpy can see, so they cross as
raw same-width integer words (ml_dtypes dtypes on the numpy side), which costs no copy.  Every
other dtype (fp32, fp16, the int types, bool) is a plain ``Tensor.numpy()`` /
``torch.from_numpy`` view.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import dtypes

# the torch device nkikit emulates (``nkikit.torch.neuron``): its tensors' values live on the
# host, so a kernel called with them runs as with CPU tensors and returns its results there
DEVICE_TYPE = "neuron"

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorSpec:
    """An abstract kernel argument: a shape and a dtype, no data."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def is_torch(x: object) -> bool:
    """Whether ``x`` is a torch tensor, a subclass's (a Parameter, the emulated device's
    tensor) included; decided without importing torch (no torch module: no torch tensor)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def spec_of(x: object) -> tuple[tuple[int, ...], np.dtype] | None:
    """``(shape, dtype)`` of an array argument; None for anything else (a constant)."""
    if isinstance(x, TensorSpec):
        return x.shape, x.dtype
    if isinstance(x, np.ndarray):
        return tuple(x.shape), dtypes.as_dtype(x.dtype)
    if is_torch(x):
        return tuple(x.shape), dtypes.as_dtype(x.dtype)
    return None


def as_numpy(x: object, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous numpy array of ``dtype`` with the values of ``x`` (no copy if possible)."""
    if is_torch(x):
        return to_numpy(x)  # type: ignore[arg-type]
    a = np.asarray(x)
    if a.dtype != dtypes.storage_dtype(dtype):
        a = a.astype(dtypes.storage_dtype(dtype))
    return np.ascontiguousarray(a)


def as_kind_of(a: np.ndarray, like: object) -> object:
    """``a`` as the kind of array ``like`` is: a torch tensor for a torch argument, on the
    ``neuron`` device for an argument there (a kernel's results stay on its device)."""
    if not is_torch(like):
        return a
    t = from_numpy(a)
    return t if like.device.type == "cpu" else t.to(like.device)  # type: ignore[attr-defined]


# -- torch ------------------------------------------------------------------------------------
# The dtype tables are built on first use: building them imports torch.

_TORCH_NAMES = (
    "float32",
    "bfloat16",
    "float16",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",  # torch >= 2.3
    "uint32",  # torch >= 2.3
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
)


@dataclass(frozen=True)
class _TorchTables:
    names: dict[Any, str]  # torch dtype -> nkikit's name
    by_name: dict[str, Any]
    # torch dtype -> (same-width integer torch dtype, ml_dtypes numpy dtype), and back
    views: dict[Any, tuple[Any, np.dtype]]
    back: dict[np.dtype, tuple[type, Any]]


@functools.cache
def _torch_tables() -> _TorchTables:
    import torch

    names = {getattr(torch, n): n for n in _TORCH_NAMES if hasattr(torch, n)}
    return _TorchTables(
        names=names,
        by_name={v: k for k, v in names.items()},
        views={
            torch.bfloat16: (torch.int16, dtypes.bfloat16),
            torch.float8_e4m3fn: (torch.uint8, dtypes.float8_e4m3fn),
            torch.float8_e5m2: (torch.uint8, dtypes.float8_e5m2),
        },
        back={
            dtypes.bfloat16: (np.int16, torch.bfloat16),
            dtypes.float8_e4m3fn: (np.uint8, torch.float8_e4m3fn),
            dtypes.float8_e5m2: (np.uint8, torch.float8_e5m2),
        },
    )


def torch_dtype_names() -> dict[torch.dtype, str]:
    """Every torch dtype nkikit takes, with nkikit's name for it."""
    return dict(_torch_tables().names)


def dtype_name(dtype: torch.dtype) -> str:
    """nkikit's name for a torch dtype ('float32', 'bfloat16', ...); str(dtype) if it has none."""
    return _torch_tables().names.get(dtype, str(dtype).removeprefix("torch."))


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an nkikit dtype name. Raises TypeError if torch has no such dtype."""
    try:
        return _torch_tables().by_name[name]
    except KeyError:
        raise TypeError(f"dtype {name} has no torch equivalent supported by nkikit") from None


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy view (or copy, for non-contiguous input) of a CPU tensor; a copy
    of a tensor on the ``neuron`` device (the values a kernel on the device reads).  Raises
    TypeError for a tensor on any other device (nkikit simulates on the CPU)."""
    if t.device.type != "cpu":
        if t.device.type != DEVICE_TYPE:
            raise TypeError(
                f"nkikit simulates on the CPU; move the tensor from {t.device} to 'cpu' first"
            )
        t = t.detach().cpu()  # the device's values, as a transfer to the host reads them
    if t.requires_grad:
        t = t.detach()
    if t.is_neg() or t.is_conj():  # lazy negation / conjugation bits: numpy sees no such bit
        t = t.resolve_neg().resolve_conj()
    if not t.is_contiguous():
        t = t.contiguous()
    view_as = _torch_tables().views.get(t.dtype)
    if view_as is not None:  # dtypes numpy only knows through ml_dtypes: cross as raw bits
        return t.view(view_as[0]).numpy().view(view_as[1])
    return t.numpy()


def from_numpy(a: np.ndarray, inputs: tuple[np.ndarray, ...] = ()) -> torch.Tensor:
    """A tensor owning (or sharing, when the array is fresh) the array's data.

    Arrays that may alias one of `inputs` are copied: a custom op must never return its input.
    """
    import torch

    if type(a) is not np.ndarray:
        a = np.asarray(a)
    flags = a.flags
    # an array owning its memory (base None) aliases an input only by being it
    aliased = (
        any(a is i for i in inputs)
        if a.base is None
        else any(np.may_share_memory(a, i) for i in inputs)
    )
    if aliased or not (flags.c_contiguous and flags.writeable):
        a = np.array(a, order="C", copy=True)
    back = _torch_tables().back.get(a.dtype)
    if back is not None:
        return torch.from_numpy(a.view(back[0])).view(back[1])
    return torch.from_numpy(a)
