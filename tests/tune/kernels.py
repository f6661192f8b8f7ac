"""Small kernels whose best meta-parameters are known, for the autotuning tests (one per
dialect), and the sweep task functions the sweep tests run (importable by Ray workers)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import nkikit as nki
import nkikit.language as nl
import nkikit.nki as nki0x
import nkikit.nki.isa as nisa0x
import nkikit.nki.language as nl0x


@nki.jit
def scale_kernel(x, rows=128, cols=512):
    """``2 * x`` in [rows, cols] tiles.  Larger DMAs cost less per byte, so for a shape both
    divide the widest tile that fits the partitions is fastest; rows > 128 breaks the
    partition limit; a ``cols`` that does not divide the width leaves the tail unwritten."""
    n, m = x.shape
    out = nl.ndarray((n, m), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(rows)[:, None]
    i_f = nl.arange(cols)[None, :]
    for r in nl.affine_range(n // rows):
        for c in nl.affine_range(m // cols):
            t = nl.load(x[r * rows + i_p, c * cols + i_f])
            nl.store(out[r * rows + i_p, c * cols + i_f], value=nl.multiply(t, 2.0))
    return out


@nki0x.jit
def scale_kernel_0x(x, cols=512):
    """The same in NKI 0.x: ``2 * x`` in [128, cols] tiles."""
    n, m = x.shape
    out = nl0x.ndarray((n, m), dtype=x.dtype, buffer=nl0x.shared_hbm)
    for r in range(n // 128):
        for c in range(m // cols):
            t = nl0x.ndarray((128, cols), dtype=x.dtype, buffer=nl0x.sbuf)
            nisa0x.dma_copy(dst=t, src=x[r * 128 : (r + 1) * 128, c * cols : (c + 1) * cols])
            nisa0x.tensor_scalar(dst=t, data=t, op0=nl0x.multiply, operand0=2.0)
            nisa0x.dma_copy(dst=out[r * 128 : (r + 1) * 128, c * cols : (c + 1) * cols], src=t)
    return out


# -- sweep task functions -----------------------------------------------------------------------


def square(x: int) -> dict:
    """A pure task: the same inputs give the same result on every backend."""
    return {"x": x, "square": x * x, "pair": (x, -x)}


def fails_once(marker: str, x: int) -> int:
    """Raises on its first attempt (a transient failure), succeeds on the second."""
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once")
        raise RuntimeError("transient failure")
    return x + 1


def always_fails(x: int) -> int:
    """A deterministic failure: every attempt raises."""
    raise ValueError(f"bad input {x}")


def dies_once(marker: str, x: int) -> int:
    """Kills its own worker process (SIGKILL: no cleanup, as when a node is lost) the first
    time it runs; the retried task finds the marker and returns."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 10


def slow_square(x: int, seconds: float, starts: str) -> int:
    """Takes ``seconds`` (so that a node can be removed while tasks run on it); records each
    start as a file ``<x>-<pid>`` holding the Ray node id it runs on, in the folder ``starts``
    (a task started twice was run again)."""
    import time

    import ray

    node = ray.get_runtime_context().get_node_id()
    (Path(starts) / f"{x}-{os.getpid()}").write_text(node)
    time.sleep(seconds)
    return x * x
