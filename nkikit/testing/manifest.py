"""Check a library kernel's ``kernel.toml`` against its code: the manifest has the registry's
shape, its entry and reference resolve, the entry's signature matches ``inputs``/``attrs``, and
the ``example`` runs and matches the reference in every listed dtype."""

from __future__ import annotations

import importlib
import inspect
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import dtypes
from .check import check_kernel
from .inputs import random_inputs

_KERNEL_KEYS = {"name": str, "version": int, "license": str, "description": str}
_FUNCTION_KEYS = {"entry": str, "reference": str, "inputs": list, "dtypes": list, "example": dict}
_OPTIONAL_FUNCTION_KEYS = {"attrs": dict, "backward": str}


def load_manifest(folder: str | Path) -> dict[str, Any]:
    """Parse ``folder/kernel.toml``.  Raises ``FileNotFoundError`` or ``tomllib.TOMLDecodeError``."""
    with open(Path(folder) / "kernel.toml", "rb") as f:
        return tomllib.load(f)


def manifest_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Everything wrong with the manifest's shape (an empty list when it is well formed)."""
    problems: list[str] = []
    kernel = manifest.get("kernel")
    if not isinstance(kernel, dict):
        return ["missing [kernel] table"]
    for key, typ in _KERNEL_KEYS.items():
        if not isinstance(kernel.get(key), typ) or isinstance(kernel.get(key), bool):
            problems.append(f"[kernel].{key} must be a {typ.__name__}")
    if isinstance(kernel.get("version"), int) and kernel["version"] < 1:
        problems.append("[kernel].version must be >= 1")
    functions = manifest.get("functions")
    if not isinstance(functions, dict) or not functions:
        return problems + ["missing [functions.<name>] tables"]
    for fname, fn in functions.items():
        where = f"[functions.{fname}]"
        if not isinstance(fn, dict):
            problems.append(f"{where} must be a table")
            continue
        for key, typ in _FUNCTION_KEYS.items():
            if not isinstance(fn.get(key), typ):
                problems.append(f"{where}.{key} must be a {typ.__name__}")
        for key, typ in _OPTIONAL_FUNCTION_KEYS.items():
            if key in fn and not isinstance(fn[key], typ):
                problems.append(f"{where}.{key} must be a {typ.__name__}")
        unknown = set(fn) - set(_FUNCTION_KEYS) - set(_OPTIONAL_FUNCTION_KEYS)
        if unknown:
            problems.append(f"{where} has unknown keys {sorted(unknown)}")
        for key in ("entry", "reference", "backward"):
            if isinstance(fn.get(key), str) and fn[key].count(":") != 1:
                problems.append(f"{where}.{key} must be 'module:callable', got {fn[key]!r}")
        for name in fn.get("dtypes") or []:
            try:
                dtypes.as_dtype(name)
            except TypeError:
                problems.append(f"{where}.dtypes: {name!r} is not an NKI dtype")
        inputs = fn.get("inputs") or []
        example = fn.get("example") or {}
        if isinstance(example, dict) and set(example) != set(inputs):
            problems.append(
                f"{where}.example must give a shape for each input {inputs}, got {sorted(example)}"
            )
    return problems


def resolve(package: str, target: str) -> Callable[..., Any]:
    """``module:callable`` inside ``package`` (e.g. ``kernel:rmsnorm``)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(f"{package}.{module}"), attr)


def check_manifest(
    folder: str | Path,
    package: str,
    *,
    op_kind: str | Mapping[str, str] = "elementwise",
    seed: int = 0,
    run_examples: bool = True,
) -> dict[str, Any]:
    """Assert the kernel in ``folder`` (imported as ``package``) matches its manifest.

    ``op_kind``: the tolerance kind for every function, or a mapping function -> kind.
    With ``run_examples`` each function's example shapes run in every listed dtype and are
    compared with the reference (``check_kernel``).  Returns the parsed manifest.
    Raises ``AssertionError`` listing what is wrong.
    """
    manifest = load_manifest(folder)
    problems = manifest_problems(manifest)
    assert not problems, "kernel.toml: " + "; ".join(problems)
    assert manifest["kernel"]["name"] == Path(folder).name, (
        f"kernel.toml: [kernel].name {manifest['kernel']['name']!r} differs from the folder name {Path(folder).name!r}"
    )
    for fname, fn in manifest["functions"].items():
        entry = resolve(package, fn["entry"])
        reference = resolve(package, fn["reference"])
        attrs = fn.get("attrs", {})
        for label, f in (("entry", entry), ("reference", reference)):
            params = inspect.signature(f).parameters
            positional = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
            assert positional == fn["inputs"], (
                f"{fname}: {label} {fn[label]} takes arrays {positional}, kernel.toml says inputs = {fn['inputs']}"
            )
            for a, default in attrs.items():
                assert a in params, (
                    f"{fname}: {label} {fn[label]} has no argument {a!r} (kernel.toml attrs)"
                )
                assert params[a].default == default, (
                    f"{fname}: {label} {fn[label]} default {a}={params[a].default!r}, kernel.toml says {default!r}"
                )
        if not run_examples:
            continue
        kind = op_kind if isinstance(op_kind, str) else op_kind.get(fname, "elementwise")
        shapes = [tuple(fn["example"][name]) for name in fn["inputs"]]
        for dt in fn["dtypes"]:
            args = random_inputs(shapes, dt, seed)
            check_kernel(entry, reference, *args, dtype=dt, op_kind=kind, **attrs)
    return manifest
