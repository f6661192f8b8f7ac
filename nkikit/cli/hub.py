"""``nkikit hub serve``: a Hub-compatible server over a local folder (``nkikit.hub``)."""

from __future__ import annotations

import argparse


def add_hub(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hub",
        help="Hub-compatible server: `nkikit hub serve --root DIR [--port N]`",
        description="A Hub-compatible HTTP server over a local folder, for offline use, CI and "
        "private registries.",
    )
    hub = p.add_subparsers(dest="hub_command", required=True, metavar="COMMAND")
    serve = hub.add_parser(
        "serve",
        help="serve a folder of kernel repos",
        add_help=False,  # `nkikit hub serve --help` is the server's own (all its options)
        usage="nkikit hub serve --root DIR [--port N] [--token T] [...]",
    )
    serve.set_defaults(fn=cmd_serve, passthrough=2)


def cmd_serve(ns: argparse.Namespace) -> int:
    from ..hub.server import main

    return int(main(ns.rest) or 0)
