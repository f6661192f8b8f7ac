"""PyTorch on an emulated NeuronCore: a ``neuron`` device whose ATen ops run as NKI kernels on
nkikit's simulator, and a ``torch.compile`` backend that fuses graphs into generated kernels.
"""

from .backend import (
    compile_report,
    generated_kernels,
    register,
    reset_compile_report,
    write_kernel_folder,
)
from .backend import neuron_backend as backend  # noqa: E402  (torch.compile(backend=backend))

register()

__all__ = [
    "backend",
    "compile_report",
    "generated_kernels",
    "reset_compile_report",
    "write_kernel_folder",
]
