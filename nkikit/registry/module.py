"""`KernelModule`: what `kernels.pull` returns, a module holding the kernel's functions.

`k = kernels.pull("org/rmsnorm", version=1)`; `k.rmsnorm(x, w)` on numpy arrays or torch
tensors; `k.ops` is `torch.ops.<build id>`; `k.repo_id`, `k.version`, `k.revision` (commit),
`k.variant`, `k.path`, `k.metadata` say exactly what was loaded.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any


class KernelModule(types.ModuleType):
    """A pulled kernel build: a module (named after the build id) with provenance attached."""

    def __init__(
        self,
        module: types.ModuleType,
        *,
        repo_id: str,
        revision: str,
        version: int | None,
        variant: str,
        path: Path,
        metadata: dict[str, Any],
    ):
        super().__init__(module.__name__, module.__doc__)
        names = list(getattr(module, "__all__", []))
        self.__all__ = names
        self.__file__ = getattr(module, "__file__", None)
        for n in names:
            setattr(self, n, getattr(module, n))
        self.module = module
        self.repo_id = repo_id
        self.revision = revision
        self.version = version
        self.variant = variant
        self.path = path
        self.metadata = metadata

    @property
    def namespace(self) -> str:
        """The build id: the module name and the torch op namespace."""
        return str(self.metadata["id"])

    @property
    def functions(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.__all__}

    @property
    def ops(self) -> Any:
        """`torch.ops.<build id>`, with every function's op registered (needs torch)."""
        import torch

        for f in self.functions.values():
            register = getattr(f, "register_torch_op", None)
            if register is not None:
                register()
        return getattr(torch.ops, self.namespace)

    def __repr__(self) -> str:
        v = f" v{self.version}" if self.version is not None else ""
        return (
            f"<KernelModule {self.repo_id}{v} @{self.revision[:12]} ({self.variant}): "
            f"{', '.join(self.__all__)}>"
        )

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__all__))
