"""``nkikit.testing``: check kernels against numpy references on the simulator.

* ``check_kernel(kernel, reference, *args, dtype=..., op_kind=...)``: run both, compare with
  the per-dtype tolerance, fail with a message that locates the error.
* ``assert_close``, ``compare``: the comparison alone.
* ``tolerance(dtype, op_kind)``, ``Tolerance``, ``DTYPE_TOLERANCES``, ``OP_KINDS``.
* ``random_inputs(shapes, dtype, seed)`` (one dtype, or one per array; optional value
  ``bounds``), ``round_to(x, dtype)``.
* ``example_inputs(spec, dtype, seed)``: inputs for a manifest function (a registry
  ``FunctionSpec``) in its declared per-input dtypes and value ranges.
* ``check_manifest(folder, package)``: a library kernel's ``kernel.toml`` (parsed by the
  registry's parser) matches its code and its example runs against the reference in every
  declared dtype; ``load_manifest``, ``manifest_problems``.
* ``nkikit.testing.strategies`` (needs hypothesis): tile-legal shapes, NKI dtypes, inputs.
* ``nkikit.testing.random_kernels`` (needs hypothesis): random Beta-1 kernels, legal and
  illegal, with a numpy model's verdict, and ``check_random_kernel`` (the front end's fuzz).
* ``load_profile()`` / ``register_profiles()`` (needs hypothesis): the ``ci``/``dev``
  settings profiles.

Importing this package does not import hypothesis; ``strategies``, ``random_kernels``,
``load_profile`` and ``register_profiles`` do, on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .check import assert_close, assert_grads_close, check_kernel, compare
from .inputs import example_inputs, random_inputs, round_to
from .manifest import check_manifest, load_manifest, manifest_problems
from .tolerances import DTYPE_TOLERANCES, OP_KINDS, Tolerance, loosest_tolerance, tolerance

_LAZY = {
    "strategies": ("nkikit.testing.strategies", None),
    "random_kernels": ("nkikit.testing.random_kernels", None),
    "load_profile": ("nkikit.testing.profiles", "load_profile"),
    "register_profiles": ("nkikit.testing.profiles", "register_profiles"),
    "profile_name": ("nkikit.testing.profiles", "profile_name"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        m = importlib.import_module(module)
        return m if attr is None else getattr(m, attr)
    raise AttributeError(f"module 'nkikit.testing' has no attribute {name!r}")


__all__ = [
    "assert_grads_close",
    "DTYPE_TOLERANCES",
    "OP_KINDS",
    "Tolerance",
    "assert_close",
    "check_kernel",
    "check_manifest",
    "compare",
    "example_inputs",
    "load_manifest",
    "load_profile",
    "loosest_tolerance",
    "manifest_problems",
    "profile_name",
    "random_inputs",
    "register_profiles",
    "random_kernels",
    "round_to",
    "strategies",
    "tolerance",
]
