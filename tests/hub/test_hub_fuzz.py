"""Malformed input gets a 4xx, never a 500: fixed regressions, then hypothesis fuzzing every route.

The fuzz tests draw request bodies (JSON of any shape, with the fields the routes read given any
type), query strings (unicode digits and all) and path segments, and send them over HTTP with
huggingface_hub's session to one in-process hub. Deterministic (derandomized, no example
database), so the default suite runs the same requests every time.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from huggingface_hub import HfApi
from huggingface_hub.utils import get_session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nkikit.hub import running_hub

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# The JSON fields the routes read, so that drawn bodies reach the validation of each.
FIELDS = [
    "type", "name", "organization", "private", "visibility", "paths", "expand", "files",
    "path", "startingPoint", "tag", "message", "content", "key", "value", "summary",
    "description", "parentCommit", "encoding",
]  # fmt: skip
QUERY_KEYS = ["cursor", "limit", "recursive", "expand", "blobs", "author", "search", "create_pr"]


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An open hub with repo org/k: branch v1, a file a/f.txt, a tag t1."""
    with running_hub(tmp_path_factory.mktemp("fuzz-hub")) as url:
        api = HfApi(endpoint=url)
        api.create_repo("org/k")
        api.create_branch("org/k", branch="v1")
        api.upload_file(path_or_fileobj=b"data", path_in_repo="a/f.txt", repo_id="org/k")
        api.create_tag("org/k", tag="t1")
        yield url


def _ok(response) -> None:  # noqa: ANN001
    assert response.status_code < 500, (
        f"{response.request.method} {response.request.url} -> {response.status_code}: "
        f"{response.text[:300]}"
    )


def _cursor(sha: str, offset: str) -> str:
    import base64

    return base64.urlsafe_b64encode(f"{sha}:{offset}".encode()).decode()


# -- the faults found by hand, as fixed cases ---------------------------------------------------


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/api/models?limit=%C2%B2", None),  # '²'.isdigit() is True, int('²') fails
        ("GET", "/api/models?limit=%D9%A3", None),  # an Arabic-Indic digit
        ("GET", "/api/models/org/k/tree/main?cursor=%C2%B2", None),
        # a well-formed cursor whose offset is a unicode digit: "<40 hex>:²", base64
        ("GET", f"/api/models/org/k/tree/main?cursor={_cursor('a' * 40, '²')}", None),
        ("GET", f"/api/models/org/k/commits/main?cursor={_cursor('a' * 40, '٣')}", None),
        ("POST", "/api/repos/create", {"name": ["k"], "type": "model"}),
        ("POST", "/api/repos/create", {"name": "x", "type": ["model"]}),
        ("POST", "/api/repos/create", {"name": "x", "organization": 7}),
        ("POST", "/api/repos/create", {"name": "x", "private": "yes"}),
        ("POST", "/api/repos/create", {"name": "x", "visibility": ["private"]}),
        ("DELETE", "/api/repos/delete", {"name": "k", "type": {"a": 1}}),
        ("POST", "/api/models/org/k/paths-info/main", {"paths": 5}),
        ("POST", "/api/models/org/k/paths-info/main", {"paths": "a"}),
        ("POST", "/api/models/org/k/preupload/main", {"files": {"path": "x"}}),
        ("POST", "/api/models/org/k/tag/main", {"tag": "t9", "message": ["m"]}),
        ("PUT", "/api/models/org/k/settings", {"visibility": ["private"]}),
        ("PUT", "/api/models/org/k/settings", {"private": "no"}),
        ("POST", "/api/repos/create", "[" * 100_000 + "]" * 100_000),  # deeply nested JSON
        ("POST", "/api/models/org/k/commit/main", "[" * 100_000 + "]" * 100_000),
        ("POST", "/api/repos/create", {"name": "new\n", "type": "model"}),  # trailing newline
    ],
)
def test_malformed_input_is_a_4xx(fuzz_hub: str, method: str, path: str, body: object) -> None:
    content = body if isinstance(body, str) else (None if body is None else json.dumps(body))
    r = get_session().request(
        method, fuzz_hub + path, content=content, headers={"Content-Type": "application/json"}
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])


def test_names_ending_in_a_newline_are_refused(fuzz_hub: str) -> None:
    from nkikit.hub.errors import BadRequest
    from nkikit.hub.names import check_ref_name, is_commit_sha, is_valid_name

    assert not is_valid_name("name\n") and not is_commit_sha("a" * 40 + "\n")
    with pytest.raises(BadRequest):
        check_ref_name("v1\n")
    r = get_session().post(f"{fuzz_hub}/api/models/org/k/branch/v2%0A", content=b"{}")
    assert 400 <= r.status_code < 500


def test_a_truncated_chunked_body_is_a_4xx(fuzz_hub: str) -> None:
    host, port = fuzz_hub.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /api/models/org/k/commit/main HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'100\r\n{"key": "header"'  # announces 256 bytes, sends 16, then stops
        )
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else None
    assert status is not None and 400 <= status < 500, reply[:300]


# -- fuzzing ---------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["main", "v1", "t1", "org", "k", "a/f.txt", "model", "kernel", "private"])
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=12,
)
_bodies = st.dictionaries(st.sampled_from(FIELDS), _json, max_size=6) | _json
_query = st.dictionaries(
    st.sampled_from(QUERY_KEYS),
    st.text(max_size=8) | st.sampled_from(["²", "٣", "1", "-1", "99999999999999999999"]),
    max_size=3,
)
_segment = st.sampled_from(["main", "v1", "t1", "a", "f.txt", "org", "k", "..", "%0A", "%2F"]) | (
    st.text(st.characters(codec="utf-8", exclude_characters="/?#"), min_size=1, max_size=8)
)

ROUTES = [
    ("POST", "/api/repos/create"),
    ("DELETE", "/api/repos/delete"),
    ("POST", "/api/validate-yaml"),
    ("GET", "/api/models"),
    ("GET", "/api/kernels"),
    ("GET", "/api/organizations/{0}/overview"),
    ("GET", "/api/models/org/k"),
    ("GET", "/api/models/org/k/revision/{0}"),
    ("GET", "/api/models/org/k/refs"),
    ("POST", "/api/models/org/k/branch/{0}"),
    ("DELETE", "/api/models/org/k/branch/{0}"),
    ("POST", "/api/models/org/k/tag/{0}"),
    ("DELETE", "/api/models/org/k/tag/{0}"),
    ("GET", "/api/models/org/k/tree/{0}"),
    ("GET", "/api/models/org/k/tree/{0}/{1}"),
    ("POST", "/api/models/org/k/paths-info/{0}"),
    ("POST", "/api/models/org/k/preupload/{0}"),
    ("POST", "/api/models/org/k/commit/{0}"),
    ("GET", "/api/models/org/k/commits/{0}"),
    ("PUT", "/api/models/{0}/{1}/settings"),
    ("GET", "/org/k/resolve/{0}/{1}"),
    ("HEAD", "/org/k/resolve/{0}/{1}"),
]


@pytest.mark.parametrize("method, template", ROUTES, ids=[f"{m} {t}" for m, t in ROUTES])
@FUZZ
@given(segments=st.tuples(_segment, _segment), query=_query, body=_bodies)
def test_fuzz_routes_never_answer_500(fuzz_hub, method, template, segments, query, body) -> None:  # noqa: ANN001
    from urllib.parse import quote

    path = template.format(*(quote(s, safe="%") for s in segments))
    content = None if method in ("GET", "HEAD") else json.dumps(body)
    r = get_session().request(
        method,
        fuzz_hub + path,
        params=query,
        content=content,
        headers={"Content-Type": "application/json"},
    )
    _ok(r)


_op = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["header", "file", "deletedFile", "deletedFolder", "lfsFile"])
        | _json,
        "value": st.dictionaries(st.sampled_from(FIELDS), _json, max_size=5) | _json,
    }
)


@FUZZ
@given(lines=st.lists(_op | _json, max_size=5), raw=st.binary(max_size=40), cut=st.booleans())
def test_fuzz_commit_payloads_never_answer_500(fuzz_hub, lines, raw, cut) -> None:  # noqa: ANN001
    body = "\n".join(json.dumps(line) for line in lines).encode()
    body = body[: len(body) // 2] + raw if cut else body
    r = get_session().post(
        f"{fuzz_hub}/api/models/org/k/commit/v1",
        content=body,
        headers={"Content-Type": "application/x-ndjson"},
    )
    _ok(r)


@FUZZ
@given(card=st.text(max_size=200), head=st.sampled_from(["---\n", "---\r\n", ""]))
def test_fuzz_card_metadata_never_answers_500(fuzz_hub, card, head) -> None:  # noqa: ANN001
    r = get_session().post(f"{fuzz_hub}/api/validate-yaml", json={"content": head + card})
    _ok(r)


@pytest.mark.slow
@settings(FUZZ, max_examples=3000)
@given(route=st.sampled_from(ROUTES), segments=st.tuples(_segment, _segment), query=_query,
       body=_bodies)  # fmt: skip
def test_fuzz_routes_long(fuzz_hub, route, segments, query, body) -> None:  # noqa: ANN001
    """The slow suite's longer run of the route fuzz (all routes drawn together)."""
    test_fuzz_routes_never_answer_500.hypothesis.inner_test(fuzz_hub, *route, segments, query, body)
