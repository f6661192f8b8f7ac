"""check_manifest / manifest_problems on throwaway kernel packages: one parser (the registry's),
signatures, examples in every declared dtype, per-input dtypes and value ranges."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nkikit.registry.errors import ManifestError
from nkikit.registry.manifest import Manifest
from nkikit.registry.manifest import load_manifest as registry_load_manifest
from nkikit.testing import check_manifest, load_manifest, manifest_problems
from nkikit.testing.manifest import dtype_variants

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
    assert isinstance(m, Manifest) and m.name == "scale"
    assert m.functions["scale"].dtypes == ("float32", "bfloat16")
    assert manifest_problems(folder) == []
    assert load_manifest(folder) == m  # the registry's parser and dataclass


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


def test_manifest_problems_are_the_registry_parser_messages(tmp_path, monkeypatch):
    assert manifest_problems({}) == ["kernel.toml: a [kernel] table is required"]
    data = {
        "kernel": {"name": "kk", "version": 1, "license": "MIT"},
        "functions": {
            "f": {
                "entry": "kernel.f",
                "reference": "reference:f",
                "inputs": ["x"],
                "example": {"x": [1]},
            }
        },
    }
    (problem,) = manifest_problems(data)
    assert problem == "kernel.toml: [functions.f] entry: expected 'module:callable', got 'kernel.f'"
    data["functions"]["f"]["entry"] = "kernel:f"
    assert manifest_problems(data) == []
    data["functions"]["f"]["dtypes"] = ["float64"]
    assert "unknown dtype(s) ['float64']" in manifest_problems(data)[0]
    # from a folder: the message names the file and the key, exactly as nkikit publish says it
    bad = TOML.replace("attrs = {", 'input_dtypes = { y = "int32" }\nattrs = {')
    folder = _make(tmp_path, monkeypatch, "lib_problem", toml=bad)
    with pytest.raises(ManifestError) as err:
        registry_load_manifest(folder)
    assert manifest_problems(folder) == [str(err.value)]
    assert str(err.value).startswith(f"{folder / 'kernel.toml'}: [functions.scale] input_dtypes.y")


def test_check_manifest_reports_parse_errors_as_assertions(tmp_path, monkeypatch):
    folder = _make(
        tmp_path, monkeypatch, "lib_parse", toml=TOML.replace("version = 1", "version = -1")
    )
    with pytest.raises(AssertionError, match=r"kernel\.toml: \[kernel\] version must be"):
        check_manifest(folder, "lib_parse.scale")


def test_check_manifest_needs_a_reference(tmp_path, monkeypatch):
    toml = TOML.replace('reference = "reference:scale"\n', "")
    folder = _make(tmp_path, monkeypatch, "lib_noref", toml=toml)
    with pytest.raises(AssertionError, match=r"\[functions.scale\] has no reference"):
        check_manifest(folder, "lib_noref.scale")


PICK_KERNEL = (
    KERNEL
    + """

import numpy as np


def pick(x, idx):
    idx = np.asarray(idx)
    if idx.dtype not in ACCEPTED:
        raise TypeError(f"idx must be one of {ACCEPTED}, got {idx.dtype}")
    if (idx < 0).any() or (idx >= x.shape[1]).any():
        raise IndexError("idx out of range")
    y = np.asarray(_scale(x, 1.0))
    return y[np.arange(x.shape[0]), idx]
"""
)
PICK_REFERENCE = """
import numpy as np


def pick(x, idx):
    return np.asarray(x)[np.arange(x.shape[0]), idx]
"""
PICK_TOML = """
[kernel]
name = "scale"
version = 1
license = "Apache-2.0"
description = "one element per row, by index"

[functions.pick]
entry = "kernel:pick"
reference = "reference:pick"
inputs = ["x", "idx"]
dtypes = ["float32", "bfloat16"]
input_dtypes = { idx = ["int32", "int64"] }
ranges = { idx = [0, "x.shape[1]"] }
example = { x = [100, 40], idx = [100] }
"""


def _make_pick(tmp_path, monkeypatch, pkg, toml=PICK_TOML, accepted="np.int32, np.int64"):
    folder = _make(tmp_path, monkeypatch, pkg, toml=toml, reference=PICK_REFERENCE)
    (folder / "kernel.py").write_text(
        textwrap.dedent(PICK_KERNEL).replace("ACCEPTED", f"({accepted},)")
    )
    return folder


def test_int_input_with_its_own_dtypes_and_range(tmp_path, monkeypatch):
    folder = _make_pick(tmp_path, monkeypatch, "lib_pick")
    m = check_manifest(folder, "lib_pick.scale")
    fn = m.functions["pick"]
    assert fn.accepted_dtypes("idx") == ("int32", "int64")
    assert fn.accepted_dtypes("x") == ("float32", "bfloat16")
    # both function dtypes with idx in int32, then idx's other declared dtype once
    assert dtype_variants(fn) == [
        ("float32", {"x": "float32", "idx": "int32"}),
        ("bfloat16", {"x": "bfloat16", "idx": "int32"}),
        ("float32", {"x": "float32", "idx": "int64"}),
    ]


def test_every_declared_input_dtype_is_run(tmp_path, monkeypatch):
    # the entry refuses int64, which the manifest declares: check_manifest must notice
    folder = _make_pick(tmp_path, monkeypatch, "lib_pick32", accepted="np.int32")
    with pytest.raises(TypeError, match="got int64"):
        check_manifest(folder, "lib_pick32.scale")


def test_without_a_range_indices_are_not_valid(tmp_path, monkeypatch):
    toml = PICK_TOML.replace('ranges = { idx = [0, "x.shape[1]"] }\n', "")
    folder = _make_pick(tmp_path, monkeypatch, "lib_pick_norange", toml=toml)
    with pytest.raises(IndexError, match="out of range"):  # default ints include negatives
        check_manifest(folder, "lib_pick_norange.scale")


def test_library_manifests_are_well_formed():
    root = Path(__file__).resolve().parents[2] / "kernels"
    folders = [p.parent for p in root.glob("*/kernel.toml")]
    assert {f.name for f in folders} >= {"tensor_add", "rmsnorm", "layernorm", "softmax", "matmul"}
    for f in folders:
        assert manifest_problems(f) == [], f.name
        assert load_manifest(f).name == f.name
