"""Softmax over the last dimension (``softmax(x, causal=False, offset=0)``) and its backward
(``softmax_backward``)."""

from .kernel import softmax, softmax_backward, softmax_backward_kernel, softmax_kernel

__all__ = ["softmax", "softmax_backward", "softmax_backward_kernel", "softmax_kernel"]
