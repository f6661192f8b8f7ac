"""Elementwise addition as an SPMD grid of 128 x 512 tiles (``tensor_add(a, b)``)."""

from .kernel import tensor_add, tensor_add_kernel

__all__ = ["tensor_add", "tensor_add_kernel"]
