"""``nki.simulator``: ``simulate_kernel(func, args, kwargs, lnc)``, the entry point vllm-neuron
calls to run an NKI kernel on a CPU simulator (``NKI_SIMULATOR=1``) [reference/nki-0x.md §2.4]."""

from __future__ import annotations

from typing import Any


def simulate_kernel(func, args: tuple = (), kwargs: dict | None = None, lnc: int = 1) -> Any:
    """Run ``func`` (an ``@nki.jit`` kernel or a plain function) on ``lnc`` logical cores of
    the simulator with ``*args`` and ``**kwargs``; returns what the kernel returns (numpy
    arrays, or torch tensors for torch inputs), as calling it does."""
    from .jit import jit

    kernel = jit(func)
    return (kernel[lnc] if lnc != 1 else kernel)(*args, **(kwargs or {}))


__all__ = ["simulate_kernel"]
