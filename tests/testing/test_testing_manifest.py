"""check_manifest / manifest_problems on a throwaway kernel package."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nkikit.testing import check_manifest, load_manifest, manifest_problems

KERNEL = """
import nkikit as nki
import nkikit.language as nl


@nki.jit
def _scale(x, factor):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(x), factor))
    return out


def scale(x, *, factor=2.0):
    return _scale(x, factor)
"""
REFERENCE = """
def scale(x, *, factor=2.0):
    return x * factor
"""
TOML = """
[kernel]
name = "scale"
version = 1
license = "Apache-2.0"
description = "x times a constant"

[functions.scale]
entry = "kernel:scale"
reference = "reference:scale"
inputs = ["x"]
attrs = { factor = 2.0 }
dtypes = ["float32", "bfloat16"]
example = { x = [64, 32] }
"""


def _make(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pkg: str,
    toml: str = TOML,
    reference: str = REFERENCE,
) -> Path:
    folder = tmp_path / pkg / "scale"
    folder.mkdir(parents=True)
    (tmp_path / pkg / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    (folder / "kernel.py").write_text(textwrap.dedent(KERNEL))
    (folder / "reference.py").write_text(textwrap.dedent(reference))
    (folder / "kernel.toml").write_text(textwrap.dedent(toml))
    monkeypatch.syspath_prepend(str(tmp_path))
    return folder


def test_good_manifest(tmp_path, monkeypatch):
    folder = _make(tmp_path, monkeypatch, "lib_good")
    m = check_manifest(folder, "lib_good.scale")
    assert m["kernel"]["name"] == "scale"
    assert manifest_problems(load_manifest(folder)) == []


def test_wrong_reference_fails_the_example(tmp_path, monkeypatch):
    bad = REFERENCE.replace("x * factor", "x * factor + 1.0")
    folder = _make(tmp_path, monkeypatch, "lib_badref", reference=bad)
    with pytest.raises(AssertionError, match="does not match the reference"):
        check_manifest(folder, "lib_badref.scale")
    check_manifest(folder, "lib_badref.scale", run_examples=False)


def test_attr_default_mismatch(tmp_path, monkeypatch):
    folder = _make(
        tmp_path, monkeypatch, "lib_attr", toml=TOML.replace("factor = 2.0", "factor = 3.0")
    )
    with pytest.raises(AssertionError, match="default factor=2.0, kernel.toml says 3.0"):
        check_manifest(folder, "lib_attr.scale")


def test_inputs_mismatch(tmp_path, monkeypatch):
    toml = TOML.replace('inputs = ["x"]', 'inputs = ["y"]').replace("x = [64, 32]", "y = [64, 32]")
    folder = _make(tmp_path, monkeypatch, "lib_inputs", toml=toml)
    with pytest.raises(
        AssertionError, match=r"takes arrays \['x'\], kernel.toml says inputs = \['y'\]"
    ):
        check_manifest(folder, "lib_inputs.scale")


def test_manifest_problems():
    assert manifest_problems({}) == ["missing [kernel] table"]
    m = {
        "kernel": {"name": "k", "version": 0, "license": "MIT", "description": 3},
        "functions": {
            "f": {
                "entry": "kernel.f",
                "reference": "reference:f",
                "inputs": ["x"],
                "dtypes": ["float64"],
                "example": {"y": [1]},
                "extra": 1,
            }
        },
    }
    problems = manifest_problems(m)
    assert "[kernel].description must be a str" in problems
    assert "[kernel].version must be >= 1" in problems
    assert "[functions.f].entry must be 'module:callable', got 'kernel.f'" in problems
    assert "[functions.f].dtypes: 'float64' is not an NKI dtype" in problems
    assert any("example must give a shape for each input" in p for p in problems)
    assert any("unknown keys ['extra']" in p for p in problems)
    assert manifest_problems(
        {"kernel": {"name": "k", "version": 1, "license": "x", "description": "d"}}
    ) == ["missing [functions.<name>] tables"]


def test_library_manifests_are_well_formed():
    root = Path(__file__).resolve().parents[2] / "kernels"
    folders = [p.parent for p in root.glob("*/kernel.toml")]
    assert {f.name for f in folders} >= {"tensor_add", "rmsnorm", "layernorm", "softmax", "matmul"}
    for f in folders:
        assert manifest_problems(load_manifest(f)) == [], f.name
