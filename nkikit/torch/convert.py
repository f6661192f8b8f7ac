"""torch <-> numpy for kernel calls: dtypes, layouts and memory ownership.

The simulator takes C-contiguous numpy arrays (bfloat16 as ml_dtypes.bfloat16); torch has its
own bfloat16 that numpy cannot see, so bf16 crosses as raw 16-bit words, which costs no copy.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes

TORCH_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.uint8: "uint8",
    torch.int16: "int16",
}
_BY_NAME = {v: k for k, v in TORCH_DTYPE_NAMES.items()}

# torch dtype -> (same-width integer torch dtype, ml_dtypes numpy dtype), and back.
_VIEWS: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, dtypes.float8_e5m2),
}
_BACK: dict[np.dtype, tuple[type, torch.dtype]] = {
    dtypes.bfloat16: (np.int16, torch.bfloat16),
    dtypes.float8_e4m3fn: (np.uint8, torch.float8_e4m3fn),
    dtypes.float8_e5m2: (np.uint8, torch.float8_e5m2),
}


def dtype_name(dtype: torch.dtype) -> str:
    """nkikit's name for a torch dtype ('float32', 'bfloat16', ...); str(dtype) if it has none."""
    return TORCH_DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an nkikit dtype name. Raises TypeError if torch has no such dtype."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(f"dtype {name} has no torch equivalent supported by nkikit") from None


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy view (or copy, for non-contiguous input) of a CPU tensor."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    view_as = _VIEWS.get(t.dtype)
    if view_as is not None:  # dtypes numpy only knows through ml_dtypes: cross as raw bits
        return t.view(view_as[0]).numpy().view(view_as[1])
    return t.numpy()


def from_numpy(a: np.ndarray, inputs: tuple[np.ndarray, ...] = ()) -> torch.Tensor:
    """A tensor owning (or sharing, when the array is fresh) the array's data.

    Arrays that may alias one of `inputs` are copied: a custom op must never return its input.
    """
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
    back = _BACK.get(a.dtype)
    if back is not None:
        return torch.from_numpy(a.view(back[0])).view(back[1])
    return torch.from_numpy(a)
