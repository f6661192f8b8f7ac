"""``nkikit.nki``: the current NKI dialect (NKI 0.x, ``import nki``) on nkikit.

Laid out like AWS's ``nki`` package: ``nkikit.nki.language`` (``nl``), ``nkikit.nki.isa``
(``nisa``), ``nkikit.nki.typing``, ``nkikit.nki.compiler``, ``nkikit.nki.tensor``,
``nkikit.nki.builtin``, ``nkikit.nki.collectives``.  Kernels trace into the same IR as the
Beta-1 dialect (``nkikit``), so the verifier, both simulators, the compiler, the profiler,
the registry and the torch binding serve both.

Running a kernel on the CPU: call it with numpy arrays or CPU torch tensors, or use
``nki.simulate(kernel)(*args)`` or ``nki.cpu_simulate(kernel)[lnc](**kwargs)``.
To run an unmodified file that says ``import nki``: ``nkikit.nki.install_alias()`` first, or
``python -m nkikit.nki FILE.py`` / ``python -m nkikit.nki -m pytest ...``.
"""

from __future__ import annotations

import importlib.util
import sys

from . import (  # noqa: F401
    builtin,
    collectives,
    compiler,
    experimental,
    isa,
    language,
    meta,
    simulator,
    tensor,
    typing,
)
from .jit import Kernel0x, jit
from .ranks import simulate_ranks
from .tensor import NkiTensor

Kernel = Kernel0x
dtype = language.dtypes  # kernels annotate `dtype: nki.dtype`


def simulate(kernel):
    """``nki.simulate(kernel)(*args, **kwargs)``: run a kernel (jitted or a plain function,
    optionally launched: ``nki.simulate(kernel[2])``) on the simulator; returns numpy arrays
    (or torch tensors, for torch inputs) like the kernel's return value."""
    return jit(kernel)


class _CpuSimulate:
    __slots__ = ("kernel",)

    def __init__(self, kernel: Kernel0x) -> None:
        self.kernel = kernel

    def __getitem__(self, lnc) -> Kernel0x:
        return self.kernel[int(lnc)]

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs)


def cpu_simulate(kernel) -> _CpuSimulate:
    """``nki.cpu_simulate(kernel)[lnc](**kwargs)``, the NKI Library test harness's entry
    point: run ``kernel`` on ``lnc`` logical cores of the simulator."""
    return _CpuSimulate(jit(kernel))


def execute(kernel, *args, **kwargs):
    """``nki.execute(kernel, *args, **kwargs)`` (NKI docs after 0.6): run ``kernel`` once on
    these arguments on the simulator and return its outputs, like calling it."""
    return jit(kernel)(*args, **kwargs)


def install_alias() -> None:
    """Make ``import nki`` (and ``nki.language``, ``nki.isa``, ...) resolve to
    ``nkikit.nki`` in this process, so an unmodified NKI 0.x file runs on nkikit; and, unless
    a real torch-xla is installed, ``import torch_xla`` to :mod:`nkikit.nki.xla` (its device
    is the emulated NeuronCore).  Opt-in: nothing is installed under the bare name ``nki``."""
    this = sys.modules[__name__]
    sys.modules["nki"] = this
    for name in (
        "language",
        "language.dtypes",
        "isa",
        "isa.constants",
        "typing",
        "compiler",
        "tensor",
        "builtin",
        "collectives",
        "simulator",
        "meta",
        "meta.tensor",
        "experimental",
    ):
        sys.modules[f"nki.{name}"] = sys.modules[f"{__name__}.{name}"]
    sys.modules["nki.dtype"] = sys.modules[f"{__name__}.language.dtypes"]
    # the NKI docs' PyTorch examples put their tensors on a torch-xla device: without a real
    # torch-xla, that is the emulated neuron device (``nkikit.nki.xla``)
    if "torch_xla" not in sys.modules and importlib.util.find_spec("torch_xla") is None:
        from . import xla

        for name in ("torch_xla", "torch_xla.core", "torch_xla.core.xla_model"):
            sys.modules[name] = xla


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"nki.{name} is not part of NKI 0.x; use nki.simulate / nkikit.nki.jit and "
            "nkikit.benchmark / nkikit.profile / nkikit.profile_kernel for the cost model"
        )

    fn.__name__ = name
    return fn


# NKI 0.2+ answers these with "not available" errors (profiling moved to Neuron Explorer);
# nkikit's cost model has them as ``nkikit.benchmark`` / ``nkikit.profile``.
baremetal = _unavailable("baremetal")
benchmark = _unavailable("benchmark")
profile = _unavailable("profile")
simulate_kernel = _unavailable("simulate_kernel")


def __getattr__(name: str):
    # ``nki.autotune`` ranks configs with the cost model (nkikit.compiler), a layer above this
    # dialect, so the dialect cannot import it: it is the same decorator as ``nkikit.autotune``
    # (dialect-neutral: it wraps any @nki.jit kernel), looked up in the package above on first
    # use.  ``import nkikit.nki`` has always imported ``nkikit`` first, so it is there.
    if name == "autotune":
        return sys.modules["nkikit"].autotune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "jit",
    "simulate",
    "cpu_simulate",
    "execute",
    "simulate_ranks",
    "install_alias",
    "Kernel",
    "NkiTensor",
    "language",
    "isa",
    "typing",
    "compiler",
    "tensor",
    "builtin",
    "collectives",
    "simulator",
    "meta",
    "experimental",
]
