"""``nkikit run | ir | profile``: one kernel, its ``--args`` and ``--grid``, three views of it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import (
    add_args,
    add_grid,
    add_kernel,
    add_out,
    add_target,
    kernel_and_args,
    materialize,
)


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
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(fn=cmd_run)


def cmd_run(ns: argparse.Namespace) -> int:
    import numpy as np

    kernel, positional, named = kernel_and_args(ns)
    values = materialize([*positional, *named.values()], ns.seed)
    out = kernel(*values[: len(positional)], **dict(zip(named, values[len(positional) :])))
    outs = out if isinstance(out, tuple | list) else [out]
    for i, o in enumerate(outs):
        a = np.asarray(o, dtype=np.float32)
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
    p.set_defaults(fn=cmd_profile)


def cmd_profile(ns: argparse.Namespace) -> int:
    from ..compiler.api import compile, write_profile_artifacts
    from ..targets import get_target
    from .options import UsageError

    try:
        target = get_target(ns.target)
    except (KeyError, ValueError) as e:
        raise UsageError(f"--target: {e.args[0] if e.args else e}") from None
    kernel, positional, named = kernel_and_args(ns)
    program = compile(kernel, *positional, target=target, **named)
    prof = program.profile()
    out = Path(ns.out or f"nkikit-profile-{program.kernel}")
    files = write_profile_artifacts(
        program, prof, out, trace_name="profile", neff_name=program.kernel, html=not ns.no_html
    )
    print(str(prof))
    for kind, path in files.items():
        print(f"{kind:>9}: {path}")
    return 0
