"""Downloads: ETag / Content-Length / Range, a server killed mid-download, offline re-use."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.utils import get_session

from nkikit.hub import running_hub
from nkikit.hub.storage import FAILPOINT_ENV


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _publish_big(api: HfApi, size: int) -> tuple[bytes, str]:
    data = os.urandom(size)
    api.create_repo("org/big")
    api.create_branch("org/big", branch="v1")
    info = api.upload_file(
        path_or_fileobj=data, path_in_repo="weights.bin", repo_id="org/big", revision="v1"
    )
    return data, info.oid


def test_large_file_etag_length_and_range(api: HfApi, hub: str, cache_dir: Path):
    data, sha = _publish_big(api, 4 * 1024 * 1024 + 17)
    meta = get_hf_file_metadata(hf_hub_url("org/big", "weights.bin", revision="v1", endpoint=hub))
    assert meta.commit_hash == sha
    assert meta.etag == _git_blob_sha1(data)  # what the Hub reports for a regular file
    assert meta.size == len(data)
    assert meta.location.endswith(f"/resolve/{sha}/weights.bin")  # branch pinned to its commit

    path = hf_hub_download(
        "org/big", "weights.bin", revision="v1", cache_dir=cache_dir, endpoint=hub
    )
    assert Path(path).read_bytes() == data
    # The client stores the blob under its ETag: same bytes, same name, whatever the revision.
    assert Path(path).resolve().name == meta.etag

    url = hf_hub_url("org/big", "weights.bin", revision=sha, endpoint=hub)
    r = get_session().get(url, headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206
    assert r.content == data[1000:2000]
    assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
    r = get_session().get(url, headers={"Range": f"bytes={len(data) - 10}-"})
    assert r.status_code == 206 and r.content == data[-10:]
    r = get_session().head(url)
    assert r.headers["Content-Length"] == str(len(data))
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["X-Repo-Commit"] == sha


def test_download_resumes_after_server_killed_mid_transfer(
    hub_root: Path, hub_process, cache_dir: Path, free_port: int
):
    with running_hub(hub_root) as url:
        # The client writes what it received in 10 MiB chunks: the server must die after more
        # than one chunk for the retry to have something to resume from.
        data, _ = _publish_big(HfApi(endpoint=url, token=False), 21 * 1024 * 1024)

    # A fixed port, so the restarted server is where the client's retry goes.
    port = free_port
    doomed = hub_process(hub_root, port=port, env={FAILPOINT_ENV: "mid-download:exit"})
    result: dict[str, object] = {}

    def download() -> None:
        try:
            result["path"] = hf_hub_download(
                "org/big", "weights.bin", revision="v1", cache_dir=cache_dir, endpoint=doomed.url
            )
        except BaseException as e:  # noqa: BLE001 (reported below)
            result["error"] = e

    worker = threading.Thread(target=download)
    worker.start()
    assert doomed.wait() == 75  # sent half of the file, then died
    assert list(cache_dir.rglob("*.incomplete"))  # the partial download the retry resumes
    revived = hub_process(hub_root, port=port)  # the client retries (with Range) for ~5 s
    worker.join(timeout=60)
    assert "error" not in result, result.get("error")
    assert Path(str(result["path"])).read_bytes() == data
    # The retry asked for the missing tail only.
    deadline = time.monotonic() + 5
    while " 206 " not in revived.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert " 206 " in revived.log.read_text()


_OFFLINE_SCRIPT = """
import sys
from huggingface_hub import constants, snapshot_download
assert constants.HF_HUB_OFFLINE
folder = snapshot_download(sys.argv[1], revision="v1", cache_dir=sys.argv[2])
print(folder)
"""


def test_offline_snapshot_after_one_download(api: HfApi, hub: str, hub_root: Path, cache_dir: Path):
    api.create_repo("org/k")
    api.create_branch("org/k", branch="v1")
    api.upload_file(
        path_or_fileobj=b"v1 data", path_in_repo="x/y.txt", repo_id="org/k", revision="v1"
    )
    from huggingface_hub import snapshot_download

    online = snapshot_download("org/k", revision="v1", cache_dir=cache_dir, endpoint=hub)
    # Offline mode is read at import time: it needs a fresh interpreter.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run(
        [sys.executable, "-c", _OFFLINE_SCRIPT, "org/k", str(cache_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    offline = out.stdout.strip().splitlines()[-1]
    assert offline == online
    assert (Path(offline) / "x" / "y.txt").read_bytes() == b"v1 data"
