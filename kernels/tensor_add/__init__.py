"""Elementwise addition (``tensor_add(a, b)``): a pipelined tiled kernel, and the SPMD grid
example ``tensor_add_kernel``."""

from .kernel import tensor_add, tensor_add_kernel, tensor_add_tiled_kernel

__all__ = ["tensor_add", "tensor_add_kernel", "tensor_add_tiled_kernel"]
