"""kernels.lock round-trips between nkikit and the real HF `kernels` package (>= 0.17).

HF `kernels` runs in a subprocess (it reads HF_ENDPOINT at import time) against a hub of its own
that reports `nkikit` as a trusted kernel publisher, which `kernels lock` insists on.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubfixtures import TINY

from nkikit.hub import running_hub
from nkikit.registry.lock import lock
from nkikit.registry.publish import PublishResult, publish
from nkikit.registry.pull import pull

try:
    importlib.metadata.version("kernels")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("HF `kernels` is not installed", allow_module_level=True)

REPO = "nkikit/tiny-rmsnorm"


@pytest.fixture(scope="module")
def trusted_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, PublishResult]]:
    root = tmp_path_factory.mktemp("trusted-hub")
    with running_hub(root, trusted_orgs=["nkikit"], reserved_namespaces=()) as url:
        yield url, publish(TINY, REPO, endpoint=url, run_tests=False)


def _hf_kernels(code: str, url: str, cwd: Path, *args: str) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    }
    env.update(HF_ENDPOINT=url, HF_HUB_CACHE=str(cwd / "hf-kernels-cache"))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_hf_kernels_loads_with_the_lockfile_nkikit_writes(
    trusted_hub: tuple[str, PublishResult], tmp_path: Path
) -> None:
    url, published = trusted_hub
    path = tmp_path / "kernels.lock"
    lock([REPO], path, endpoint=url)
    out = _hf_kernels(
        """
        import json, sys
        from pathlib import Path
        from kernels import get_locked_kernel
        from kernels._rust import KernelLocks

        locks = KernelLocks.from_json(Path(sys.argv[1]).read_text())
        k = get_locked_kernel("nkikit/tiny-rmsnorm", lockfile=Path(sys.argv[1]))
        # str(): kernels 0.19 gives the commit as an Oid object
        print(json.dumps({"commits": [str(lk.commit) for lk in locks.values()],
                          "file": k.__file__, "all": list(k.__all__)}))
        """,
        url,
        tmp_path,
        str(path),
    )
    info = json.loads(out.strip().splitlines()[-1])
    assert info["commits"] == [published.commit]
    assert published.commit in info["file"]  # the snapshot of the locked commit
    assert "rmsnorm" in info["all"]


def test_nkikit_pull_honours_the_lockfile_kernels_lock_writes(
    trusted_hub: tuple[str, PublishResult], tmp_path: Path, cache_dir: Path
) -> None:
    url, published = trusted_hub
    (tmp_path / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{REPO}" = 1\n')
    _hf_kernels(
        # the `kernels` console script, wherever the installed release keeps it (kernels.cli
        # until 0.18, kernels._internals.cli from 0.19)
        "import sys; from importlib.metadata import entry_points; "
        "main = entry_points(group='console_scripts')['kernels'].load(); "
        "sys.argv = ['kernels', 'lock', sys.argv[1]]; main()",
        url,
        tmp_path,
        str(tmp_path),
    )
    path = tmp_path / "kernels.lock"
    assert json.loads(path.read_text())[0]["lock"]["commit"] == published.commit
    k = pull(REPO, lockfile=path, endpoint=url, cache_dir=cache_dir, trust_remote_code=True)
    assert k.revision == published.commit
    # and nkikit writes the same file for the same project
    lock(tmp_path, tmp_path / "nkikit.lock", endpoint=url)
    assert json.loads((tmp_path / "nkikit.lock").read_text()) == json.loads(path.read_text())
