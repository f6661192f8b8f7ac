"""SwiGLU gate ``silu(a) * b`` and its backward (``swiglu(a, b)``, ``swiglu_backward``)."""

from .kernel import swiglu, swiglu_backward, swiglu_backward_kernel, swiglu_kernel

__all__ = ["swiglu", "swiglu_backward", "swiglu_backward_kernel", "swiglu_kernel"]
