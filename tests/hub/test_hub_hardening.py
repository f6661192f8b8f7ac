"""The hub under attack: reserved namespaces, upload limits and memory, card metadata bombs,
stalled connections, symlinked storage, corrupt blobs, and malformed input that must get a 4xx.

Everything goes over HTTP through huggingface_hub (its HfApi, or its HTTP session for requests
the high-level API will not make), or through a raw socket where the attack is at that level.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import get_session

from nkikit.hub import running_hub


def _session():
    return get_session()


# -- trust: reserved namespaces --------------------------------------------------------------


def test_a_hub_without_token_keeps_the_trusted_namespace_read_only(hub_root: Path) -> None:
    with running_hub(hub_root) as url:  # the default: nkikit is reserved
        api = HfApi(endpoint=url)
        with pytest.raises(HfHubHTTPError, match="reserved") as e:
            api.create_repo("nkikit/rmsnorm", repo_type="kernel")
        assert e.value.response.status_code == 403
        api.create_repo("acme/rmsnorm", repo_type="kernel")  # other namespaces stay open
    with running_hub(hub_root, reserved_namespaces=()) as url:  # told otherwise
        HfApi(endpoint=url).create_repo("nkikit/rmsnorm", repo_type="kernel")
    with running_hub(hub_root) as url:  # an existing nkikit repo cannot be overwritten either
        with pytest.raises(HfHubHTTPError, match="reserved"):
            HfApi(endpoint=url).upload_file(
                path_or_fileobj=b"evil",
                path_in_repo="x.py",
                repo_id="nkikit/rmsnorm",
                repo_type="kernel",
            )
    with running_hub(hub_root, token="t0k") as url:  # with a token, its holder may write
        HfApi(endpoint=url, token="t0k").upload_file(
            path_or_fileobj=b"ok",
            path_in_repo="x.py",
            repo_id="nkikit/rmsnorm",
            repo_type="kernel",
        )


def test_hub_serve_reserves_default_and_advertised_namespaces() -> None:
    from nkikit.hub.server import reserved_namespaces

    assert reserved_namespaces([], []) == ("nkikit",)
    assert reserved_namespaces(["acme"], []) == ("nkikit", "acme")
    assert reserved_namespaces(["acme"], ["nkikit"]) == ("acme",)
    assert reserved_namespaces(["acme"], ["*"]) == ()


def test_the_served_hub_refuses_the_trusted_namespace(hub_process, tmp_path: Path) -> None:  # noqa: ANN001
    hub = hub_process(tmp_path / "served")
    with pytest.raises(HfHubHTTPError, match="reserved"):
        HfApi(endpoint=hub.url).create_repo("nkikit/evil", repo_type="kernel")


# -- uploads: a size limit, and memory that does not grow with the file ----------------------


def test_an_upload_over_the_limit_is_413(hub_root: Path) -> None:
    with running_hub(hub_root, max_upload_bytes=4096) as url:
        api = HfApi(endpoint=url)
        api.create_repo("org/k")
        api.upload_file(path_or_fileobj=b"x" * 1000, path_in_repo="small.bin", repo_id="org/k")
        with pytest.raises(HfHubHTTPError) as e:
            api.upload_file(path_or_fileobj=b"x" * 6000, path_in_repo="big.bin", repo_id="org/k")
        assert e.value.response.status_code == 413
        assert [f for f in api.list_repo_files("org/k") if f.endswith(".bin")] == ["small.bin"]


def _peak_rss(pid: int) -> int:
    """VmHWM (peak resident set) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_a_large_upload_is_streamed_to_disk(hub_process, tmp_path: Path) -> None:  # noqa: ANN001
    """Peak memory of the server grows by well under the file's size (it used to hold the body
    several times over: 200 MB took it from 55 MB to 1.3 GB)."""
    hub = hub_process(tmp_path / "root")
    api = HfApi(endpoint=hub.url)
    api.create_repo("org/big")
    api.upload_file(path_or_fileobj=b"warm-up", path_in_repo="w.txt", repo_id="org/big")
    size = 48 << 20
    data = os.urandom(size)
    before = _peak_rss(hub.proc.pid)
    api.upload_file(path_or_fileobj=data, path_in_repo="weights.bin", repo_id="org/big")
    growth = _peak_rss(hub.proc.pid) - before
    assert growth < size // 2, f"server peak memory grew by {growth >> 20} MiB for a 48 MiB file"
    path = hf_hub_download("org/big", "weights.bin", endpoint=hub.url, cache_dir=tmp_path / "c")
    assert Path(path).read_bytes() == data


def test_commit_payload_with_long_escaped_strings(hub: str) -> None:
    """The streamed lexer decodes what JSON allows in a long string ('\\/' from some encoders)."""
    api = HfApi(endpoint=hub)
    api.create_repo("org/esc")
    payload_text = ('a/b"c\\d\n' * 20000).encode()
    b64 = base64.b64encode(payload_text).decode()
    lines = [
        {"key": "header", "value": {"summary": "escaped", "description": ""}},
        {
            "key": "file",
            "value": {"path": "t.b64", "content": b64.replace("/", "\\/"), "encoding": "base64"},
        },
        {
            "key": "file",
            "value": {"path": "t.txt", "content": payload_text.decode(), "encoding": "utf-8"},
        },
    ]
    body = "\n".join(json.dumps(x).replace("\\\\/", "\\/") for x in lines).encode()
    r = _session().post(
        f"{hub}/api/models/org/esc/commit/main",
        content=body,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 200, r.text
    for name in ("t.b64", "t.txt"):
        got = _session().get(f"{hub}/org/esc/resolve/main/{name}")
        assert got.content == payload_text


# -- card metadata ---------------------------------------------------------------------------


def _raw_commit(hub: str, repo_id: str, files: dict[str, bytes]) -> None:
    """A commit through the HTTP API without the client's own checks (it validates README
    metadata first, which an attacker's client would not)."""
    lines = [{"key": "header", "value": {"summary": "raw", "description": ""}}]
    lines += [
        {"key": "file", "value": {"path": p, "content": base64.b64encode(d).decode()}}
        for p, d in files.items()
    ]
    r = _session().post(
        f"{hub}/api/models/{repo_id}/commit/main",
        content="\n".join(json.dumps(x) for x in lines).encode(),
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 200, r.text


def test_a_yaml_alias_bomb_in_a_card_is_not_expanded(api: HfApi, hub: str) -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefg"):
        prev = "abcdefg"[i]
        refs = ", ".join([f"*{prev}"] * 9)
        levels.append(f"{name}: &{name} [{refs}]")
    card = "---\n" + "\n".join(levels) + "\ntags: [kernel]\n---\n# bomb\n"
    assert len(card) < 600
    api.create_repo("org/bomb")
    _raw_commit(hub, "org/bomb", {"README.md": card.encode()})
    r = _session().get(f"{hub}/api/models/org/bomb")
    assert r.status_code == 200 and len(r.content) < 10_000
    assert "cardData" not in r.json()
    r = _session().post(f"{hub}/api/validate-yaml", json={"content": card})
    assert r.status_code == 400 and "expands" in r.json()["error"]


def test_ordinary_card_metadata_is_still_reported(api: HfApi, hub: str) -> None:
    card = "---\nbase: &b {license: mit}\nother: *b\ntags: [kernel, nki]\n---\n# ok\n"
    api.create_repo("org/card")
    api.upload_file(path_or_fileobj=card.encode(), path_in_repo="README.md", repo_id="org/card")
    info = _session().get(f"{hub}/api/models/org/card").json()
    assert info["cardData"]["other"] == {"license": "mit"} and info["tags"] == ["kernel", "nki"]


# -- connections -----------------------------------------------------------------------------


def test_a_stalled_connection_is_dropped(hub_root: Path) -> None:
    with running_hub(hub_root, timeout=0.5) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            s.settimeout(30)  # a safety net only: the server closes long before
            s.sendall(b"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\n")  # and never finishes
            while s.recv(65536):  # whatever the server says, it then closes the connection
                pass
        # the server still answers others
        assert _session().get(f"{url}/api/whoami-v2").status_code == 200


# -- storage: symlinks and blob integrity ----------------------------------------------------


def test_a_symlinked_repo_folder_is_refused(api: HfApi, hub: str, hub_root: Path) -> None:
    api.create_repo("org/real")
    api.upload_file(path_or_fileobj=b"v1", path_in_repo="f.txt", repo_id="org/real")
    models = hub_root / "repos" / "models"
    (models / "org" / "alias").symlink_to(models / "org" / "real")  # same repo, second name
    outside = hub_root.parent / "outside"
    outside.mkdir()
    (models / "evil").symlink_to(outside)  # a namespace leaving the root
    for repo_id in ("org/alias", "evil/x"):
        r = _session().get(f"{hub}/api/models/{repo_id}")
        assert r.status_code == 404, repo_id
        with pytest.raises(HfHubHTTPError):
            api.upload_file(path_or_fileobj=b"lost", path_in_repo="f.txt", repo_id=repo_id)
    with pytest.raises(HfHubHTTPError):
        api.create_repo("evil/x")
    assert not any(outside.iterdir())
    assert [r.id for r in api.list_models()] == ["org/real"]
    assert _session().get(f"{hub}/org/real/resolve/main/f.txt").content == b"v1"


def test_a_corrupt_blob_is_not_served(api: HfApi, hub: str, hub_root: Path) -> None:
    api.create_repo("org/blob")
    api.upload_file(path_or_fileobj=b"original", path_in_repo="f.txt", repo_id="org/blob")
    assert _session().get(f"{hub}/org/blob/resolve/main/f.txt").content == b"original"
    blobs = hub_root / "repos" / "models" / "org" / "blob" / "blobs"
    (blob,) = [p for p in blobs.rglob("*") if p.is_file() and p.read_bytes() == b"original"]
    time.sleep(0.01)  # a new change time, as any real rewrite has
    blob.write_bytes(b"tampered")  # same size, other content
    r = _session().get(f"{hub}/org/blob/resolve/main/f.txt")
    assert r.status_code == 500 and b"tampered" not in r.content
    assert "corrupt" in r.json()["error"]


def test_a_malformed_range_header_is_ignored(api: HfApi, hub: str) -> None:
    api.create_repo("org/range")
    api.upload_file(path_or_fileobj=b"0123456789", path_in_repo="f.txt", repo_id="org/range")
    url = f"{hub}/org/range/resolve/main/f.txt"
    for bad in ("bytes=abc", "bytes=5-2", "items=0-1", "bytes=--1"):
        r = _session().get(url, headers={"Range": bad})
        assert (r.status_code, r.content) == (200, b"0123456789"), bad
    r = _session().get(url, headers={"Range": "bytes=2-4"})
    assert (r.status_code, r.content) == (206, b"234")
    assert _session().get(url, headers={"Range": "bytes=50-60"}).status_code == 416
