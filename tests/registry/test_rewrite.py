"""Import rewriting for builds: sibling imports become relative, NKI imports point at neuronxcc."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from hubfixtures import LIBRARY

from nkikit.registry.errors import BuildError
from nkikit.registry.rewrite import neuron_imports, relative_imports

SIBS = {"kernel", "reference", "helpers.tiles"}


def test_sibling_imports_become_relative() -> None:
    src = (
        "import reference\n"
        "import reference as ref\n"
        "from reference import f, g as h\n"
        "from nkikit.library.rmsnorm.reference import x\n"
        "from nkikit.library.rmsnorm import reference as r2\n"
        "from helpers.tiles import t\n"
        "import os, numpy as np\n"
        "from .kernel import k\n"
    )
    out = relative_imports(src, "k.py", SIBS, "rmsnorm")
    assert out.splitlines() == [
        "from . import reference",
        "from . import reference as ref",
        "from .reference import (f, g as h)",
        "from .reference import (x)",
        "from . import (reference as r2)",
        "from .helpers.tiles import (t)",
        "import os, numpy as np",
        "from .kernel import k",
    ]
    ast.parse(out)


def test_line_numbers_are_kept() -> None:
    src = "from reference import (\n    a,\n    b,\n)\nimport os, \\\n    reference\nX = 1\n"
    out = relative_imports(src, "k.py", SIBS, "rmsnorm")
    assert len(out.splitlines()) == len(src.splitlines())
    assert out.splitlines()[6] == "X = 1"
    ast.parse(out)


def test_other_library_kernels_are_refused() -> None:
    with pytest.raises(BuildError, match="k.py:2: imports nkikit.library.softmax"):
        relative_imports(
            "x = 1\nfrom nkikit.library.softmax import kernel\n", "k.py", SIBS, "rmsnorm"
        )


def test_neuron_imports() -> None:
    src = (
        "import nkikit as nki\n"
        "import nkikit.language as nl\n"
        "import nkikit.isa as nisa\n"
        "from nkikit import dtypes, language as nl2\n"
        "from nkikit.typing import tensor\n"
        "import nkikit\n"
        "import nkikit.isa\n"
    )
    out = neuron_imports(src, "k.py", SIBS, "rmsnorm")
    assert out.splitlines() == [
        "import neuronxcc.nki as nki",
        "import neuronxcc.nki.language as nl",
        "import neuronxcc.nki.isa as nisa",
        "from neuronxcc.nki import (language as nl2); from . import _nkikit_dtypes as dtypes",
        "from neuronxcc.nki.typing import (tensor)",
        "import neuronxcc.nki as nkikit",
        "import neuronxcc.nki.isa; import neuronxcc.nki as nkikit",
    ]
    assert (
        neuron_imports("import nkikit.language as nl\n", "k.py", SIBS, "r", target="nki")
        == "import nki.language as nl\n"
    )


@pytest.mark.parametrize(
    "line",
    ["import nkikit.testing as t", "from nkikit.sim import interp", "from nkikit import registry"],
)
def test_neuron_refuses_nkikit_machinery(line: str) -> None:
    with pytest.raises(BuildError, match="no NKI counterpart"):
        neuron_imports(line + "\n", "k.py", SIBS, "rmsnorm")


def test_neuron_source_runs_unchanged_on_nkikit(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The exported Neuron source is the tested kernel: mapping its imports back to nkikit
    gives a module that computes the same as the library kernel."""
    import importlib
    import sys

    pkg = tmp_path / "neuron_rms"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod in ("kernel", "reference"):
        text = neuron_imports(
            (LIBRARY / "rmsnorm" / f"{mod}.py").read_text(),
            f"{mod}.py",
            {"kernel", "reference"},
            "rmsnorm",
        )
        assert "nkikit" not in text.replace("_nkikit_dtypes", "").replace("as nkikit", "")
        back = text.replace("neuronxcc.nki", "nkikit").replace(
            "from . import _nkikit_dtypes as dtypes", "from nkikit import dtypes"
        )
        (pkg / f"{mod}.py").write_text(back)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("neuron_rms.kernel")
    try:
        lib = importlib.import_module("nkikit.library.rmsnorm.kernel")
        x = np.random.default_rng(0).standard_normal((130, 32)).astype(np.float32)
        w = np.ones(32, np.float32)
        np.testing.assert_array_equal(mod.rmsnorm(x, w), lib.rmsnorm(x, w))
    finally:
        for name in [m for m in sys.modules if m.startswith("neuron_rms")]:
            del sys.modules[name]
