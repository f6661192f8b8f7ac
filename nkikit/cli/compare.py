"""``nkikit compare A B``: two profiles (kernel or system) side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .options import describe_os_error, output_file, path_arg


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two profiles (kernel or system)",
        description="Compare two profiles written by `nkikit profile` (kernel: *.nkikit.json; "
        "system: key_averages.json; or the folders holding them): per-metric, per-engine, "
        "per-line and per-kernel deltas.",
    )
    # type=path_arg: an empty path would be the current folder, read or written silently
    p.add_argument(
        "a", type=path_arg, help="profile A: *.nkikit.json, key_averages.json, or their folder"
    )
    p.add_argument("b", type=path_arg, help="profile B")
    p.add_argument(
        "--html", type=path_arg, default=None, help="write a side-by-side HTML report here"
    )
    p.add_argument("--json", type=path_arg, default=None, help="write the comparison as JSON here")
    p.set_defaults(fn=cmd_compare)


def _unreadable(path: str, e: Exception) -> str:
    """Why the profile ``path`` cannot be read, in one line that names it once."""
    if isinstance(e, OSError):
        return describe_os_error(e)  # "[Errno 2] No such file or directory: ..." in words
    if isinstance(e, json.JSONDecodeError):
        return f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})"
    if isinstance(e, KeyError):
        return f"{path}: not a profile nkikit wrote (it has no {e} field)"
    message = str(e)  # load's own errors already start with the path
    return message if message.startswith(f"{path}:") else f"{path}: {message}"


def cmd_compare(ns: argparse.Namespace) -> int:
    import sys

    from ..profiler.compare import compare, load, render_text, write_html

    outputs = {"--html": ns.html, "--json": ns.json}
    for option, out in outputs.items():
        if out is not None:
            output_file(out, option)
    profiles = []
    for path in (ns.a, ns.b):
        try:
            profiles.append(load(path))
        except (OSError, ValueError, KeyError) as e:  # a missing or unreadable profile: exit 1
            print(f"error: {_unreadable(path, e)}", file=sys.stderr)
            return 1
    try:
        c = compare(*profiles)
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(render_text(c), end="")
    for out in outputs.values():
        if out is not None:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
    if ns.html:
        print(f"html: {write_html(c, ns.html, (str(ns.a), str(ns.b)))}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(c, indent=1), encoding="utf-8")
        print(f"json: {ns.json}")
    return 0
