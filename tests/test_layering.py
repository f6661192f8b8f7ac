"""The package's layers: no module imports from a layer above its own, and every module imports
on its own (an import cycle would make some module fail when it is the first one imported)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

# found without importing it: a broken import fails the tests below, not their collection
ROOT = Path(importlib.util.find_spec("nkikit").submodule_search_locations[0])

# The layer of every part of the package, lowest first, in the order a kernel's data flows
# (DESIGN.md): a module may import from its own layer and the ones below, never from above, so
# each layer can be read, tested and replaced with only the layers under it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the vocabulary every layer speaks: named errors, dtypes, the arrays a kernel is called
    # with, and the hardware numbers a profile carries
    (
        "vocabulary",
        (
            "nkikit.errors",
            "nkikit.dtypes",
            "nkikit.arrays",
            "nkikit.target_info",
            "nkikit.collector",
            "nkikit.memory",
        ),
    ),
    # the IR (data model, primitive records, verifier) and the targets it is verified against
    ("ir", ("nkikit.ir", "nkikit.targets")),
    # what builds IR and what runs it; neither knows a dialect
    ("trace/sim", ("nkikit.trace", "nkikit.sim")),
    # the two dialects' front ends: argument parsing down to the trace's emit layer
    ("dialects", ("nkikit.language", "nkikit.isa", "nkikit.typing", "nkikit.nki")),
    # what happens to a traced kernel after it is verified: compile, model, profile
    ("compiler/profiler", ("nkikit.compiler", "nkikit.profiler")),
    # the public top level and everything built on the core: registry, torch, testing helpers,
    # autotuning and sweeps (tune),
    # the CLI and demo, the Hub server (hub/) and the kernel library (kernels/)
    (
        "above the core",
        (
            "nkikit",
            "nkikit.cli",
            "nkikit.kernels",
            "nkikit.registry",
            "nkikit.torch",
            "nkikit.testing",
            "nkikit.tune",
            "nkikit.demo",
            "nkikit.hub",
            "nkikit.library",
        ),
    ),
)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a module of the package (its longest listed prefix)."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _under(module, p) and len(p) > best_len:
                # the bare package name covers only itself, not its subpackages
                if p == "nkikit" and module != "nkikit":
                    continue
                best, best_len = i, len(p)
    return best


def package_modules() -> dict[str, Path]:
    """Every module of the nkikit package (the folder, not hub/ or kernels/), by name."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = package_modules()


def imports_of(module: str, path: Path) -> list[tuple[int, str, bool]]:
    """``(line, module, at_import)`` for every import of an nkikit module anywhere in the file
    (also inside functions and ``if TYPE_CHECKING:``); ``at_import`` is False inside a function
    body.  ``from pkg import name`` counts as importing ``pkg.name`` when that is a module of
    the package, else ``pkg``."""
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            at_import = False
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "nkikit":
                    found.append((node.lineno, a.name, at_import))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                pkg = ".".join(base + ([node.module] if node.module else []))
            else:
                pkg = node.module or ""
            if pkg.split(".")[0] == "nkikit":
                for a in node.names:
                    sub = f"{pkg}.{a.name}"
                    found.append((node.lineno, sub if sub in MODULES else pkg, at_import))
        for child in ast.iter_child_nodes(node):
            visit(child, at_import)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return found


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, f"add these to LAYERS in {__file__}: {missing}"


def test_no_module_imports_from_a_higher_layer():
    upward = []
    for module, path in MODULES.items():
        own = layer_of(module)
        for line, target, _ in imports_of(module, path):
            theirs = layer_of(target)
            if own is not None and theirs is not None and theirs > own:
                upward.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {module} ({LAYERS[own][0]}) "
                    f"imports {target} ({LAYERS[theirs][0]})"
                )
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
    """The scan itself: a lazy import inside a function counts, and ``from .. import x``
    resolves to the module ``x`` it names."""
    path = tmp_path / "fake.py"
    path.write_text("from .. import dtypes\n\ndef f():\n    from ..compiler import api\n")
    assert imports_of("nkikit.trace.fake", path) == [
        (1, "nkikit.dtypes", True),
        (4, "nkikit.compiler.api", False),
    ]


# Each module is imported first, with nothing of nkikit loaded yet, as in a fresh interpreter.
# The package's own __init__ (which imports most of nkikit, in one fixed order) is skipped unless
# the module imports the top-level package itself: otherwise it would always run first and hide a
# cycle that shows when a lower module is the entry point.  Third-party modules (numpy, torch)
# stay loaded between modules: only nkikit's own import order is under test.
_IMPORT_EACH = r"""
import importlib, sys, traceback, types

root, names = sys.argv[1], sys.argv[2:]
failed = []
for name in names:
    for m in [m for m in sys.modules if m == "nkikit" or m.startswith("nkikit.")]:
        del sys.modules[m]
    importlib.invalidate_caches()
    if name.endswith("+"):  # it imports the top-level package: load that for real
        name = name[:-1]
        importlib.import_module("nkikit")
    else:
        stub = types.ModuleType("nkikit")
        stub.__path__ = [root]
        sys.modules["nkikit"] = stub
    try:
        importlib.import_module(name)
    except BaseException:
        failed.append(name + ":\n" + traceback.format_exc())
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""

_PROCESSES = 2  # run side by side; each imports its share of the modules one after another
_TORCH = "nkikit.torch"  # its modules go to one process, so that only one pays for torch


def _entry(module: str) -> str:
    """The module's name for the import script: with ``+`` when importing it imports the
    top-level package itself (``import nkikit as nki`` at module level)."""
    top = any(t == "nkikit" and now for _, t, now in imports_of(module, MODULES[module]))
    return module + "+" if top or module == "nkikit" else module


def test_each_module_imports_alone():
    names = [_entry(m) for m in MODULES]
    torch = [n for n in names if _under(n.rstrip("+"), _TORCH)]
    rest = [n for n in names if n not in torch]
    shares = [rest[k::_PROCESSES] for k in range(_PROCESSES)]
    shares[-1] = torch + shares[-1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _IMPORT_EACH, str(ROOT), *share],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT.parent,
        )
        for share in shares
    ]
    failures = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failures.append(out)
    assert not failures, "\n".join(failures)


def test_the_core_does_not_import_torch():
    """torch is optional: importing both dialects loads neither torch nor nkikit's torch layer
    (``@nki.jit`` converts a tensor through ``nkikit.arrays``, which imports torch on use)."""
    code = (
        "import sys, nkikit, nkikit.nki, nkikit.compiler; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('nkikit.torch')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, check=True
    )
    assert out.stdout.strip() == "[]"
