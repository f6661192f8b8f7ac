"""The sharing demo: a private Hub on loopback, publish the library's rmsnorm, pull it, use it.

`sharing_demo(out_dir)` is what `nkikit demo` runs for the registry part: everything happens
under `out_dir` (hub storage, HF cache), nothing touches the network beyond 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DEMO_REPO = "nkikit/rmsnorm"


def library_kernel_dir(name: str) -> Path:
    """The folder of library kernel `name` (nkikit.library, i.e. the repo's kernels/ folder).

    Raises FileNotFoundError if the library is not installed with its sources.
    """
    spec = importlib.util.find_spec("nkikit.library")
    roots = list(spec.submodule_search_locations or []) if spec else []
    roots.append(str(Path(__file__).resolve().parents[2] / "kernels"))  # a source checkout
    for root in roots:
        folder = Path(root) / name
        if (folder / "kernel.toml").is_file():
            return folder
    raise FileNotFoundError(f"library kernel {name!r} not found (looked in {', '.join(roots)})")


def sharing_demo(
    out_dir: str | Path,
    *,
    kernel_dir: str | Path | None = None,
    run_tests: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Start a local hub, publish rmsnorm, pull it and run it inside a small torch module.

    Prints a few lines through `echo` and returns what happened (url, commit, timings, max
    error vs the numpy reference). Without torch the last step runs on numpy arrays.
    Raises whatever publish/pull raise (see nkikit.kernels).
    """
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    from nkikit.hub import running_hub

    from .publish import publish
    from .pull import pull

    out = Path(out_dir)
    folder = Path(kernel_dir) if kernel_dir is not None else library_kernel_dir("rmsnorm")
    result: dict[str, Any] = {}
    disable_progress_bars()
    try:
        # The demo's own throw-away hub: nkikit/* is writable there (not reserved), and the pull
        # trusts it for this call only (trust is tied to an endpoint; see trust.py).
        with running_hub(out / "hub", reserved_namespaces=()) as url:
            echo(f"local hub at {url} (storage: {out / 'hub'})")
            t0 = time.perf_counter()
            pub = publish(folder, DEMO_REPO, endpoint=url, run_tests=run_tests)
            result["publish_s"] = time.perf_counter() - t0
            echo(
                f"published {pub.repo_id} v{pub.version} -> branch {pub.branch} @ {pub.commit[:12]} "
                f"({', '.join(pub.variants)}) in {result['publish_s']:.2f} s"
            )
            t0 = time.perf_counter()
            k = pull(
                DEMO_REPO,
                version=pub.version,
                endpoint=url,
                cache_dir=out / "cache",
                trust_remote_code=True,
            )
            result["pull_s"] = time.perf_counter() - t0
            echo(
                f"pulled {k!r} in {result['pull_s'] * 1e3:.0f} ms; every file verified against the commit's tree"
            )
            result.update(url=url, commit=pub.commit, namespace=k.namespace)
    finally:
        enable_progress_bars()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 64)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    try:
        import torch
    except ImportError:
        y = np.asarray(k.rmsnorm(x, w))
        echo("torch not installed: ran the kernel on numpy arrays")
    else:

        class Block(torch.nn.Module):
            """A residual block whose norm is the pulled kernel."""

            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.from_numpy(w))

            def forward(self, h: torch.Tensor) -> torch.Tensor:
                return k.rmsnorm(h, self.weight)

        with torch.no_grad():
            y = Block()(torch.from_numpy(x)).numpy()
        echo(
            f"ran it in a torch module as torch.ops.{k.namespace}.rmsnorm on a {tuple(x.shape)} input"
        )
    result["max_abs_error"] = float(np.abs(y - expected).max())
    echo(f"max |kernel - numpy reference| = {result['max_abs_error']:.2e}")
    return result
