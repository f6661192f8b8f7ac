"""The HTTP face of the hub: the routes `huggingface_hub` calls, as a Flask app over a `Storage`.

Routing is done on the *raw* request path, segment by segment, because revisions and paths arrive
URL-quoted ('release%2Fv1') and a decoded path could no longer tell a branch 'release/v1' from a
branch 'release' followed by a folder 'v1'. Every route below is one `case` of `HubApi.dispatch`.

Errors leave as `{"error": message}` with the `X-Error-Code` / `X-Error-Message` headers the client
maps to its named exceptions (see errors.py). Auth: with a token configured, writes, whoami and
private repos need `Authorization: Bearer <token>`; a private repo hidden from a caller answers
exactly like a missing one. With no token configured the hub is open, except for its reserved
namespaces (by default the ones nkikit's client trusts): they are read-only, since anyone could
otherwise publish under a trusted name.

Limits: a request body is read in chunks up to `max_upload_bytes` (413 beyond; commits are
streamed to disk, see upload.py), card metadata is parsed with a size and an expanded-node limit,
and malformed input of any kind is a 4xx: a 500 means a bug or corrupt storage.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes, urlencode, urlsplit

import yaml
from flask import Flask, Request, Response, jsonify, request, send_file
from werkzeug.exceptions import HTTPException
from werkzeug.http import parse_range_header

from nkikit.registry.trust import DEFAULT_TRUSTED_ORGS

from . import names
from .errors import (
    BadRequest,
    EntryNotFound,
    Forbidden,
    HubError,
    NotFound,
    RepoNotFound,
    RevisionNotFound,
    Unauthorized,
)
from .names import RepoRef, check_folder_path, check_repo_path, is_commit_sha
from .storage import AddFile, Commit, CommitOp, DeleteFile, DeleteFolder, RepoMeta, Storage
from .upload import decode_base64_file, ndjson_lines, read_body, read_small_body

log = logging.getLogger("nkikit.hub")

DEFAULT_USER = "local"
DEFAULT_MAX_UPLOAD = 1 << 30  # 1 GiB per request body
MAX_CARD_METADATA = 64 << 10  # bytes of a card's YAML front matter
MAX_CARD_NODES = 10_000  # YAML nodes of card metadata once aliases are expanded
_PLURALS = tuple(names.TYPE_BY_PLURAL)  # ("models", "datasets", "spaces", "kernels")
_TYPED_PREFIXES = ("datasets", "spaces", "kernels")  # download URLs of models have no prefix
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]


def create_app(
    root: str | os.PathLike[str],
    *,
    token: str | None = None,
    user: str = DEFAULT_USER,
    trusted_orgs: Iterable[str] = (),
    page_size: int = 1000,
    failpoint: str | None = None,
    reserved_namespaces: Iterable[str] | None = None,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD,
) -> Flask:
    """A WSGI app serving the repos stored under `root` (created if missing).

    token: if set, required (as a Bearer token) for writes and for private repos.
    user: the account name whoami reports, and the namespace of repos created without one.
    trusted_orgs: namespaces reported as `trustedKernelPublisher` ("*" = every namespace).
    page_size: entries per page of tree listings (the Hub uses 1000; 50 when expanded).
    failpoint: testing only, see storage.Failpoint.
    reserved_namespaces: namespaces that only an authenticated writer may write to, so that on
      a hub without a token they are read-only (the default, None: the namespaces nkikit's
      client trusts by default, plus `trusted_orgs`; "*" reserves every namespace; () none).
    max_upload_bytes: the largest request body accepted (413 beyond).
    """
    trusted_orgs = list(trusted_orgs)
    if reserved_namespaces is None:
        reserved_namespaces = (*DEFAULT_TRUSTED_ORGS, *trusted_orgs)
    api = HubApi(
        Storage(root, failpoint=failpoint),
        token,
        user,
        trusted_orgs,
        page_size,
        reserved=reserved_namespaces,
        max_upload=max_upload_bytes,
    )
    app = Flask("nkikit.hub")
    app.url_map.merge_slashes = False  # 'a//b' must reach the path check, not be redirected

    @app.route("/", defaults={"_path": ""}, methods=_ALL_METHODS)
    @app.route("/<path:_path>", methods=_ALL_METHODS)
    def _dispatch(_path: str) -> Response:
        return api.dispatch(request)

    @app.errorhandler(HubError)
    def _hub_error(err: HubError) -> Response:
        return _error_response(err)

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> Response:
        return _error_response(HubError(err.description or err.name, status=err.code or 500))

    @app.errorhandler(Exception)
    def _crash(err: Exception) -> Response:
        if isinstance(err, TimeoutError):
            return _error_response(HubError(str(err), status=503))
        log.error("internal error:\n%s", traceback.format_exc())
        return _error_response(HubError(f"Internal error: {type(err).__name__}: {err}", status=500))

    return app


def _header_safe(text: str) -> str:
    # ASCII without control characters: a NUL or newline from a client's input (echoed in the
    # message) would make the header line illegal, and the client would see no answer at all.
    ascii_text = text.encode("ascii", "replace").decode()
    return "".join(c if 32 <= ord(c) < 127 else " " for c in ascii_text)[:1000]


def _error_response(err: HubError) -> Response:
    resp = jsonify({"error": err.message, **err.extra})
    resp.status_code = err.status
    resp.headers["X-Error-Message"] = _header_safe(err.message)
    if err.code:
        resp.headers["X-Error-Code"] = err.code
    if err.repo_commit:
        resp.headers["X-Repo-Commit"] = err.repo_commit
    return resp


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes", "on")


def _flag(body: dict, key: str) -> bool:
    """A boolean field of a JSON body (absent or null: False). Raises BadRequest otherwise."""
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key!r} must be true or false")
    return value


def _is_count(text: str) -> bool:
    """True for a non-negative decimal integer in ASCII digits ('²' and '٣' are digits too)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _raw_path(environ: dict) -> str:
    """The request path exactly as the client sent it (still percent-encoded)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if not raw:  # a server that keeps no raw URI: re-quote the decoded path (loses '%2F')
        # WSGI strings carry the request's bytes as latin-1 characters.
        return quote(
            (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1")
        )
    if "://" in raw.split("?", 1)[0]:  # absolute-form request target
        return urlsplit(raw).path
    return raw.split("?", 1)[0]


def _route_segments(environ: dict) -> list[str]:
    """The decoded segments of the request path below the app's mount point."""
    raw = _raw_path(environ)
    mount = quote(environ.get("SCRIPT_NAME", "").encode("latin-1"))
    if mount and raw.startswith(mount):
        raw = raw[len(mount) :]
    try:
        # Decode each segment on its own, so an encoded '/' stays inside its segment.
        return [unquote_to_bytes(s.encode("latin-1")).decode() for s in raw.split("/")[1:]]
    except UnicodeError:
        raise BadRequest("Request path is not valid UTF-8") from None


def _front_matter(text: str) -> dict | None:
    """The YAML block at the top of a model card, or None if it has none. Raises yaml.YAMLError.

    The block is held to MAX_CARD_METADATA bytes and MAX_CARD_NODES nodes *after* aliases are
    expanded: a few hundred bytes of nested aliases ("billion laughs") would otherwise expand
    into gigabytes when the metadata is turned into JSON.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            block = "\n".join(lines[1:i])
            if len(block.encode()) > MAX_CARD_METADATA:
                raise yaml.YAMLError(f"metadata is larger than {MAX_CARD_METADATA} bytes")
            data = _safe_yaml(block)
            if data is None:
                return {}
            if not isinstance(data, dict):
                raise yaml.YAMLError("metadata must be a YAML mapping")
            return data
    raise yaml.YAMLError("metadata block is not closed by a '---' line")


def _safe_yaml(text: str) -> object:
    """yaml.safe_load, refusing documents that expand past MAX_CARD_NODES nodes."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n: yaml.Node) -> int:
            # Memoized by node identity: an alias is the anchored node itself, counted again.
            if id(n) in sizes:
                return sizes[id(n)]
            sizes[id(n)] = MAX_CARD_NODES + 1  # a cycle (recursive alias) is too large
            if isinstance(n, yaml.SequenceNode):
                total = 1 + sum(expanded(c) for c in n.value)
            elif isinstance(n, yaml.MappingNode):
                total = 1 + sum(expanded(k) + expanded(v) for k, v in n.value)
            else:
                total = 1
            sizes[id(n)] = total = min(total, MAX_CARD_NODES + 1)
            return total

        if expanded(node) > MAX_CARD_NODES:
            raise yaml.YAMLError(
                f"metadata expands to more than {MAX_CARD_NODES} YAML nodes (aliases included)"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError("metadata is nested too deeply") from None
    finally:
        loader.dispose()


class HubApi:
    """Request handlers. One instance per app; holds no per-request state."""

    def __init__(
        self,
        storage: Storage,
        token: str | None,
        user: str,
        trusted_orgs: Iterable[str],
        page_size: int,
        *,
        reserved: Iterable[str] = (),
        max_upload: int = DEFAULT_MAX_UPLOAD,
    ):
        self.storage = storage
        self.token = token
        self.user = user
        self.trusted = set(trusted_orgs)
        self.page_size = max(1, page_size)
        self.reserved = {r.lower() for r in reserved}
        self.max_upload = max_upload

    # -- auth --------------------------------------------------------------------------------

    def _presented_token(self, req: Request) -> str | None:
        header = req.headers.get("Authorization", "")
        if header[:7].lower() == "bearer ":
            return header[7:].strip()
        return None

    def _authorized(self, req: Request) -> bool:
        if self.token is None:
            return True
        presented = self._presented_token(req)
        return presented is not None and hmac.compare_digest(
            presented.encode(), self.token.encode()
        )

    def _require_write(self, req: Request, namespace: str) -> None:
        if self.token is None and ("*" in self.reserved or namespace.lower() in self.reserved):
            # Without a token nobody is authenticated, so a reserved namespace is read-only:
            # clients may trust it by name, and anyone could otherwise publish under it.
            raise Forbidden(
                f"Namespace {namespace!r} is reserved on this hub: it takes writes only from an "
                "authenticated writer. Start the hub with a token (--token or NKIKIT_HUB_TOKEN), "
                f"or with --unreserve {namespace} to let anyone write to it."
            )
        if self._authorized(req):
            return
        if self._presented_token(req) is None:
            raise Unauthorized(
                "Authentication required: this hub needs 'Authorization: Bearer <token>' for writes "
                "(pass token= to huggingface_hub)"
            )
        raise Unauthorized("Invalid credentials in Authorization header")

    def _readable(self, req: Request, meta: RepoMeta) -> RepoMeta:
        if meta.private and not self._authorized(req):
            # Same answer as a missing repo, so private names do not leak.
            raise RepoNotFound(f"Repository not found: {meta.ref.id}")
        return meta

    # -- helpers -----------------------------------------------------------------------------

    def _ref(self, plural: str, namespace: str, name: str) -> RepoRef:
        try:
            return names.repo_ref(names.TYPE_BY_PLURAL[plural], namespace, name)
        except BadRequest:
            # A name that cannot be created cannot exist.
            raise RepoNotFound(f"Repository not found: {namespace}/{name}") from None

    def _read_repo(self, req: Request, plural: str, ns: str, name: str) -> RepoMeta:
        return self._readable(req, self.storage.meta(self._ref(plural, ns, name)))

    def _write_repo(self, req: Request, plural: str, ns: str, name: str) -> RepoRef:
        self._require_write(req, ns)
        ref = self._ref(plural, ns, name)
        self.storage.meta(ref)  # RepoNotFound before any work
        return ref

    @staticmethod
    def _json_body(req: Request) -> dict:
        data = read_small_body(req)
        if not data.strip():
            return {}
        try:
            body = json.loads(data)
        except ValueError as e:
            raise BadRequest(f"Request body is not valid JSON: {e}") from None
        except RecursionError:
            raise BadRequest("Request body is nested too deeply") from None
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object")
        return body

    @staticmethod
    def _base_url(req: Request) -> str:
        """The hub's root URL (including the mount point when served under a path prefix)."""
        return req.root_url.rstrip("/")

    def _next_link(self, req: Request, **params: str) -> str:
        """Absolute URL of the next page: same raw path, query with `params` replaced."""
        query = {k: v for k, v in req.args.items(multi=True) if k not in params}
        query.update(params)
        return f"{req.host_url.rstrip('/')}{_raw_path(req.environ)}?{urlencode(query)}"

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, req: Request) -> Response:
        segs = _route_segments(req.environ)
        method = req.method
        match (method, segs):
            case ("GET", ["api", "whoami-v2"]):
                return self.whoami(req)
            case ("POST", ["api", "repos", "create"]):
                return self.create_repo(req)
            case ("DELETE", ["api", "repos", "delete"]):
                return self.delete_repo(req)
            case ("POST", ["api", "validate-yaml"]):
                return self.validate_yaml(req)
            case ("GET", ["api", "organizations", org, "overview"]):
                return self.org_overview(req, org)
            case ("GET", ["api", plural]) if plural in _PLURALS:
                return self.list_repos(req, plural)
            case (_, ["api", plural, ns, name, *rest]) if plural in _PLURALS:
                return self.repo_route(req, method, plural, ns, name, rest)
            case ("GET" | "HEAD", [prefix, ns, name, "resolve", rev, *path]) if (
                prefix in _TYPED_PREFIXES
            ):
                return self.resolve(req, prefix, ns, name, rev, path)
            case ("GET" | "HEAD", [ns, name, "resolve", rev, *path]):
                return self.resolve(req, "models", ns, name, rev, path)
        raise NotFound(f"No route for {method} {req.path}")

    def repo_route(
        self, req: Request, method: str, plural: str, ns: str, name: str, rest: list[str]
    ) -> Response:
        match (method, rest):
            case ("GET", []):
                return self.repo_info(req, plural, ns, name, None)
            case ("GET", ["revision", rev]):
                return self.repo_info(req, plural, ns, name, rev)
            case ("GET", ["refs"]):
                return self.list_refs(req, plural, ns, name)
            case ("POST", ["branch", branch]):
                return self.create_branch(req, plural, ns, name, branch)
            case ("DELETE", ["branch", branch]):
                return self.delete_branch(req, plural, ns, name, branch)
            case ("POST", ["tag", rev]):
                return self.create_tag(req, plural, ns, name, rev)
            case ("DELETE", ["tag", tag]):
                return self.delete_tag(req, plural, ns, name, tag)
            case ("GET", ["tree", rev, *path]):
                return self.tree(req, plural, ns, name, rev, path)
            case ("POST", ["paths-info", rev]):
                return self.paths_info(req, plural, ns, name, rev)
            case ("POST", ["preupload", rev]):
                return self.preupload(req, plural, ns, name, rev)
            case ("POST", ["commit", rev]):
                return self.commit(req, plural, ns, name, rev)
            case ("GET", ["commits", rev]):
                return self.list_commits(req, plural, ns, name, rev)
            case ("PUT", ["settings"]):
                return self.update_settings(req, plural, ns, name)
        raise NotFound(f"No route for {method} {req.path}")

    # -- account -----------------------------------------------------------------------------

    def whoami(self, req: Request) -> Response:
        if self.token is not None and not self._authorized(req):
            raise Unauthorized("Invalid user token")
        return jsonify(
            {
                "type": "user",
                "id": self.user,
                "name": self.user,
                "fullname": self.user,
                "email": None,
                "emailVerified": False,
                "isPro": False,
                "orgs": [],
                "auth": {
                    "type": "access_token",
                    "accessToken": {"displayName": "nkikit-hub", "role": "write"},
                },
            }
        )

    def org_overview(self, req: Request, org: str) -> Response:
        counts = {plural: 0 for plural in _PLURALS}
        visible_all = self._authorized(req)
        for plural in _PLURALS:
            for meta in self.storage.list_repos(names.TYPE_BY_PLURAL[plural]):
                if meta.ref.namespace == org and (visible_all or not meta.private):
                    counts[plural] += 1
        trusted = org in self.trusted or "*" in self.trusted
        if not any(counts.values()) and not trusted:
            raise NotFound(f"Organization not found: {org}")
        return jsonify(
            {
                "type": "org",
                "name": org,
                "fullname": org,
                "avatarUrl": "",
                "isVerified": False,
                "numUsers": 1,
                "numFollowers": 0,
                "numModels": counts["models"],
                "numDatasets": counts["datasets"],
                "numSpaces": counts["spaces"],
                "numKernels": counts["kernels"],
                "trustedKernelPublisher": trusted,
            }
        )

    def validate_yaml(self, req: Request) -> Response:
        body = self._json_body(req)
        content = body.get("content", "")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string")
        try:
            _front_matter(content)
        except yaml.YAMLError as e:
            message = f"Invalid YAML metadata: {e}"
            raise HubError(message, status=400, extra={"errors": [{"message": message}]}) from None
        return jsonify({"errors": [], "warnings": []})

    # -- repos -------------------------------------------------------------------------------

    def create_repo(self, req: Request) -> Response:
        body = self._json_body(req)
        repo_type = body.get("type") or "model"
        namespace = body.get("organization") or self.user
        name = body.get("name")
        if not all(isinstance(v, str) for v in (name, namespace, repo_type)):
            raise BadRequest("'name' (and 'organization', 'type' if given) must be strings")
        self._require_write(req, namespace)
        ref = names.repo_ref(repo_type, namespace, name)
        visibility = body.get("visibility")
        if visibility is not None and visibility not in ("public", "private"):
            raise BadRequest("'visibility' must be 'public' or 'private'")
        private = visibility == "private" if visibility is not None else _flag(body, "private")
        url = f"{self._base_url(req)}/{ref.url_path}"
        try:
            self.storage.create_repo(ref, private=private, author=self.user)
        except HubError as err:
            # The client reads `url` from the 409 body when called with exist_ok=True.
            err.extra.update(url=url, name=ref.id)
            raise
        return jsonify({"url": url, "name": ref.id, "id": ref.id})

    def delete_repo(self, req: Request) -> Response:
        body = self._json_body(req)
        repo_type = body.get("type") or "model"
        if not isinstance(repo_type, str) or repo_type not in names.REPO_TYPES:
            raise BadRequest(f"Invalid repo type {repo_type!r}")
        name = body.get("name")
        namespace = body.get("organization") or self.user
        if not isinstance(name, str) or not isinstance(namespace, str):
            raise BadRequest("'name' (and 'organization' if given) must be strings")
        self._require_write(req, namespace)
        ref = self._ref(names.REPO_TYPES[repo_type], namespace, name)
        self.storage.delete_repo(ref)
        return jsonify({"deleted": ref.id})

    def update_settings(self, req: Request, plural: str, ns: str, name: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        body = self._json_body(req)
        if "visibility" in body:
            if body["visibility"] not in ("public", "private"):
                raise BadRequest("'visibility' must be 'public' or 'private'")
            self.storage.set_private(ref, body["visibility"] == "private")
        elif "private" in body:
            self.storage.set_private(ref, _flag(body, "private"))
        return jsonify({})

    def list_repos(self, req: Request, plural: str) -> Response:
        author = req.args.get("author")
        search = (req.args.get("search") or "").lower()
        limit = req.args.get("limit")
        if limit and not _is_count(limit):
            raise BadRequest(f"Invalid limit {limit!r}: expected a non-negative integer")
        visible_all = self._authorized(req)
        out = []
        for meta in self.storage.list_repos(names.TYPE_BY_PLURAL[plural]):
            if meta.private and not visible_all:
                continue
            if author and meta.ref.namespace != author:
                continue
            if search and search not in meta.ref.id.lower():
                continue
            try:
                head = self.storage.resolve(meta.ref, "main")
            except HubError:
                continue  # deleted while listing
            out.append(self._repo_summary(meta, head))
        if limit:
            out = out[: int(limit)]
        return jsonify(out)

    def _repo_summary(self, meta: RepoMeta, commit: Commit) -> dict:
        ref = meta.ref
        info = {
            "_id": hashlib.sha1(f"{ref.type}/{ref.id}".encode()).hexdigest()[:24],
            "id": ref.id,
            "author": ref.namespace,
            "sha": commit.sha,
            "lastModified": commit.date,
            "createdAt": meta.created_at,
            "private": meta.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
        }
        if ref.type == "model":
            info["modelId"] = ref.id
        return info

    def repo_info(self, req: Request, plural: str, ns: str, name: str, rev: str | None) -> Response:
        meta = self._read_repo(req, plural, ns, name)
        commit = self.storage.resolve(meta.ref, rev or "main")
        info = self._repo_summary(meta, commit)
        with_blobs = _truthy(req.args.get("blobs"))
        siblings = []
        for path, entry in sorted(commit.files.items()):
            sibling: dict = {"rfilename": path}
            if with_blobs:
                sibling.update(size=entry.size, blobId=entry.oid)
            siblings.append(sibling)
        info["siblings"] = siblings
        card = self._card_data(meta.ref, commit)
        if card is not None:
            info["cardData"] = card
            tags = card.get("tags")
            if isinstance(tags, list):
                info["tags"] = [t for t in tags if isinstance(t, str)]
        return jsonify(info)

    def _card_data(self, ref: RepoRef, commit: Commit) -> dict | None:
        entry = commit.files.get("README.md")
        if entry is None or entry.size > 1 << 20:
            return None
        try:
            data = _front_matter(self.storage.blob_path(ref, entry).read_text("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            return None
        # Only JSON-safe metadata is echoed (YAML dates and the like would break jsonify).
        try:
            return json.loads(json.dumps(data)) if data is not None else None
        except (TypeError, ValueError):
            return None

    # -- refs --------------------------------------------------------------------------------

    def list_refs(self, req: Request, plural: str, ns: str, name: str) -> Response:
        meta = self._read_repo(req, plural, ns, name)
        refs = self.storage.refs(meta.ref)
        out: dict = {
            "branches": [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha}
                for b, sha in sorted(refs.branches.items())
            ],
            "converts": [],
            "tags": [
                {"name": t, "ref": f"refs/tags/{t}", "targetCommit": tag["commit"]}
                for t, tag in sorted(refs.tags.items())
            ],
        }
        if _truthy(req.args.get("include_prs")):
            out["pullRequests"] = []
        return jsonify(out)

    def create_branch(self, req: Request, plural: str, ns: str, name: str, branch: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        body = self._json_body(req)
        start = body.get("startingPoint")
        if start is not None and not isinstance(start, str):
            raise BadRequest("'startingPoint' must be a string")
        self.storage.create_branch(ref, branch, start)
        return jsonify({})

    def delete_branch(self, req: Request, plural: str, ns: str, name: str, branch: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        self.storage.delete_branch(ref, branch)
        return jsonify({})

    def create_tag(self, req: Request, plural: str, ns: str, name: str, rev: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        body = self._json_body(req)
        tag = body.get("tag")
        if not isinstance(tag, str):
            raise BadRequest("'tag' is required")
        message = body.get("message")
        if message is not None and not isinstance(message, str):
            raise BadRequest("'message' must be a string")
        self.storage.create_tag(ref, tag, rev, message if isinstance(message, str) else None)
        return jsonify({})

    def delete_tag(self, req: Request, plural: str, ns: str, name: str, tag: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        self.storage.delete_tag(ref, tag)
        return jsonify({})

    # -- listings ----------------------------------------------------------------------------

    def _entry_json(self, commit: Commit, path: str) -> dict:
        entry = commit.files.get(path)
        if entry is not None:
            return {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
        return {"type": "directory", "oid": commit.folders[path], "size": 0, "path": path}

    def _add_last_commits(self, ref: RepoRef, commit: Commit, items: list[dict]) -> None:
        last = self.storage.last_commits(ref, commit, [item["path"] for item in items])
        for item in items:
            c = last[item["path"]]
            item["lastCommit"] = {"id": c.sha, "title": c.title, "date": c.date}

    def tree(
        self, req: Request, plural: str, ns: str, name: str, rev: str, path: list[str]
    ) -> Response:
        meta = self._read_repo(req, plural, ns, name)
        folder = "/".join(path).rstrip("/")
        if folder:
            check_folder_path(folder)
        cursor = req.args.get("cursor")
        if cursor:
            # The cursor pins the commit of the first page, so a branch moving mid-listing
            # cannot make pages overlap or skip entries.
            sha, offset = self._decode_cursor(cursor)
            commit = self.storage.read_commit(meta.ref, sha)
        else:
            commit, offset = self.storage.resolve(meta.ref, rev), 0
        if folder and folder not in commit.folders:
            err = EntryNotFound(f"{folder} does not exist on {rev}")
            err.repo_commit = commit.sha
            raise err
        recursive = _truthy(req.args.get("recursive"))
        expand = _truthy(req.args.get("expand"))
        prefix = f"{folder}/" if folder else ""
        paths = sorted(
            p
            for p in (*commit.folders, *commit.files)
            if p.startswith(prefix) and p != folder and (recursive or "/" not in p[len(prefix) :])
        )
        limit = min(self.page_size, 50) if expand else self.page_size
        page = [self._entry_json(commit, p) for p in paths[offset : offset + limit]]
        if expand:
            self._add_last_commits(meta.ref, commit, page)
        resp = jsonify(page)
        if offset + limit < len(paths):
            next_cursor = self._encode_cursor(commit.sha, offset + limit)
            resp.headers["Link"] = f'<{self._next_link(req, cursor=next_cursor)}>; rel="next"'
        return resp

    @staticmethod
    def _encode_cursor(sha: str, offset: int) -> str:
        return base64.urlsafe_b64encode(f"{sha}:{offset}".encode()).decode()

    @staticmethod
    def _decode_cursor(cursor: str) -> tuple[str, int]:
        try:
            sha, _, offset = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
            if is_commit_sha(sha) and _is_count(offset):
                return sha, int(offset)
        except (binascii.Error, ValueError):
            pass
        raise BadRequest("Invalid cursor")

    def paths_info(self, req: Request, plural: str, ns: str, name: str, rev: str) -> Response:
        meta = self._read_repo(req, plural, ns, name)
        commit = self.storage.resolve(meta.ref, rev)
        if req.is_json:
            body = self._json_body(req)
            paths, expand = body.get("paths") or [], _flag(body, "expand")
            if not isinstance(paths, list):
                raise BadRequest("'paths' must be a list of strings")
        else:
            paths, expand = req.form.getlist("paths"), _truthy(req.form.get("expand"))
        out = []
        for raw in paths:
            if not isinstance(raw, str):
                raise BadRequest("'paths' must be strings")
            path = check_folder_path(raw)
            if path in commit.files or path in commit.folders:
                out.append(self._entry_json(commit, path))
        if expand:
            self._add_last_commits(meta.ref, commit, out)
        return jsonify(out)

    def list_commits(self, req: Request, plural: str, ns: str, name: str, rev: str) -> Response:
        meta = self._read_repo(req, plural, ns, name)
        cursor = req.args.get("cursor")
        if cursor:
            # Later pages walk back from the commit the first page started at, not from the
            # branch's current head, so a commit landing mid-listing shifts nothing.
            sha, offset = self._decode_cursor(cursor)
            head = self.storage.read_commit(meta.ref, sha)
        else:
            head, offset = self.storage.resolve(meta.ref, rev), 0
        per_page = min(self.page_size, 50)
        out, more = [], False
        for i, c in enumerate(self.storage.history(meta.ref, head)):
            if i < offset:
                continue
            if len(out) == per_page:
                more = True
                break
            out.append(
                {
                    "id": c.sha,
                    "title": c.title,
                    "message": c.message,
                    "date": c.date,
                    "authors": [{"user": c.author}] if c.author else [],
                }
            )
        resp = jsonify(out)
        if more:
            next_cursor = self._encode_cursor(head.sha, offset + per_page)
            resp.headers["Link"] = f'<{self._next_link(req, cursor=next_cursor)}>; rel="next"'
        return resp

    # -- writes ------------------------------------------------------------------------------

    def preupload(self, req: Request, plural: str, ns: str, name: str, rev: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        if _truthy(req.args.get("create_pr")):
            raise BadRequest("Pull requests are not supported by this hub")
        refs = self.storage.refs(ref)
        if rev not in refs.branches:
            raise RevisionNotFound(f"Invalid rev id: {rev}")
        head = self.storage.read_commit(ref, refs.branches[rev])
        files = self._json_body(req).get("files") or []
        if not isinstance(files, list):
            raise BadRequest("'files' must be a list")
        out = []
        for item in files:
            path = item.get("path") if isinstance(item, dict) else None
            if not isinstance(path, str):
                raise BadRequest("each file needs a 'path'")
            check_repo_path(path)
            existing = head.files.get(path)
            # Everything is uploaded inline ("regular"): no LFS or Xet round trips. Paths are
            # checked at commit time, where they would take effect.
            out.append(
                {
                    "path": path,
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": existing.oid if existing else None,
                }
            )
        return jsonify({"files": out, "commitOid": head.sha})

    def commit(self, req: Request, plural: str, ns: str, name: str, rev: str) -> Response:
        ref = self._write_repo(req, plural, ns, name)
        if _truthy(req.args.get("create_pr")):
            raise BadRequest("Pull requests are not supported by this hub")
        with self.storage.staging_area() as area:
            header, ops = self._parse_commit_body(req, area)
            commit = self.storage.commit(
                ref,
                rev,
                ops,
                title=header.get("summary") or "update",
                message=header.get("description") or "",
                author=self.user,
                parent_commit=header.get("parentCommit"),
            )
        return jsonify(
            {
                "success": True,
                "commitOid": commit.sha,
                "commitUrl": f"{self._base_url(req)}/{ref.url_path}/commit/{commit.sha}",
                "pullRequestUrl": None,
                "hookOutput": "",
            }
        )

    def _parse_commit_body(self, req: Request, area: Path) -> tuple[dict, list[CommitOp]]:
        """Decode the NDJSON commit payload: one header line, then one operation per line.

        The body is streamed (upload.py): file contents larger than a few KiB are staged as files
        in `area`, so memory does not grow with the upload.
        """
        header: dict | None = None
        ops: list[CommitOp] = []
        for lineno, item, spills in ndjson_lines(read_body(req, self.max_upload), area):
            if not isinstance(item, dict) or "key" not in item or "value" not in item:
                raise BadRequest(
                    f"Commit payload line {lineno} is not a {{key, value}} JSON object"
                )
            key, value = item["key"], item["value"]
            if not isinstance(value, dict):
                raise BadRequest(f"Commit payload line {lineno}: 'value' must be an object")
            if key == "header":
                header = value
            elif key == "file":
                path = check_repo_path(value.get("path"))
                ops.append(AddFile(path, self._file_content(value, spills, area, len(ops))))
            elif key == "deletedFile":
                ops.append(DeleteFile(check_repo_path(value.get("path"))))
            elif key == "deletedFolder":
                folder = value.get("path") or ""
                ops.append(DeleteFolder(check_folder_path(folder)))
            elif key == "lfsFile":
                raise BadRequest(
                    "LFS uploads are not supported by this hub: it asks for every file inline "
                    "(uploadMode 'regular')"
                )
            else:
                raise BadRequest(f"Unknown commit operation {str(key)[:100]!r} on line {lineno}")
            if key != "file" and spills:
                raise BadRequest(f"Commit payload line {lineno}: a string is too long")
        if header is None:
            raise BadRequest("Commit payload has no header line")
        for field in ("summary", "description"):
            if header.get(field) is not None and not isinstance(header[field], str):
                raise BadRequest(f"Commit header: {field!r} must be a string")
        parent = header.get("parentCommit")
        if parent is not None and not (isinstance(parent, str) and is_commit_sha(parent)):
            raise BadRequest(f"Invalid parentCommit {parent!r}: expected a 40-hex commit id")
        return header, ops

    @staticmethod
    def _file_content(value: dict, spills: dict[str, Path], area: Path, n: int) -> bytes | Path:
        """A file operation's content: bytes, or a staged file for a long one."""
        content = value.get("content")
        path = value.get("path")
        if not isinstance(content, str):
            raise BadRequest(f"File {path!r} has no 'content'")
        encoding = value.get("encoding", "base64")
        if encoding not in ("base64", "utf-8", "utf8"):
            raise BadRequest(f"File {path!r}: unknown encoding {str(encoding)[:100]!r}")
        spilled = spills.get(content)
        if spilled is not None:
            if encoding != "base64":
                return spilled  # the spill file holds the text, unescaped: the content
            target = area / f"file-{n}"
            decode_base64_file(spilled, target)
            spilled.unlink()
            return target
        if encoding == "base64":
            try:
                return base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise BadRequest(f"File {path!r}: content is not valid base64") from None
        try:
            return content.encode()
        except UnicodeEncodeError:  # a lone surrogate from a \\uD800 escape
            raise BadRequest(f"File {path!r}: content is not valid UTF-8") from None

    # -- downloads ---------------------------------------------------------------------------

    def resolve(
        self, req: Request, plural: str, ns: str, name: str, rev: str, path: list[str]
    ) -> Response:
        file_path = check_repo_path("/".join(path))
        meta = self._read_repo(req, plural, ns, name)
        commit = self.storage.resolve(meta.ref, rev)
        entry = commit.files.get(file_path)
        if entry is None:
            err = EntryNotFound(f"Entry not found: {file_path} at {rev}")
            err.repo_commit = commit.sha  # lets the client cache the miss under this commit
            raise err
        if req.method == "HEAD" and not is_commit_sha(rev):
            # Pin a branch or tag to its commit: the client then GETs the URL it was redirected
            # to, so the ETag it records and the bytes it receives come from the same commit even
            # if the branch moves in between. Same-host relative redirects are followed by
            # huggingface_hub.
            resp = Response(status=307)
            resp.headers["Location"] = (
                f"{req.script_root}/{meta.ref.url_path}/resolve/{commit.sha}/{quote(file_path)}"
            )
            resp.headers["X-Repo-Commit"] = commit.sha
            return resp
        blob = self.storage.checked_blob(meta.ref, entry)
        if "HTTP_RANGE" in req.environ:
            parsed = parse_range_header(req.environ["HTTP_RANGE"])
            if parsed is None or parsed.units != "bytes":
                # A Range header that is malformed or in another unit is ignored (RFC 9110
                # §14.2): the whole file is sent. A well-formed unsatisfiable one is still a 416.
                del req.environ["HTTP_RANGE"]
        if req.method == "GET" and self.storage.failpoint.armed("mid-download"):
            resp = self._broken_download(blob, entry.size)
        else:
            resp = send_file(
                blob,
                mimetype="application/octet-stream",
                download_name=file_path.rsplit("/", 1)[-1],
                conditional=True,
                etag=entry.oid,
            )
        resp.headers["X-Repo-Commit"] = commit.sha
        resp.headers["Cache-Control"] = "private, max-age=0, must-revalidate"
        return resp

    def _broken_download(self, blob: Path, size: int) -> Response:
        # Failpoint: announce the whole file, send half of it, then die.
        def body() -> Iterator[bytes]:
            with open(blob, "rb") as f:
                yield f.read(size // 2)
            self.storage.failpoint.hit("mid-download")

        resp = Response(body(), mimetype="application/octet-stream", direct_passthrough=True)
        resp.headers["Content-Length"] = str(size)
        return resp
