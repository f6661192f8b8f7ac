"""``nkikit run | ir | profile``: one kernel, its ``--args`` and ``--grid``, three views of it."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from .options import (
    add_args,
    add_grid,
    add_kernel,
    add_out,
    add_target,
    kernel_and_args,
    load_kernel,
    materialize,
    output_folder,
    parse_args_spec,
    split_args,
)


def _seed(text: str) -> int:
    """A seed of numpy's generator: an integer >= 0 (argparse names the option otherwise)."""
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return seed


def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a kernel on random inputs in the simulator",
        description="Run a kernel on random inputs in the simulator and print statistics of "
        "each output (a warning names outputs left partly unwritten).",
    )
    add_kernel(p)
    add_args(p)
    add_grid(p)
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(fn=cmd_run)


def cmd_run(ns: argparse.Namespace) -> int:
    import numpy as np

    kernel, positional, named = kernel_and_args(ns)
    values = materialize([*positional, *named.values()], ns.seed)
    out = kernel(*values[: len(positional)], **dict(zip(named, values[len(positional) :])))
    outs = out if isinstance(out, tuple | list) else [out]
    for i, o in enumerate(outs):
        a = np.asarray(o, dtype=np.float32)
        with warnings.catch_warnings():  # inf - inf or an all-NaN output: the line says nan
            warnings.simplefilter("ignore", RuntimeWarning)
            print(
                f"output {i}: shape={a.shape} dtype={np.asarray(o).dtype} mean={np.nanmean(a):.6g} "
                f"min={np.nanmin(a):.6g} max={np.nanmax(a):.6g} nan={int(np.isnan(a).sum())}"
            )
    return 0


def add_ir(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ir",
        help="print a kernel's IR",
        description="Trace and verify a kernel for the given argument shapes; print its IR.",
    )
    add_kernel(p)
    add_args(p)
    add_grid(p)
    p.set_defaults(fn=cmd_ir)


def cmd_ir(ns: argparse.Namespace) -> int:
    kernel, positional, named = kernel_and_args(ns)
    print(kernel.ir(*positional, **named), end="")
    return 0


def add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="profile a kernel on a NeuronCore model",
        description="Model a kernel on a NeuronCore; print its profile and write the Perfetto "
        "trace, HTML report and JSON summary.",
    )
    add_kernel(p)
    add_args(p)
    add_grid(p)
    add_target(p)
    add_out(p, "output folder (default: ./nkikit-profile-<kernel>)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML report")
    p.add_argument(
        "--launches",
        action="store_true",
        help="KERNEL is a Python function: call it on random inputs of --args and profile each "
        "kernel it launches (a system profile: trace, key averages, HTML)",
    )
    p.set_defaults(fn=cmd_profile)


def cmd_profile(ns: argparse.Namespace) -> int:
    from ..compiler.api import compile, write_profile_artifacts
    from .options import parse_target

    target = parse_target(ns.target)  # None: each kernel its own default (its dialect's)
    if ns.launches:
        return _profile_launches(ns, target)
    kernel, positional, named = kernel_and_args(ns)
    # checked before the profile, which can take minutes (the default is named by the kernel)
    out = output_folder(ns.out or f"nkikit-profile-{kernel.func.__name__}")
    program = compile(kernel, *positional, target=target, **named)
    prof = program.profile()
    files = write_profile_artifacts(
        program, prof, out, trace_name="profile", neff_name=program.kernel, html=not ns.no_html
    )
    print(str(prof))
    for kind, path in files.items():
        print(f"{kind:>9}: {path}")
    return 0


def _launched_nothing(name: str, fn: object) -> str:
    """The error for ``--launches`` of a function that launched no kernel, at its ``def``."""
    code = getattr(getattr(fn, "func", fn), "__code__", None)  # (an @nki.jit kernel's .func)
    where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}: " if code else ""
    return (
        f"{where}{getattr(fn, '__name__', name)}() launched no NKI kernel, so there is nothing "
        "to profile; --launches profiles the kernels a function calls (to profile a kernel "
        "itself, leave out --launches)"
    )


def _profile_launches(ns: argparse.Namespace, target) -> int:  # noqa: ANN001
    """``nkikit profile FILE.py::function --launches``: one profile per kernel launch."""
    from ..compiler.launches import profile_launches
    from ..targets import ENV_VAR as TARGET_ENV_VAR
    from .options import UsageError

    fn = load_kernel(ns.kernel)
    if not callable(fn):  # it is called below: "'int' object is not callable" was a traceback
        raise UsageError(f"{ns.kernel}: expected a function, got {type(fn).__name__}")
    if ns.grid is not None:
        raise UsageError("--grid: a function given with --launches launches its own kernels")
    positional, named = split_args(parse_args_spec(ns.args))
    out = output_folder(ns.out or f"nkikit-profile-{getattr(fn, '__name__', 'function')}")
    values = materialize([*positional, *named.values()], 0)
    args, kwargs = values[: len(positional)], dict(zip(named, values[len(positional) :]))
    # the function's kernels are traced for the default target, which the environment names
    saved = os.environ.get(TARGET_ENV_VAR)
    if target is not None:
        os.environ[TARGET_ENV_VAR] = target.name
    try:
        _, sp = profile_launches(fn, *args, **kwargs)
    finally:
        if saved is None:
            os.environ.pop(TARGET_ENV_VAR, None)
        else:
            os.environ[TARGET_ENV_VAR] = saved
    if not sp.runs:  # a report of the host call alone says nothing: most likely a wrong name
        print(f"error: {_launched_nothing(ns.kernel, fn)}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "trace": sp.to_perfetto(out / "system_trace.json"),
        "averages": sp.to_json(out / "key_averages.json"),
    }
    if not ns.no_html:
        files["html"] = sp.to_html(out / "system_report.html")
    seen: set[str] = set()
    for r in sp.runs:  # each kernel's own profile, for `nkikit compare`
        if r.profile is not None and r.kernel not in seen:
            seen.add(r.kernel)
            files[r.kernel] = r.profile.to_json(out / f"{r.kernel}.nkikit.json")
    print(sp.table_text(), end="")
    for kind, path in files.items():
        print(f"{kind:>9}: {path}")
    return 0
