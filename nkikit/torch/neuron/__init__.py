"""PyTorch on an emulated NeuronCore: a ``neuron`` device whose ATen ops run as NKI kernels on
nkikit's simulator, and a ``torch.compile`` backend that fuses graphs into generated kernels.

Importing this package sets the device up (idempotent): ``"neuron"`` is then a torch device,
and ``"neuron"`` a ``torch.compile`` backend (also ``backend=nkikit.torch.neuron.backend``).
"""

from .backend import (
    compile_report,
    generated_kernels,
    register,
    reset_compile_report,
    write_kernel_folder,
)
from .backend import neuron_backend as backend
from .device import NeuronTensor, neuron_device
from .dispatch import NeuronFallbackWarning
from .source import kernel_source
from .stats import DeviceStats, device_stats

neuron_device()
register()

__all__ = [
    "DeviceStats",
    "NeuronFallbackWarning",
    "NeuronTensor",
    "backend",
    "compile_report",
    "device_stats",
    "generated_kernels",
    "kernel_source",
    "neuron_device",
    "reset_compile_report",
    "write_kernel_folder",
]
