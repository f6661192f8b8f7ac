"""torch <-> numpy for kernel calls: dtypes, layouts and memory ownership.

The one converter: ``@nki.jit`` called with torch tensors (``nkikit.trace.jit``, which imports
this module only when it sees a tensor, so torch stays optional) and the torch custom ops
(``nkikit.torch.ops``) both cross here.

The simulator takes C-contiguous numpy arrays (bfloat16 and fp8 as ml_dtypes dtypes); torch has
its own bfloat16 and fp8 types that numpy cannot see, so they cross as raw same-width integer
words, which costs no copy.  Every other dtype (fp32, fp16, the int types, bool) is a plain
``Tensor.numpy()`` / ``torch.from_numpy`` view.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes

# torch dtype -> nkikit's name.  uint16/uint32 exist in torch >= 2.3 only.
TORCH_DTYPE_NAMES: dict[torch.dtype, str] = {
    getattr(torch, name): nki_name
    for name, nki_name in (
        ("float32", "float32"),
        ("bfloat16", "bfloat16"),
        ("float16", "float16"),
        ("float64", "float64"),
        ("int8", "int8"),
        ("int16", "int16"),
        ("int32", "int32"),
        ("int64", "int64"),
        ("uint8", "uint8"),
        ("uint16", "uint16"),
        ("uint32", "uint32"),
        ("bool", "bool"),
        ("float8_e4m3fn", "float8_e4m3fn"),
        ("float8_e5m2", "float8_e5m2"),
    )
    if hasattr(torch, name)
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
    """A C-contiguous numpy view (or copy, for non-contiguous input) of a CPU tensor.
    Raises TypeError for a tensor on another device (nkikit simulates on the CPU)."""
    if t.device.type != "cpu":
        raise TypeError(
            f"nkikit simulates on the CPU; move the tensor from {t.device} to 'cpu' first"
        )
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
