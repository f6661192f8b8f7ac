"""The options every ``nkikit`` subcommand spells the same way, and how their values are read.

- a kernel: ``FILE.py::KERNEL`` or ``MODULE:KERNEL`` (positional ``KERNEL``);
- its arguments: ``--args 'x=128x64:bfloat16,eps=1e-6'`` (a tensor is ``SHAPE[:DTYPE]``, with
  the dims joined by ``x``; anything else is a Python literal, or a string; an item without a
  name is a positional argument);
- an SPMD launch: ``--grid 2x4``;
- a NeuronCore generation: ``--target trn2``;
- where results go: ``-o/--out``;
- a Hub: ``--endpoint URL`` and ``--token TOKEN``.

A value that cannot be read raises :class:`UsageError`, which the CLI prints as one line and
exits with 2, like argparse's own usage errors.
"""

from __future__ import annotations

import argparse
import ast
import errno
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

KERNEL_HELP = "the kernel: FILE.py::KERNEL or MODULE:KERNEL"
ARGS_HELP = (
    "the kernel's arguments, e.g. 'x=128x64:bfloat16,eps=1e-6' (a tensor is SHAPE[:DTYPE], "
    "dims joined by x, default dtype float32; other values are Python literals; an item "
    "without NAME= is positional)"
)
GRID_HELP = "SPMD launch grid, e.g. 2x4 (default: no grid)"
TARGET_HELP = (
    "trn1, trn2 or trn3 (default: $NEURON_PLATFORM_TARGET_OVERRIDE, else trn2 for a Beta-1 "
    "kernel and trn3 for an NKI 0.x one)"
)

_TENSOR = re.compile(r"^(\d+(?:x\d+)*)(?::([A-Za-z0-9_]+))?$")
# sizes joined by x: int() alone would also take "+2", " 2" and "1_0" (read as 10)
_SIZES = re.compile(r"\d+(?:x\d+)*")


class UsageError(Exception):
    """A command line that cannot be carried out as written (exit code 2)."""


def add_kernel(p: argparse.ArgumentParser) -> None:
    p.add_argument("kernel", metavar="KERNEL", help=KERNEL_HELP)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--args", default="", metavar="ARGS", help=ARGS_HELP)


def add_grid(p: argparse.ArgumentParser) -> None:
    # None when not given, so an explicit `--grid ''` is an error and not "no grid"
    p.add_argument("--grid", default=None, metavar="GRID", help=GRID_HELP)


def add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, metavar="TARGET", help=TARGET_HELP)


def add_out(p: argparse.ArgumentParser, what: str, default: str | None = None) -> None:
    p.add_argument("-o", "--out", type=path_arg, default=default, metavar="PATH", help=what)


def add_hub(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint",
        type=nonempty_arg,
        default=None,
        help="Hub URL (default: HF_ENDPOINT or huggingface.co)",
    )
    p.add_argument(
        "--token",
        type=nonempty_arg,
        default=None,
        help="Hub token (default: HF_TOKEN / the saved login)",
    )


def path_arg(text: str) -> str:
    """argparse ``type`` of a path option: ``''`` (an unset shell variable, say) is refused,
    since ``Path('')`` is the current folder and the command would write there silently."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def nonempty_arg(text: str) -> str:
    """argparse ``type`` of an option whose empty value would silently mean "not given"."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty string")
    return text


# what an OSError's errno means for a path the user named (strerror is C's wording)
_OS_REASONS = {
    errno.ENOTDIR: "a part of it is a file, not a folder",
    errno.EEXIST: "it exists and is not a folder",
    errno.EISDIR: "it is a folder, not a file",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ENOENT: "no such file or folder",
}


def describe_os_error(e: OSError) -> str:
    """``PATH: REASON`` for an OSError about a path, e.g. ``out/x: permission denied``."""
    reason = _OS_REASONS.get(e.errno or 0) or (e.strerror or str(e)).lower()
    return f"{e.filename}: {reason}" if e.filename is not None else reason


def output_folder(path: str, option: str = "-o/--out") -> Path:
    """Check that the folder ``path`` exists or can be created, and can be written in; raise
    a UsageError naming ``option`` if not. Called before any work (a profile can take minutes)
    and creates nothing (the work may still fail)."""
    _check_folder(Path(path), path, option)
    return Path(path)


def output_file(path: str, option: str) -> Path:
    """Like :func:`output_folder`, for the file ``path`` (the writer creates its folder)."""
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"{option}: {path} is a folder, not a file")
    _check_folder(file.parent, path, option)
    if file.exists() and not os.access(file, os.W_OK):
        raise UsageError(f"{option}: {path}: permission denied")
    return file


def _check_folder(folder: Path, named: str, option: str) -> None:
    """The nearest existing one of ``folder`` and its parents must be a writable folder."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    # the path itself, or the part of it in the way (named: what the user typed)
    where = named if existing == Path(named).absolute() else f"{named}: {existing}"
    if not existing.is_dir():
        raise UsageError(f"{option}: {where} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: {where}: cannot write in this folder (permission denied)")


def load_kernel(target: str) -> Any:
    """``FILE.py::KERNEL`` or ``MODULE:KERNEL`` -> the object it names. Raises UsageError.

    Errors raised by the user's module while it is imported propagate (they are the user's)."""
    if "::" in target:
        path, name = target.split("::", 1)
        file = Path(path)
        if not file.is_file():
            raise UsageError(f"{target}: no such file {path!r}")
        spec = importlib.util.spec_from_file_location(file.stem, file)
        if spec is None or spec.loader is None:
            raise UsageError(f"{target}: cannot load {path!r} as Python")
        module = importlib.util.module_from_spec(spec)
        folder = str(file.resolve().parent)
        if folder not in sys.path:  # its own imports of sibling modules
            sys.path.insert(0, folder)
        spec.loader.exec_module(module)
    elif ":" in target:
        mod, name = target.split(":", 1)
        if not mod.strip():
            raise UsageError(f"name a kernel as FILE.py::KERNEL or MODULE:KERNEL, got {target!r}")
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name is not None and mod.startswith(e.name):
                raise UsageError(f"{target}: no module named {e.name!r}") from None
            raise
    else:
        raise UsageError(f"name a kernel as FILE.py::KERNEL or MODULE:KERNEL, got {target!r}")
    try:
        return getattr(module, name)
    except AttributeError:
        raise UsageError(f"{target}: {module.__name__} has no {name!r}") from None


def parse_args_spec(text: str) -> dict[str, Any]:
    """``'a=4096x4096:bfloat16,eps=1e-6'`` -> {"a": TensorSpec, "eps": 1e-6}; an item without
    ``NAME=`` is positional, keyed by its position (an int). Raises UsageError."""
    out: dict[Any, Any] = {}
    position = 0
    for item in _split(text):
        name, sep, value = item.partition("=")
        if not sep:
            name, value = position, item  # type: ignore[assignment]
            position += 1
        elif not name.strip() or not value.strip():
            raise UsageError(f"--args: bad item {item!r}; use NAME=SHAPE:DTYPE or NAME=VALUE")
        key = name.strip() if isinstance(name, str) else name
        if key in out:
            raise UsageError(f"--args: {key!r} is given twice")
        out[key] = _value(value.strip(), item)
    return out


def split_args(spec: dict[Any, Any]) -> tuple[list[Any], dict[str, Any]]:
    """:func:`parse_args_spec`'s result as (positional, keyword) arguments."""
    positional = [v for k, v in sorted((k, v) for k, v in spec.items() if isinstance(k, int))]
    return positional, {k: v for k, v in spec.items() if isinstance(k, str)}


def _split(text: str) -> list[str]:
    """Split on commas outside brackets (a literal like ``(1, 2)`` is one value)."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    if len(items) > 1 and any(not i.strip() for i in items):  # a,,b or a trailing comma
        raise UsageError(f"--args: an empty item in {text!r}")
    return [i.strip() for i in items if i.strip()]


def _value(value: str, item: str) -> Any:
    from .. import dtypes
    from ..typing import TensorSpec

    m = _TENSOR.match(value)
    if m and ("x" in value or ":" in value):
        dims = tuple(int(d) for d in m.group(1).split("x"))
        try:
            dt = dtypes.as_dtype(m.group(2) or "float32")
        except TypeError as e:
            raise UsageError(f"--args: {item!r}: {e}") from None
        return TensorSpec(dims, dt)
    if (":" in value and re.match(r"^[\dxX*]+:", value)) or re.fullmatch(
        r"-?\d+([xX*]-?\d*)+", value
    ):  # a shape gone wrong (4096x, -1x4, 4x4x, 128X64, 128*64), not a string the kernel takes
        raise UsageError(f"--args: bad tensor {item!r}; use SHAPE:DTYPE, e.g. 128x512:bfloat16")
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_grid(text: str | None) -> tuple[int, ...]:
    """``'2x4'`` -> (2, 4); None (no ``--grid``) -> (). Raises UsageError."""
    if text is None:
        return ()
    if not _SIZES.fullmatch(text):
        raise UsageError(f"--grid: expected sizes joined by x, e.g. 2x4, got {text!r}")
    grid = tuple(int(g) for g in text.split("x"))
    if any(g < 1 for g in grid):
        raise UsageError(f"--grid: every size must be at least 1, got {text!r}")
    return grid


def parse_target(text: str | None) -> Any:
    """``--target`` -> its Target; None when it is not given (each kernel is then built for
    its own default: ``NEURON_PLATFORM_TARGET_OVERRIDE``, else its dialect's), after checking
    that variable.  Raises UsageError."""
    from ..targets import default_target_name, get_target

    try:
        if text is None:
            default_target_name()  # a bad NEURON_PLATFORM_TARGET_OVERRIDE, before any work
            return None
        return get_target(text)
    except (KeyError, ValueError) as e:
        raise UsageError(f"--target: {e.args[0] if e.args else e}") from None


def kernel_and_args(ns: argparse.Namespace) -> tuple[Any, list[Any], dict[str, Any]]:
    """The jitted kernel (launched on ``--grid``) and its ``--args``, checked against its
    signature, so a misspelled argument is a usage error and not a trace."""
    import inspect

    from ..compiler.api import _jit

    obj = load_kernel(ns.kernel)
    try:
        kernel = _jit(obj)
    except TypeError as e:
        raise UsageError(f"{ns.kernel}: {e}") from None
    grid = parse_grid(ns.grid)
    if grid:
        kernel = kernel[grid]
    positional, named = split_args(parse_args_spec(ns.args))
    try:
        inspect.signature(kernel.func).bind(*positional, **named)
    except TypeError as e:
        raise UsageError(f"--args: {kernel.func.__name__}(): {e}") from None
    return kernel, positional, named


def _check_fits(shape: tuple[int, ...]) -> None:
    """Refuse a random input larger than this machine's memory: numpy's "array is too big"
    (shown at numpy's own line) or, worse, the OOM killer part way through filling it."""
    import math

    need = math.prod(shape) * 8  # the float64 draw (float32 and the dtype's copy come after)
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): numpy decides
        return
    if need > have:
        dims = "x".join(map(str, shape))
        raise UsageError(
            f"--args: a {dims} input needs {need / 2**30:,.1f} GiB to fill with random values; "
            f"this machine has {have / 2**30:,.1f} GiB"
        )


def materialize(values: list[Any], seed: int) -> list[Any]:
    """Random arrays for the tensor specs in ``values`` (normal, cast to the dtype; integers
    scaled by 10, unsigned ones of its magnitude; booleans a fair coin each), the rest as
    given."""
    import numpy as np

    from .. import dtypes
    from ..typing import TensorSpec

    rng = np.random.default_rng(seed)
    out = []
    for v in values:
        if isinstance(v, TensorSpec):
            _check_fits(v.shape)
            x = rng.standard_normal(v.shape).astype(np.float32)
            if v.dtype == np.bool_:  # (x * 10).astype(bool) is True almost everywhere
                v = x > 0
            elif np.issubdtype(v.dtype, np.unsignedinteger):  # -3 would wrap to 4294967293
                v = (np.abs(x) * 10).astype(v.dtype)
            else:
                v = (
                    dtypes.cast(x, v.dtype)
                    if dtypes.is_float(v.dtype)
                    else (x * 10).astype(v.dtype)
                )
        out.append(v)
    return out
