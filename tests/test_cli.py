"""The ``nkikit`` command line, driven as a user would (``main(argv)``)."""

import textwrap

import pytest

from nkikit.cli import main, parse_args_spec
from nkikit.typing import TensorSpec

KERNEL = textwrap.dedent(
    """
    import nkikit as nki
    import nkikit.language as nl

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.load(x), 2.0))
        return out

    @nki.jit
    def too_wide(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out
    """
)


@pytest.fixture
def kernel_file(tmp_path):
    path = tmp_path / "mykernels.py"
    path.write_text(KERNEL)
    return path


def test_parse_args_spec():
    spec = parse_args_spec("a=4x8:bfloat16,eps=1e-6,n=3")
    assert spec["a"] == TensorSpec((4, 8), spec["a"].dtype) and str(spec["a"].dtype) == "bfloat16"
    assert spec["eps"] == 1e-6 and spec["n"] == 3


def test_run_prints_output_statistics(kernel_file, capsys):
    assert main(["run", f"{kernel_file}::double", "--args", "x=128x64:float32"]) == 0
    out = capsys.readouterr().out
    assert "output 0: shape=(128, 64)" in out and "nan=0" in out


def test_ir_prints_the_kernel(kernel_file, capsys):
    assert main(["ir", f"{kernel_file}::double", "--args", "x=128x64:bfloat16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernel double(%x: shared_hbm[128, 64] bfloat16)")
    assert "tensor_scalar" in out


def test_a_rejected_kernel_prints_the_error_and_line_not_a_traceback(kernel_file, capsys):
    assert main(["run", f"{kernel_file}::too_wide", "--args", "x=256x64:float32"]) == 1
    err = capsys.readouterr().err
    assert "mykernels.py:" in err and "err_num_partition_exceed_arch_limit" in err
    assert "Traceback" not in err


def test_demo_runs_small_and_writes_reports(tmp_path, capsys):
    assert main(["demo", "--shape", "256x512", "--no-share", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "naive" in out and "fused" in out and "tuned" in out and "is fastest" in out
    for name in ("fused", "tuned", "naive-1-square"):
        assert (tmp_path / f"{name}.html").exists()
        assert (tmp_path / f"{name}.perfetto.json").exists()
