"""Softmax over the last dimension (``softmax(x)``)."""

from .kernel import softmax, softmax_kernel

__all__ = ["softmax", "softmax_kernel"]
