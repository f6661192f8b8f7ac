"""RMSNorm over the last dimension (``rmsnorm(x, weight, eps=1e-6)``)."""

from .kernel import rmsnorm, rmsnorm_kernel

__all__ = ["rmsnorm", "rmsnorm_kernel"]
