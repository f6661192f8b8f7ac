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
        (
            'inputs = ["x"]',
            'inputs = ["x"]\ninput_dtypes = { y = "int32" }',
            r"\[functions.f\] input_dtypes.y: 'y' is not an input \(inputs: x\)",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\ninput_dtypes = { x = ["int99"] }',
            r"input_dtypes.x: unknown dtype\(s\) \['int99'\].*or int64",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\ninput_dtypes = { x = [] }',
            "input_dtypes.x: expected a dtype name or a non-empty list",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\ninput_dtypes = ["int32"]',
            "input_dtypes must be a table",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\nranges = { x = [0] }',
            r"ranges.x: expected \[low, high\]",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\nranges = { x = [0, "y.shape[1]"] }',
            r"ranges.x: bound 'y.shape\[1\]' must be a number or '<input>.shape\[<axis>\]'",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\nranges = { x = [0, "x.shape[2]"] }',
            "axis out of range for x, which has 2 dimension",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\nranges = { x = [5, "x.shape[0]"] }',
            r"ranges.x = \[5, 'x.shape\[0\]'\] is empty for the example shapes: \[5, 4\)",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\ninput_dtypes = { x = "int32" }\nranges = { x = [0.5, 3] }',
            "bound 0.5 must be an integer for an integer input",
        ),
        (
            'inputs = ["x"]',
            'inputs = ["x"]\ninput_dtypes = { x = "bool" }\nranges = { x = [0, 1] }',
            "a bool input takes no range",
        ),
    ],
)
def test_manifest_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = copy_fixture(tmp_path)
    _write(folder, GOOD.replace(old, new))
    with pytest.raises(ManifestError, match=message):
        load_manifest(folder)


def test_errors_name_the_file(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    _write(folder, GOOD.replace('inputs = ["x"]', 'inputs = ["x"]\ninput_dtypes = { y = "int32" }'))
    with pytest.raises(ManifestError) as err:
        load_manifest(folder)
    assert str(err.value).startswith(f"{folder / 'kernel.toml'}: [functions.f] input_dtypes.y:")


def test_per_input_dtypes_and_ranges(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    text = GOOD.replace('inputs = ["x"]', 'inputs = ["x", "t", "w"]').replace(
        "example = { x = [4, 4] }",
        """dtypes = ["float32", "bfloat16"]
input_dtypes = { t = ["int32", "int64"], w = "float32" }
ranges = { t = [0, "x.shape[-1]"], w = [0.5, 2.0] }
example = { x = [4, 9], t = [4], w = [9] }""",
    )
    _write(folder, text)
    m = load_manifest(folder)
    f = m.functions["f"]
    assert f.input_dtypes == {"t": ("int32", "int64"), "w": ("float32",)}
    assert f.accepted_dtypes("x") == ("float32", "bfloat16")
    assert f.accepted_dtypes("t") == ("int32", "int64")
    assert [f.input_dtype(n, "bfloat16") for n in f.inputs] == ["bfloat16", "int32", "float32"]
    assert f.input_range("t") == (0, 9)
    assert f.input_range("t", {"x": (2, 32000), "t": (2,), "w": (32000,)}) == (0, 32000)
    assert f.input_range("w") == (0.5, 2.0) and f.input_range("x") is None
    with pytest.raises(ManifestError, match="is empty for shapes"):
        f.input_range("t", {"x": (2, 0), "t": (2,), "w": (0,)})
    # kernel.json carries them; manifests without them serialize as before
    d = m.to_dict()["functions"]["f"]
    assert d["input_dtypes"] == {"t": ["int32", "int64"], "w": ["float32"]}
    assert d["ranges"] == {"t": [0, "x.shape[-1]"], "w": [0.5, 2.0]}
    assert Manifest.from_dict(m.to_dict()).functions == m.functions
    assert "input_dtypes" not in load_manifest(TINY).to_dict()["functions"]["rmsnorm"]


def test_cross_entropy_declares_int_targets() -> None:
    f = load_manifest(LIBRARY / "cross_entropy").functions["cross_entropy"]
    assert f.accepted_dtypes("logits") == ("float32", "bfloat16")
    assert f.accepted_dtypes("targets") == ("int32", "int64")
    assert f.input_range("targets") == (0, f.example["logits"][1])


def test_missing_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no kernel.toml"):
        load_manifest(tmp_path)
    (tmp_path / "kernel.toml").write_text("[kernel\n")
    with pytest.raises(ManifestError, match="invalid TOML"):
        load_manifest(tmp_path)
    (tmp_path / "kernel.toml").write_text("x = 1\n")
    with pytest.raises(ManifestError, match=r"\[kernel\] table is required"):
        load_manifest(tmp_path)


def test_one_function_table_reports_all_its_problems() -> None:
    """A table with several bad keys gets one message per key; a key that depends on a bad
    one (example on inputs) is not reported twice."""
    data = {
        "name": "kern",
        "version": 1,
        "license": "MIT",
        "functions": {
            "f": {
                "entry": "kernel",  # not module:callable
                "inputs": ["x", "x"],  # duplicate
                "dtypes": ["float33"],
                "outputs": 0,
                "returns_tuple": "yes",
                "colour": "red",
            }
        },
    }
    with pytest.raises(ManifestError) as info:
        Manifest.from_dict(data)
    problems = info.value.problems
    assert len(problems) == 6, problems
    joined = "\n".join(problems)
    for part in (
        "unknown key(s) colour",
        "entry: expected 'module:callable'",
        "inputs has duplicate names",
        "unknown dtype(s) ['float33']",
        "outputs must be a positive int",
        "returns_tuple must be a bool",
    ):
        assert part in joined
    assert all(p.startswith("manifest: [functions.f]") for p in problems)
