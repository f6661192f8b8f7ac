"""The ``nkikit`` command line: one parser tree, one spelling of each option (``options.py``).

Each subcommand is one ``add_<name>(subparsers)`` function that adds its parser and sets
``fn`` (the function that runs it, returning an exit code); :data:`COMMANDS` lists them in the
order ``nkikit --help`` shows. A new subcommand is one more function and one more entry.

A subcommand that sets ``passthrough=N`` (``test``: pytest's options, ``hub serve``: the
server's) receives ``ns.rest``, the command line after its first N words, unparsed.

Errors come out in one style, one line on stderr:

- a command line that cannot be carried out (argparse's errors, :class:`UsageError`):
  ``nkikit CMD: error: ...``, exit code 2;
- a kernel nkikit rejects (an ``NkiError``), a registry failure, or a Python error raised in
  the user's own code: ``error: FILE:LINE: ...``, exit code 1. ``NKIKIT_FULL_TRACEBACK=1``
  shows the whole traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from .options import UsageError, describe_os_error, load_kernel, parse_args_spec

__all__ = ["main", "build_parser", "COMMANDS", "UsageError", "load_kernel", "parse_args_spec"]

# (module, function): each function adds one subcommand; imported when the parser is built
COMMANDS: tuple[tuple[str, str], ...] = (
    ("nkikit.cli.kernel", "add_run"),
    ("nkikit.cli.kernel", "add_ir"),
    ("nkikit.cli.kernel", "add_profile"),
    ("nkikit.cli.compare", "add_compare"),
    ("nkikit.cli.test", "add_test"),
    ("nkikit.cli.new", "add_new"),
    ("nkikit.registry.cli", "add_publish"),
    ("nkikit.registry.cli", "add_pull"),
    ("nkikit.registry.cli", "add_lock"),
    ("nkikit.cli.hub", "add_hub"),
    ("nkikit.demo", "add_demo"),
)


class Parser(argparse.ArgumentParser):
    """argparse with nkikit's usage-error style: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> Parser:
    parser = Parser(
        prog="nkikit",
        description="Write, simulate, profile and share Trainium NKI kernels on any CPU.",
        epilog="`nkikit COMMAND --help` describes a command's options.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"nkikit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module, func in COMMANDS:
        getattr(importlib.import_module(module), func)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``nkikit ARGV``; returns the exit code (0 success, 1 failure, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        ns, extra = parser.parse_known_args(argv)
        depth = getattr(ns, "passthrough", 0)
        if depth:  # `test` and `hub serve` hand the rest of the line on as written
            ns.rest = argv[depth:]
        elif extra:
            parser.parse_args(argv)  # reports the unrecognized arguments as a usage error
    except SystemExit as e:  # --help, or a usage error already printed
        return int(e.code or 0)
    return run_command(f"nkikit {ns.command}", lambda: ns.fn(ns))


def run_command(prog: str, fn: Callable[[], int | None]) -> int:
    r"""Call ``fn`` and turn what it raises into nkikit's one-line error style (and the
    ``NkiWarning``\ s it issues into one ``warning: FILE:LINE: ...`` line each)."""
    import warnings

    from ..errors import NkiWarning

    shown = warnings.showwarning

    def one_line(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
        if issubclass(category, NkiWarning):
            print(f"warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    try:
        warnings.showwarning = one_line
        return int(fn() or 0)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - sorted below: ours to explain, or re-raised
        message = describe(e)
        if message is None or os.environ.get("NKIKIT_FULL_TRACEBACK"):
            raise
        print(f"error: {message}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = shown


def describe(e: BaseException) -> str | None:
    """One line for an error that is the user's to act on; None for one that is nkikit's own
    bug (the caller re-raises it with its traceback)."""
    from ..errors import NkiError, _is_internal

    if isinstance(e, NkiError):
        return str(e).splitlines()[0]
    registry = sys.modules.get("nkikit.registry.errors")
    if registry is not None and isinstance(e, registry.RegistryError):
        return str(e)
    if isinstance(e, OSError) and e.filename is not None:
        # a path that cannot be read or written: the path and why, in words (checked before
        # the user's frames: pathlib's own frame is not the user's line)
        return describe_os_error(e)
    if isinstance(e, FileNotFoundError | PermissionError):  # raised with a message of its own
        return str(e)
    if isinstance(e, SyntaxError) and e.filename:  # the user's file, at its own line
        return f"{os.path.basename(e.filename)}:{e.lineno}: SyntaxError: {e.msg}"
    user = [f for f in traceback.extract_tb(e.__traceback__) if not _is_internal(f.filename)]
    if user and not _is_internal(traceback.extract_tb(e.__traceback__)[-1].filename):
        where = f"{os.path.basename(user[-1].filename)}:{user[-1].lineno}"
        return f"{where}: {type(e).__name__}: {e}"
    if isinstance(e, ValueError | LookupError | ImportError) and registry is not None:
        return str(e)  # the registry's documented failures (bad spec, missing version, ...)
    return None


if __name__ == "__main__":
    sys.exit(main())
