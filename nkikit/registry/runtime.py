"""What a published torch-cpu build runs when imported: its kernel functions, bound.

The `__init__.py` that publishing generates is three lines: it calls `bind_build(__name__,
__file__)` and exports the functions. `bind_build` reads the build's `kernel.json`, imports each
function's entry (and reference, backward) from the build's own modules, and wraps it as a
`KernelFunction`: numpy arrays in, numpy arrays out on the simulator; torch tensors in, torch
tensors out through a torch custom op `<build id>::<function>` (nkikit.torch).

This module imports neither torch nor huggingface_hub: loading a kernel for numpy use stays
fast, and the torch ops are registered when torch is in use (see KernelFunction.torch).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import is_torch
from .errors import KernelCallError, RegistryError
from .manifest import FunctionSpec, Manifest, Symbol, numpy_dtype

BUILD_FILE = "kernel.json"
# 1: every input in the function's dtypes, backward only for single-output functions.
# 2: per-input dtypes and value ranges, backward for tuple-returning functions. A build is
# written as format 1 unless it needs 2, so older nkikit keeps loading what it can run and
# says "upgrade nkikit" (not an obscure manifest error) for what it cannot.
BUILD_FORMAT = 2
READABLE_FORMATS = (1, 2)


def build_format(manifest: Manifest) -> int:
    """The oldest build format that can carry `manifest`."""
    needs_2 = any(
        f.input_dtypes or f.ranges or (f.backward is not None and f.returns_tuple)
        for f in manifest.functions.values()
    )
    return 2 if needs_2 else 1


Spec = tuple[tuple[int, ...], str]  # (shape, dtype name) of one array


_DTYPE_NAMES: dict[object, str] = {}


def dtype_name(dtype: object) -> str:
    """The nkikit name of a numpy dtype (ml_dtypes' bfloat16 included): 'float32', 'bfloat16'..."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:  # np.dtype(...).name costs microseconds (ml_dtypes): remember it
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name  # type: ignore[call-overload]
    return name


_INTS = (int, np.integer, np.bool_)  # bool is an int, for torch's schema too
_REALS = (*_INTS, float, np.floating)


def attr_type_name(default: object) -> str:
    """The op schema's type of an attr with this default: bool, int, float, str, int[], float[]."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "str"
    if isinstance(default, list | tuple):
        return "float[]" if any(isinstance(x, float) for x in default) else "int[]"
    return type(default).__name__


def _accepts(default: object, v: object) -> bool:
    """Whether the op schema (torch's rules for its types) takes `v` for an attr with `default`."""
    kind = attr_type_name(default)
    if kind == "bool":
        return isinstance(v, _INTS)
    if kind == "int":
        return isinstance(v, _INTS) and _INT64[0] <= v <= _INT64[1]
    if kind == "float":
        return isinstance(v, _REALS)
    if kind == "str":
        return isinstance(v, str)
    if kind == "int[]":
        return isinstance(v, list | tuple) and all(_accepts(0, x) for x in v)
    if kind == "float[]":
        return isinstance(v, list | tuple) and all(isinstance(x, _REALS) for x in v)
    return True


_INT64 = (-(2**63), 2**63 - 1)  # an op schema's int is a 64-bit integer


class KernelFunction:
    """One function of a kernel build, callable on numpy arrays or torch tensors.

    `f(*inputs, **attrs)`: inputs positionally (or by name), attrs by name or after the inputs.
    With numpy arrays the entry runs directly on the simulator; with torch tensors the call goes
    through the torch op (`f.op`), registered on first use, so autograd and torch.compile see it.

    Raises KernelCallError for a wrong number of arguments or an unsupported dtype or device;
    the kernel's own errors (e.g. an NkiError for a shape it cannot tile) propagate unchanged.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        entry: Callable[..., Any],
        *,
        namespace: str,
        reference: Callable[..., Any] | None = None,
        backward: Callable[..., Any] | None = None,
    ):
        self.spec = spec
        self.name = spec.name
        self.entry = entry
        self.reference = reference
        self.backward = backward
        self.namespace = namespace
        self._nin = len(spec.inputs)
        self._attr_names = tuple(spec.attrs)
        self._attr_defaults = tuple(spec.attrs.values())
        self._binding: Any = None
        self._bind_lock = threading.Lock()
        self._spec_cache: dict[tuple, tuple[Spec, ...]] = {}
        params = [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in spec.inputs
        ]
        params += [
            inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=v)
            for k, v in spec.attrs.items()
        ]
        self.__signature__ = inspect.Signature(params)
        self.__name__ = self.__qualname__ = spec.name
        own = "".join(
            f"; {n}: {', '.join(d)}" for n, d in spec.input_dtypes.items() if n in spec.inputs
        )
        self.__doc__ = (
            f"{spec.signature}\n\nNKI kernel run on the nkikit simulator. Inputs: numpy arrays or "
            f"CPU torch tensors of dtype {', '.join(spec.dtypes)}{own}."
        )

    def __repr__(self) -> str:
        return f"<kernel function {self.namespace}.{self.spec.signature}>"

    # -- calling -------------------------------------------------------------------------------

    def normalize(self, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
        """(inputs..., attrs...) positionally, defaults filled. Raises KernelCallError."""
        if not kwargs and len(args) == self._nin:
            return args + self._attr_defaults
        try:
            bound = self.__signature__.bind(*args, **kwargs)
        except TypeError as e:
            raise KernelCallError(f"{self.spec.signature}: {e}") from None
        bound.apply_defaults()
        return tuple(bound.arguments.values())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        full = self.normalize(args, kwargs)
        for a in full[: self._nin]:
            if is_torch(a):
                return self.torch.call(full)
        return self.call_numpy(full)

    def attrs_accepted(self, attrs: Sequence[Any]) -> bool:
        """True when every attr has the type of its default, as the op schema types it
        (`float` takes any real number, `int` any integer, `float[]` a list or tuple of them)."""
        return all(_accepts(d, v) for d, v in zip(self._attr_defaults, attrs))

    def check_attr_ranges(self, attrs: Sequence[Any]) -> None:
        """Raises KernelCallError naming the first integer attr (or item of one) that a 64-bit
        integer cannot hold, which the op schema's ``int`` is."""
        for name, default, v in zip(self._attr_names, self._attr_defaults, attrs):
            if attr_type_name(default) not in ("int", "int[]"):
                continue  # a float takes any integer (as a double)
            items = v if isinstance(v, list | tuple) else (v,)
            for x in items:
                if isinstance(x, _INTS) and not _INT64[0] <= x <= _INT64[1]:
                    raise KernelCallError(
                        f"{self.name}(): argument {name!r} holds {x}, outside the 64-bit "
                        "integers an op's int takes"
                    )

    def check_attrs(self, attrs: Sequence[Any]) -> None:
        """Raises KernelCallError naming the first attr whose type the schema does not take."""
        self.check_attr_ranges(attrs)
        for name, default, v in zip(self._attr_names, self._attr_defaults, attrs):
            if not _accepts(default, v):
                text = repr(v)
                text = text if len(text) <= 60 else text[:57] + "..."
                raise KernelCallError(
                    f"{self.name}(): argument {name!r} must be {attr_type_name(default)} (the "
                    f"type of its default, {default!r}), got {type(v).__name__} {text}"
                )

    def call_numpy(self, full: Sequence[Any]) -> Any:
        """Run the entry on numpy arrays: `full` = inputs then attrs, as from `normalize`."""
        self.check_attrs(full[self._nin :])
        arrays = [np.asarray(a) for a in full[: self._nin]]
        for name, a in zip(self.spec.inputs, arrays):
            self.check_dtype(name, dtype_name(a.dtype))
        attrs = dict(zip(self._attr_names, full[self._nin :]))
        return self.entry(*arrays, **attrs)

    def check_dtype(self, input_name: str, dtype: str) -> None:
        """Raises KernelCallError if `dtype` is not one the manifest declares for the input."""
        accepted = self.spec.accepted_dtypes(input_name)
        if dtype not in accepted:
            first = accepted[0]
            raise KernelCallError(
                f"{self.name}(): input {input_name!r} has dtype {dtype}; this kernel supports "
                f"{', '.join(accepted)}. Cast the input first (e.g. {input_name}.to(torch.{first}) "
                f"or {input_name}.astype('{first}'))."
            )

    # -- shapes without data (fake tensors) ------------------------------------------------------

    def output_specs(self, inputs: tuple[Spec, ...], attrs: tuple) -> tuple[Spec, ...]:
        """(shape, dtype name) of each output for inputs of these shapes/dtypes, without data.

        An `@nki.jit` entry is traced (no simulation); any other entry is run once on zeros.
        Cached per (inputs, attrs). Kernel errors (e.g. a shape the kernel rejects) propagate.
        """
        key = (inputs, attrs)
        hit = self._spec_cache.get(key)
        if hit is not None:
            return hit
        kwargs = dict(zip(self._attr_names, attrs))
        entry = self.entry
        if hasattr(entry, "specialize") and hasattr(entry, "func"):  # an @nki.jit kernel
            from ..typing import TensorSpec

            specs = [TensorSpec(shape, np.dtype(_np_dtype(dt))) for shape, dt in inputs]
            kernel, _ = entry.specialize(*specs, **kwargs)
            order = _flatten_structure(kernel.return_structure)
            result = tuple(
                (tuple(kernel.outputs[i].shape), dtype_name(kernel.outputs[i].dtype)) for i in order
            )
        else:
            arrays = [np.zeros(shape, dtype=_np_dtype(dt)) for shape, dt in inputs]
            outs = entry(*arrays, **kwargs)
            outs = outs if isinstance(outs, tuple | list) else (outs,)
            result = tuple((tuple(np.shape(o)), dtype_name(np.asarray(o).dtype)) for o in outs)
        self._spec_cache[key] = result
        return result

    # -- torch -----------------------------------------------------------------------------------

    def learn_outputs(self) -> None:
        """Record in `spec` how many arrays the function returns and whether as a tuple.

        A build's manifest has this from publishing; one read from a kernel folder (e.g. bound
        with `bind_functions` for the folder's own torch tests) does not, and the torch op's
        schema needs it. An `@nki.jit` entry is traced on the example shapes; any other entry
        runs once on the example shapes, on zeros (or the low end of a declared range).
        """
        spec = self.spec
        if spec.outputs is not None:
            return
        kwargs = dict(spec.attrs)
        shapes = {n: tuple(spec.example[n]) for n in spec.inputs}
        entry = self.entry
        if hasattr(entry, "specialize") and hasattr(entry, "func"):  # an @nki.jit kernel
            from ..typing import TensorSpec

            specs = [TensorSpec(shapes[n], _np_dtype(spec.input_dtype(n))) for n in spec.inputs]
            kernel, _ = entry.specialize(*specs, **kwargs)
            structure = kernel.return_structure
            count, as_tuple = (
                len(_flatten_structure(structure)),
                isinstance(structure, tuple | list),
            )
        else:
            arrays = []
            for n in spec.inputs:
                a = np.zeros(shapes[n], dtype=_np_dtype(spec.input_dtype(n)))
                bounds = spec.input_range(n, shapes)
                if bounds is not None:
                    a[...] = bounds[0]
                arrays.append(a)
            result = entry(*arrays, **kwargs)
            as_tuple = isinstance(result, tuple | list)
            count = len(result) if as_tuple else 1
        self.spec = replace(spec, outputs=count, returns_tuple=as_tuple)

    @property
    def torch(self) -> Any:
        """The torch binding (nkikit.torch.ops.TorchBinding), registered on first access."""
        if self._binding is None:
            with self._bind_lock:
                if self._binding is None:
                    from ..torch.ops import TorchBinding

                    self.learn_outputs()
                    self._binding = TorchBinding(self)
        return self._binding

    @property
    def op(self) -> Any:
        """The torch op `torch.ops.<namespace>.<name>.default` (registers it if needed)."""
        return self.torch.op

    def register_torch_op(self) -> None:
        """Register the torch op now (needs torch); later calls do nothing."""
        self.torch  # noqa: B018 - the property registers


def _np_dtype(name: str) -> np.dtype:
    return numpy_dtype(name)  # type: ignore[return-value]


def _flatten_structure(s: object) -> list[int]:
    if isinstance(s, int):
        return [s]
    if isinstance(s, tuple | list):
        return [i for x in s for i in _flatten_structure(x)]
    return []


@dataclass
class Build:
    """A bound build: its manifest, id (= module name = torch op namespace) and functions."""

    id: str
    manifest: Manifest
    functions: dict[str, KernelFunction]
    root: Path

    def register_torch_ops(self) -> None:
        """Register every function's torch op now (needs torch)."""
        for f in self.functions.values():
            f.register_torch_op()


def read_build_file(root: Path) -> dict[str, Any]:
    """The parsed `kernel.json` of a build folder. Raises RegistryError if absent or malformed."""
    path = root / BUILD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"{root} is not an nkikit build: it has no {BUILD_FILE}") from None
    except ValueError as e:
        raise RegistryError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") not in READABLE_FORMATS:
        raise RegistryError(
            f"{path}: unsupported build format {data.get('format') if isinstance(data, dict) else data!r}; "
            "upgrade nkikit"
        )
    return data


def bind_functions(package: str, manifest: Manifest, namespace: str) -> dict[str, KernelFunction]:
    """Import each function's entry/reference/backward from `package`'s modules and wrap them."""

    def resolve(sym: Symbol | None) -> Callable[..., Any] | None:
        if sym is None:
            return None
        module = importlib.import_module(f"{package}.{sym.module}")
        try:
            return getattr(module, sym.attr)
        except AttributeError:
            raise RegistryError(
                f"{package}.{sym.module} has no {sym.attr!r} (named in kernel.json)"
            ) from None

    functions = {}
    for name, spec in manifest.functions.items():
        entry = resolve(spec.entry)
        assert entry is not None
        functions[name] = KernelFunction(
            spec,
            entry,
            namespace=namespace,
            reference=resolve(spec.reference),
            backward=resolve(spec.backward),
        )
    return functions


def bind_build(package: str, init_file: str) -> Build:
    """Bind the build whose `__init__.py` is `init_file`, imported as package `package`.

    Registers the torch ops right away when torch is already imported (so `torch.ops.<id>` is
    there for code that expects it, as HF kernels does); otherwise on first torch use.
    Raises RegistryError for a malformed build.
    """
    # not resolve(): in the HF cache files are symlinks into blobs/, the package is the folder
    root = Path(init_file).absolute().parent
    data = read_build_file(root)
    manifest = Manifest.from_dict(data["manifest"], where=str(root / BUILD_FILE))
    build = Build(data["id"], manifest, bind_functions(package, manifest, data["id"]), root)
    if "torch" in sys.modules:
        build.register_torch_ops()
    return build
