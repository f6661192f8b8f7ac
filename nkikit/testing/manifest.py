"""Check a library kernel's ``kernel.toml`` against its code.

The manifest is parsed by the registry's parser (``nkikit.registry.manifest``: the same rules
and error messages as ``nkikit publish``); on top of that this checks that each function's
entry and reference resolve, that their signatures match ``inputs``/``attrs``, and that the
``example`` runs and matches the reference in every declared dtype.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..registry.errors import ManifestError
from ..registry.manifest import MANIFEST_FILE, FunctionSpec, Manifest, Symbol, is_float_dtype
from ..registry.manifest import load_manifest as _load_registry_manifest
from .check import check_kernel
from .inputs import example_inputs


def load_manifest(folder: str | Path) -> Manifest:
    """Parse ``folder/kernel.toml`` (``nkikit.registry.manifest.load_manifest``).

    Raises ``ManifestError`` naming the file and the first problem (missing file, invalid TOML,
    a bad or missing key)."""
    return _load_registry_manifest(folder)


def manifest_problems(source: str | Path | Mapping[str, Any]) -> list[str]:
    """What is wrong with a manifest: ``[]`` when it is well formed, else the registry parser's
    message for the first problem (it names the file and the key).

    ``source``: a kernel folder, or ``kernel.toml`` data as ``tomllib`` returns it (a
    ``[kernel]`` table and ``[functions.<name>]`` tables)."""
    try:
        if isinstance(source, Mapping):
            kernel = source.get("kernel")
            if not isinstance(kernel, Mapping):
                raise ManifestError(f"{MANIFEST_FILE}: a [kernel] table is required")
            merged = {**kernel, "functions": source.get("functions")}
            Manifest.from_dict(merged, where=MANIFEST_FILE)
        else:
            _load_registry_manifest(source)
    except ManifestError as e:
        return [str(e)]
    return []


def resolve(package: str, target: str | Symbol) -> Callable[..., Any]:
    """``module:callable`` inside ``package`` (e.g. ``kernel:rmsnorm``)."""
    module, _, attr = str(target).partition(":")
    return getattr(importlib.import_module(f"{package}.{module}"), attr)


def dtype_variants(spec: FunctionSpec) -> list[tuple[str, dict[str, str]]]:
    """The (function dtype, per-input dtypes) combinations ``check_manifest`` runs: every
    dtype in ``dtypes`` with each input in its first declared dtype, then each further dtype an
    input declares in ``input_dtypes`` once (with the first function dtype), so every declared
    dtype of every input is exercised without running the full product."""
    base = {n: spec.input_dtype(n) for n in spec.inputs}
    variants = [(dt, {n: spec.input_dtype(n, dt) for n in spec.inputs}) for dt in spec.dtypes]
    for name, own in spec.input_dtypes.items():
        variants += [(spec.dtypes[0], {**base, name: alt}) for alt in own[1:]]
    return variants


def check_manifest(
    folder: str | Path,
    package: str,
    *,
    op_kind: str | Mapping[str, str] = "elementwise",
    seed: int = 0,
    run_examples: bool = True,
) -> Manifest:
    """Assert the kernel in ``folder`` (imported as ``package``) matches its manifest.

    The manifest must parse (the registry's rules), name the folder, and give every function a
    ``reference``; each entry and reference must take exactly ``inputs`` as positional
    parameters and ``attrs`` with the manifest's defaults.
    ``op_kind``: the tolerance kind for every function, or a mapping function -> kind.
    With ``run_examples`` each function's example runs (inputs from ``example_inputs``: the
    declared per-input dtypes and value ranges) in every combination of ``dtype_variants`` and
    is compared with the reference (``check_kernel``).
    Returns the parsed ``nkikit.registry.manifest.Manifest``.
    Raises ``AssertionError`` saying what is wrong.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the report, not ours
    try:
        manifest = _load_registry_manifest(folder)
    except ManifestError as e:
        raise AssertionError(str(e)) from e
    where = Path(folder) / MANIFEST_FILE
    assert manifest.name == Path(folder).name, (
        f"{where}: [kernel] name {manifest.name!r} differs from the folder name "
        f"{Path(folder).name!r}"
    )
    for fname, fn in manifest.functions.items():
        assert fn.reference is not None, (
            f"{where}: [functions.{fname}] has no reference; check_manifest needs one"
        )
        entry = resolve(package, fn.entry)
        reference = resolve(package, fn.reference)
        for label, sym, f in (("entry", fn.entry, entry), ("reference", fn.reference, reference)):
            params = inspect.signature(f).parameters
            positional = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
            assert positional == list(fn.inputs), (
                f"{fname}: {label} {sym} takes arrays {positional}, kernel.toml says inputs = "
                f"{list(fn.inputs)}"
            )
            for a, default in fn.attrs.items():
                assert a in params, (
                    f"{fname}: {label} {sym} has no argument {a!r} (kernel.toml attrs)"
                )
                assert params[a].default == default, (
                    f"{fname}: {label} {sym} default {a}={params[a].default!r}, kernel.toml "
                    f"says {default!r}"
                )
        if not run_examples:
            continue
        kind = op_kind if isinstance(op_kind, str) else op_kind.get(fname, "elementwise")
        for dt, per_input in dtype_variants(fn):
            args = example_inputs(fn, dt, seed, input_dtypes=per_input)
            # check_kernel rounds float inputs to `dtype`; an input with a float dtype of its own
            # must keep it, so then the inputs go as drawn (already in their dtypes)
            own_float = any(per_input[n] != dt and is_float_dtype(per_input[n]) for n in fn.inputs)
            check_kernel(
                entry,
                reference,
                *args,
                dtype=None if own_float else dt,
                op_kind=kind,
                **fn.attrs,
            )
    return manifest
