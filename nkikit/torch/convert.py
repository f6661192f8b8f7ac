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
}
_BY_NAME = {v: k for k, v in TORCH_DTYPE_NAMES.items()}


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
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray, inputs: tuple[np.ndarray, ...] = ()) -> torch.Tensor:
    """A tensor owning (or sharing, when the array is fresh) the array's data.

    Arrays that may alias one of `inputs` are copied: a custom op must never return its input.
    """
    a = np.asarray(a)
    if not a.flags.c_contiguous or not a.flags.writeable or any(np.may_share_memory(a, i) for i in inputs):
        a = np.array(a, order="C", copy=True)
    if a.dtype == dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
