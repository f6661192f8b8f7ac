"""The everyday path as a user types it: `nkikit new` -> `nkikit test` (pytest options pass
through, the summary line always shows) -> `nkikit publish` to the offline hub -> the card's
usage snippet, run as written; and `nkikit demo` honouring its own options."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from clihelp import nkikit

from nkikit.hub import running_hub
from nkikit.registry.build import build_kernel

SUMMARY = re.compile(r"\b\d+ passed\b.* in [\d.]+s")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("new")
    for name, dialect in (("my_add", "beta1"), ("my_add0x", "nki")):
        p = nkikit("new", name, "--dialect", dialect, cwd=root)
        assert p.returncode == 0, p.stderr
        assert f"created {name}/" in p.stdout
    return root


def test_new_refuses_a_bad_name_or_an_existing_folder(made):
    for argv, message in ((["new", "My-Add"], "lowercase Python identifier"), (["new", "my_add"], "already exists")):  # fmt: skip
        p = nkikit(*argv, cwd=made)
        assert p.returncode == 2 and message in p.stderr


@pytest.mark.parametrize("name", ["my_add", "my_add0x"])
def test_a_new_kernel_passes_its_tests_as_created(made, name):
    p = nkikit("test", name, cwd=made)
    assert p.returncode == 0, p.stdout[-2000:]
    assert SUMMARY.search(p.stdout.strip().splitlines()[-1]) and "2 passed" in p.stdout


def test_pytest_options_pass_through_and_the_summary_line_always_shows(made):
    p = nkikit("test", "my_add", "-k", "manifest", "-x", "-p", "no:cacheprovider", cwd=made)
    assert p.returncode == 0, p.stdout[-2000:]
    last = p.stdout.strip().splitlines()[-1]
    assert SUMMARY.search(last) and "1 deselected" in last
    # inside a project whose pytest config already says -q, one more -q must not hide it
    (made / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-q"\n')
    try:
        p = nkikit("test", "my_add", "-q", "-k", "manifest", cwd=made)
    finally:
        (made / "pyproject.toml").unlink()
    assert p.returncode == 0 and SUMMARY.search(p.stdout.strip().splitlines()[-1])
    p = nkikit("test", "my_add", "-k", "no_such_test", cwd=made)
    assert p.returncode == 5  # pytest's own exit code: nothing collected


def test_a_new_kernel_publishes_and_its_card_snippet_runs_for_any_org(made, tmp_path):
    with running_hub(tmp_path / "hub") as url:
        p = nkikit("publish", "my_add", "--repo", "acme/my_add", "--endpoint", url, cwd=made)
        assert p.returncode == 0, p.stderr + p.stdout
        assert "acme/my_add v1: v1 @" in p.stdout
        card = build_kernel(made / "my_add", tmp_path / "b", "acme/my_add").root / "README.md"
        usage = card.read_text().split("## Usage", 1)[1].split("```python", 1)[1].split("```")[0]
        assert "trust_remote_code=True" in usage
        script = tmp_path / "use.py"
        script.write_text(
            "import numpy as np\na = b = np.ones((256, 512), np.float32)\n"
            + textwrap.dedent(usage)
            + "assert (out == 2).all(), out\nprint('ok')\n"
        )
        p = nkikit_python(script, url, tmp_path)
        assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def nkikit_python(script: Path, url: str, tmp_path: Path):
    import os
    import subprocess
    import sys

    from clihelp import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("NKIKIT_TRUSTED")}
    env.update(HF_ENDPOINT=url, HF_HUB_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_demo_checks_numerics_at_its_shape_and_dtype_and_lists_every_report(tmp_path):
    # 384 rows: the numerics check takes 256 of them (300 rows ran the naive and fused kernels
    # on 256 only, since they walk whole 128-row tiles; the demo now refuses such a shape)
    p = nkikit(
        "demo", "--shape", "384x256", "--dtype", "float32", "--no-share", "--out", str(tmp_path)
    )
    assert p.returncode == 0, p.stderr
    assert "match numpy on 256x256 float32" in p.stdout
    assert "RMSNorm 384x256 float32" in p.stdout
    reports = sorted(tmp_path.glob("*.html"))
    line = " ".join(p.stdout.split("Reports:", 1)[1].split())
    assert len(reports) >= 7 and all(
        str(r) in line.replace(" ", "") or r.name in line for r in reports
    )
