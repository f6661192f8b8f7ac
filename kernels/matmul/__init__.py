"""Tiled matmul with PSUM accumulation (``matmul(lhsT, rhs)`` = ``lhsT.T @ rhs``)."""

from .kernel import matmul, matmul_backward, matmul_kernel

__all__ = ["matmul", "matmul_backward", "matmul_kernel"]
