"""Import rewriting for builds: kernel sources made portable without touching anything else.

A kernel folder is written to be run in place (its tests import it as a folder or as
`nkikit.library.<name>`). A build is imported from the HF cache under a unique module name, so
  - `relative_imports` turns imports of sibling modules into relative ones (`import reference`,
    `from nkikit.library.rmsnorm.reference import f` -> `from . import reference`,
    `from .reference import f`);
  - `neuron_imports` additionally points the NKI imports at the real NKI package
    (`import nkikit.language as nl` -> `import neuronxcc.nki.language as nl`).
Only import statements are rewritten, in place, so line numbers (and the error locations the
simulator and the Neuron compiler report) stay those of the author's file.
"""

from __future__ import annotations

import ast
from collections.abc import Collection

from .errors import BuildError

LIBRARY_PACKAGE = "nkikit.library"

#: nkikit modules that exist, under the same names, in the NKI package.
NKI_MODULES = ("language", "isa", "typing")


def relative_imports(source: str, filename: str, siblings: Collection[str], kernel: str) -> str:
    """Rewrite imports of the kernel folder's own modules (`siblings`, dotted names relative to
    the folder) to relative imports. `kernel` is the folder's Python name (for
    `nkikit.library.<kernel>` imports). Raises BuildError for an import of another library
    kernel, which a build cannot carry."""
    return _Rewriter(filename, siblings, kernel, None).run(source)


def neuron_imports(
    source: str,
    filename: str,
    siblings: Collection[str],
    kernel: str,
    target: str = "neuronxcc.nki",
) -> str:
    """`relative_imports`, plus nkikit's NKI modules mapped onto `target` (`neuronxcc.nki` for the
    Neuron SDK's NKI Beta-1, or `nki`) and nkikit's portable helpers (VENDORED) onto the copies
    the build carries. Raises BuildError for an nkikit import with no NKI counterpart (e.g.
    `nkikit.testing`)."""
    return _Rewriter(filename, siblings, kernel, target).run(source)


#: Pure-numpy nkikit modules a Neuron build carries a copy of: nkikit module -> build module.
VENDORED = {"dtypes": "_nkikit_dtypes"}


class _Rewriter:
    def __init__(
        self, filename: str, siblings: Collection[str], kernel: str, nki_target: str | None
    ):
        self.filename = filename
        self.siblings = set(siblings)
        self.tops = {s.split(".")[0] for s in siblings}
        self.own_pkg = f"{LIBRARY_PACKAGE}.{kernel}"
        self.nki = nki_target

    def run(self, source: str) -> str:
        try:
            tree = ast.parse(source, self.filename)
        except SyntaxError as e:
            raise BuildError(f"{self.filename}:{e.lineno}: cannot parse: {e.msg}") from None
        edits: list[tuple[ast.stmt, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                parts = [self._one_import(node, a) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = self._import_from(node)
            else:
                continue
            if any(p is not None for p in parts):
                if isinstance(node, ast.Import):  # untouched names keep their own statement
                    parts = [p or _import_text(a) for p, a in zip(parts, node.names)]
                edits.append((node, "; ".join(p for p in parts if p)))
        return _apply(source, edits)

    def where(self, node: ast.stmt) -> str:
        return f"{self.filename}:{node.lineno}"

    def relative(self, module: str) -> str | None:
        """The module's name relative to the kernel folder, or None if it is not one of its own."""
        if module == self.own_pkg:
            return ""
        if module.startswith(self.own_pkg + "."):
            return module[len(self.own_pkg) + 1 :]
        if module.split(".")[0] in self.tops:
            return module
        return None

    def check_library(self, module: str, node: ast.stmt) -> None:
        if (
            module == LIBRARY_PACKAGE or module.startswith(LIBRARY_PACKAGE + ".")
        ) and self.relative(module) is None:
            raise BuildError(
                f"{self.where(node)}: imports {module}: a published kernel must be self-contained "
                "(copy what it needs into its folder)"
            )

    def nkikit_module(self, module: str, node: ast.stmt) -> tuple[str, bool] | None:
        """(new module path, is relative) for an nkikit module in a Neuron build, None if `module`
        is not nkikit's. Raises BuildError for a module with no counterpart."""
        if self.nki is None or (module != "nkikit" and not module.startswith("nkikit.")):
            return None
        rest = module[len("nkikit") :].lstrip(".")
        head = rest.split(".")[0]
        if not rest:
            return self.nki, False
        if head in NKI_MODULES:
            return f"{self.nki}.{rest}", False
        if rest in VENDORED:
            return VENDORED[rest], True
        raise BuildError(
            f"{self.where(node)}: imports {module}, which has no NKI counterpart; a kernel published "
            f"for Neuron may only use nkikit itself, nkikit.{{{', '.join(NKI_MODULES)}}} and "
            f"nkikit.{{{', '.join(VENDORED)}}}"
        )

    def _one_import(self, node: ast.Import, alias: ast.alias) -> str | None:
        name, asname = alias.name, alias.asname
        self.check_library(name, node)
        rel = self.relative(name)
        if rel is not None:
            if rel == "":
                raise BuildError(
                    f"{self.where(node)}: a kernel module cannot import its own package"
                )
            if asname is None and "." in rel:
                raise BuildError(
                    f"{self.where(node)}: write `import {name} as <alias>` or `from ... import`: "
                    "a dotted import of a kernel's own module cannot be made relative"
                )
            head, _, last = rel.rpartition(".")
            bound = asname or last
            return f"from .{head} import {last}" + (f" as {bound}" if bound != last else "")
        target = self.nkikit_module(name, node)
        if target is None:
            return None
        new, is_rel = target
        if is_rel:
            if asname is None:
                raise BuildError(
                    f"{self.where(node)}: write `from nkikit import {name.split('.')[-1]}`"
                )
            return f"from . import {new} as {asname}"
        if asname:
            return f"import {new} as {asname}"
        if name == "nkikit":
            return f"import {new} as nkikit"
        # `import nkikit.language` binds `nkikit` with .language loaded
        return f"import {new}; import {self.nki} as nkikit"

    def _import_from(self, node: ast.ImportFrom) -> list[str | None]:
        module = node.module or ""
        names = [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
        self.check_library(module, node)
        rel = self.relative(module)
        if rel is not None:
            return [
                f"from .{rel} import ({', '.join(names)})"
                if rel
                else f"from . import ({', '.join(names)})"
            ]
        target = self.nkikit_module(module, node)
        if target is None:
            return [None]
        new, is_rel = target
        if is_rel:
            return [f"from .{new} import ({', '.join(names)})"]
        if module != "nkikit":
            return [f"from {new} import ({', '.join(names)})"]
        # `from nkikit import language as nl, dtypes`: NKI names and vendored helpers split up
        keep, out = [], []
        for a in node.names:
            if a.name in VENDORED:
                out.append(f"from . import {VENDORED[a.name]} as {a.asname or a.name}")
            else:
                if a.name in _NOT_NKI:
                    self.nkikit_module(f"nkikit.{a.name}", node)  # raises: not part of NKI
                keep.append(a.name + (f" as {a.asname}" if a.asname else ""))
        if keep:
            out.insert(0, f"from {new} import ({', '.join(keep)})")
        return ["; ".join(out)]


# nkikit submodules that are nkikit's own machinery, never part of NKI.
_NOT_NKI = {
    "registry",
    "testing",
    "sim",
    "trace",
    "ir",
    "errors",
    "compiler",
    "profiler",
    "torch",
    "kernels",
    "library",
    "hub",
    "cli",
}


def _import_text(alias: ast.alias) -> str:
    return f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")


def _apply(source: str, edits: list[tuple[ast.stmt, str]]) -> str:
    """Replace each node's source span with its new text (ast offsets are UTF-8 byte columns)."""
    if not edits:
        return source
    lines = source.encode("utf-8").splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    data = source.encode("utf-8")
    spans = []
    for node, text in edits:
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
        # Keep the statement's line count, so every later line keeps its number.
        extra = node.end_lineno - node.lineno  # type: ignore[operator]
        if extra:
            text = text[:-1] + "\n" * extra + ")" if text.endswith(")") else text + " \\\n" * extra
        spans.append((begin, end, text.encode("utf-8")))
    for begin, end, text in sorted(spans, reverse=True):
        data = data[:begin] + text + data[end:]
    return data.decode("utf-8")
