"""``@nki.jit`` for NKI Beta 1: the shared jit machinery (``nkikit.trace.jit``) with this
dialect's argument proxies (:class:`~nkikit.language.tile.Tile`) and return values (HBM tiles
created with ``nl.ndarray(..., buffer=nl.shared_hbm)``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..errors import NkiError, SourceLoc
from ..ir.core import Kernel, Tensor
from ..targets import get_target
from ..trace.jit import JitKernel
from .eviction import evict_oversized_psum
from .tile import Tile


class Beta1Kernel(JitKernel):
    """A kernel decorated with ``nkikit.jit``: call it with numpy arrays or CPU torch tensors
    to run it on the simulator; ``kernel[g0, g1]`` launches an SPMD grid."""

    dialect = "nki-beta1"

    def proxy(self, tensor: Tensor) -> Tile:
        return Tile.of(tensor)

    def _trace(self, bound: inspect.BoundArguments, target: str) -> Kernel:
        """The shared trace; under ``nki.compiler.force_auto_alloc`` direct allocations are
        dropped (the tensors are placed automatically)."""
        kernel = super()._trace(bound, target)
        if self.options.get("force_auto_alloc"):
            for t in kernel.tensors:
                t.user_span = None
        return kernel

    def verify(self, kernel: Kernel, target: str) -> None:
        """Verify; a kernel whose automatically placed PSUM tensors do not fit PSUM together
        first has them placed where the compiler would (:mod:`nkikit.language.eviction`:
        Beta 1 leaves placement to the compiler) and is verified again.  Kernels that fit
        pay nothing for it."""
        try:
            super().verify(kernel, target)
        except NkiError as e:
            if e.name != "err_psum_total_capacity_exceeded":
                raise
            if not evict_oversized_psum(kernel, get_target(target)):
                raise
            super().verify(kernel, target)

    def returned(self, value: object, loc: SourceLoc) -> Tensor | None:
        if not isinstance(value, Tile):
            return None
        t = value.access.tensor
        if not t.is_hbm or t.kind not in ("hbm", "output"):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="return",
                why=f"the kernel returns {t.name!r} ({t.buffer}); return HBM tensors created "
                "with nl.ndarray(..., buffer=nl.shared_hbm)",
            )
        return t


def jit(func: Callable | None = None, **options) -> JitKernel | Callable[[Callable], JitKernel]:
    """Decorate an NKI kernel: ``@nki.jit`` or ``@nki.jit(mode=...)``.  An already jitted
    kernel (of either dialect) is returned as it is."""
    if func is None:
        return lambda f: Beta1Kernel(f, options=options)
    if isinstance(func, JitKernel):
        return func
    return Beta1Kernel(func, options=options)
