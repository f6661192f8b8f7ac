"""torch <-> numpy for kernel calls, as the torch layer names it.

The converter itself is ``nkikit.arrays`` (a leaf module that imports torch only when handed a
tensor), so that ``@nki.jit`` called with torch tensors crosses through the same code without
importing this layer; the torch custom ops (``nkikit.torch.ops``) cross here.
"""

from __future__ import annotations

import torch

from ..arrays import dtype_name, from_numpy, to_numpy, torch_dtype, torch_dtype_names

TORCH_DTYPE_NAMES: dict[torch.dtype, str] = torch_dtype_names()
"""torch dtype -> nkikit's name, for every torch dtype nkikit takes."""

__all__ = ["TORCH_DTYPE_NAMES", "dtype_name", "from_numpy", "to_numpy", "torch_dtype"]
