"""Flash attention with causal masking and grouped-query heads
(``attention(q, k, v, causal=True, scale=0.0, softmax="two_pass")``, ``softmax="online"`` for
the flash-style single pass), with a backward kernel."""

from .kernel import (
    attention,
    attention_backward,
    flash_attention_fwd_kernel,
    flash_attention_online_fwd_kernel,
)

__all__ = [
    "attention",
    "attention_backward",
    "flash_attention_fwd_kernel",
    "flash_attention_online_fwd_kernel",
]
