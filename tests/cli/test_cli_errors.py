"""One error style: one line on stderr, the user's file:line, exit 2 for usage errors and 1 for
a kernel or registry failure; the kernel named as FILE.py::KERNEL or MODULE:KERNEL everywhere."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from clihelp import nkikit

from nkikit.cli import main

KERNELS = textwrap.dedent(
    """
    import nkikit as nki
    import nkikit.language as nl

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.load(x), 2.0))
        return out

    @nki.jit
    def typo(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exponential(nl.load(x)))
        return out

    @nki.jit
    def halves(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nl.store(out[i * 128 : (i + 1) * 128, :], value=nl.load(x[i * 128 : (i + 1) * 128, :]))
        return out

    @nki.jit
    def scale(x, s):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.load(x), s))
        return out
    """
)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(KERNELS.splitlines(), 1) if text in line)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "mykernels.py").write_text(KERNELS)
    return tmp_path


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "{f}::double", "--args", "x=128x64:float33"], "nkikit run: error: --args:"),
        (["run", "{f}::double", "--args", "x=128x64,y=1"], "unexpected keyword argument 'y'"),
        (["ir", "{f}::double"], "missing a required argument: 'x'"),
        (["profile", "{f}::double", "--args", "x=128x64", "--grid", "2,2"], "--grid: expected"),
        (["profile", "{f}::double", "--args", "x=128x64", "--target", "tpu"], "valid targets"),
        (["run", "{f}::nope"], "has no 'nope'"),
        (["run", "double"], "FILE.py::KERNEL or MODULE:KERNEL"),
        (["run", "nosuchmodule:double"], "no module named 'nosuchmodule'"),
        (["runn"], "invalid choice: 'runn'"),
        (["run", "{f}::double", "--sed", "1"], "unrecognized arguments: --sed"),
        # found by a fuzz of the CLI: each was a traceback or a misleading message before
        (["run", "os:getcwd"], "expected an @nki.jit kernel or a function"),
        (["run", ":double"], "FILE.py::KERNEL or MODULE:KERNEL"),
        (["run", "{f}::double", "--args", "x=128x64", "--seed", "-1"], "argument --seed"),
        (["run", "{f}::double", "--args", "x=4096x"], "--args: bad tensor 'x=4096x'"),
        (["run", "{f}::double", "--args", "x=-1x4"], "--args: bad tensor"),
        (["run", "{f}::double", "--args", "x=128X64"], "--args: bad tensor 'x=128X64'"),
        (["run", "{f}::double", "--args", "x=128*64:bfloat16"], "--args: bad tensor"),
        (["run", "{f}::double", "--args", "x=4x4,x=4x4"], "'x' is given twice"),
        (["run", "{f}::double", "--args", "x=4x4,,y=1"], "--args: an empty item"),
        (["run", "{f}::double", "--args", "x=99999999999x9999999"], "--args: a 99999999999x"),
        (["profile", "{f}::nl", "--launches"], "::nl: expected a function, got module"),
        # an empty value (an unset shell variable) was read as "not given" or as "."
        (["run", "{f}::double", "--args", "x=128x64", "--grid", ""], "--grid: expected sizes"),
        (["run", "{f}::double", "--args", "x=128x64", "--grid", "1_0"], "--grid: expected"),
        (["profile", "{f}::double", "--args", "x=128x64", "-o", ""], "-o/--out: expected a path"),
        (["compare", "a.json", "b.json", "--json", ""], "--json: expected a path"),
        (["compare", "a.json", "b.json", "--html", " "], "--html: expected a path"),
        (["compare", "", "b.json"], "argument a: expected a path"),
        (["new", "my_add", "-o", ""], "-o/--out: expected a path"),
        (["demo", "-o", ""], "-o/--out: expected a path"),
        (["lock", "org/k", "-o", ""], "-o/--out: expected a path"),
        (["lock", ""], "argument targets: expected a value"),
        (["publish", ""], "argument path: expected a path"),
        (["pull", "org/k", "--revision", ""], "--revision: expected a value"),
        (["pull", "org/k", "--cache-dir", ""], "--cache-dir: expected a path"),
        (["pull", "org/k", "--lockfile", ""], "--lockfile: expected a path"),
        (["pull", "org/k", "--endpoint", ""], "--endpoint: expected a value"),
        (["pull", "org/k", "--token", ""], "--token: expected a value"),
        # the demo's naive and fused kernels walk whole 128-row tiles: 100 rows ran, unchecked
        (["demo", "--shape", "100x64"], "--shape 100x64: the rows must be a positive multiple"),
        (["demo", "--shape", "0x64"], "the rows must be a positive multiple of 128"),
        (["demo", "--shape", "128x0"], "the columns must be at least 1"),
        (["demo", "--shape=-128x64"], "--shape: expected ROWSxCOLUMNS"),
        (["demo", "--target", "trn9"], "--target: unknown target 'trn9'"),
        (
            ["demo", "--shape", "128x65536", "--no-torch", "--no-share"],
            "--shape 128x65536: the demo's kernels cannot run at this shape: variants.py:",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(folder, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(folder)  # a command that wrongly runs writes in a temporary folder
    argv = [a.replace("{f}", str(folder / "mykernels.py")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in _one_line(err) and err.startswith("nkikit")


def test_a_python_error_in_the_kernel_is_one_line_at_the_users_line(folder):
    p = nkikit("run", "mykernels.py::typo", "--args", "x=128x64", cwd=folder)
    assert p.returncode == 1
    line = _one_line(p.stderr)
    where = f"mykernels.py:{_line('nl.exponential')}"
    assert line.startswith(f"error: {where}: AttributeError:") and "exponential" in line
    full = nkikit(
        "run", "mykernels.py::typo", "--args", "x=128x64", cwd=folder,
        env={"NKIKIT_FULL_TRACEBACK": "1"},
    )  # fmt: skip
    assert full.returncode == 1 and "Traceback" in full.stderr


def test_module_kernel_works_for_every_kernel_command(folder):
    env = {"PYTHONPATH": str(folder)}
    for argv in (
        ["run", "mykernels:double", "--args", "x=128x64"],
        ["ir", "mykernels:double", "--args", "x=128x64"],
        ["profile", "mykernels:double", "--args", "x=128x64", "--out", str(folder / "p")],
    ):
        p = nkikit(*argv, cwd=folder.parent, env=env)
        assert p.returncode == 0, p.stderr
    assert (folder / "p" / "profile.html").exists()


def test_an_spmd_kernel_run_without_its_grid_says_which_grid(folder):
    p = nkikit("run", "mykernels.py::halves", "--args", "x=256x64", cwd=folder)
    assert p.returncode == 0 and "nan=8192" in p.stdout
    line = _one_line(p.stderr)
    assert line.startswith(f"warning: mykernels.py:{_line('def halves')}: kernel halves writes")
    assert line.endswith("did you mean halves[2]?")
    p = nkikit("run", "mykernels.py::halves", "--args", "x=256x64", "--grid", "2", cwd=folder)
    assert p.returncode == 0 and "nan=0" in p.stdout and "did you mean" not in p.stderr


def test_a_rejected_kernel_is_one_line_with_its_name_and_line(folder, capsys):
    assert main(["run", f"{folder / 'mykernels.py'}::double", "--args", "x=256x64"]) == 1
    line = _one_line(capsys.readouterr().err)
    where = f"mykernels.py:{_line('nl.multiply(nl.load(x), 2.0)')}"
    assert line.startswith(f"error: {where}: err_num_partition_exceed_arch_limit")


def test_a_syntax_error_names_the_users_file_and_line(tmp_path):
    (tmp_path / "broken.py").write_text("import nkikit\ndef f(:\n    pass\n")
    p = nkikit("run", "broken.py::f", cwd=tmp_path)
    assert p.returncode == 1 and _one_line(p.stderr).startswith("error: broken.py:2: SyntaxError")


def test_random_bool_inputs_are_a_fair_coin():
    from nkikit.cli.options import materialize
    from nkikit.typing import TensorSpec

    (x,) = materialize([TensorSpec((128, 64), np.dtype(bool))], seed=0)
    assert 0.4 < x.mean() < 0.6  # (x * 10).astype(bool) made them all True


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
def test_random_unsigned_inputs_do_not_wrap_around(dtype):
    from nkikit.cli.options import materialize
    from nkikit.typing import TensorSpec

    (x,) = materialize([TensorSpec((128, 64), np.dtype(dtype))], seed=0)
    assert x.dtype == dtype and x.max() < 100 and x.mean() > 1  # -3 was 4294967293 in uint32


def test_running_an_nki_file_or_module_that_is_not_there_is_one_line(tmp_path):
    import subprocess
    import sys

    # in a process of its own: the `nki` alias it installs is not this test session's
    for args, message in (
        (["missing.py"], "no such file 'missing.py'"),
        (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "nkikit.nki", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 2 and message in _one_line(p.stderr)


def test_a_hub_port_out_of_range_is_refused(tmp_path):
    # 99999 was served as 34463 (modulo 65536) without a word
    p = nkikit("hub", "serve", "--root", str(tmp_path), "--port", "99999")
    assert p.returncode == 2 and "argument --port: expected a port 0-65535" in p.stderr


def test_compare_names_the_file_it_cannot_read_and_publish_all_the_empty_folder(tmp_path):
    (tmp_path / "a.json").write_text("{} {}")
    p = nkikit("compare", "a.json", "a.json", cwd=tmp_path)
    assert p.returncode == 1 and _one_line(p.stderr).startswith("error: a.json:")
    (tmp_path / "empty").mkdir()
    p = nkikit("publish", "empty", "--all", "--org", "o", "--no-tests", cwd=tmp_path)
    assert p.returncode == 1 and "no kernel folder" in _one_line(p.stderr)


@pytest.mark.parametrize(
    "argv, message",
    [
        # each named the path twice, or in Python's "[Errno 2] No such ... : 'x'" form
        (["compare", "missing.json", "a.json"], "error: missing.json: no such file or folder"),
        (["compare", "bad.json", "a.json"], "error: bad.json: not JSON (Expecting value at line 1"),
        (["compare", "a.json", "a.json"], "error: a.json: neither an nkikit profile nor"),
        (["lock"], "error: pyproject.toml: no such file or folder"),
    ],
)
def test_a_file_that_cannot_be_read_is_named_once_in_words(
    tmp_path, capsys, monkeypatch, argv, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "bad.json").write_text("garbage")
    assert main(argv) == 1
    assert _one_line(capsys.readouterr().err).startswith(message)


def test_run_prints_the_statistics_of_an_infinite_output_without_numpy_warnings(folder):
    # inf and -inf in one output: numpy's "invalid value encountered" came out as 2 lines
    p = nkikit("run", "mykernels.py::scale", "--args", "x=128x64,s=1e400", cwd=folder)
    assert p.returncode == 0 and "mean=nan min=-inf max=inf" in p.stdout and p.stderr == ""


def test_version(capsys):
    import nkikit

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"nkikit {nkikit.__version__}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["profile", "{f}::double", "--args", "x=128x64", "-o", "afile"], "afile is a file"),
        (["profile", "{f}::double", "--args", "x=128x64", "-o", "afile/sub"], "afile is a file"),
        (["profile", "{f}::double", "--launches", "--args", "x=128x64", "-o", "afile"], "afile"),
        (["new", "my_add", "-o", "afile"], "-o/--out: afile is a file, not a folder"),
        (["compare", "a.json", "b.json", "--json", "."], "--json: . is a folder, not a file"),
        (["compare", "a.json", "b.json", "--html", "afile/c.html"], "afile is a file"),
        (["lock", "org/k", "-o", "afile/kernels.lock"], "afile is a file"),
        (["demo", "-o", "afile"], "-o/--out: afile is a file, not a folder"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_a_usage_error(
    folder, capsys, monkeypatch, argv, message
):
    # pathlib's own error came out after the work, as "error: pathlib.py:1116: ..."
    monkeypatch.chdir(folder)
    (folder / "afile").write_text("")
    assert main([a.replace("{f}", str(folder / "mykernels.py")) for a in argv]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"nkikit {argv[0]}: error: ") and message in line


def test_an_output_folder_without_permission_is_a_usage_error(folder, capsys, monkeypatch):
    import os

    monkeypatch.chdir(folder)
    # the tests may run as root, for whom every folder is writable: os.access says no instead
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    assert main(["new", "my_add", "-o", "locked/inner"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.endswith(
        f"-o/--out: locked/inner: {folder}: cannot write in this folder (permission denied)"
    )


def test_a_path_error_while_writing_names_the_path_in_words(tmp_path, capsys):
    from nkikit.cli import run_command

    (tmp_path / "afile").write_text("")
    # a real pathlib error; pathlib's frame was shown as if it were the user's line
    assert run_command("nkikit x", lambda: (tmp_path / "afile" / "sub").mkdir(parents=True)) == 1
    assert _one_line(capsys.readouterr().err) == (
        f"error: {tmp_path / 'afile' / 'sub'}: a part of it is a file, not a folder"
    )


def test_profile_launches_of_a_function_that_launches_no_kernel_is_an_error(folder, capsys):
    # it wrote a report of the host call alone, without a word
    (folder / "calls.py").write_text("def no_kernel(x):\n    return x\n")
    out = folder / "report"
    argv = ["profile", f"{folder / 'calls.py'}::no_kernel", "--launches", "--args", "x=128x64"]
    assert main([*argv, "-o", str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: calls.py:1: no_kernel() launched no NKI kernel")
    assert not out.exists()


@pytest.mark.parametrize(
    "name, message",
    [
        # each was created, then failed in its tests or at publish (or broke `import json`)
        ("héllo", "ASCII letters, digits and _"),
        ("a", "ending with a letter or digit"),  # the Hub's kernel names have two characters
        ("_x", "starting with a letter"),
        ("x_", "ending with a letter or digit"),
        ("class", "is a Python keyword"),
        ("kernel", "is the name of a module in the kernel folder"),
        ("json", "is the name of an installed Python module"),
        ("numpy", "is the name of an installed Python module"),
    ],
)
def test_new_refuses_a_name_the_scaffold_cannot_use(tmp_path, capsys, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    assert main(["new", name]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("nkikit new: error: NAME") and message in line
    assert not list(tmp_path.iterdir())


def test_a_file_not_found_error_with_a_message_of_its_own_is_one_line(capsys):
    from nkikit.cli import run_command

    def fail() -> None:
        raise FileNotFoundError("no kernel.toml in the folder")

    assert run_command("nkikit x", fail) == 1
    assert _one_line(capsys.readouterr().err) == "error: no kernel.toml in the folder"
