"""Per-row cross-entropy with a chunked logsumexp (``cross_entropy(logits, targets)``) and its
backward."""

from .kernel import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_backward_kernel,
    cross_entropy_forward,
    cross_entropy_kernel,
)

__all__ = [
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_backward_kernel",
    "cross_entropy_forward",
    "cross_entropy_kernel",
]
