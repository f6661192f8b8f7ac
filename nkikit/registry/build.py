"""Turn a kernel folder into the HF-kernels repo layout, in a local folder, ready to commit.

    README.md                         the model card
    build/torch-cpu/                  a Python package: the kernel on the nkikit simulator
        __init__.py                   generated: binds the functions (numpy + torch ops)
        _ops.py                       generated: op namespace helpers (HF kernels convention)
        kernel.json                   the manifest, plus what the probe learnt and the build id
        kernel.py, reference.py, ...  the author's modules, sibling imports made relative
        <name>/__init__.py            compatibility entry for loaders of the older nested layout
        README.md, metadata.json
    build/torch-neuron/               the NKI source for real Trainium (imports -> neuronxcc.nki)
        __init__.py, kernel.py, ..., README.md, metadata.json

Every variant's `metadata.json` has the HF kernels fields (id, name, version, license, backend,
python-depends, digest of every other file); its `id` is unique per content and backend and is
both the module name a loader imports the package as and the torch op namespace.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .card import VariantRow, render_card
from .digests import METADATA_FILE, content_hash, digest_folder
from .manifest import MANIFEST_FILE, Manifest, load_manifest
from .names import build_id, python_name
from .probe import FunctionProbe, probe_build
from .rewrite import VENDORED, neuron_imports, relative_imports
from .runtime import BUILD_FILE, build_format
from .testrun import TestReport

NEURON_PYTHON_DEPENDS = ["nki"]  # the HF kernels allow-list name for the NKI package

# Never part of a build: the author's tests and test config, the folder's own __init__ (a build
# has a generated one), the manifest (kernel.json carries it), the README (the card embeds it).
_SKIP_TOP = {"__init__.py", "conftest.py", MANIFEST_FILE, "README.md"}


@dataclass
class VariantBuild:
    variant: str
    id: str
    dir: Path
    metadata: dict


@dataclass
class BuildResult:
    """A built repo layout under `root`, with what went into it."""

    root: Path
    manifest: Manifest
    variants: dict[str, VariantBuild]
    probes: dict[str, FunctionProbe]
    tests: TestReport | None
    source_hash: str = ""
    warnings: list[str] = field(default_factory=list)

    def files(self) -> dict[str, Path]:
        """Repo path -> local file, for every file of the layout."""
        out = {}
        for dirpath, _, names in os.walk(self.root):
            for n in names:
                p = Path(dirpath, n)
                out[p.relative_to(self.root).as_posix()] = p
        return dict(sorted(out.items()))


def _is_test_file(rel: Path) -> bool:
    name = rel.name
    return name.startswith("test_") or name.endswith("_test.py") or "tests" in rel.parts[:-1]


def collect_sources(folder: Path) -> dict[str, bytes]:
    """The files of a kernel folder that a build carries (rel POSIX path -> bytes)."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for n in sorted(names):
            path = Path(dirpath, n)
            rel = path.relative_to(folder)
            if n.startswith(".") or n.endswith((".pyc", ".pyo")) or _is_test_file(rel):
                continue
            if len(rel.parts) == 1 and n in _SKIP_TOP:
                continue
            out[rel.as_posix()] = path.read_bytes()
    return out


def _module_names(sources: dict[str, bytes]) -> set[str]:
    mods = set()
    for rel in sources:
        if rel.endswith(".py"):
            parts = rel[:-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts:
                mods.add(".".join(parts))
    return mods


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)


def _metadata(
    manifest: Manifest,
    bid: str,
    backend: str,
    python_depends: list[str],
    variant_dir: Path,
    source: str,
) -> dict:
    from .. import __version__

    return {
        "id": bid,
        "name": manifest.hub_name,
        "version": manifest.version,
        "license": manifest.license,
        "backend": {"type": backend},
        "python-depends": python_depends,
        "digest": {"algorithm": "sha256", "files": digest_folder(variant_dir)},
        # Our own section (HF kernels ignores unknown keys): what runs the build.
        "nkikit": {
            "requires": f"nkikit>={__version__}",
            "build-format": build_format(manifest),
            "source": source,
        },
    }


_INIT_CPU = '''"""{name} v{version} for torch-cpu: NKI kernels run on the nkikit simulator.

Generated by `nkikit publish`; every file here is covered by the digest in metadata.json.
Functions: {functions}.
"""

try:
    from nkikit.registry.runtime import bind_build as _bind_build
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "this kernel runs on the nkikit simulator: install nkikit (pip install nkikit)"
    ) from _e

_build = _bind_build(__name__, __file__)
{assignments}
__all__ = {all!r}
'''

_OPS = '''"""Op namespace of this build (HF kernels convention): ops live in torch.ops.{ns}."""

NAMESPACE = "{ns}"


def add_op_namespace_prefix(op_name: str) -> str:
    """'rmsnorm' -> '{ns}::rmsnorm'."""
    return f"{{NAMESPACE}}::{{op_name}}"


def __getattr__(name: str):
    if name == "ops":
        import torch

        return getattr(torch.ops, NAMESPACE)
    raise AttributeError(name)
'''

_COMPAT = '''"""Entry point for loaders of the older nested layout (build/<variant>/<name>/): the
package is the folder above; this re-exports it."""

import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path

_ID = "{ns}"
_pkg = _sys.modules.get(_ID)
if _pkg is None:
    _root = _Path(__file__).absolute().parent.parent  # not resolve(): cache files are symlinks
    _spec = _util.spec_from_file_location(
        _ID, _root / "__init__.py", submodule_search_locations=[str(_root)]
    )
    _pkg = _util.module_from_spec(_spec)
    _sys.modules[_ID] = _pkg
    _spec.loader.exec_module(_pkg)
globals().update({{_k: getattr(_pkg, _k) for _k in _pkg.__all__}})
__all__ = list(_pkg.__all__)
'''

_INIT_NEURON = '''"""{name} v{version} for Trainium: the NKI source, for the Neuron SDK.

Generated by `nkikit publish` from the kernel nkikit simulated and tested; imports point at
{target}. Functions: {functions}.
"""

{imports}

__all__ = {all!r}
'''


def build_kernel(
    folder: str | Path,
    out_dir: str | Path,
    repo_id: str,
    *,
    manifest: Manifest | None = None,
    tests: TestReport | None = None,
    neuron: bool = True,
    neuron_import: str = "neuronxcc.nki",
    profile: bool = True,
) -> BuildResult:
    """Build the repo layout of the kernel in `folder` into the empty folder `out_dir`.

    manifest: use this (e.g. with an overridden version) instead of reading kernel.toml.
    neuron: also build `torch-neuron`; neuron_import: 'neuronxcc.nki' or 'nki'.
    Raises ManifestError (bad kernel.toml), BuildError (an import a build cannot carry, an
    example that fails to run).
    """
    folder = Path(folder).resolve()
    out = Path(out_dir)
    manifest = manifest or load_manifest(folder)
    kname = python_name(manifest.name)
    sources = collect_sources(folder)
    modules = _module_names(sources)

    cpu_dir = out / "build" / "torch-cpu"
    cpu_sources: dict[str, bytes] = {}
    for rel, data in sources.items():
        if rel.endswith(".py"):
            text = relative_imports(data.decode("utf-8"), f"{folder.name}/{rel}", modules, kname)
            data = text.encode("utf-8")
        cpu_sources[rel] = data
        _write(cpu_dir / rel, data)

    probes = probe_build(cpu_dir, manifest, profile=profile)
    manifest = manifest.with_outputs({n: (p.outputs, p.returns_tuple) for n, p in probes.items()})

    manifest_json = json.dumps(manifest.to_dict(), sort_keys=True).encode()
    source = content_hash(
        {**cpu_sources, BUILD_FILE: manifest_json, "version": str(manifest.version).encode()}
    )
    variants: dict[str, VariantBuild] = {}

    cpu_id = build_id(
        manifest.name, "cpu", content_hash({"source": source.encode(), "backend": b"cpu"})
    )
    names = list(manifest.functions)
    build_file = {
        "format": build_format(manifest),
        "id": cpu_id,
        "name": manifest.hub_name,
        "version": manifest.version,
        "backend": "cpu",
        "manifest": manifest.to_dict(),
    }
    _write(cpu_dir / BUILD_FILE, json.dumps(build_file, indent=2, sort_keys=True) + "\n")
    _write(cpu_dir / "_ops.py", _OPS.format(ns=cpu_id))
    _write(
        cpu_dir / "__init__.py",
        _INIT_CPU.format(
            name=manifest.name,
            version=manifest.version,
            functions=", ".join(names),
            assignments="\n".join(f'{n} = _build.functions["{n}"]' for n in names),
            all=names,
        ),
    )
    _write(cpu_dir / kname / "__init__.py", _COMPAT.format(ns=cpu_id))
    variants["torch-cpu"] = VariantBuild("torch-cpu", cpu_id, cpu_dir, {})

    if neuron:
        neuron_id = build_id(
            manifest.name,
            "neuron",
            content_hash(
                {"source": source.encode(), "backend": b"neuron", "target": neuron_import.encode()}
            ),
        )
        variants["torch-neuron"] = _build_neuron(
            folder, out, manifest, sources, modules, kname, neuron_id, neuron_import
        )

    rows = [VariantRow(v.variant, v.id) for v in variants.values()]
    author_readme = (
        (folder / "README.md").read_text(encoding="utf-8")
        if (folder / "README.md").is_file()
        else ""
    )
    for v in variants.values():
        _write(
            v.dir / "README.md",
            render_card(
                manifest, repo_id, variants=rows, probes=probes, tests=tests, variant=v.variant
            ),
        )
        backend = "cpu" if v.variant == "torch-cpu" else "neuron"
        depends = [] if backend == "cpu" else list(NEURON_PYTHON_DEPENDS)
        v.metadata = _metadata(manifest, v.id, backend, depends, v.dir, source)
        _write(v.dir / METADATA_FILE, json.dumps(v.metadata, indent=2, sort_keys=True) + "\n")
    _write(
        out / "README.md",
        render_card(
            manifest,
            repo_id,
            variants=rows,
            probes=probes,
            tests=tests,
            author_readme=author_readme,
        ),
    )
    return BuildResult(out, manifest, variants, probes, tests, source)


def _build_neuron(
    folder: Path,
    out: Path,
    manifest: Manifest,
    sources: dict[str, bytes],
    modules: set[str],
    kname: str,
    bid: str,
    target: str,
) -> VariantBuild:
    vdir = out / "build" / "torch-neuron"
    used_vendored: set[str] = set()
    for rel, data in sources.items():
        if rel.endswith(".py"):
            text = neuron_imports(
                data.decode("utf-8"), f"{folder.name}/{rel}", modules, kname, target
            )
            used_vendored |= {v for v in VENDORED.values() if v in text}
            data = text.encode("utf-8")
        _write(vdir / rel, data)
    nkikit_dir = Path(__file__).resolve().parent.parent
    for nk_mod, build_mod in VENDORED.items():
        if build_mod in used_vendored:
            shutil.copyfile(nkikit_dir / f"{nk_mod}.py", vdir / f"{build_mod}.py")
    imports = []
    for name, spec in manifest.functions.items():
        line = f"from .{spec.entry.module} import {spec.entry.attr}"
        imports.append(line if spec.entry.attr == name else f"{line} as {name}")
    _write(
        vdir / "__init__.py",
        _INIT_NEURON.format(
            name=manifest.name,
            version=manifest.version,
            target=target,
            functions=", ".join(manifest.functions),
            imports="\n".join(imports),
            all=list(manifest.functions),
        ),
    )
    return VariantBuild("torch-neuron", bid, vdir, {})
