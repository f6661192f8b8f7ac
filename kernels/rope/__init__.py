"""Rotary position embedding (``rope(x, cos, sin, layout="half")``) and its backward."""

from .kernel import rope, rope_backward, rope_kernel

__all__ = ["rope", "rope_backward", "rope_kernel"]
