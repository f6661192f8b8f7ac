"""LayerNorm over the last dimension (``layernorm(x, weight, bias, eps=1e-5)``) and its
backward (``layernorm_backward``)."""

from .kernel import layernorm, layernorm_backward, layernorm_backward_kernel, layernorm_kernel

__all__ = ["layernorm", "layernorm_backward", "layernorm_backward_kernel", "layernorm_kernel"]
