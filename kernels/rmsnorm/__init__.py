"""RMSNorm over the last dimension (``rmsnorm(x, weight, eps=1e-6)``), its backward, and the
fused residual variant ``add_rmsnorm(x, residual, weight)`` with its backward."""

from .kernel import (
    add_rmsnorm,
    add_rmsnorm_backward,
    add_rmsnorm_backward_kernel,
    add_rmsnorm_kernel,
    rmsnorm,
    rmsnorm_backward,
    rmsnorm_backward_kernel,
    rmsnorm_kernel,
)

__all__ = [
    "add_rmsnorm",
    "add_rmsnorm_backward",
    "add_rmsnorm_backward_kernel",
    "add_rmsnorm_kernel",
    "rmsnorm",
    "rmsnorm_backward",
    "rmsnorm_backward_kernel",
    "rmsnorm_kernel",
]
