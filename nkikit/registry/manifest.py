"""`kernel.toml`: the manifest of a kernel folder, parsed and checked.

    [kernel]
    name = "rmsnorm"
    version = 1                 # major version; published on Hub branch "v1"
    license = "Apache-2.0"
    description = "..."
    [functions.rmsnorm]
    entry = "kernel:rmsnorm"    # module:callable in the folder, numpy arrays in and out
    reference = "reference:rmsnorm"
    inputs = ["x", "weight"]
    attrs = { eps = 1e-6 }
    dtypes = ["float32", "bfloat16"]
    example = { x = [256, 1024], weight = [1024] }
    backward = "kernel:rmsnorm_backward"   # optional: fn(grad_out, *inputs, **attrs) -> grads

The same data, plus what publishing learns (the number of outputs of each function), travels
inside every build as `kernel.json` (`Manifest.to_dict` / `Manifest.from_dict`), so a pulled
build needs no TOML parser and no access to the original folder.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import ManifestError
from .names import kernel_name

MANIFEST_FILE = "kernel.toml"

_ATTR_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class Symbol:
    """A `module:callable` reference inside a kernel folder."""

    module: str
    attr: str

    @classmethod
    def parse(cls, text: object, where: str) -> Symbol:
        if not isinstance(text, str) or text.count(":") != 1:
            raise ManifestError(f"{where}: expected 'module:callable', got {text!r}")
        module, attr = text.split(":")
        parts = module.split(".")
        if not all(p.isidentifier() for p in parts) or not attr.isidentifier():
            raise ManifestError(f"{where}: {text!r} is not 'module:callable' of Python names")
        return cls(module, attr)

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}"


@dataclass(frozen=True)
class FunctionSpec:
    """One public function of a kernel.

    inputs: names of the tensor arguments, in call order. attrs: non-tensor arguments with their
    defaults (their types fix the torch schema). outputs: number of returned arrays, and
    returns_tuple whether they come back as a tuple (both learnt by running the example at
    build time; None before).
    """

    name: str
    entry: Symbol
    inputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("float32",)
    example: dict[str, tuple[int, ...]] = field(default_factory=dict)
    reference: Symbol | None = None
    backward: Symbol | None = None
    outputs: int | None = None
    returns_tuple: bool = False

    @property
    def signature(self) -> str:
        """`rmsnorm(x, weight, eps=1e-06)`: how the function is called."""
        args = [*self.inputs, *(f"{k}={v!r}" for k, v in self.attrs.items())]
        return f"{self.name}({', '.join(args)})"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "entry": str(self.entry),
            "inputs": list(self.inputs),
            "attrs": dict(self.attrs),
            "dtypes": list(self.dtypes),
            "example": {k: list(v) for k, v in self.example.items()},
        }
        if self.reference is not None:
            d["reference"] = str(self.reference)
        if self.backward is not None:
            d["backward"] = str(self.backward)
        if self.outputs is not None:
            d["outputs"] = self.outputs
            d["returns_tuple"] = self.returns_tuple
        return d


@dataclass(frozen=True)
class Manifest:
    """A parsed `kernel.toml`. `path` is the kernel folder (None for a manifest read from a build)."""

    name: str
    version: int
    license: str
    description: str
    functions: dict[str, FunctionSpec]
    path: Path | None = None

    @property
    def hub_name(self) -> str:
        """The name in Hub form (`tensor_add` -> `tensor-add`)."""
        return kernel_name(self.name)

    def with_version(self, version: int) -> Manifest:
        return replace(self, version=_check_version(version, "version"))

    def with_outputs(self, outputs: Mapping[str, tuple[int, bool]]) -> Manifest:
        """A copy recording, per function, (number of outputs, returns a tuple)."""
        functions = {
            n: replace(f, outputs=outputs[n][0], returns_tuple=outputs[n][1]) if n in outputs else f
            for n, f in self.functions.items()
        }
        return replace(self, functions=functions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "license": self.license,
            "description": self.description,
            "functions": {n: f.to_dict() for n, f in self.functions.items()},
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, path: Path | None = None, where: str = "manifest"
    ) -> Manifest:
        """Build a Manifest from `kernel.json` data (or the tables of a `kernel.toml`).

        Raises ManifestError naming the first problem found.
        """
        if not isinstance(data, Mapping):
            raise ManifestError(f"{where}: expected a table")
        name = data.get("name")
        if not isinstance(name, str):
            raise ManifestError(f"{where}: [kernel] name is required (a string)")
        try:
            kernel_name(name)
        except ValueError as e:
            raise ManifestError(f"{where}: {e}") from None
        version = _check_version(data.get("version"), f"{where}: [kernel] version")
        license_ = data.get("license", "")
        description = data.get("description", "")
        if not isinstance(license_, str) or not license_:
            raise ManifestError(
                f"{where}: [kernel] license is required (an SPDX id, e.g. 'Apache-2.0')"
            )
        if not isinstance(description, str):
            raise ManifestError(f"{where}: [kernel] description must be a string")
        raw_functions = data.get("functions")
        if not isinstance(raw_functions, Mapping) or not raw_functions:
            raise ManifestError(f"{where}: at least one [functions.<name>] table is required")
        functions = {
            fname: _parse_function(fname, spec, f"{where}: [functions.{fname}]")
            for fname, spec in raw_functions.items()
        }
        return cls(name, version, license_, description, functions, path)


def load_manifest(folder: str | Path) -> Manifest:
    """Parse `<folder>/kernel.toml`. Raises ManifestError (missing file, bad TOML, bad field)."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{folder} is not a kernel folder: it has no {MANIFEST_FILE}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{path}: invalid TOML: {e}") from None
    kernel = data.get("kernel")
    if not isinstance(kernel, Mapping):
        raise ManifestError(f"{path}: a [kernel] table is required")
    merged = {**kernel, "functions": data.get("functions")}
    manifest = Manifest.from_dict(merged, path=folder.resolve(), where=str(path))
    for fn in manifest.functions.values():
        for sym in (fn.entry, fn.reference, fn.backward):
            if sym is not None and not _module_file(folder, sym.module):
                raise ManifestError(
                    f"{path}: [functions.{fn.name}] refers to module {sym.module!r}, "
                    f"but {folder} has no {sym.module.replace('.', '/')}.py"
                )
    return manifest


def _module_file(folder: Path, module: str) -> bool:
    rel = Path(*module.split("."))
    return (folder / rel.with_suffix(".py")).is_file() or (folder / rel / "__init__.py").is_file()


def _check_version(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(
            f"{where} must be a non-negative integer (the major version), got {value!r}"
        )
    return value


def _parse_function(name: str, spec: object, where: str) -> FunctionSpec:
    if not name.isidentifier():
        raise ManifestError(f"{where}: the function name must be a Python identifier")
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{where}: expected a table")
    known = {
        "entry",
        "reference",
        "inputs",
        "attrs",
        "dtypes",
        "example",
        "backward",
        "outputs",
        "returns_tuple",
    }
    unknown = set(spec) - known
    if unknown:
        raise ManifestError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    entry = Symbol.parse(spec.get("entry"), f"{where} entry")
    reference = (
        Symbol.parse(spec["reference"], f"{where} reference") if "reference" in spec else None
    )
    backward = Symbol.parse(spec["backward"], f"{where} backward") if "backward" in spec else None

    inputs = spec.get("inputs")
    if (
        not isinstance(inputs, list)
        or not inputs
        or not all(isinstance(i, str) and i.isidentifier() for i in inputs)
    ):
        raise ManifestError(f"{where}: inputs must be a non-empty list of argument names")
    if len(set(inputs)) != len(inputs):
        raise ManifestError(f"{where}: inputs has duplicate names")

    attrs = spec.get("attrs", {})
    if not isinstance(attrs, Mapping):
        raise ManifestError(f"{where}: attrs must be a table of name = default")
    for k, v in attrs.items():
        if not k.isidentifier() or k in inputs:
            raise ManifestError(
                f"{where}: attr {k!r} must be an identifier distinct from the inputs"
            )
        if not _is_attr_value(v):
            raise ManifestError(
                f"{where}: attr {k} = {v!r}: defaults must be bool, int, float, str or a list of numbers"
            )

    dtypes = spec.get("dtypes", ["float32"])
    if not isinstance(dtypes, list) or not dtypes or not all(isinstance(d, str) for d in dtypes):
        raise ManifestError(f"{where}: dtypes must be a non-empty list of dtype names")
    bad = [d for d in dtypes if not _is_nki_dtype(d)]
    if bad:
        raise ManifestError(
            f"{where}: unknown dtype(s) {bad}; use NKI dtype names (float32, bfloat16, ...)"
        )

    example = spec.get("example", {})
    if not isinstance(example, Mapping):
        raise ManifestError(f"{where}: example must be a table of input = shape")
    missing = [i for i in inputs if i not in example]
    extra = [k for k in example if k not in inputs]
    if missing or extra:
        raise ManifestError(
            f"{where}: example must give a shape for every input and nothing else "
            f"(missing: {missing or 'none'}, unknown: {extra or 'none'})"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for k in inputs:
        shape = example[k]
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape
        ):
            raise ManifestError(
                f"{where}: example.{k} must be a list of positive ints, got {shape!r}"
            )
        shapes[k] = tuple(shape)

    outputs = spec.get("outputs")
    if outputs is not None and (
        not isinstance(outputs, int) or isinstance(outputs, bool) or outputs < 1
    ):
        raise ManifestError(f"{where}: outputs must be a positive int")
    returns_tuple = spec.get("returns_tuple", False)
    if not isinstance(returns_tuple, bool):
        raise ManifestError(f"{where}: returns_tuple must be a bool")
    return FunctionSpec(
        name=name,
        entry=entry,
        inputs=tuple(inputs),
        attrs=dict(attrs),
        dtypes=tuple(dtypes),
        example=shapes,
        reference=reference,
        backward=backward,
        outputs=outputs,
        returns_tuple=returns_tuple,
    )


def _is_nki_dtype(name: str) -> bool:
    from .. import dtypes

    try:
        dtypes.as_dtype(name)
    except TypeError:
        return False
    return True


def _is_attr_value(v: object) -> bool:
    if isinstance(v, _ATTR_TYPES):
        return True
    if isinstance(v, list) and v:
        return all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
    return False
