"""LayerNorm over the last dimension (``layernorm(x, weight, bias, eps=1e-5)``)."""

from .kernel import layernorm, layernorm_kernel

__all__ = ["layernorm", "layernorm_kernel"]
