"""The real HF `kernels` package loads what nkikit publishes, and agrees on digests.

`kernels` is imported in a subprocess: it reads HF_ENDPOINT at import time.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nkikit.registry.pull import pull

try:
    importlib.metadata.version("kernels")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("HF `kernels` is not installed", allow_module_level=True)

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    import torch
    from kernels import get_kernel
    from kernels._rust import Digest, Metadata

    k = get_kernel("nkikit/tiny-rmsnorm", version=1, backend="cpu", trust_remote_code=True)
    x, w = np.load(sys.argv[1]), np.load(sys.argv[2])
    y = k.rmsnorm(torch.from_numpy(x), torch.from_numpy(w), eps=1e-5)
    np.save(sys.argv[3], y.numpy())
    variant = Path(k.__file__).parent
    meta = Metadata.read_from_file(variant / "metadata.json")
    meta.digest.validate(Digest.hash_variant(meta.digest.algorithm, variant))  # raises on mismatch
    print(json.dumps({"module": k.__name__, "all": list(k.__all__), "variant": variant.name,
                      "op": str(getattr(torch.ops, k.__name__).rmsnorm.default._schema)}))
    """
)


def test_hf_kernels_get_kernel(tiny_repo, hub_url: str, tmp_path: Path, cache_dir: Path) -> None:  # noqa: ANN001
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    }
    env.update(HF_ENDPOINT=hub_url, HF_HUB_CACHE=str(tmp_path / "hf-kernels-cache"))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            str(tmp_path / "x.npy"),
            str(tmp_path / "w.npy"),
            str(tmp_path / "y.npy"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["module"] == tiny_repo.variants["torch-cpu"] and info["variant"] == "torch-cpu"
    assert info["all"] == ["rmsnorm", "add_sub"]
    assert info["op"].startswith(f"{info['module']}::rmsnorm(Tensor x, Tensor weight, float eps=")
    ours = pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), ours.rmsnorm(x, w, eps=1e-5))
