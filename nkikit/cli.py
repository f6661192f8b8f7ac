"""The ``nkikit`` command line: run, ir, test, profile, compare, publish, pull, lock, hub serve,
demo."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from . import dtypes
from .errors import NkiError
from .typing import TensorSpec


def load_kernel(target: str):
    """``path/to/file.py::name`` (or ``module:name``) -> the object it names."""
    if "::" in target:
        path, name = target.split("::", 1)
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"nkikit: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(Path(path).resolve().parent))
        spec.loader.exec_module(module)
    elif ":" in target:
        mod, name = target.split(":", 1)
        module = importlib.import_module(mod)
    else:
        raise SystemExit(
            f"nkikit: name a kernel as FILE.py::KERNEL or MODULE:KERNEL, got {target!r}"
        )
    try:
        return getattr(module, name)
    except AttributeError:
        raise SystemExit(f"nkikit: {target}: no attribute {name!r}") from None


def parse_args_spec(text: str) -> dict[str, object]:
    """``a=4096x4096:bfloat16,eps=1e-6`` -> {"a": TensorSpec, "eps": 1e-6}."""
    out: dict[str, object] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if not value:
            raise SystemExit(f"nkikit: bad argument {item!r}; use name=SHAPE:DTYPE or name=VALUE")
        shape, sep, dt = value.partition(":")
        if sep or "x" in shape:
            try:
                dims = tuple(int(s) for s in shape.split("x"))
            except ValueError:
                raise SystemExit(f"nkikit: bad shape {shape!r} in {item!r}") from None
            out[name] = TensorSpec(dims, dtypes.as_dtype(dt or "float32"))
        else:
            try:
                out[name] = int(value)
            except ValueError:
                try:
                    out[name] = float(value)
                except ValueError:
                    out[name] = value
    return out


def _materialize(args: dict[str, object], seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    real = {}
    for k, v in args.items():
        if isinstance(v, TensorSpec):
            x = rng.standard_normal(v.shape).astype(np.float32)
            real[k] = (
                dtypes.cast(x, v.dtype) if dtypes.is_float(v.dtype) else (x * 10).astype(v.dtype)
            )
        else:
            real[k] = v
    return real


def _grid(kernel, grid: str):
    return kernel[tuple(int(g) for g in grid.split("x"))] if grid else kernel


def cmd_run(ns) -> int:
    kernel = _grid(load_kernel(ns.kernel), ns.grid)
    args = _materialize(parse_args_spec(ns.args), ns.seed)
    out = kernel(**args)
    outs = out if isinstance(out, tuple | list) else [out]
    for i, o in enumerate(outs):
        a = np.asarray(o, dtype=np.float32)
        print(
            f"output {i}: shape={a.shape} dtype={np.asarray(o).dtype} mean={np.nanmean(a):.6g} "
            f"min={np.nanmin(a):.6g} max={np.nanmax(a):.6g} nan={int(np.isnan(a).sum())}"
        )
    return 0


def cmd_ir(ns) -> int:
    kernel = _grid(load_kernel(ns.kernel), ns.grid)
    print(kernel.ir(**parse_args_spec(ns.args)), end="")
    return 0


def cmd_test(ns) -> int:
    paths = ns.paths or [str(Path(__file__).resolve().parent.parent / "kernels")]
    if ns.ray or ns.sweep:
        return _test_sweep(ns, paths)
    import pytest

    return pytest.main(["-q", *(["-m", ns.markexpr] if ns.markexpr else []), *paths])


def _test_sweep(ns, paths: list[str]) -> int:
    """``nkikit test --ray`` / ``--sweep``: one task per test file, each run by pytest in a
    fresh process, on a Ray cluster (or one after another here, with ``--sweep``)."""
    from .tune.tasks import pytest_matrix

    sweep = pytest_matrix(paths, str(Path.cwd()), ns.markexpr or "not slow")
    options = {}
    if ns.ray:
        options = {"address": ns.address, "num_cpus": None if ns.address else ns.num_cpus}
    results = sweep.run("ray" if ns.ray else "local", retries=0, **options)
    failed = 0
    for r in results.values():
        ok = r.ok and r.value["exit_code"] in (0, 5)  # 5: nothing collected (all deselected)
        failed += not ok
        what = r.value["summary"] if r.ok else r.error
        files = ", ".join(r.value["files"]) if r.ok else r.task_id[:12]
        print(f"{'ok  ' if ok else 'FAIL'} {files}: {what}")
    print(f"{len(results) - failed} of {len(results)} test files passed")
    return 1 if failed else 0


def _forward(module: str, func: str, argv: list[str]) -> int:
    mod = importlib.import_module(module)
    return int(getattr(mod, func)(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="nkikit", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="run a kernel on random inputs in the simulator")
    p.add_argument("kernel", help="FILE.py::KERNEL or MODULE:KERNEL")
    p.add_argument("--args", default="", help="e.g. 'a=256x512:float32,b=256x512:float32,eps=1e-6'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", default="", help="SPMD launch grid, e.g. 2x4")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("ir", help="print a kernel's IR")
    p.add_argument("kernel")
    p.add_argument("--args", default="")
    p.add_argument("--grid", default="", help="SPMD launch grid, e.g. 2x4")
    p.set_defaults(fn=cmd_ir)

    p = sub.add_parser("test", help="run kernel tests (default: the library in kernels/)")
    p.add_argument("paths", nargs="*")
    p.add_argument("-m", dest="markexpr", default="", help="pytest marker expression")
    p.add_argument("--ray", action="store_true", help="one task per test file on a Ray cluster")
    p.add_argument("--sweep", action="store_true", help="one task per test file, here")
    p.add_argument("--address", default=None, help="Ray cluster address (default: a local one)")
    p.add_argument("--num-cpus", type=int, default=2, help="workers of a local Ray cluster")
    p.set_defaults(fn=cmd_test)

    forwarded = {
        "profile": (
            "nkikit.compiler.api",
            "main_profile",
            "profile a kernel on a NeuronCore model",
        ),
        "compare": ("nkikit.profiler.compare", "main", "compare two profiles (kernel or system)"),
        "publish": ("nkikit.registry.cli", "main_publish", "publish a kernel folder to a Hub"),
        "pull": ("nkikit.registry.cli", "main_pull", "pull a kernel from a Hub"),
        "lock": ("nkikit.registry.cli", "main_lock", "write kernels.lock"),
        "demo": (
            "nkikit.demo",
            "main",
            "the RMSNorm story: profile three versions, then share one",
        ),
    }
    for name, (_, _, help_text) in forwarded.items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser(
        "hub", help="Hub-compatible server: `nkikit hub serve --root DIR --port N`", add_help=False
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)

    if argv and argv[0] in forwarded:
        module, func, _ = forwarded[argv[0]]
        return _run(lambda: _forward(module, func, argv[1:]))
    if argv and argv[0] == "hub":
        rest = argv[1:]
        if rest and rest[0] == "serve":
            rest = rest[1:]
        return _run(lambda: _forward("nkikit.hub", "main", rest))
    ns = parser.parse_args(argv)
    return _run(lambda: ns.fn(ns))


def _run(fn) -> int:
    try:
        return fn()
    except NkiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
