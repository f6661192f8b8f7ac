"""`nkikit publish | pull | lock`: the registry's subcommands in the `nkikit` parser tree.

Each `add_<name>(subparsers)` adds one subcommand (nkikit/cli/__init__.py lists them); its
`cmd_<name>(ns)` runs it and returns an exit code. Errors are raised, and printed by the CLI
in its one-line style: 1 for a registry error, 2 for bad usage. `main_<name>(argv)` runs
`nkikit <name> ARGV`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..cli.options import (
    UsageError,
    add_hub,
    add_out,
    describe_os_error,
    nonempty_arg,
    output_file,
    path_arg,
)
from .errors import RegistryError

# the registry's documented failures: reported as one line (exit 1), never as a traceback
_EXPECTED = (
    RegistryError,
    ValueError,
    FileNotFoundError,
    PermissionError,
    LookupError,
    ImportError,
)


def _cli(name: str, argv: Sequence[str] | None) -> int:
    from ..cli import main

    return main([name, *(sys.argv[1:] if argv is None else argv)])


def _expected(fn):  # noqa: ANN001, ANN202
    """Raise the registry's expected failures as RegistryError, so the CLI prints one line."""
    try:
        return fn()
    except RegistryError:
        raise
    except _EXPECTED as e:
        # an OSError about a path in words, not "[Errno 2] No such file or directory: ..."
        path_error = isinstance(e, OSError) and e.filename is not None
        raise RegistryError(describe_os_error(e) if path_error else str(e)) from e


def main_publish(argv: Sequence[str] | None = None) -> int:
    """`nkikit publish ARGV`."""
    return _cli("publish", argv)


def main_pull(argv: Sequence[str] | None = None) -> int:
    """`nkikit pull ARGV`."""
    return _cli("pull", argv)


def main_lock(argv: Sequence[str] | None = None) -> int:
    """`nkikit lock ARGV`."""
    return _cli("lock", argv)


def add_publish(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish",
        help="publish a kernel folder to a Hub",
        description="Check a kernel folder's manifest, test it, build it and publish it to a Hub.",
    )
    p.add_argument(
        "path",
        nargs="?",
        type=path_arg,  # '' would publish the current folder
        default="kernels",
        help="kernel folder (or, with --all, the folder of kernel folders)",
    )
    p.add_argument("--repo", help="target repo id, org/name")
    p.add_argument(
        "--all", action="store_true", help="publish every kernel folder under PATH to --org"
    )
    p.add_argument("--org", help="organization for --all (repos are <org>/<kernel name>)")
    p.add_argument(
        "--version", type=int, default=None, help="override the major version in kernel.toml"
    )
    p.add_argument(
        "--no-tests", action="store_true", help="publish without running the kernel's tests"
    )
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument(
        "--no-neuron",
        action="store_true",
        help="do not publish the torch-neuron (NKI source) build",
    )
    add_hub(p)
    p.set_defaults(fn=cmd_publish)


def cmd_publish(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .publish import publish, publish_all

    if args.all and not args.org:
        raise UsageError("--all needs --org ORG")
    if not args.all and not args.repo:
        raise UsageError("--repo org/name is required (or use --all --org ORG)")
    # progress on stderr: a spinner with the step under way (tests and uploads take seconds),
    # each finished step as a line on stdout
    with Console(stderr=True).status("publishing ...") as status:

        def log(message: str) -> None:
            print(message, flush=True)
            status.update(message)

        kwargs = dict(
            endpoint=args.endpoint,
            token=args.token,
            version=args.version,
            run_tests=not args.no_tests,
            private=args.private,
            neuron=not args.no_neuron,
            log=log,
        )
        if args.all:
            results = _expected(lambda: publish_all(args.path, args.org, **kwargs))
        else:
            results = [_expected(lambda: publish(args.path, args.repo, **kwargs))]
    if not results:  # --all found no kernel folder: say so, not a silent success
        print(
            f"error: no kernel folder (one with a kernel.toml) under {args.path}", file=sys.stderr
        )
        return 1
    for r in results:
        builds = ", ".join(f"{v}={i}" for v, i in r.variants.items())
        print(f"{r.repo_id} v{r.version}: {r.branch} @ {r.commit} ({builds})")
    return 0


def add_pull(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="pull a kernel from a Hub",
        description="Download, verify and load a kernel from a Hub; print its functions.",
    )
    p.add_argument("repo", help="repo id, org/name")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--version", type=int, default=None, help="major version (branch vN); default: latest"
    )
    g.add_argument("--revision", type=nonempty_arg, default=None, help="branch, tag or commit")
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron"])
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run code from an organization not in NKIKIT_TRUSTED_ORGS",
    )
    p.add_argument(
        "--lockfile",
        type=path_arg,
        default=None,
        help="kernels.lock to honour (default: ./kernels.lock if present)",
    )
    p.add_argument("--no-lockfile", action="store_true", help="ignore ./kernels.lock")
    p.add_argument(
        "--cache-dir", type=path_arg, default=None, help="HF cache folder (default: HF_HUB_CACHE)"
    )
    p.add_argument(
        "--download-only", action="store_true", help="download and verify, do not import"
    )
    add_hub(p)
    p.set_defaults(fn=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    from .pull import locate, pull

    lockfile = False if args.no_lockfile else args.lockfile
    common = dict(
        endpoint=args.endpoint,
        token=args.token,
        backend=args.backend,
        lockfile=lockfile,
        cache_dir=args.cache_dir,
    )
    if args.download_only:
        from .names import parse_repo_id
        from .trust import check_trust

        def download():  # noqa: ANN202
            check_trust(parse_repo_id(args.repo), True)  # nothing runs: downloading is safe
            return locate(args.repo, args.version, args.revision, **common)

        path, found, meta = _expected(download)
        print(f"{args.repo} @ {found.sha}: verified {len(meta['digest']['files'])} files in {path}")
        return 0
    k = _expected(
        lambda: pull(
            args.repo,
            args.version,
            args.revision,
            trust_remote_code=args.trust_remote_code,
            **common,
        )
    )
    print(f"{k.repo_id} v{k.version} @ {k.revision} ({k.variant}) -> module {k.namespace}")
    print(f"  files: {k.path}")
    for name, fn in k.functions.items():
        spec = getattr(fn, "spec", None)
        sig = spec.signature if spec is not None else name
        if spec is None:
            print(f"  {sig}")
            continue
        own = "".join(f"; {n}: {', '.join(d)}" for n, d in spec.input_dtypes.items())
        print(f"  {sig}  dtypes: {', '.join(spec.dtypes)}{own}")
    return 0


def add_lock(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lock",
        help="write kernels.lock",
        description="Pin kernel repos to commits in kernels.lock, in the format of HF kernels "
        ">= 0.17 (from [tool.kernels.dependencies] in pyproject.toml, or repo ids).",
    )
    p.add_argument(
        "targets",
        nargs="*",
        type=nonempty_arg,
        default=["."],
        help="a project folder / pyproject.toml, or repo ids org/name[@N]",
    )
    add_out(p, "lockfile to write (default: kernels.lock next to the project, or ./kernels.lock)")
    add_hub(p)
    p.set_defaults(fn=cmd_lock)


def cmd_lock(args: argparse.Namespace) -> int:
    from .lock import lock

    targets = list(args.targets)
    project = len(targets) == 1 and (os.path.isdir(targets[0]) or targets[0].endswith(".toml"))
    deps: object = targets[0] if project else targets
    if args.out:
        out = Path(args.out)
    elif project:
        base = Path(targets[0])
        out = (base if base.is_dir() else base.parent) / "kernels.lock"
    else:
        out = Path("kernels.lock")
    output_file(str(out), "-o/--out" if args.out else "the lockfile")  # before the Hub calls
    entries = _expected(lambda: lock(deps, out, endpoint=args.endpoint, token=args.token))
    for e in entries:
        print(f"{e.repo_id} @ {e.sha}")
    print(f"wrote {out}")
    return 0
