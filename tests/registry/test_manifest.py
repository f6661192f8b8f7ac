"""kernel.toml parsing: the library's manifests load, and each kind of mistake is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from hubfixtures import LIBRARY, TINY, copy_fixture

from nkikit.registry.errors import ManifestError
from nkikit.registry.manifest import Manifest, load_manifest


@pytest.mark.parametrize("name", ["tensor_add", "rmsnorm", "layernorm", "softmax", "matmul"])
def test_library_manifests_load(name: str) -> None:
    m = load_manifest(LIBRARY / name)
    assert m.name == name and m.version >= 0 and m.functions
    assert m.hub_name == name.replace("_", "-")
    for f in m.functions.values():
        assert set(f.example) == set(f.inputs)


def test_fixture_manifest() -> None:
    m = load_manifest(TINY)
    rms = m.functions["rmsnorm"]
    assert rms.inputs == ("x", "weight") and rms.attrs == {"eps": 1e-6}
    assert str(rms.backward) == "kernel:rmsnorm_backward"
    assert rms.signature == "rmsnorm(x, weight, eps=1e-06)"
    assert Manifest.from_dict(m.to_dict()).functions == m.functions


def _write(folder: Path, text: str) -> Path:
    (folder / "kernel.toml").write_text(text)
    return folder


GOOD = """
[kernel]
name = "kk"
version = 1
license = "MIT"
[functions.f]
entry = "kernel:rmsnorm"
inputs = ["x"]
example = { x = [4, 4] }
"""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("version = 1", 'version = "1"', "version must be a non-negative integer"),
        ("version = 1", "version = -1", "version must be a non-negative integer"),
        ('name = "kk"', 'name = "Bad Name"', "invalid kernel name"),
        ('license = "MIT"', "", "license is required"),
        ('entry = "kernel:rmsnorm"', 'entry = "kernel.rmsnorm"', "expected 'module:callable'"),
        ('entry = "kernel:rmsnorm"', 'entry = "nope:f"', "refers to module 'nope'"),
        ('inputs = ["x"]', "inputs = []", "inputs must be a non-empty list"),
        (
            "example = { x = [4, 4] }",
            "example = { y = [4] }",
            "example must give a shape for every input",
        ),
        ("example = { x = [4, 4] }", "example = { x = [4, 0] }", "positive ints"),
        ('inputs = ["x"]', 'inputs = ["x"]\ndtypes = ["float99"]', "unknown dtype"),
        ('inputs = ["x"]', 'inputs = ["x"]\nattrs = { eps = {a = 1} }', "defaults must be"),
        ('inputs = ["x"]', 'inputs = ["x"]\nbogus = 1', "unknown key"),
    ],
)
def test_manifest_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = copy_fixture(tmp_path)
    _write(folder, GOOD.replace(old, new))
    with pytest.raises(ManifestError, match=message):
        load_manifest(folder)


def test_missing_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no kernel.toml"):
        load_manifest(tmp_path)
    (tmp_path / "kernel.toml").write_text("[kernel\n")
    with pytest.raises(ManifestError, match="invalid TOML"):
        load_manifest(tmp_path)
    (tmp_path / "kernel.toml").write_text("x = 1\n")
    with pytest.raises(ManifestError, match=r"\[kernel\] table is required"):
        load_manifest(tmp_path)
