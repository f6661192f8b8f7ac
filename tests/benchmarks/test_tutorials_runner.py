"""The Beta-1 tutorial runner (``benchmarks/tutorials``): its import rewriting touches import
lines only, and a case is reported as passing with a modeled time, or failing with its error,
on a small tutorial-shaped folder written here (the real tutorials are not in the repository)."""

from __future__ import annotations

import numpy as np

from benchmarks.tutorials import run

SOURCE = """\
from neuronxcc import nki
import neuronxcc.nki.language as nl
from neuronxcc.nki.typing import tensor
from torch_xla.core import xla_model as xm
text = "neuronxcc.nki stays in strings"


@nki.jit
def double(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(a), 2.0))
    return out
"""


def test_rewrite_changes_import_lines_only():
    out = run.rewrite_imports(SOURCE).splitlines()
    assert out[0] == "import nkikit as nki"
    assert out[1] == "import nkikit.language as nl"
    assert out[2] == "from nkikit.typing import tensor"
    assert out[3].startswith("pass  # nkikit: from torch_xla")
    assert out[4:] == SOURCE.splitlines()[4:]


def _setup(root):
    m = run.load(root, "double/double_kernels.py")
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    return (lambda: m.double(a)), (m.double, (a,)), a * 2, None


def _setup_wrong(root):
    run_, launch, expected, tol = _setup(root)
    return run_, launch, expected + 1, tol


def test_cases_pass_with_a_modeled_time_or_fail_with_the_error(tmp_path):
    src, dst = tmp_path / "src" / "double", tmp_path / "dst"
    src.mkdir(parents=True)
    (src / "double_kernels.py").write_text(SOURCE)
    run.copy_tutorials(tmp_path / "src", dst)
    try:
        ok = run.run_case(run.Case("double", _setup), dst, profile=True)
        assert ok["ok"] and ok["us"] > 0 and ok["error"] == ""
        run.forget_modules()
        bad = run.run_case(run.Case("double wrong", _setup_wrong), dst, profile=True)
        assert not bad["ok"] and bad["us"] is None
        assert bad["error"].startswith("AssertionError: mismatch with the reference")
    finally:
        run.forget_modules()
