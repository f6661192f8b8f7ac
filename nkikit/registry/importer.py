"""Import a build folder as a package under a unique name, reading only verified sources.

A pulled build lives in the HF cache and is imported as `<build id>` (e.g.
`_rmsnorm_cpu_1a2b3c4`), so two versions of a kernel are two packages side by side. Every
module of such a package is loaded by `_VerifiedLoader`, which
  - reads the source, checks it against the digest from metadata.json *as it is read* (so a file
    swapped between the up-front check and the import is still caught), and
  - compiles from source, never from `__pycache__`: a planted or stale .pyc could otherwise run
    code that no digest covers.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Mapping
from pathlib import Path

from .digests import file_digest
from .errors import IntegrityError

_lock = threading.RLock()


class _VerifiedLoader(importlib.machinery.SourceFileLoader):
    """Source-only loader; checks the bytes against `digest` (base64) when one is given."""

    def __init__(self, fullname: str, path: str, digest: str | None, algorithm: str):
        super().__init__(fullname, path)
        self._digest = digest
        self._algorithm = algorithm

    def get_code(self, fullname: str) -> types.CodeType:
        path = self.get_filename(fullname)
        data = self.get_data(path)
        if self._digest is not None and file_digest(data, self._algorithm) != self._digest:
            raise IntegrityError(
                f"{path}: content does not match the digest in metadata.json (changed while "
                "loading); refusing to import it",
                path=path,
            )
        return compile(data, path, "exec", dont_inherit=True)


class _BuildFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of registered build packages (and nothing else)."""

    def __init__(self) -> None:
        # package name -> (root folder, {relative path: digest} or None, algorithm)
        self.packages: dict[str, tuple[Path, Mapping[str, str] | None, str]] = {}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib protocol
        top = fullname.split(".", 1)[0]
        entry = self.packages.get(top)
        if entry is None:
            return None
        root, digests, algorithm = entry
        rel_parts = fullname.split(".")[1:]
        base = root.joinpath(*rel_parts)
        for file, is_pkg in ((base / "__init__.py", True), (base.with_suffix(".py"), False)):
            if rel_parts == [] and not is_pkg:
                continue
            if file.is_file():
                rel = file.relative_to(root).as_posix()
                if digests is not None and rel not in digests:
                    raise IntegrityError(
                        f"{file}: not part of the published build (not in metadata.json); "
                        "refusing to import it",
                        path=str(file),
                    )
                loader = _VerifiedLoader(
                    fullname, str(file), None if digests is None else digests[rel], algorithm
                )
                return importlib.util.spec_from_file_location(
                    fullname,
                    file,
                    loader=loader,
                    submodule_search_locations=[str(file.parent)] if is_pkg else None,
                )
        if rel_parts == [] and digests is None:
            # A folder without __init__.py (a kernel folder probed at build time): an empty package.
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(root)]
            return spec
        return None


_finder = _BuildFinder()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def import_build(
    name: str,
    root: Path,
    *,
    digests: Mapping[str, str] | None,
    algorithm: str = "sha256",
    run_init: bool = True,
) -> types.ModuleType:
    """Import folder `root` as package `name` and return it.

    digests: {path relative to root: base64 digest}; every module loaded is checked against it
    (IntegrityError otherwise). None skips the checks (for a build being made, not a pulled one).
    run_init: False loads an empty package (no `__init__.py` executed), so single modules can be
    imported from it, as publishing does to probe a kernel's functions.

    Raises ValueError if `name` is already imported from a different folder.
    """
    with _lock:
        existing = _finder.packages.get(name)
        if existing is not None and existing[0] != root:
            raise ValueError(f"module {name!r} is already loaded from {existing[0]}")
        _install_finder()
        _finder.packages[name] = (root, digests, algorithm)
        if name in sys.modules:
            return sys.modules[name]
        if run_init:
            try:
                return importlib.import_module(name)
            except BaseException:
                forget(name)
                raise
        module = types.ModuleType(name)
        module.__path__ = [str(root)]
        module.__package__ = name
        sys.modules[name] = module
        return module


def forget(name: str) -> None:
    """Drop package `name` and its submodules from the import system (probe cleanup, failed loads)."""
    with _lock:
        _finder.packages.pop(name, None)
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


def loaded_root(name: str) -> Path | None:
    """The folder package `name` was imported from by `import_build`, if any."""
    entry = _finder.packages.get(name)
    return entry[0] if entry is not None and name in sys.modules else None
