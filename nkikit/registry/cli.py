"""`nkikit publish | pull | lock`: the registry's command lines (nkikit/cli.py dispatches here).

Each `main_*(argv)` parses its own arguments and returns an exit code: 0 on success, 1 for a
registry error (printed as one `error: ...` message, no traceback), 2 for bad usage (argparse).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import RegistryError

_EXPECTED = (
    RegistryError,
    ValueError,
    FileNotFoundError,
    PermissionError,
    LookupError,
    ImportError,
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or huggingface.co)"
    )
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN / the saved login)")


def _fail(e: BaseException) -> int:
    print(f"error: {e}", file=sys.stderr)
    return 1


def main_publish(argv: Sequence[str] | None = None) -> int:
    """`nkikit publish kernels/<name> --repo org/name` or `nkikit publish [kernels/] --all --org ORG`."""
    p = argparse.ArgumentParser(
        prog="nkikit publish", description="Test a kernel folder, build it and publish it to a Hub."
    )
    p.add_argument(
        "path",
        nargs="?",
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
    _common(p)
    args = p.parse_args(argv)
    from .publish import publish, publish_all

    kwargs = dict(
        endpoint=args.endpoint,
        token=args.token,
        version=args.version,
        run_tests=not args.no_tests,
        private=args.private,
        neuron=not args.no_neuron,
        log=print,
    )
    try:
        if args.all:
            if not args.org:
                p.error("--all needs --org ORG")
            results = publish_all(args.path, args.org, **kwargs)
        else:
            if not args.repo:
                p.error("--repo org/name is required (or use --all --org ORG)")
            results = [publish(args.path, args.repo, **kwargs)]
    except _EXPECTED as e:
        return _fail(e)
    for r in results:
        print(
            f"{r.repo_id} v{r.version}: {r.branch} @ {r.commit} ({', '.join(f'{v}={i}' for v, i in r.variants.items())})"
        )
    return 0


def main_pull(argv: Sequence[str] | None = None) -> int:
    """`nkikit pull org/name [--version N | --revision R]`: download, verify, import; print a summary."""
    p = argparse.ArgumentParser(
        prog="nkikit pull", description="Download, verify and load a kernel from a Hub."
    )
    p.add_argument("repo", help="repo id, org/name")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--version", type=int, default=None, help="major version (branch vN); default: latest"
    )
    g.add_argument("--revision", default=None, help="branch, tag or commit")
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron"])
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run code from an organization not in NKIKIT_TRUSTED_ORGS",
    )
    p.add_argument(
        "--lockfile",
        default=None,
        help="kernels.lock to honour (default: ./kernels.lock if present)",
    )
    p.add_argument("--no-lockfile", action="store_true", help="ignore ./kernels.lock")
    p.add_argument("--cache-dir", default=None, help="HF cache folder (default: HF_HUB_CACHE)")
    p.add_argument(
        "--download-only", action="store_true", help="download and verify, do not import"
    )
    _common(p)
    args = p.parse_args(argv)
    from .pull import locate, pull

    lockfile = False if args.no_lockfile else args.lockfile
    common = dict(
        endpoint=args.endpoint,
        token=args.token,
        backend=args.backend,
        lockfile=lockfile,
        cache_dir=args.cache_dir,
    )
    try:
        if args.download_only:
            from .names import parse_repo_id
            from .trust import check_trust

            check_trust(parse_repo_id(args.repo), True)  # nothing runs: downloading is safe
            path, found, meta = locate(args.repo, args.version, args.revision, **common)
            print(
                f"{args.repo} @ {found.sha}: verified {len(meta['digest']['files'])} files in {path}"
            )
            return 0
        k = pull(
            args.repo,
            args.version,
            args.revision,
            trust_remote_code=args.trust_remote_code,
            **common,
        )
    except _EXPECTED as e:
        return _fail(e)
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


def main_lock(argv: Sequence[str] | None = None) -> int:
    """`nkikit lock [PROJECT_DIR | org/name[@N] ...] [-o kernels.lock]`: pin kernels to commits."""
    p = argparse.ArgumentParser(
        prog="nkikit lock",
        description="Pin kernel repos to commits and per-build hashes in kernels.lock "
        "(from [tool.kernels.dependencies] in pyproject.toml, or repo ids).",
    )
    p.add_argument(
        "targets",
        nargs="*",
        default=["."],
        help="a project folder / pyproject.toml, or repo ids org/name[@N]",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="lockfile to write (default: kernels.lock next to the project, or ./kernels.lock)",
    )
    _common(p)
    args = p.parse_args(argv)
    from .lock import lock

    targets = list(args.targets)
    project = len(targets) == 1 and (os.path.isdir(targets[0]) or targets[0].endswith(".toml"))
    deps: object = targets[0] if project else targets
    if args.output:
        out = Path(args.output)
    elif project:
        base = Path(targets[0])
        out = (base if base.is_dir() else base.parent) / "kernels.lock"
    else:
        out = Path("kernels.lock")
    try:
        entries = lock(deps, out, endpoint=args.endpoint, token=args.token)
    except _EXPECTED as e:
        return _fail(e)
    for e in entries:
        print(f"{e.repo_id} @ {e.sha}")
    print(f"wrote {out}")
    return 0
