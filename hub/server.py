"""Running the hub: in a background thread (tests, demos), in the foreground, or from the CLI.

`running_hub(root)` is the one-liner for tests: it serves `root` on a free loopback port and yields
the base URL to pass as `HfApi(endpoint=url)`. `serve()` blocks; `main(argv)` is the CLI behind both
`python -m nkikit.hub` and `nkikit hub serve`. The server is werkzeug's threaded WSGI server, which
is right for loopback, CI and small teams; put a production WSGI server in front of `create_app`
for anything larger.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from nkikit.registry.trust import DEFAULT_TRUSTED_ORGS

from .app import DEFAULT_MAX_UPLOAD, DEFAULT_USER, create_app
from .storage import FAILPOINT_ENV

TOKEN_ENV = "NKIKIT_HUB_TOKEN"


#: Seconds a connection may sit idle (no bytes arriving) before the server drops it, so a
#: half-open or stalled client cannot hold a server thread forever.
DEFAULT_TIMEOUT = 60.0


class _QuietHandler(WSGIRequestHandler):
    """Logs errors only, not one line per request."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class HubServer:
    """A hub serving `root` from a daemon thread.

    `start()` binds (port 0 = a free port) and returns the base URL; `stop()` shuts the server down
    and waits for it. Usable as a context manager. `timeout`: seconds of silence after which a
    connection is dropped. Extra keyword options go to `create_app` (user, trusted_orgs,
    page_size, failpoint, reserved_namespaces, max_upload_bytes).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        quiet: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
        **app_options: Any,
    ):
        self.app = create_app(root, token=token, **app_options)
        self._host, self._port, self._quiet = host, port, quiet
        self._timeout = timeout
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. 'http://127.0.0.1:53127'."""
        if self._server is None:
            raise RuntimeError("hub server is not running")
        host = self._server.server_address[0]
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{self._server.server_port}"

    def start(self) -> str:
        if self._server is not None:
            return self.url
        base = _QuietHandler if self._quiet else WSGIRequestHandler
        # socketserver's StreamRequestHandler applies `timeout` to every read and write.
        handler = type("HubRequestHandler", (base,), {"timeout": self._timeout})
        try:
            self._server = make_server(
                self._host, self._port, self.app, threaded=True, request_handler=handler
            )
        except SystemExit:
            # werkzeug reports a busy port by exiting the process; a library must not.
            raise OSError(
                errno.EADDRINUSE, f"{self._host}:{self._port} is already in use"
            ) from None
        server = self._server
        self._thread = threading.Thread(
            # A short poll interval makes stop() quick (the default 0.5 s adds up in test suites).
            target=lambda: server.serve_forever(poll_interval=0.05),
            name=f"nkikit-hub-{self._server.server_port}",
            daemon=True,
        )
        self._thread.start()
        return self.url

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C raises KeyboardInterrupt here)."""
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running_hub(
    root: str | os.PathLike[str], token: str | None = None, **options: Any
) -> Iterator[str]:
    """Serve `root` on a free loopback port for the duration of the block; yields the base URL.

    Options as for HubServer (e.g. page_size=2, trusted_orgs=["org"]).
    """
    server = HubServer(root, token=token, **options)
    try:
        yield server.start()
    finally:
        server.stop()


def serve(
    root: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    **options: Any,
) -> None:
    """Serve `root` until interrupted (Ctrl-C). Prints the base URL on its first stdout line."""
    server = HubServer(root, host=host, port=port, token=token, **options)
    url = server.start()
    print(f"nkikit hub: serving {os.path.abspath(root)} at {url}", flush=True)
    if token is None and not _is_loopback(host):
        print(
            "nkikit hub: warning: no token set and not bound to loopback: anyone can write",
            file=sys.stderr,
            flush=True,
        )
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free one); argparse names the option when it is not."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return port


def _root(text: str) -> str:
    """A folder path; an empty one (which would serve the current folder) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder path, got an empty one")
    return text


def _positive(what: str):
    """An argparse type: a finite number above 0 (``what`` names it in the message)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"expected {what} above 0, got {text!r}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nkikit hub serve",
        description="Serve a folder as a Hugging Face Hub-compatible registry "
        "(point huggingface_hub at it with endpoint=URL or HF_ENDPOINT=URL).",
    )
    p.add_argument(
        "--root", required=True, type=_root, help="folder holding the repos (created if missing)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=0, help="port (default: 0, any free port)")
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help="require 'Authorization: Bearer TOKEN' for writes and private repos "
        f"(prefer the env var {TOKEN_ENV}: command lines are visible to other users)",
    )
    p.add_argument("--user", default=DEFAULT_USER, help="account name reported by whoami")
    p.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="ORG",
        help="report ORG as a trusted kernel publisher (repeatable; '*' for all)",
    )
    p.add_argument(
        "--unreserve",
        action="append",
        default=[],
        metavar="ORG",
        help="let anyone write to ORG on a hub without a token (repeatable; '*' for all). By "
        f"default the namespaces nkikit trusts ({', '.join(DEFAULT_TRUSTED_ORGS)}) and those given "
        "with --trust take writes only from a token holder, so without --token they are read-only",
    )
    p.add_argument(
        "--max-upload-mb",
        type=_positive("a size in MiB"),
        default=DEFAULT_MAX_UPLOAD / (1 << 20),
        help=f"largest request body in MiB (default {DEFAULT_MAX_UPLOAD >> 20}; 413 beyond)",
    )
    p.add_argument(
        "--timeout",
        type=_positive("a number of seconds"),
        default=DEFAULT_TIMEOUT,
        help=f"seconds an idle connection is kept (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument("--verbose", action="store_true", help="log every request")
    return p


def reserved_namespaces(trusted: Sequence[str], unreserved: Sequence[str]) -> tuple[str, ...]:
    """What `nkikit hub serve` reserves: the default-trusted and `--trust` namespaces, less those
    given with `--unreserve` ('*' lifts all)."""
    if "*" in unreserved:
        return ()
    lifted = {u.lower() for u in unreserved}
    return tuple(n for n in (*DEFAULT_TRUSTED_ORGS, *trusted) if n.lower() not in lifted)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: `python -m nkikit.hub --root DIR [--port N] [--token T]`. Returns an exit code."""
    args = _parser().parse_args(argv)
    try:
        serve(
            args.root,
            host=args.host,
            port=args.port,
            token=args.token or None,
            quiet=not args.verbose,
            user=args.user,
            trusted_orgs=args.trust,
            reserved_namespaces=reserved_namespaces(args.trust, args.unreserve),
            max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
            timeout=args.timeout,
            failpoint=os.environ.get(FAILPOINT_ENV),
        )
    except OSError as e:  # port taken, root not writable, ...
        print(f"nkikit hub: cannot serve {args.root}: {e}", file=sys.stderr)
        return 1
    return 0
