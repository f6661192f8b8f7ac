"""Simulator speed benchmark: nkikit (cold and warm) against numpy, torch and Triton's interpreter.

Run ``python -m benchmarks.sim`` (full sizes; several minutes, Triton dominates) or
``python -m benchmarks.sim --quick`` (small sizes, 2 repeats: a smoke test).  Results go to
``benchmarks/sim/results.json`` (machine-readable) and ``benchmarks/sim/results.md`` (the
table for the README) unless ``--out`` names another folder.

What is timed, per kernel, size and dtype, all on the same input arrays:

* ``cold``: the kernel's specialization cache is cleared, then one user call
  ``kernel(*arrays)``: trace + verify + (fast path) compile + run + result conversion.
* ``warm``: the same call with the specialization cached.
* ``ref``: a warm call on the reference interpreter (``nkikit.sim.interp``).
* ``numpy``: the same math in plain numpy (``benchmarks.sim.kernels.numpy_*``).
* ``torch``: the same math in torch eager on CPU, if torch is installed.
* ``triton``: the same algorithm as Triton kernels (``benchmarks.peers``) with the NKI
  kernel's tile sizes, under ``TRITON_INTERPRET=1``, if triton is installed.  Each of its
  ``--triton-repeats`` runs follows a warm nkikit call, and the Triton ratio is taken from
  those pairs.  With ``--triton-budget S``, a probe at a smaller size predicts the full-size
  time, and a run predicted over S seconds is extrapolated from the probe instead (marked).

Times are medians over ``--repeats`` runs; the candidates take turns within each repeat so
a change of machine load hits them alike.  Peak memory is tracemalloc's peak during one warm
call, over the bytes of the inputs plus the outputs.  The whole run is single-process; BLAS
threading is whatever threadpoolctl reports (recorded in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ml_dtypes  # noqa: E402

import nkikit.sim.interp as _interp  # noqa: E402
from benchmarks.sim import kernels as K  # noqa: E402
from nkikit.sim import fast as _fast  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"fp32": np.dtype(np.float32), "bf16": BF16}


# ---------------------------------------------------------------------------------------------
# cases


@dataclass
class Case:
    """One kernel at one size: how to make inputs and run each candidate on them."""

    name: str
    size: dict[str, int]
    label: str
    make: Callable[[np.random.Generator, np.dtype], tuple]
    nki: Any  # the @nki.jit kernel
    numpy: Callable[..., np.ndarray]
    torch: Callable[..., Any] | None
    triton: str | None  # function name in benchmarks.peers.triton_kernels
    work: float  # relative amount of work, to scale Triton's probe time
    probe: Case | None = field(default=None, repr=False)


def _norm_inputs(rows: int, cols: int, extra: int):
    def make(rng: np.random.Generator, dt: np.dtype) -> tuple:
        x = rng.standard_normal((rows, cols), dtype=np.float32).astype(dt)
        vecs = tuple(rng.standard_normal(cols, dtype=np.float32).astype(dt) for _ in range(extra))
        return (x, *vecs)

    return make


def _torch_rmsnorm(x, w, eps):
    import torch

    xf, wf = x.float(), w.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * wf).to(x.dtype)


def _torch_softmax(x):
    import torch

    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def _torch_layernorm(x, g, b, eps):
    import torch

    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), g.float(), b.float(), eps).to(
        x.dtype
    )


def _torch_matmul(a, b):
    return (a.float().T @ b.float()).to(a.dtype)


def _torch_attention(q, k, v):
    import torch

    o = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True
    )
    return o.to(q.dtype)


def make_case(name: str, size: dict[str, int]) -> Case:
    if name in ("rmsnorm", "softmax", "layernorm"):
        r, c = size["rows"], size["cols"]
        label = f"{r}x{c}"
        work = float(r * c)
        if name == "rmsnorm":
            return Case(
                name,
                size,
                label,
                _wrap(_norm_inputs(r, c, 1), (1e-6,)),
                K.rmsnorm_kernel,
                K.numpy_rmsnorm,
                _torch_rmsnorm,
                "run_rmsnorm",
                work,
            )
        if name == "softmax":
            return Case(
                name,
                size,
                label,
                _norm_inputs(r, c, 0),
                K.softmax_kernel,
                K.numpy_softmax,
                _torch_softmax,
                "run_softmax",
                work,
            )
        return Case(
            name,
            size,
            label,
            _wrap(_norm_inputs(r, c, 2), (1e-5,)),
            K.layernorm_kernel,
            K.numpy_layernorm,
            _torch_layernorm,
            "run_layernorm",
            work,
        )
    if name == "matmul":
        n = size["n"]

        def make(rng, dt):
            return tuple(rng.standard_normal((n, n), dtype=np.float32).astype(dt) for _ in range(2))

        return Case(
            name,
            size,
            f"{n}^3",
            make,
            K.matmul_kernel,
            K.numpy_matmul,
            _torch_matmul,
            "run_matmul",
            float(n) ** 3,
        )
    if name == "libmatmul":
        from kernels.matmul import kernel as lib

        n = size["n"]

        def make_lib(rng, dt):
            a, b = (rng.standard_normal((n, n), dtype=np.float32).astype(dt) for _ in range(2))
            return a, b, "float32" if dt == np.float32 else "bfloat16"

        return Case(
            name,
            size,
            f"{n}^3",
            make_lib,
            lib.matmul_kernel,
            lambda a, b, _dt: K.numpy_matmul(a, b),
            lambda a, b, _dt: _torch_matmul(a, b),
            "run_matmul",
            float(n) ** 3,
        )
    if name == "attention":
        h, s, d = size["heads"], size["seq"], size["dim"]

        def make(rng, dt):
            return tuple(
                rng.standard_normal((h, s, d), dtype=np.float32).astype(dt) for _ in range(3)
            )

        return Case(
            name,
            size,
            f"h{h} s{s} d{d} causal",
            make,
            K.attention_kernel,
            K.numpy_attention,
            _torch_attention,
            "run_attention",
            float(h) * s * s * d,
        )
    raise KeyError(name)


def _wrap(make, scalars: tuple):
    def inner(rng, dt):
        return (*make(rng, dt), *scalars)

    return inner


FULL = {
    "rmsnorm": [{"rows": 4096, "cols": 4096}],
    "softmax": [{"rows": 4096, "cols": 4096}],
    "layernorm": [{"rows": 4096, "cols": 4096}],
    "matmul": [{"n": 1024}, {"n": 2048}],
    "libmatmul": [{"n": 2048}],
    "attention": [{"heads": 8, "seq": 2048, "dim": 128}],
}
QUICK = {
    "rmsnorm": [{"rows": 512, "cols": 1024}],
    "softmax": [{"rows": 512, "cols": 1024}],
    "layernorm": [{"rows": 512, "cols": 1024}],
    "matmul": [{"n": 512}],  # the kernel tiles N by 512: a smaller n writes nothing
    "libmatmul": [{"n": 512}],
    "attention": [{"heads": 2, "seq": 512, "dim": 128}],
}
# Triton's probe sizes: its interpreter's time grows with the number of programs (rows for
# the norms) and with the work per program, so a probe keeps the full row length.
PROBE = {
    "rmsnorm": {"rows": 256, "cols": 4096},
    "softmax": {"rows": 256, "cols": 4096},
    "layernorm": {"rows": 256, "cols": 4096},
    "matmul": {"n": 512},
    "libmatmul": {"n": 512},
    "attention": {"heads": 1, "seq": 1024, "dim": 128},
}
TINY = {
    "rmsnorm": [{"rows": 128, "cols": 256}],
    "softmax": [{"rows": 128, "cols": 256}],
    "layernorm": [{"rows": 128, "cols": 512}],
    "matmul": [{"n": 512}],
    "libmatmul": [{"n": 512}],
    "attention": [{"heads": 1, "seq": 512, "dim": 64}],
}


# ---------------------------------------------------------------------------------------------
# candidates


@contextlib.contextmanager
def simulator(name: str):
    """Route ``@nki.jit`` calls to one simulator.  ``nkikit.trace.jit.run`` looks up
    ``nkikit.sim.interp.simulate`` (or ``nkikit.sim.simulate``, which reads NKIKIT_SIM) at
    call time, so both are set for the duration."""
    ref = _REF_SIMULATE
    old_env = os.environ.get("NKIKIT_SIM")
    os.environ["NKIKIT_SIM"] = name
    _interp.simulate = _fast.simulate if name == "fast" else ref
    try:
        yield
    finally:
        _interp.simulate = ref
        if old_env is None:
            os.environ.pop("NKIKIT_SIM", None)
        else:
            os.environ["NKIKIT_SIM"] = old_env


_REF_SIMULATE = _interp.simulate


def _clear(jk) -> None:
    jk._cache.clear()
    _fast._CACHE.clear()


def _timeit(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _to_torch(a):
    import torch

    if isinstance(a, np.ndarray):
        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    return a


def _from_torch(t) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _peak(fn: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _nbytes(x) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, tuple | list):
        return sum(_nbytes(y) for y in x)
    return 0


def _close(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> float:
    """Largest absolute difference (fp32) between two results."""
    d = np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))
    return float(np.nanmax(d)) if d.size else 0.0


def triton_available() -> str | None:
    """None when Triton (and torch) can run, else why not."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch not installed"
    try:
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return "not installed"
    except Exception:  # pragma: no cover - broken installs
        return "not installed"
    return None


_TRITON = None


def _triton_module():
    global _TRITON
    if _TRITON is None:
        os.environ["TRITON_INTERPRET"] = "1"
        from benchmarks.peers import triton_kernels

        _TRITON = triton_kernels
    return _TRITON


def bench_case(
    case: Case,
    dt_name: str,
    repeats: int,
    triton_budget: float,
    use_torch: bool,
    use_triton: bool,
    log: Callable[[str], None],
    triton_repeats: int = 1,
) -> dict:
    dt = DTYPES[dt_name]
    rng = np.random.default_rng(0)
    args = case.make(rng, dt)
    jk = case.nki
    row: dict[str, Any] = {
        "kernel": case.name,
        "size": case.label,
        "dtype": dt_name,
        "params": case.size,
    }

    # correctness first: the fast path must equal the reference bit for bit
    with simulator("reference"):
        _clear(jk)
        ref_out = jk(*args)
    with simulator("fast"):
        _clear(jk)
        fast_out = jk(*args)
    row["fast_equals_reference"] = bool(
        np.array_equal(
            np.asarray(ref_out, np.float64), np.asarray(fast_out, np.float64), equal_nan=True
        )
    )
    np_out = case.numpy(*args)
    row["max_abs_diff_vs_numpy"] = _close(fast_out, np_out, dt)

    # trace + verify alone (cache cleared each time)
    tv = []
    for _ in range(max(3, repeats)):
        _clear(jk)
        tv.append(_timeit(lambda: jk.specialize(*args)))
    row["trace_verify_s"] = statistics.median(tv)
    kern, _ = jk.specialize(*args)
    t = time.perf_counter()
    _fast.compile_kernel(kern)
    row["fast_compile_s"] = time.perf_counter() - t
    row["ir_ops"] = sum(1 for _ in kern.ops())

    times: dict[str, list[float]] = {
        "cold": [],
        "warm": [],
        "sim": [],
        "ref": [],
        "numpy": [],
        "torch": [],
    }
    # the simulator alone: the cached program on arrays already in the kernel's dtypes, without
    # the @nki.jit call's argument conversion and its defensive copies of the inputs
    sim_arrays = [a for a in args if isinstance(a, np.ndarray)]
    targs = [_to_torch(a) for a in args] if use_torch else None
    if use_torch:
        import torch

        row["torch_threads"] = torch.get_num_threads()
    for _ in range(repeats):
        with simulator("fast"):
            _clear(jk)
            times["cold"].append(_timeit(lambda: jk(*args)))
            jk(*args)  # untimed: the first cached call still warms numpy's allocator
            times["warm"].append(_timeit(lambda: jk(*args)))
        times["numpy"].append(_timeit(lambda: case.numpy(*args)))
        times["sim"].append(_timeit(lambda: _fast.simulate(kern, sim_arrays)))
        with simulator("reference"):
            jk(*args) if not jk._cache else None
            times["ref"].append(_timeit(lambda: jk(*args)))
        if use_torch:
            times["torch"].append(_timeit(lambda: case.torch(*targs)))
    for key, ts in times.items():
        row[f"{key}_s"] = statistics.median(ts) if ts else None
    # warm and numpy ran back to back in every repeat (A, B, A, B ...): their medians form the
    # ratio, and the spread of the per-repeat ratios shows what the machine's load did to it
    pairs = [w / n for w, n in zip(times["warm"], times["numpy"])]
    row["warm_numpy_pairs"] = {"n": len(pairs), "min": min(pairs), "max": max(pairs)}

    io_bytes = _nbytes(args) + _nbytes(np_out)
    row["io_bytes"] = io_bytes
    with simulator("fast"):
        jk(*args)
        row["peak_fast_bytes"] = _peak(lambda: jk(*args))
    with simulator("reference"):
        row["peak_ref_bytes"] = _peak(lambda: jk(*args))
    row["peak_numpy_bytes"] = _peak(lambda: case.numpy(*args))

    if use_triton:

        def warm() -> None:
            with simulator("fast"):
                jk(*args)

        row.update(_bench_triton(case, args, dt, triton_budget, log, np_out, triton_repeats, warm))
    else:
        row["triton_s"] = None
        row["triton_note"] = triton_available() or "skipped"
    log(_row_summary(row))
    return row


def triton_runner(case: Case) -> Callable[..., Any]:
    """The Triton version of ``case`` with the NKI kernel's tile sizes: matmul tiles of
    128 (M) x 512 (N) x 128 (K) as ``nc_matmul`` takes them, and attention blocks of 128
    queries x 128 keys as the NKI kernel's.  The norms run one program per row over the whole
    row (the NKI kernels hold 128 whole rows per tile)."""
    tk = _triton_module()
    if case.name in ("matmul", "libmatmul"):

        def run_matmul(lhsT, rhs, *_):  # noqa: N803
            k, m = lhsT.shape
            n = rhs.shape[1]
            out = _torch_empty((m, n), lhsT.dtype)
            grid = (m // 128, n // 512)
            tk._matmul[grid](lhsT, rhs, out, m, n, k, BM=128, BN=512, BK=128)
            return out

        return run_matmul
    if case.name == "attention":

        def run_attention(q, k, v):
            h, seq, d = q.shape
            out = _torch_empty(tuple(q.shape), q.dtype)
            scale = 1.0 / math.sqrt(d)
            tk._attention[(seq // 128, h)](q, k, v, out, seq, scale, D=d, BM=128, BN=128)
            return out

        return run_attention
    return getattr(tk, case.triton)


def _torch_empty(shape: tuple, dtype):
    import torch

    return torch.empty(shape, dtype=dtype)


def _bench_triton(
    case: Case,
    args: tuple,
    dt: np.dtype,
    budget: float,
    log,
    np_out,
    repeats: int,
    warm: Callable[[], Any],
) -> dict:
    """Triton's interpreter timed in pairs with the warm nkikit call (warm, triton, warm,
    triton ...): the ratio is the median of one side over the median of the other, both from
    this run.  With a ``budget`` (seconds), a probe predicts the time first, and if one run
    would exceed it the probe's time scaled by the work ratio is reported instead, marked as
    extrapolated."""
    fn = triton_runner(case)
    out: dict[str, Any] = {}
    probe = case.probe
    if budget and probe is not None and probe.size != case.size:
        pargs = [_to_torch(a) for a in probe.make(np.random.default_rng(0), dt)]
        fn(*pargs)  # the first call fills the interpreter's caches
        t_probe = statistics.median(_timeit(lambda: fn(*pargs)) for _ in range(2))
        predicted = t_probe * case.work / probe.work
        out["triton_probe"] = {"size": probe.label, "s": t_probe}
        if predicted > budget:
            out["triton_s"] = predicted
            out["triton_note"] = (
                f"extrapolated from {probe.label} ({t_probe:.2f} s) by work ratio "
                f"{case.work / probe.work:.0f}x; a full run was predicted to exceed the "
                f"{budget:.0f} s budget"
            )
            out["triton_extrapolated"] = True
            return out
    targs = [_to_torch(a) for a in args]
    got: list = []
    tri, nki_warm = [], []
    for _ in range(repeats):
        nki_warm.append(_timeit(warm))
        tri.append(_timeit(lambda: got.append(fn(*targs))))
    res = _from_torch(got[0])  # checked against numpy below
    out["triton_s"] = statistics.median(tri)
    out["triton_warm_s"] = statistics.median(nki_warm)
    ratios = [t / w for t, w in zip(tri, nki_warm)]
    out["triton_pairs"] = {"n": len(ratios), "min": min(ratios), "max": max(ratios)}
    out["triton_note"] = f"measured, {repeats} run(s) paired with warm nkikit calls"
    out["triton_extrapolated"] = False
    out["triton_max_abs_diff_vs_numpy"] = _close(res, np_out, dt)
    return out


def _row_summary(r: dict) -> str:
    def f(x):
        return "-" if x is None else f"{x:.4f}"

    return (
        f"{r['kernel']:10s} {r['size']:22s} {r['dtype']}  cold {f(r['cold_s'])}  warm {f(r['warm_s'])}  "
        f"ref {f(r['ref_s'])}  numpy {f(r['numpy_s'])}  torch {f(r.get('torch_s'))}  "
        f"triton {f(r.get('triton_s'))}  same={r['fast_equals_reference']}"
    )


def call_overhead(repeats: int = 2000) -> dict:
    """What a cached ``@nki.jit`` call adds to the simulation itself, on a tiny kernel."""
    import nkikit as nki
    import nkikit.language as nl

    @nki.jit
    def tiny_copy(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a))
        return out

    a = np.ones((128, 4), dtype=np.float32)
    res = {}
    for name in ("fast", "reference"):
        with simulator(name):
            tiny_copy(a)
            kern, _ = tiny_copy.specialize(a)
            sim = _fast.simulate if name == "fast" else _REF_SIMULATE
            call = [_timeit(lambda: tiny_copy(a)) for _ in range(repeats)]
            direct = [_timeit(lambda s=sim, k=kern: s(k, [a.copy()])) for _ in range(repeats)]
            spec = [_timeit(lambda: tiny_copy.specialize(a)) for _ in range(repeats)]
        res[name] = {
            "call_us": statistics.median(call) * 1e6,
            "simulate_us": statistics.median(direct) * 1e6,
            "added_us": (statistics.median(call) - statistics.median(direct)) * 1e6,
            "specialize_hit_us": statistics.median(spec) * 1e6,
        }
    return res


def library_trace_times(repeats: int = 5) -> list[dict]:
    """Trace + verify time of each kernel-library function (``kernels/*/kernel.toml``) on its
    manifest example, cache cleared each time; the simulation is replaced by empty outputs
    so only the front end is timed (plus the entry point's own argument checks)."""
    import importlib
    import tomllib

    from nkikit import dtypes
    from nkikit.trace.jit import JitKernel

    def no_sim(kernel, args, **kw):
        return [np.empty(t.shape, dtypes.storage_dtype(t.dtype)) for t in kernel.outputs]

    rows = []
    for toml_path in sorted((ROOT / "kernels").glob("*/kernel.toml")):
        manifest = tomllib.loads(toml_path.read_text())
        for fname, spec in manifest.get("functions", {}).items():
            mod_name, attr = spec["entry"].split(":")
            try:
                mod = importlib.import_module(f"kernels.{toml_path.parent.name}.{mod_name}")
            except Exception as e:  # a half-written library kernel must not stop the benchmark
                rows.append({"kernel": f"{toml_path.parent.name}.{fname}", "error": repr(e)})
                continue
            jits = [v for v in vars(mod).values() if isinstance(v, JitKernel)]
            dt = dtypes.as_dtype(spec.get("dtypes", ["float32"])[0])
            rng = np.random.default_rng(0)
            ex = spec.get("example", {})
            args = [
                rng.standard_normal(tuple(ex[n]), dtype=np.float32).astype(dt)
                for n in spec["inputs"]
            ]
            fn = getattr(mod, attr)
            times = []
            old = _interp.simulate
            _interp.simulate = no_sim
            try:
                for _ in range(repeats):
                    for j in jits:
                        j._cache.clear()
                    times.append(_timeit(lambda f=fn, a=args, s=spec: f(*a, **s.get("attrs", {}))))
            finally:
                _interp.simulate = old
            rows.append(
                {
                    "kernel": f"{toml_path.parent.name}.{fname}",
                    "example": {n: ex[n] for n in spec["inputs"]},
                    "dtype": dtypes.name(dt),
                    "trace_verify_s": statistics.median(times),
                }
            )
    return rows


def machine_info() -> dict:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
    }
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [
            {
                k: v
                for k, v in d.items()
                if k in ("internal_api", "version", "num_threads", "architecture")
            }
            for d in threadpool_info()
        ]
    except ImportError:
        info["blas"] = "threadpoolctl not installed"
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    try:
        from importlib.metadata import version

        info["triton"] = version("triton")
    except Exception:
        info["triton"] = None
    return info


# ---------------------------------------------------------------------------------------------
# report


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.2f}"
    if x >= 0.01:
        return f"{x * 1e3:.0f} ms"
    return f"{x * 1e3:.1f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}×" if a / b < 100 else f"{a / b:.0f}×"


def goal_lines(results: dict) -> list[str]:
    """The performance goals (DESIGN.md, issue "Simulator speed"), each met or not, from the
    numbers of this run."""
    rows = results["rows"]
    if not rows:
        return []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    def ratio(a, b):
        return None if a is None or b is None or not b else a / b

    def worst(fn) -> tuple[float, str]:
        vals = [
            (fn(r), f"{r['kernel']} {r['size']} {r['dtype']}") for r in rows if fn(r) is not None
        ]
        return max(vals) if vals else (float("nan"), "—")

    out = ["Goals, from this run:", ""]
    w, where = worst(lambda r: ratio(r["warm_s"], r["numpy_s"]))
    out.append(
        f"- warm within 1.5× of numpy for every kernel: {verdict(w <= 1.5)} (worst {w:.2f}×, {where})"
    )
    c, where = worst(lambda r: ratio(r["cold_s"], r["numpy_s"]))
    out.append(f"- cold within 3× of numpy: {verdict(c <= 3)} (worst {c:.2f}×, {where})")
    tri = [
        (triton_ratio(r), f"{r['kernel']} {r['size']} {r['dtype']}")
        for r in rows
        if triton_ratio(r) is not None
    ]
    if tri:
        t, where = min(tri)
        out.append(
            f"- at least 20× faster than Triton's interpreter: {verdict(t >= 20)} (least {t:.0f}×, {where})"
        )
    lib = [r for r in results.get("library_trace", []) if "trace_verify_s" in r]
    if lib:
        m = max(lib, key=lambda r: r["trace_verify_s"])
        out.append(
            f"- trace + verify of a library kernel under 100 ms: {verdict(m['trace_verify_s'] < 0.1)} "
            f"(slowest {m['trace_verify_s'] * 1e3:.1f} ms, {m['kernel']})"
        )
    ov = (results.get("call_overhead") or {}).get("fast")
    if ov:
        out.append(
            f"- a cached call adds under 50 µs: {verdict(ov['added_us'] < 50)} ({ov['added_us']:.0f} µs on a "
            f"tiny kernel; the specialization-cache lookup alone is {ov['specialize_hit_us']:.0f} µs)"
        )
    p, where = worst(lambda r: ratio(r.get("peak_fast_bytes"), r.get("io_bytes")))
    out.append(
        f"- peak memory under 2× inputs + outputs: {verdict(p < 2)} (worst {p:.2f}×, {where})"
    )
    for r in rows:
        if r["dtype"] == "fp32" and (r["kernel"], r["size"]) in (
            ("rmsnorm", "4096x4096"),
            ("matmul", "2048^3"),
        ):
            ref, fast = ratio(r["ref_s"], r["numpy_s"]), ratio(r["warm_s"], r["numpy_s"])
            out.append(
                f"- milestone Core, {r['kernel']} {r['size']} fp32 within 3× of numpy: reference "
                f"{ref:.2f}× ({verdict(ref <= 3)}), fast path {fast:.2f}× ({verdict(fast <= 3)})"
            )
    out.append(
        "- fast path bit-identical to the reference on every row: "
        f"{verdict(all(r['fast_equals_reference'] for r in rows))}"
    )
    return out


def triton_ratio(r: dict) -> float | None:
    """Triton's time over nkikit's warm time, both from this row's paired runs (the warm
    time of the pairs when they were measured, else the row's warm time)."""
    t, w = r.get("triton_s"), r.get("triton_warm_s") or r.get("warm_s")
    return t / w if t and w else None


def _range(pairs: dict | None) -> str:
    if not pairs or pairs.get("n", 0) < 2:
        return ""
    return (
        f" ({pairs['min']:.2f}–{pairs['max']:.2f})"
        if pairs["max"] < 100
        else (f" ({pairs['min']:.0f}–{pairs['max']:.0f})")
    )


def render_markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        "# Simulator speed",
        "",
        f"`python -m benchmarks.sim{' --quick' if meta['mode'] == 'quick' else ''}` on {meta['machine']['cpu']} "
        f"({meta['machine']['cores']} cores), numpy {meta['machine']['numpy']}, "
        f"torch {meta['machine'].get('torch') or 'not installed'}, triton {meta['machine'].get('triton') or 'not installed'}; "
        f"median of {meta['repeats']} runs, {meta['threads'] or 'default'} BLAS/torch thread(s). "
        "Times in seconds unless marked ms.",
        "",
        "*cold*: first call (trace + verify + compile + run); *warm*: cached call; *sim only*: the cached "
        "fast program alone, without the call's argument conversion and input copies; *ref*: warm call on the "
        "reference interpreter; *np peak*: tracemalloc peak of the numpy baseline over input + output bytes "
        "(what its temporaries cost); *triton*: Triton's interpreter (`TRITON_INTERPRET=1`) on the same "
        "algorithm with the NKI kernel's tile sizes; *peak*: tracemalloc peak of a warm fast-path call over "
        "input + output bytes.",
        "",
        "Pairing: within each repeat the candidates run back to back (cold, warm, numpy, sim only, ref, torch), "
        f"and Triton's {meta.get('triton_repeats', 1)} run(s) per row alternate with a warm nkikit call "
        "(warm, triton, warm, triton ...), so a change of the shared machine's load hits both sides of a "
        "ratio alike. Every ratio is the median of one side over the median of the other, both from this "
        "run; the range in parentheses is the lowest and highest ratio of a single pair.",
        "",
        "| kernel | size | dtype | cold | warm | sim only | ref | numpy | np peak | torch | triton | warm/numpy | cold/numpy | ref/numpy | triton/warm | peak | bit-identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["rows"]:
        tri = _fmt_s(r.get("triton_s"))
        if r.get("triton_extrapolated"):
            tri += " (extrap.)"
        elif r.get("triton_s") is None:
            tri = r.get("triton_note", "—")
        peak = r["peak_fast_bytes"] / r["io_bytes"] if r.get("io_bytes") else None
        np_peak = r["peak_numpy_bytes"] / r["io_bytes"] if r.get("peak_numpy_bytes") else None
        t_ratio = triton_ratio(r)
        t_cell = (
            "—" if t_ratio is None else (f"{t_ratio:.1f}×" if t_ratio < 100 else f"{t_ratio:.0f}×")
        )
        lines.append(
            f"| {r['kernel']} | {r['size']} | {r['dtype']} | {_fmt_s(r['cold_s'])} | {_fmt_s(r['warm_s'])} | "
            f"{_fmt_s(r.get('sim_s'))} | {_fmt_s(r['ref_s'])} | {_fmt_s(r['numpy_s'])} | "
            f"{'—' if np_peak is None else f'{np_peak:.2f}×'} | {_fmt_s(r.get('torch_s'))} | {tri} | "
            f"{_ratio(r['warm_s'], r['numpy_s'])}{_range(r.get('warm_numpy_pairs'))} | "
            f"{_ratio(r['cold_s'], r['numpy_s'])} | "
            f"{_ratio(r['ref_s'], r['numpy_s'])} | {t_cell}{_range(r.get('triton_pairs'))} | "
            f"{'—' if peak is None else f'{peak:.2f}×'} | {'yes' if r['fast_equals_reference'] else '**NO**'} |"
        )
    lines += [
        "",
        *goal_lines(results),
        "",
        "Where a goal is missed, `README.md` in this folder says why (section *Rows that miss*).",
    ]
    ov = results.get("call_overhead")
    lines += [
        "",
        "Trace + verify (cache cleared) and fast-path compile, per kernel:",
        "",
        "| kernel | size | dtype | IR ops | trace+verify | compile |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['kernel']} | {r['size']} | {r['dtype']} | {r['ir_ops']} | "
            f"{r['trace_verify_s'] * 1e3:.1f} ms | {r['fast_compile_s'] * 1e3:.1f} ms |"
        )
    if ov:
        lines += [
            "",
            "Cached-call overhead on a 128×4 copy kernel (µs, median of 2000): "
            + "; ".join(
                f"{k}: call {v['call_us']:.0f}, simulate alone {v['simulate_us']:.0f}, "
                f"added by the call {v['added_us']:.0f}, cache lookup {v['specialize_hit_us']:.0f}"
                for k, v in ov.items()
            ),
        ]
    lib = results.get("library_trace")
    if lib:
        lines += [
            "",
            "Trace + verify of the kernel library's functions on their manifest examples "
            "(cache cleared, simulation skipped; median of 5):",
            "",
            "| function | example | dtype | trace+verify |",
            "| --- | --- | --- | --- |",
        ]
        for r in lib:
            if "error" in r:
                lines.append(f"| {r['kernel']} | — | — | import failed: {r['error']} |")
                continue
            ex = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in r["example"].items())
            lines.append(
                f"| {r['kernel']} | {ex} | {r['dtype']} | {r['trace_verify_s'] * 1e3:.1f} ms |"
            )
    lines += [
        "",
        f"BLAS: {meta['machine'].get('blas')}. Load average at start {meta['machine']['loadavg_start']}, "
        f"at end {meta.get('loadavg_end')}.",
        "",
    ]
    notes = [r for r in results["rows"] if r.get("triton_extrapolated")]
    if notes:
        lines.append(
            "Extrapolated Triton times: "
            + "; ".join(
                f"{r['kernel']} {r['size']} {r['dtype']}: {r['triton_note']}" for r in notes
            )
            + "."
        )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# entry point


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.sim", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="small sizes and 2 repeats (smoke test)")
    ap.add_argument("--tiny", action="store_true", help="one tiny size per kernel (for tests)")
    ap.add_argument(
        "--render",
        default=None,
        metavar="JSON",
        help="only rewrite the Markdown next to an existing results.json",
    )
    ap.add_argument(
        "--repeats", type=int, default=None, help="runs per measurement (default 5, quick 2)"
    )
    ap.add_argument("--kernels", default="rmsnorm,softmax,layernorm,matmul,libmatmul,attention")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument(
        "--triton-budget",
        type=float,
        default=0.0,
        help="if set, a probe at a smaller size predicts each Triton run, and one predicted to "
        "take longer than this many seconds is extrapolated from the probe instead (marked); "
        "default 0: every Triton run is measured at full size",
    )
    ap.add_argument("--out", default=str(HERE), help="folder for results.json and results.md")
    ap.add_argument(
        "--no-overhead", action="store_true", help="skip the cached-call overhead measurement"
    )
    ap.add_argument(
        "--triton-repeats",
        type=int,
        default=None,
        help="Triton runs per row, each paired with a warm nkikit call (default 3, quick 1)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS and torch threads for every candidate (default 1: on a shared 2-core "
        "machine, multithreaded BLAS turns many small GEMMs into thread-wait noise); "
        "0 leaves the libraries' defaults",
    )
    opts = ap.parse_args(argv)
    with _threads(opts.threads):
        return _main(opts)


@contextlib.contextmanager
def _threads(n: int):
    if n <= 0:
        yield
        return
    try:
        import torch

        old = torch.get_num_threads()
        torch.set_num_threads(n)
    except ImportError:
        torch, old = None, None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    with threadpool_limits(n) if threadpool_limits else contextlib.nullcontext():
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(old)


def _main(opts) -> dict:
    if opts.render:
        results = json.loads(Path(opts.render).read_text())
        out = Path(opts.render).with_suffix(".md")
        out.write_text(render_markdown(results))
        print(f"wrote {out}")
        return results
    machine = machine_info()  # before the run: its load average is the one at the start
    mode = "tiny" if opts.tiny else "quick" if opts.quick else "full"
    sizes = TINY if opts.tiny else QUICK if opts.quick else FULL
    repeats = opts.repeats or (1 if opts.tiny else 2 if opts.quick else 5)
    use_torch = not opts.no_torch and triton_available() != "torch not installed"
    use_triton = not opts.no_triton and triton_available() is None

    def log(msg: str) -> None:
        print(msg, flush=True)

    triton_repeats = opts.triton_repeats or (1 if mode != "full" else 3)
    rows = []
    for name in opts.kernels.split(","):
        for size in sizes[name]:
            case = make_case(name, size)
            case.probe = make_case(name, PROBE[name]) if mode == "full" else None
            for dt_name in opts.dtypes.split(","):
                rows.append(
                    bench_case(
                        case,
                        dt_name,
                        repeats,
                        opts.triton_budget,
                        use_torch,
                        use_triton,
                        log,
                        triton_repeats,
                    )
                )
    results = {
        "meta": {
            "mode": mode,
            "repeats": repeats,
            "triton_repeats": triton_repeats,
            "threads": opts.threads,
            "machine": machine,
            "loadavg_end": os.getloadavg(),
            "triton": "measured" if use_triton else (triton_available() or "skipped"),
        },
        "rows": rows,
    }
    if not opts.no_overhead:
        results["call_overhead"] = call_overhead(200 if mode == "tiny" else 2000)
        results["library_trace"] = library_trace_times()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=_json_default) + "\n")
    (out / "results.md").write_text(render_markdown(results))
    log(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    return results


def _json_default(x: object) -> object:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


if __name__ == "__main__":
    main()
