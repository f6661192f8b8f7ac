"""PyTorch on an emulated NeuronCore: a ``neuron`` device whose ATen ops run as NKI kernels on
nkikit's simulator, and a ``torch.compile`` backend that fuses graphs into generated kernels.

Importing this package sets the device up (idempotent): ``"neuron"`` is then a torch device.
"""

from .device import NeuronTensor, neuron_device
from .dispatch import NeuronFallbackWarning
from .source import kernel_source
from .stats import DeviceStats, device_stats

neuron_device()

__all__ = [
    "DeviceStats",
    "NeuronFallbackWarning",
    "NeuronTensor",
    "device_stats",
    "kernel_source",
    "neuron_device",
]
