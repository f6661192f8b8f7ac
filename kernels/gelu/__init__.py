"""GELU (exact or tanh-approximated) and its backward (``gelu(x, approximate="none")``)."""

from .kernel import gelu, gelu_backward, gelu_backward_kernel, gelu_kernel

__all__ = ["gelu", "gelu_backward", "gelu_backward_kernel", "gelu_kernel"]
