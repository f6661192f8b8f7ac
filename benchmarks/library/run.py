"""Modeled trn2 performance of every library kernel: ``python -m benchmarks.library.run``.

For each kernel folder under ``kernels/`` the script reads ``kernel.toml`` to find its functions
(and their declared backwards), takes realistic input sizes from ``SIZES`` below (the manifest
example when a function is not listed), and profiles the call with ``nki.profile_kernel`` on
``nt.tensor`` specs for ``target="trn2"``.  Library entry points are Python wrappers that launch
one or more ``@nki.jit`` kernels: the script runs the wrapper once with every ``JitKernel``
launch intercepted (traced for its output shapes, never simulated), then profiles each captured
launch.  A function with several launches reports the summed time and time-weighted engine
percentages.

Writes ``benchmarks/library/results.md`` (kernel, function, shape, dtype, modeled µs, MBU %,
TensorE %, bound by, bar met?).  Bars (nki.md §4.5): TensorE active >= 85% for matmul-class
kernels (``matmul``, ``attention``), MBU >= 60% for the others.  A kernel or function that fails
to import, trace or profile is listed with its error instead of numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import nkikit as nki  # noqa: E402
from nkikit.profiler.metrics import dtype_class  # noqa: E402
from nkikit.registry.manifest import load_manifest, numpy_dtype  # noqa: E402
from nkikit.targets import get_target  # noqa: E402
from nkikit.trace.jit import JitKernel  # noqa: E402
from nkikit.typing import TensorSpec  # noqa: E402

KERNELS = ROOT / "kernels"
OUT = Path(__file__).resolve().parent / "results.md"
TARGET = "trn2"


def _both(shapes: list[tuple[int, ...]], **attrs: Any) -> list:
    """The same sizes in bf16 (what models train in) and fp32."""
    return [(shapes, "bfloat16", attrs), (shapes, "float32", attrs)]


# (kernel, function) -> list of (input shapes in manifest order, dtype, attrs).  The dtype is
# the function's variant: inputs with their own ``input_dtypes`` in kernel.toml (e.g. int class
# targets) get their first declared dtype.  A backward is profiled on the same sizes.
SIZES: dict[tuple[str, str], list[tuple[list[tuple[int, ...]], str, dict[str, Any]]]] = {
    ("matmul", "matmul"): [
        ([(4096, 4096), (4096, 4096)], "bfloat16", {}),
        ([(4096, 4096), (4096, 4096)], "float8_e4m3fn", {}),
        ([(4096, 4096), (4096, 4096)], "float32", {}),
    ],
    ("rmsnorm", "rmsnorm"): _both([(4096, 4096), (4096,)]),
    ("rmsnorm", "add_rmsnorm"): _both([(4096, 4096), (4096, 4096), (4096,)]),
    ("layernorm", "layernorm"): _both([(4096, 4096), (4096,), (4096,)]),
    ("softmax", "softmax"): _both([(4096, 4096)]),
    ("tensor_add", "tensor_add"): _both([(4096, 4096), (4096, 4096)]),
    ("gelu", "gelu"): _both([(4096, 4096)]) + _both([(4096, 4096)], approximate="tanh"),
    ("swiglu", "swiglu"): _both([(4096, 4096), (4096, 4096)]),
    ("attention", "attention"): [
        ([(1, 8, 2048, 128), (1, 2, 2048, 128), (1, 2, 2048, 128)], "bfloat16", {}),
        ([(1, 8, 2048, 128), (1, 2, 2048, 128), (1, 2, 2048, 128)], "bfloat16", {"causal": False}),
        (
            [(1, 8, 2048, 128), (1, 2, 2048, 128), (1, 2, 2048, 128)],
            "bfloat16",
            {"softmax": "online"},
        ),
        (
            [(1, 8, 2048, 128), (1, 2, 2048, 128), (1, 2, 2048, 128)],
            "bfloat16",
            {"causal": False, "softmax": "online"},
        ),
    ],
    ("rope", "rope"): _both([(1, 32, 2048, 128), (2048, 64), (2048, 64)]),
    ("cross_entropy", "cross_entropy"): _both([(4096, 32000), (4096,)]),
}
MATMUL_CLASS = {"matmul", "attention"}  # the TensorE bar; everything else: the MBU bar


def _attention_flops(shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> float:
    b, h, s_q, d = shapes[0]
    s_k = shapes[1][2]
    pairs = s_q * s_k
    if attrs.get("causal", True):  # the manifest's default; keys after the query are skipped
        pairs = sum(min(i + 1 + max(s_k - s_q, 0), s_k) for i in range(s_q))
    return 4.0 * b * h * pairs * d  # q @ k.T and p @ v


# The work a function must do, in FLOPs, whatever the kernel adds (a second score pass,
# transposes, broadcasts): MFU from these counts only useful work, where TensorE active %
# counts every matmul the kernel issues.  A backward: matmul 2x the forward (dA, dB), attention
# 2.5x (the FlashAttention convention: five matmuls of the forward's two sizes).
USEFUL_FLOPS: dict[tuple[str, str], Any] = {
    ("matmul", "matmul"): lambda shapes, attrs: 2.0 * shapes[0][0] * shapes[0][1] * shapes[1][1],
    ("matmul", "matmul_backward"): lambda shapes, attrs: (
        4.0 * shapes[0][0] * shapes[0][1] * shapes[1][1]
    ),
    ("attention", "attention"): _attention_flops,
    ("attention", "attention_backward"): lambda shapes, attrs: (
        2.5 * _attention_flops(shapes, attrs)
    ),
}


@dataclass
class Row:
    kernel: str
    function: str
    shape: str = ""
    dtype: str = ""
    us: float | None = None
    mbu: float | None = None
    tensor: float | None = None
    bound: str = ""
    launches: int = 0
    mfu: float | None = None  # useful FLOPs / (time x TensorE peak), see USEFUL_FLOPS
    error: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    def bar(self) -> str:
        if self.error:
            return "n/a"
        if self.kernel in MATMUL_CLASS:
            return f"{'yes' if (self.tensor or 0) >= 85 else 'no'} (TensorE >= 85%)"
        return f"{'yes' if (self.mbu or 0) >= 60 else 'no'} (MBU >= 60%)"


@contextlib.contextmanager
def captured_launches(log: list[tuple[JitKernel, tuple, dict]]):
    """Within the block, ``JitKernel`` calls are traced (not simulated): the launch is logged
    and zero arrays of the kernel's output shapes are returned."""
    original = JitKernel.__call__

    def fake_call(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        specs = tuple(_spec(a) for a in args)
        kspecs = {k: _spec(v) for k, v in kwargs.items()}
        log.append((self, specs, kspecs))
        kernel, _ = self.specialize(*specs, **kspecs)
        outs = [np.zeros(o.shape, dtype=o.dtype) for o in kernel.outputs]
        return _restructure(kernel.return_structure, outs)

    JitKernel.__call__ = fake_call
    try:
        yield
    finally:
        JitKernel.__call__ = original


def _spec(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return TensorSpec(tuple(a.shape), a.dtype)
    return a


def _restructure(structure: Any, outs: list[np.ndarray]) -> Any:
    if isinstance(structure, int):
        return outs[structure]
    if isinstance(structure, tuple | list):
        return type(structure)(_restructure(s, outs) for s in structure)
    if structure is None and len(outs) == 1:
        return outs[0]
    return outs[0] if len(outs) == 1 else tuple(outs)


TIMEOUT_S = 300  # per (function, size); a case over it is reported as failed


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raise TimeoutError in the block after ``seconds`` (SIGALRM; main thread, POSIX)."""

    def on_alarm(signum, frame):  # noqa: ANN001, ANN202, ARG001
        raise TimeoutError(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def profile_call(fn: Any, arrays: list[np.ndarray], attrs: dict[str, Any]) -> dict[str, Any]:
    log: list[tuple[JitKernel, tuple, dict]] = []
    with captured_launches(log):
        fn(*arrays, **attrs)
    if not log:
        raise RuntimeError("the function launched no @nki.jit kernel")
    total, acc = 0.0, {"mbu_percent": 0.0, "tensor_active_percent": 0.0}
    bound: dict[str, float] = {}
    for jit, specs, kspecs in log:
        s = nki.profile_kernel(jit, *specs, target=TARGET, **kspecs).summary
        t = float(s["total_us"])
        total += t
        for k in acc:
            acc[k] += t * float(s[k])
        bound[s["bound_by"]] = bound.get(s["bound_by"], 0.0) + t
    return {
        "total_us": total,
        "mbu_percent": acc["mbu_percent"] / total,
        "tensor_active_percent": acc["tensor_active_percent"] / total,
        "bound_by": max(bound, key=bound.get),
        "launches": len(log),
    }


def spec_arrays(spec: Any, shapes: list[tuple[int, ...]], dtype: str) -> list[np.ndarray]:
    """Inputs for profiling (values do not matter: launches are traced, not simulated): zeros
    in each input's declared dtype for the variant ``dtype``, or the low end of its declared
    range (a valid value, e.g. class index 0) when it has one."""
    by_name = dict(zip(spec.inputs, shapes))
    out = []
    for n, shape in by_name.items():
        a = np.zeros(shape, dtype=numpy_dtype(spec.input_dtype(n, dtype)))
        bounds = spec.input_range(n, by_name)
        if bounds is not None:
            a[...] = bounds[0]
        out.append(a)
    return out


def bench_kernel(folder: Path, rows: list[Row], echo: Any = print) -> None:
    name = folder.name
    try:
        manifest = load_manifest(folder)
        module = importlib.import_module(f"nkikit.library.{name}")
    except Exception as e:  # noqa: BLE001 - report and go on
        rows.append(Row(name, "*", error=f"import/manifest: {type(e).__name__}: {e}"))
        return
    for fname, spec in manifest.functions.items():
        cases = SIZES.get((name, fname)) or [
            ([tuple(spec.example[i]) for i in spec.inputs], spec.dtypes[0], {})
        ]
        for shapes, dtype, attrs in cases:
            kinds = [("", spec.entry)] + ([("_backward", spec.backward)] if spec.backward else [])
            for suffix, sym in kinds:
                label = fname + suffix + "".join(f" {k}={v}" for k, v in attrs.items())
                row = Row(name, label, " x ".join(str(list(s)) for s in shapes), dtype)
                try:
                    fn = getattr(
                        importlib.import_module(f"nkikit.library.{name}.{sym.module}"), sym.attr
                    )
                    arrays = spec_arrays(spec, shapes, dtype)
                    if suffix:  # backward: one gradient per output, of its shape and dtype
                        fwd = getattr(
                            importlib.import_module(f"nkikit.library.{name}.{spec.entry.module}"),
                            spec.entry.attr,
                        )
                        with captured_launches([]):
                            out = fwd(*arrays, **{**spec.attrs, **attrs})
                        outs = out if isinstance(out, tuple | list) else (out,)
                        grads = [np.zeros(np.shape(o), dtype=np.asarray(o).dtype) for o in outs]
                        arrays = [*grads, *arrays]
                    with time_limit(TIMEOUT_S):
                        r = profile_call(fn, arrays, {**spec.attrs, **attrs})
                    row.us, row.mbu, row.tensor = (
                        r["total_us"],
                        r["mbu_percent"],
                        r["tensor_active_percent"],
                    )
                    row.bound, row.launches = r["bound_by"], r["launches"]
                    useful = USEFUL_FLOPS.get((name, fname + suffix))
                    if useful is not None:
                        peak = get_target(TARGET).tensor_peak_flops[dtype_class(dtype)]
                        row.mfu = (
                            100
                            * useful(shapes, {**spec.attrs, **attrs})
                            / (r["total_us"] * 1e-6 * peak)
                        )
                except Exception as e:  # noqa: BLE001 - report and go on
                    row.error = (
                        f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    )
                    if echo is print and "-v" in sys.argv:
                        traceback.print_exc()
                rows.append(row)
                echo(_line(row))
    del module


def _line(r: Row) -> str:
    if r.error:
        return f"| {r.kernel} | {r.function} | {r.shape} | {r.dtype} | failed: {r.error} | | | | | n/a |"
    return (
        f"| {r.kernel} | {r.function} | {r.shape} | {r.dtype} | {r.us:.1f} | {r.mbu:.1f} | "
        f"{r.tensor:.1f} | {'' if r.mfu is None else f'{r.mfu:.1f}'} | {r.bound}{'' if r.launches == 1 else f' ({r.launches} launches)'} | {r.bar()} |"
    )


def render(rows: list[Row]) -> str:
    head = (
        "# Library kernels: modeled performance on trn2\n\n"
        "Generated by `python -m benchmarks.library.run` (nki.profile_kernel on nt.tensor specs, "
        "target trn2). Bars (nki.md §4.5): TensorE active >= 85% for matmul/attention, "
        "MBU >= 60% for memory-bound kernels. Multi-launch functions (e.g. backwards) sum the "
        "launches' times and weight the percentages by time. *MFU %*: the FLOPs the function "
        "must do (2MNK for matmul, 4·B·H·pairs·D for attention forward, 2.5x that backward) "
        "over modeled time x TensorE peak; TensorE % also counts the extra matmuls a kernel "
        "issues (transposes, a second score pass, broadcasts).\n\n"
        "| kernel | function | shape | dtype | modeled µs | MBU % | TensorE % | MFU % | bound by | bar met? |\n"
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |\n"
    )
    return head + "\n".join(_line(r) for r in rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernels", nargs="*", help="kernel folder names (default: all)")
    p.add_argument("-o", "--output", default=str(OUT), help="markdown file to write")
    p.add_argument("-v", action="store_true", help="print tracebacks of failures")
    p.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per function and size")
    args = p.parse_args(argv)
    globals()["TIMEOUT_S"] = args.timeout
    folders = sorted(f.parent for f in KERNELS.glob("*/kernel.toml"))
    if args.kernels:
        folders = [f for f in folders if f.name in args.kernels]
    rows: list[Row] = []
    for folder in folders:
        bench_kernel(folder, rows)
    Path(args.output).write_text(render(rows))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
