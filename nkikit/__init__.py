"""nkikit: write Trainium NKI kernels, run them exactly on any CPU, see how they would run on
the NeuronCore, and share them on the Hugging Face Hub.

``import nkikit as nki`` is source-compatible with NKI Beta-1's ``neuronxcc.nki``.
"""

from . import compiler, isa, language, typing  # noqa: F401
from .compiler import launches as _launches  # noqa: F401  (installs the launch recorder)
from .compiler.api import benchmark, compile, profile, profile_kernel
from .compiler.launches import profile_launches
from .compiler.program import Program
from .errors import NkiError
from .language.jit import jit
from .language.tile import Tile as tensor  # NKI Beta-1's ``nki.tensor``: a kernel's tensors
from .trace.jit import JitKernel
from .tune import autotune
from .typing import TensorSpec

__version__ = "0.1.0"


def simulate_kernel(kernel, *args, **kwargs):
    """Run ``kernel`` (a jitted kernel, optionally with a grid) on the simulator."""
    if not isinstance(kernel, JitKernel):
        kernel = jit(kernel)
    return kernel(*args, **kwargs)


def baremetal(func=None, **options):
    """NKI's ``nki.baremetal``: here the kernel runs on the simulator (no device needed)."""
    if func is None:
        return lambda f: jit(f)
    return jit(func)


__all__ = [
    "JitKernel",
    "NkiError",
    "autotune",
    "Program",
    "TensorSpec",
    "baremetal",
    "benchmark",
    "compile",
    "jit",
    "profile",
    "profile_kernel",
    "profile_launches",
    "simulate_kernel",
    "tensor",
    "compiler",
    "isa",
    "language",
    "typing",
]
