"""The HF-kernels layout a build produces, before anything is uploaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hubfixtures import LIBRARY, TINY, copy_fixture

from nkikit.registry.build import build_kernel, collect_sources
from nkikit.registry.digests import digest_folder
from nkikit.registry.errors import BuildError


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return build_kernel(TINY, tmp_path_factory.mktemp("build"), "nkikit/tiny-rmsnorm")


def test_layout(built) -> None:  # noqa: ANN001
    files = set(built.files())
    assert {
        "README.md",
        "build/torch-cpu/__init__.py",
        "build/torch-cpu/_ops.py",
        "build/torch-cpu/kernel.json",
        "build/torch-cpu/kernel.py",
        "build/torch-cpu/reference.py",
        "build/torch-cpu/metadata.json",
        "build/torch-cpu/README.md",
        "build/torch-cpu/tiny_rmsnorm/__init__.py",
        "build/torch-neuron/__init__.py",
        "build/torch-neuron/kernel.py",
        "build/torch-neuron/metadata.json",
    } <= files
    # the author's tests, manifest and own __init__ never ship
    assert not any("test_" in f or f.endswith("kernel.toml") for f in files)


def test_metadata(built) -> None:  # noqa: ANN001
    for variant, backend, depends in (
        ("torch-cpu", "cpu", []),
        ("torch-neuron", "neuron", ["nki"]),
    ):
        vdir = built.root / "build" / variant
        meta = json.loads((vdir / "metadata.json").read_text())
        assert (
            meta["name"] == "tiny-rmsnorm"
            and meta["version"] == 1
            and meta["license"] == "Apache-2.0"
        )
        assert meta["backend"] == {"type": backend}
        assert meta["python-depends"] == depends
        assert re.fullmatch(rf"_tiny_rmsnorm_{backend}_[0-9a-f]{{7}}", meta["id"])
        assert meta["digest"] == {"algorithm": "sha256", "files": digest_folder(vdir)}
        assert "metadata.json" not in meta["digest"]["files"]


def test_kernel_json_records_outputs(built) -> None:  # noqa: ANN001
    data = json.loads((built.root / "build/torch-cpu/kernel.json").read_text())
    fns = data["manifest"]["functions"]
    assert (fns["rmsnorm"]["outputs"], fns["rmsnorm"]["returns_tuple"]) == (1, False)
    assert (fns["add_sub"]["outputs"], fns["add_sub"]["returns_tuple"]) == (2, True)
    assert data["id"] == built.variants["torch-cpu"].id


def test_neuron_source_has_no_nkikit_imports(built) -> None:  # noqa: ANN001
    text = (built.root / "build/torch-neuron/kernel.py").read_text()
    assert "import neuronxcc.nki as nki" in text and "import neuronxcc.nki.language as nl" in text
    assert "import nkikit" not in text
    init = (built.root / "build/torch-neuron/__init__.py").read_text()
    assert "from .kernel import rmsnorm" in init and "from .kernel import add_sub" in init


def test_card(built) -> None:  # noqa: ANN001
    card = (built.root / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\n")
    assert "### `rmsnorm(x, weight, eps=1e-06)`" in card and "float32, bfloat16, float16" in card
    assert 'kernels.pull("nkikit/tiny-rmsnorm", version=1)' in card
    assert "trust_remote_code=True)" in card  # the HF kernels snippet only


def test_card_usage_opts_in_for_an_org_not_trusted_by_default(tmp_path: Path) -> None:
    card = (build_kernel(TINY, tmp_path / "b", "acme/tiny-rmsnorm").root / "README.md").read_text()
    assert 'kernels.pull("acme/tiny-rmsnorm", version=1, trust_remote_code=True)' in card
    assert "a tuple of 2 arrays" in card and "kernel:rmsnorm_backward" in card
    assert "## From the kernel's README" in card and "### tiny_rmsnorm" in card  # demoted heading
    assert "Published without running the kernel's tests." in card


def test_ids_are_content_addressed(tmp_path: Path, built) -> None:  # noqa: ANN001
    again = build_kernel(TINY, tmp_path / "a", "nkikit/tiny-rmsnorm")
    assert again.variants["torch-cpu"].id == built.variants["torch-cpu"].id
    changed = copy_fixture(tmp_path)
    (changed / "reference.py").write_text((changed / "reference.py").read_text() + "\n# changed\n")
    other = build_kernel(changed, tmp_path / "b", "nkikit/tiny-rmsnorm")
    assert other.variants["torch-cpu"].id != built.variants["torch-cpu"].id


@pytest.mark.parametrize("name", ["tensor_add", "rmsnorm", "layernorm", "softmax", "matmul"])
def test_library_kernels_collect(name: str) -> None:
    srcs = collect_sources(LIBRARY / name)
    assert set(srcs) == {"kernel.py", "reference.py"}


def test_failing_example_is_a_build_error(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path)
    toml = (
        (folder / "kernel.toml")
        .read_text()
        .replace("x = [130, 64], weight = [64]", "x = [130, 64], weight = [65]")
    )
    (folder / "kernel.toml").write_text(toml)
    with pytest.raises(BuildError, match="running rmsnorm on its example"):
        build_kernel(folder, tmp_path / "out", "nkikit/x")


def test_build_format_is_1_unless_a_function_needs_2(built) -> None:  # noqa: ANN001
    # the fixture uses no per-input dtype, range or multi-output backward: older nkikit reads it
    data = json.loads((built.root / "build/torch-cpu/kernel.json").read_text())
    meta = json.loads((built.root / "build/torch-cpu/metadata.json").read_text())
    assert data["format"] == 1 and meta["nkikit"]["build-format"] == 1
    assert "input_dtypes" not in json.dumps(data)


def test_per_input_dtypes_and_ranges_travel_in_the_build(tmp_path: Path) -> None:
    b = build_kernel(
        LIBRARY / "cross_entropy", tmp_path, "nkikit/cross-entropy", neuron=False, profile=False
    )
    data = json.loads((b.root / "build/torch-cpu/kernel.json").read_text())
    assert data["format"] == 2
    fn = data["manifest"]["functions"]["cross_entropy"]
    assert fn["input_dtypes"] == {"targets": ["int32", "int64"]}
    assert fn["ranges"] == {"targets": [0, "logits.shape[1]"]}
    card = (b.root / "README.md").read_text()
    assert "| dtypes | float32, bfloat16; `targets`: int32, int64 |" in card
    assert "`targets` (e.g. `[256]`; int32 or int64; values in `[0, logits.shape[1])`)" in card


def test_an_unknown_build_format_says_upgrade(tmp_path: Path) -> None:
    from nkikit.registry.errors import RegistryError
    from nkikit.registry.runtime import read_build_file

    (tmp_path / "kernel.json").write_text(json.dumps({"format": 3, "id": "x"}))
    with pytest.raises(RegistryError, match="unsupported build format 3; upgrade nkikit"):
        read_build_file(tmp_path)
