"""A stand-in for ``torch_xla`` on the emulated ``neuron`` device, for unmodified NKI programs.

The NKI documentation's PyTorch examples run a kernel on Trainium through torch-xla::

    import torch_xla
    device = torch_xla.device()            # or torch_xla.core.xla_model.xla_device()
    a = torch.ones((4, 3)).to(device=device)
    c = nki_kernel(a, b)                   # runs on the device, returns device tensors
    torch_xla.sync()                       # or xm.mark_step()

``nkikit.nki.install_alias()`` (and so ``python -m nkikit.nki FILE.py``) makes this module
``torch_xla``, ``torch_xla.core`` and ``torch_xla.core.xla_model`` when no real torch-xla is
installed: the device is nkikit's emulated NeuronCore (``nkikit.torch.neuron``), on which
every op completes when it is called, so the synchronisation calls have nothing to wait for.
Only what those programs use is here; any other name is an AttributeError saying so.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# the names this stand-in answers (the rest of torch-xla is not emulated)
PROVIDED = ("device", "xla_device", "sync", "mark_step", "wait_device_ops")


def device(index: int | None = None) -> Any:
    """The emulated NeuronCore as a torch device (``torch.device("neuron", 0)``).  There is
    one: an index other than None or 0 is a ValueError."""
    if index not in (None, 0):
        raise ValueError(f"torch_xla.device({index!r}): nkikit emulates one device, index 0")
    # the emulated device is in the torch layer above this dialect: looked up when first
    # asked for, as ``nki.autotune`` is, so that the alias imports no torch until then
    return importlib.import_module("nkikit.torch.neuron").neuron_device()


def xla_device(n: int | None = None, devkind: str | None = None) -> Any:
    """``torch_xla.core.xla_model.xla_device``: the same device as :func:`device`."""
    return device(n)


def sync(wait: bool = False) -> None:
    """Nothing to do: the emulated device runs every op when it is called."""


def mark_step(wait: bool = False) -> None:
    """Nothing to do (see :func:`sync`)."""


def wait_device_ops(devices: Any = None) -> None:
    """Nothing to do (see :func:`sync`)."""


# ``torch_xla.core.xla_model`` (``xm``) is this module too: ``import torch_xla.core.xla_model
# as xm`` reads the submodules as attributes of their parents
core = xla_model = sys.modules[__name__]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # the import system's probes (__path__, __spec__, ...)
        raise AttributeError(name)
    raise AttributeError(
        f"torch_xla.{name} is not emulated: nkikit stands in for torch-xla only with "
        f"{', '.join(PROVIDED)} (the emulated neuron device runs every op when it is called)"
    )
