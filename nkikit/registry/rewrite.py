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
    return _rewrite(source, filename, siblings, kernel, nki_target=None)


def neuron_imports(
    source: str, filename: str, siblings: Collection[str], kernel: str, target: str = "neuronxcc.nki"
) -> str:
    """`relative_imports`, plus nkikit's NKI modules mapped onto `target` (`neuronxcc.nki` for the
    Neuron SDK's NKI Beta-1, or `nki`). Raises BuildError for an nkikit import with no NKI
    counterpart (e.g. `nkikit.testing`)."""
    return _rewrite(source, filename, siblings, kernel, nki_target=target)


def _rewrite(
    source: str, filename: str, siblings: Collection[str], kernel: str, nki_target: str | None
) -> str:
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise BuildError(f"{filename}:{e.lineno}: cannot parse: {e.msg}") from None
    own_pkg = f"{LIBRARY_PACKAGE}.{kernel}"
    edits: list[tuple[ast.stmt, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            new = _rewrite_import(node, filename, siblings, own_pkg, nki_target)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            new = _rewrite_from(node, filename, siblings, own_pkg, nki_target)
        else:
            continue
        if new is not None:
            edits.append((node, new))
    return _apply(source, edits)


def _where(filename: str, node: ast.stmt) -> str:
    return f"{filename}:{node.lineno}"


def _relative_name(module: str, siblings: Collection[str], own_pkg: str) -> str | None:
    """The module's name relative to the kernel folder, or None if it is not one of its modules."""
    if module == own_pkg:
        return ""
    if module.startswith(own_pkg + "."):
        return module[len(own_pkg) + 1 :]
    if module in siblings or module.split(".")[0] in {s.split(".")[0] for s in siblings}:
        return module
    return None


def _nki_name(module: str, target: str, filename: str, node: ast.stmt) -> str | None:
    """`nkikit[.language|.isa|.typing]` -> the same under `target`; None if not an nkikit import."""
    if module != "nkikit" and not module.startswith("nkikit."):
        return None
    rest = module[len("nkikit") :].lstrip(".")
    if rest and rest.split(".")[0] not in NKI_MODULES:
        raise BuildError(
            f"{_where(filename, node)}: imports {module}, which has no NKI counterpart; a kernel "
            f"published for Neuron may only use nkikit.{{{', '.join(NKI_MODULES)}}} and nkikit itself"
        )
    return f"{target}.{rest}" if rest else target


def _check_library(module: str, filename: str, node: ast.stmt, own_pkg: str) -> None:
    if (module == LIBRARY_PACKAGE or module.startswith(LIBRARY_PACKAGE + ".")) and not (
        module == own_pkg or module.startswith(own_pkg + ".")
    ):
        raise BuildError(
            f"{_where(filename, node)}: imports {module}: a published kernel must be self-contained "
            "(copy what it needs into its folder)"
        )


def _rewrite_import(
    node: ast.Import, filename: str, siblings: Collection[str], own_pkg: str, nki_target: str | None
) -> str | None:
    parts: list[str] = []
    changed = False
    for alias in node.names:
        _check_library(alias.name, filename, node, own_pkg)
        rel = _relative_name(alias.name, siblings, own_pkg)
        if rel is not None:
            if rel == "":
                raise BuildError(f"{_where(filename, node)}: a kernel module cannot import its own package")
            head, _, last = rel.rpartition(".")
            bound = alias.asname or rel.split(".")[0]
            if alias.asname is None and "." in rel:
                # `import a.b` binds `a`: import the top module relatively, submodule with it.
                parts.append(f"from . import {rel.split('.')[0]}")
                parts.append(f"from .{head} import {last} as _{last}_submodule")
            else:
                parts.append(f"from .{head} import {last} as {bound}" if head else f"from . import {last}" + (f" as {bound}" if bound != last else ""))
            changed = True
            continue
        if nki_target is not None:
            new = _nki_name(alias.name, nki_target, filename, node)
            if new is not None:
                if alias.asname:
                    parts.append(f"import {new} as {alias.asname}")
                elif alias.name == "nkikit":
                    parts.append(f"import {new} as nkikit")
                else:  # `import nkikit.language` binds `nkikit`, with .language loaded
                    parts.append(f"import {new}")
                    parts.append(f"import {nki_target} as nkikit")
                changed = True
                continue
        parts.append(f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""))
    return "; ".join(parts) if changed else None


def _rewrite_from(
    node: ast.ImportFrom, filename: str, siblings: Collection[str], own_pkg: str, nki_target: str | None
) -> str | None:
    module = node.module or ""
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    _check_library(module, filename, node, own_pkg)
    if module == LIBRARY_PACKAGE:
        raise BuildError(f"{_where(filename, node)}: imports from {module}: a published kernel must be self-contained")
    rel = _relative_name(module, siblings, own_pkg)
    if rel is not None:
        return f"from .{rel} import ({names})" if rel else f"from . import ({names})"
    if nki_target is not None:
        new = _nki_name(module, nki_target, filename, node)
        if new is not None:
            return f"from {new} import ({names})"
    return None


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
