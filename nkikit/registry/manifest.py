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
    backward = "kernel:rmsnorm_backward"   # optional: fn(*grad_outs, *inputs, **attrs) -> grads

    [functions.cross_entropy]
    ...
    inputs = ["logits", "targets"]
    dtypes = ["float32", "bfloat16"]
    input_dtypes = { targets = ["int32", "int64"] }  # optional: inputs with dtypes of their own
    ranges = { targets = [0, "logits.shape[1]"] }   # optional: where test values are drawn

`dtypes` lists the dtypes the function computes in (NKI dtypes); each is one variant in which
every input not named in `input_dtypes` has that dtype. `input_dtypes.<input>` (a dtype name or
a list) is what that input accepts whatever the variant; the first is the one example and test
inputs use. Besides NKI dtypes it may name `int64` (HOST_DTYPES: what torch and numpy index
tensors are; the entry converts it before a kernel sees it). Integer inputs get no gradient.
`ranges.<input>` = [low, high): random example/test values are drawn uniformly from it (integers
for an integer input); a bound is a number or `"<input>.shape[<axis>]"`, a dimension of an input
resolved against the shapes in use (so class indices stay below the vocabulary size).
A backward takes one gradient per output (a tuple-returning function gets several, zeros for
outputs that did not contribute to the loss), then the inputs and attrs, and returns one
gradient per input (entries for integer inputs are ignored and may be None).

The same data, plus what publishing learns (the number of outputs of each function), travels
inside every build as `kernel.json` (`Manifest.to_dict` / `Manifest.from_dict`), so a pulled
build needs no TOML parser and no access to the original folder.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import ManifestError
from .names import kernel_name

MANIFEST_FILE = "kernel.toml"

_ATTR_TYPES = (bool, int, float, str)

# Dtypes an input may declare beyond the NKI ones: host-side only (no kernel computes in them),
# accepted at the API boundary because torch and numpy index tensors default to them.
HOST_DTYPES = ("int64",)

Bound = int | float | str  # a number, or "<input>.shape[<axis>]"
_SHAPE_REF = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\.shape\[\s*(-?\d+)\s*\]\s*$")


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
    input_dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ranges: dict[str, tuple[Bound, Bound]] = field(default_factory=dict)

    def accepted_dtypes(self, input_name: str) -> tuple[str, ...]:
        """Every dtype `input_name` may have: its `input_dtypes` entry, else `dtypes`."""
        return self.input_dtypes.get(input_name, self.dtypes)

    def input_dtype(self, input_name: str, dtype: str | None = None) -> str:
        """The dtype of `input_name` in example/test inputs when the function runs in `dtype`
        (default: the first of `dtypes`): the first of its own `input_dtypes`, else `dtype`."""
        own = self.input_dtypes.get(input_name)
        return own[0] if own else (dtype or self.dtypes[0])

    def input_range(
        self, input_name: str, shapes: Mapping[str, Sequence[int]] | None = None
    ) -> tuple[int | float, int | float] | None:
        """The declared [low, high) of `input_name`'s values with shape references resolved
        against `shapes` (input name -> shape; default: the example), or None.

        Raises ManifestError when a referenced input or axis is missing from `shapes` or the
        range comes out empty."""
        bounds = self.ranges.get(input_name)
        if bounds is None:
            return None
        shapes = self.example if shapes is None else shapes
        where = f"[functions.{self.name}] ranges.{input_name}"
        lo, hi = (_resolve_bound(b, shapes, where) for b in bounds)
        if not lo < hi:
            raise ManifestError(
                f"{where} = {list(bounds)} is empty for shapes {dict(shapes)}: [{lo}, {hi})"
            )
        return lo, hi

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
        # only when used, so the kernel.json (and the build id) of other kernels is unchanged
        if self.input_dtypes:
            d["input_dtypes"] = {k: list(v) for k, v in self.input_dtypes.items()}
        if self.ranges:
            d["ranges"] = {k: list(v) for k, v in self.ranges.items()}
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

        Raises ManifestError listing every problem found (its ``problems``: one message each).
        """
        if not isinstance(data, Mapping):
            raise ManifestError(f"{where}: expected a table")
        problems = Problems()
        name = data.get("name")
        with problems:
            if not isinstance(name, str):
                raise ManifestError(f"{where}: [kernel] name is required (a string)")
            try:
                kernel_name(name)
            except ValueError as e:
                raise ManifestError(f"{where}: {e}") from None
        version = problems.check(
            lambda: _check_version(data.get("version"), f"{where}: [kernel] version")
        )
        license_ = data.get("license", "")
        description = data.get("description", "")
        with problems:
            if not isinstance(license_, str) or not license_:
                raise ManifestError(
                    f"{where}: [kernel] license is required (an SPDX id, e.g. 'Apache-2.0')"
                )
        with problems:
            if not isinstance(description, str):
                raise ManifestError(f"{where}: [kernel] description must be a string")
        raw_functions = data.get("functions")
        functions = {}
        with problems:
            if not isinstance(raw_functions, Mapping) or not raw_functions:
                raise ManifestError(f"{where}: at least one [functions.<name>] table is required")
            for fname, spec in raw_functions.items():
                functions[fname] = problems.check(
                    lambda fname=fname, spec=spec: _parse_function(
                        fname, spec, f"{where}: [functions.{fname}]"
                    )
                )
        problems.raise_if_any()
        return cls(name, version, license_, description, functions, path)


class Problems:
    """Collects ManifestErrors so that one pass reports every problem (each message names the
    file, the table and the key); ``raise_if_any`` raises one ManifestError listing them all."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __enter__(self) -> Problems:
        return self

    def __exit__(self, kind: object, value: BaseException | None, tb: object) -> bool:
        if isinstance(value, ManifestError):
            # a nested collection (one function table's problems) keeps its items apart
            self.messages.extend(getattr(value, "problems", None) or [str(value)])
            return True
        return False

    def check(self, fn: Any) -> Any:
        """``fn()``, or None after recording the ManifestError it raised."""
        with self:
            return fn()
        return None

    def raise_if_any(self) -> None:
        """Raise one ManifestError for what was collected (its ``problems``: the messages)."""
        if not self.messages:
            return
        if len(self.messages) == 1:
            error = ManifestError(self.messages[0])
        else:
            listed = "\n".join(f"  - {m}" for m in self.messages)
            error = ManifestError(f"{len(self.messages)} problems in the manifest:\n{listed}")
        error.problems = list(self.messages)  # type: ignore[attr-defined]
        raise error


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
    problems = Problems()
    manifest = None
    try:
        manifest = Manifest.from_dict(merged, path=folder.resolve(), where=str(path))
    except ManifestError as e:
        problems.messages.extend(getattr(e, "problems", None) or [str(e)])
    # the names each function's entry, reference and backward give must exist: checked from
    # the source, without importing (or running) it, so a typo is reported before any test
    raw = data.get("functions")
    for fname, spec in raw.items() if isinstance(raw, Mapping) else ():
        for key in ("entry", "reference", "backward"):
            try:  # a malformed value is already reported by from_dict
                sym = Symbol.parse(spec.get(key) if isinstance(spec, Mapping) else None, key)
            except ManifestError:
                continue
            with problems:
                _check_symbol(folder, sym, f"{path}: [functions.{fname}] {key}")
    problems.raise_if_any()
    assert manifest is not None
    return manifest


def _module_file(folder: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for candidate in (folder / rel.with_suffix(".py"), folder / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _check_symbol(folder: Path, sym: Symbol, where: str) -> None:
    """Raise ManifestError unless ``sym.module`` is a file of ``folder`` that defines
    ``sym.attr`` at top level (a def, class, assignment or import; a module with a star import
    or a module ``__getattr__`` is given the benefit of the doubt)."""
    import ast

    file = _module_file(folder, sym.module)
    if file is None:
        raise ManifestError(
            f"{where} = {str(sym)!r} refers to module {sym.module!r}, but {folder} has no "
            f"{sym.module.replace('.', '/')}.py"
        )
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    except SyntaxError:
        return  # the tests report it, with the line
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return
                names.add(alias.asname or alias.name.split(".")[0])
    if sym.attr in names or "__getattr__" in names:
        return
    close = difflib.get_close_matches(sym.attr, sorted(names), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ManifestError(f"{where} = {str(sym)!r}: {file.name} defines no {sym.attr!r}{hint}")


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
        "input_dtypes",
        "ranges",
    }
    # every key is checked, so one pass reports all of the table's problems; a key that
    # depends on another (example on inputs) is checked once that one is valid
    problems = Problems()
    with problems:
        unknown = set(spec) - known
        if unknown:
            raise ManifestError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    entry = problems.check(lambda: Symbol.parse(spec.get("entry"), f"{where} entry"))
    reference = backward = None
    if "reference" in spec:
        reference = problems.check(lambda: Symbol.parse(spec["reference"], f"{where} reference"))
    if "backward" in spec:
        backward = problems.check(lambda: Symbol.parse(spec["backward"], f"{where} backward"))
    inputs = problems.check(lambda: _parse_inputs(spec.get("inputs"), where))
    dtypes = problems.check(lambda: _parse_dtypes(spec.get("dtypes", ["float32"]), where))
    with problems:
        outputs = spec.get("outputs")
        if outputs is not None and (
            not isinstance(outputs, int) or isinstance(outputs, bool) or outputs < 1
        ):
            raise ManifestError(f"{where}: outputs must be a positive int")
    returns_tuple = spec.get("returns_tuple", False)
    with problems:
        if not isinstance(returns_tuple, bool):
            raise ManifestError(f"{where}: returns_tuple must be a bool")
    attrs = input_dtypes = shapes = ranges = None
    if inputs is not None:
        attrs = problems.check(lambda: _parse_attrs(spec.get("attrs", {}), inputs, where))
        input_dtypes = problems.check(
            lambda: _parse_input_dtypes(spec.get("input_dtypes", {}), inputs, where)
        )
        shapes = problems.check(lambda: _parse_example(spec.get("example", {}), inputs, where))
        if dtypes is not None and input_dtypes is not None and shapes is not None:
            ranges = problems.check(
                lambda: _parse_ranges(
                    spec.get("ranges", {}), inputs, input_dtypes, dtypes, shapes, where
                )
            )
    problems.raise_if_any()
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
        input_dtypes=input_dtypes,
        ranges=ranges,
    )


def _parse_inputs(inputs: object, where: str) -> list[str]:
    if (
        not isinstance(inputs, list)
        or not inputs
        or not all(isinstance(i, str) and i.isidentifier() for i in inputs)
    ):
        raise ManifestError(f"{where}: inputs must be a non-empty list of argument names")
    if len(set(inputs)) != len(inputs):
        raise ManifestError(f"{where}: inputs has duplicate names")
    return inputs


def _parse_attrs(attrs: object, inputs: list[str], where: str) -> dict[str, Any]:
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
    return dict(attrs)


def _parse_dtypes(dtypes: object, where: str) -> list[str]:
    if not isinstance(dtypes, list) or not dtypes or not all(isinstance(d, str) for d in dtypes):
        raise ManifestError(f"{where}: dtypes must be a non-empty list of dtype names")
    bad = [d for d in dtypes if not _is_nki_dtype(d)]
    if bad:
        raise ManifestError(
            f"{where}: unknown dtype(s) {bad}; use NKI dtype names (float32, bfloat16, ...)"
        )
    return dtypes


def _parse_example(example: object, inputs: list[str], where: str) -> dict[str, tuple[int, ...]]:
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
    return shapes


def _parse_input_dtypes(raw: object, inputs: list[str], where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, Mapping):
        raise ManifestError(
            f"{where}: input_dtypes must be a table of input = dtype or [dtypes], "
            f'e.g. input_dtypes = {{ targets = ["int32", "int64"] }}'
        )
    out: dict[str, tuple[str, ...]] = {}
    for name, value in raw.items():
        key = f"{where} input_dtypes.{name}"
        if name not in inputs:
            raise ManifestError(f"{key}: {name!r} is not an input (inputs: {', '.join(inputs)})")
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(d, str) for d in names):
            raise ManifestError(f"{key}: expected a dtype name or a non-empty list of them")
        bad = [d for d in names if not (_is_nki_dtype(d) or d in HOST_DTYPES)]
        if bad:
            raise ManifestError(
                f"{key}: unknown dtype(s) {bad}; use NKI dtype names (float32, int32, ...) "
                f"or {', '.join(HOST_DTYPES)}"
            )
        if len(set(names)) != len(names):
            raise ManifestError(f"{key}: lists a dtype twice")
        out[name] = tuple(names)
    return out


def _parse_ranges(
    raw: object,
    inputs: list[str],
    input_dtypes: Mapping[str, tuple[str, ...]],
    dtypes: list[str],
    shapes: Mapping[str, tuple[int, ...]],
    where: str,
) -> dict[str, tuple[Bound, Bound]]:
    if not isinstance(raw, Mapping):
        raise ManifestError(
            f"{where}: ranges must be a table of input = [low, high], "
            f'e.g. ranges = {{ targets = [0, "logits.shape[1]"] }}'
        )
    out: dict[str, tuple[Bound, Bound]] = {}
    for name, value in raw.items():
        key = f"{where} ranges.{name}"
        if name not in inputs:
            raise ManifestError(f"{key}: {name!r} is not an input (inputs: {', '.join(inputs)})")
        if not isinstance(value, list) or len(value) != 2:
            raise ManifestError(f"{key}: expected [low, high] (high excluded), got {value!r}")
        kinds = {_dtype_kind(d) for d in input_dtypes.get(name, dtypes)}
        if "bool" in kinds:
            raise ManifestError(f"{key}: a bool input takes no range")
        for b in value:
            if isinstance(b, str):
                m = _SHAPE_REF.match(b)
                if m is None or m.group(1) not in inputs:
                    raise ManifestError(
                        f"{key}: bound {b!r} must be a number or '<input>.shape[<axis>]' "
                        f"naming one of {', '.join(inputs)}"
                    )
                rank = len(shapes[m.group(1)])
                if not -rank <= int(m.group(2)) < rank:
                    raise ManifestError(
                        f"{key}: {b!r}: axis out of range for {m.group(1)}, which has "
                        f"{rank} dimension(s) in the example"
                    )
            elif isinstance(b, bool) or not isinstance(b, int | float):
                raise ManifestError(f"{key}: bound {b!r} must be a number or a shape reference")
            elif "int" in kinds and not isinstance(b, int):
                raise ManifestError(f"{key}: bound {b!r} must be an integer for an integer input")
        bounds = (value[0], value[1])
        lo, hi = (_resolve_bound(b, shapes, key) for b in bounds)
        if not lo < hi:
            raise ManifestError(f"{key} = {value!r} is empty for the example shapes: [{lo}, {hi})")
        out[name] = bounds
    return out


def _resolve_bound(b: Bound, shapes: Mapping[str, Sequence[int]], where: str) -> int | float:
    if not isinstance(b, str):
        return b
    m = _SHAPE_REF.match(b)
    assert m is not None  # checked when parsed
    name, axis = m.group(1), int(m.group(2))
    shape = shapes.get(name)
    if shape is None or not -len(shape) <= axis < len(shape):
        raise ManifestError(f"{where}: {b!r} needs the shape of {name!r}, got {shape!r}")
    return int(shape[axis])


def _dtype_kind(name: str) -> str:
    """'float', 'int' or 'bool' for a dtype name the manifest accepts."""
    if name in HOST_DTYPES:
        return "int"
    from .. import dtypes

    dt = dtypes.as_dtype(name)
    if dt == dtypes.bool_:
        return "bool"
    return "int" if dtypes.is_int(dt) else "float"


def numpy_dtype(name: str) -> object:
    """The numpy dtype of a manifest dtype name (NKI dtypes and HOST_DTYPES)."""
    import numpy as np

    if name in HOST_DTYPES:
        return np.dtype(name)
    from .. import dtypes

    return dtypes.as_dtype(name)


def is_float_dtype(name: str) -> bool:
    """True for a floating dtype name (a differentiable input)."""
    return _dtype_kind(name) == "float"


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
