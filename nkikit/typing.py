"""``nkikit.typing`` (``nt``): annotations for kernel parameters and abstract arguments.

``nt.tensor[[8192, 4096], nl.bfloat16]`` describes an argument by shape and dtype alone (for
profiling without data); ``nt.mutable_tensor`` marks a parameter the kernel may write.
"""

from __future__ import annotations

from . import dtypes
from .arrays import TensorSpec

__all__ = ["TensorSpec", "mutable_tensor", "scalar", "tensor"]


class _TensorType:
    mutable = False

    def __class_getitem__(cls, item):
        if not isinstance(item, tuple):
            item = (item,)
        if len(item) == 2 and isinstance(item[0], list | tuple):
            return TensorSpec(tuple(int(s) for s in item[0]), dtypes.as_dtype(item[1]))
        if item and not isinstance(item[-1], int):
            return TensorSpec(tuple(int(s) for s in item[:-1]), dtypes.as_dtype(item[-1]))
        return TensorSpec(tuple(int(s) for s in item), dtypes.float32)


class tensor(_TensorType):  # noqa: N801 - NKI's name
    """Annotation for an (immutable) kernel tensor; ``tensor[shape, dtype]`` makes a spec."""


class mutable_tensor(_TensorType):  # noqa: N801
    """Annotation for a kernel parameter that the kernel writes to."""

    mutable = True


scalar = float
