"""``python -m nkikit.nki FILE.py [ARGS...]`` / ``python -m nkikit.nki -m MODULE [ARGS...]``:
run an unmodified NKI 0.x program (one that says ``import nki``) on nkikit, e.g.
``python -m nkikit.nki -m pytest tests/``."""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] != "-m" and not os.path.isfile(argv[0]):
        print(f"python -m nkikit.nki: no such file {argv[0]!r}", file=sys.stderr)
        return 2
    from . import install_alias

    install_alias()  # before a module is looked for: it may be one of ``nki``'s
    if argv[0] == "-m":
        if len(argv) < 2:
            print("python -m nkikit.nki -m MODULE [ARGS...]: a module name is missing")
            return 2
        if importlib.util.find_spec(argv[1].partition(".")[0]) is None:
            print(f"python -m nkikit.nki: no module named {argv[1]!r}", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
