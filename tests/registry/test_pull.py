"""Pulling: resolve, download, verify, import; every failure named; offline after one pull."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hubfixtures import REPO_ROOT, TINY, HubProcess, copy_fixture
from huggingface_hub import HfApi

from nkikit.registry.cli import main_pull
from nkikit.registry.errors import (
    BackendUnavailableError,
    DownloadError,
    IntegrityError,
    KernelNotFoundError,
    NotInCacheError,
    RevisionNotFoundError,
    UntrustedKernelError,
    VariantNotFoundError,
    VersionNotFoundError,
)
from nkikit.registry.importer import forget, import_build
from nkikit.registry.publish import publish
from nkikit.registry.pull import locate, pull
from nkikit.registry.resolve import repo_cache_dir

DEAD = "http://127.0.0.1:9"  # nothing listens there: any request fails at once


def _ref(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w


def test_pull_and_call_on_numpy(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    k = pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    assert k.revision == tiny_repo.commit and k.version == 1 and k.variant == "torch-cpu"
    assert k.namespace == tiny_repo.variants["torch-cpu"] == k.__name__
    assert k.__all__ == ["rmsnorm", "add_sub"] and "tiny-rmsnorm v1" in repr(k)
    assert (
        k.path
        == repo_cache_dir(cache_dir, _repo("nkikit/tiny-rmsnorm"))
        / "snapshots"
        / k.revision
        / "build"
        / "torch-cpu"
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((130, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(k.rmsnorm(x, w), _ref(x, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k.rmsnorm(x, w, eps=0.5), _ref(x, w, 0.5), rtol=1e-5, atol=1e-5)
    s, m = k.add_sub(x, x, alpha=3.0)
    np.testing.assert_allclose(s, 4 * x, rtol=1e-6)
    assert not m.any()


def _repo(repo_id: str):  # noqa: ANN202
    from nkikit.registry.names import parse_repo_id

    return parse_repo_id(repo_id)


def test_versions_load_side_by_side(hub_url: str, tmp_path: Path, cache_dir: Path) -> None:
    folder = copy_fixture(tmp_path)
    v1 = publish(folder, "nkikit/multi", endpoint=hub_url, run_tests=False)
    kernel = (
        (folder / "kernel.py")
        .read_text()
        .replace('"""(a + alpha * b, a - b)', '"""v2: (a + alpha * b, a - b)')
    )
    (folder / "kernel.py").write_text(kernel)
    v2 = publish(folder, "nkikit/multi", endpoint=hub_url, run_tests=False, version=2)
    latest = pull("nkikit/multi", endpoint=hub_url, cache_dir=cache_dir)
    old = pull("nkikit/multi", version=1, endpoint=hub_url, cache_dir=cache_dir)
    assert (latest.version, latest.revision) == (2, v2.commit)
    assert (old.version, old.revision) == (1, v1.commit)
    assert latest.namespace != old.namespace
    assert sys.modules[latest.namespace] is not sys.modules[old.namespace]
    assert latest.add_sub.entry.__doc__.startswith(
        "v2:"
    ) and not old.add_sub.entry.__doc__.startswith("v2:")
    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(latest.add_sub(x, x)[0], old.add_sub(x, x)[0])


def test_pull_by_revision(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    HfApi(endpoint=hub_url).create_tag(
        "nkikit/tiny-rmsnorm",
        tag="v1.0",
        revision=tiny_repo.commit,
        repo_type="kernel",
        exist_ok=True,
    )
    for rev in (tiny_repo.commit, "v1", "v1.0"):
        assert (
            pull(
                "nkikit/tiny-rmsnorm", revision=rev, endpoint=hub_url, cache_dir=cache_dir
            ).revision
            == tiny_repo.commit
        )


@pytest.mark.parametrize(
    ("repo_id", "kwargs", "error", "message"),
    [
        ("nkikit/nope", {"version": 1}, KernelNotFoundError, "kernel repo nkikit/nope not found"),
        ("nkikit/nope", {}, KernelNotFoundError, "nkikit/nope"),
        (
            "nkikit/tiny-rmsnorm",
            {"version": 7},
            VersionNotFoundError,
            r"no version 7 \(no branch 'v7'; versions: v1\)",
        ),
        (
            "nkikit/tiny-rmsnorm",
            {"revision": "nope"},
            RevisionNotFoundError,
            "no branch or tag 'nope'",
        ),
        (
            "nkikit/tiny-rmsnorm",
            {"revision": "0" * 40},
            RevisionNotFoundError,
            "no revision '0000000000",
        ),
    ],
)
def test_missing_things_are_named(
    tiny_repo, hub_url: str, cache_dir: Path, repo_id: str, kwargs: dict, error: type, message: str
) -> None:  # noqa: ANN001
    with pytest.raises(error, match=message):
        pull(repo_id, endpoint=hub_url, cache_dir=cache_dir, **kwargs)


def test_no_published_version(hub_url: str, cache_dir: Path) -> None:
    HfApi(endpoint=hub_url).create_repo("nkikit/empty", repo_type="kernel", exist_ok=True)
    with pytest.raises(VersionNotFoundError, match="nkikit/empty has no published version"):
        pull("nkikit/empty", endpoint=hub_url, cache_dir=cache_dir)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(repo_id="not-a-repo-id"), "expected 'org/name'"),
        (dict(repo_id="nkikit/x", version=1, revision="v1"), "either version= or revision="),
        (dict(repo_id="nkikit/x", version=-1), "non-negative int"),
        (dict(repo_id="nkikit/x", backend="gpu"), "unknown backend 'gpu'"),
    ],
)
def test_bad_arguments(args: dict, message: str, cache_dir: Path) -> None:
    with pytest.raises(ValueError, match=message):
        pull(endpoint=DEAD, cache_dir=cache_dir, **args)


def test_untrusted_org_needs_opt_in(
    hub_url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(TINY, "acme/tiny", endpoint=hub_url, run_tests=False, neuron=False)
    with pytest.raises(
        UntrustedKernelError,
        match=r"'acme' is not trusted.*trust_remote_code=True.*NKIKIT_TRUSTED_ORGS=acme",
    ):
        pull("acme/tiny", version=1, endpoint=hub_url, cache_dir=cache_dir)
    assert not cache_dir.exists()  # refused before anything was downloaded
    assert (
        pull(
            "acme/tiny", version=1, endpoint=hub_url, cache_dir=cache_dir, trust_remote_code=True
        ).version
        == 1
    )
    monkeypatch.setenv("NKIKIT_TRUSTED_ORGS", f"someone, acme@{hub_url}")
    assert pull("acme/tiny", version=1, endpoint=hub_url, cache_dir=cache_dir).version == 1
    monkeypatch.setenv("NKIKIT_TRUSTED_ORGS", "")  # an empty list trusts nothing, not even nkikit
    with pytest.raises(UntrustedKernelError, match="trusted: nothing"):
        pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)


def test_tampered_file_is_refused_at_load(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    k = pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    target = k.path / "kernel.py"
    target.write_text(target.read_text() + "\nimport os; os.system('echo pwned')\n")
    with pytest.raises(
        IntegrityError, match=r"kernel\.py: content does not match the commit's tree"
    ) as e:
        pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    assert e.value.path == str(target)
    with pytest.raises(IntegrityError):  # offline, from the cache only: same refusal
        pull("nkikit/tiny-rmsnorm", revision=tiny_repo.commit, endpoint=DEAD, cache_dir=cache_dir)


def test_planted_file_is_refused(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    k = pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    (k.path / "sitecustomize.py").write_text("print('pwned')\n")
    with pytest.raises(IntegrityError, match=r"sitecustomize\.py: not part of the published build"):
        pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)


def test_importer_checks_sources_as_it_reads_them(tmp_path: Path) -> None:
    from nkikit.registry.digests import digest_folder

    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import mod\n")
    (pkg / "mod.py").write_text("VALUE = 1\n")
    digests = digest_folder(pkg)
    # a planted bytecode file is never read: the loader compiles from the verified source
    (pkg / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc").write_bytes(b"not bytecode")
    try:
        assert import_build("_nkikit_test_pkg_ok", pkg, digests=digests).mod.VALUE == 1
    finally:
        forget("_nkikit_test_pkg_ok")
    (pkg / "mod.py").write_text("VALUE = 2\n")  # changed after the up-front check
    with pytest.raises(IntegrityError, match=r"mod\.py: content does not match"):
        import_build("_nkikit_test_pkg_bad", pkg, digests=digests)
    assert "_nkikit_test_pkg_bad" not in sys.modules


def test_cached_pull_needs_no_server(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    # by commit: no request at all
    assert (
        pull(
            "nkikit/tiny-rmsnorm", revision=tiny_repo.commit, endpoint=DEAD, cache_dir=cache_dir
        ).version
        == 1
    )
    # by version with the Hub unreachable: the ref recorded in the cache, with a warning
    with pytest.warns(UserWarning, match="cannot reach"):
        assert (
            pull("nkikit/tiny-rmsnorm", version=1, endpoint=DEAD, cache_dir=cache_dir).revision
            == tiny_repo.commit
        )
    with pytest.raises(DownloadError, match="cannot reach .* and the cache has no copy"):
        pull("nkikit/tiny-rmsnorm", version=1, endpoint=DEAD, cache_dir=cache_dir / "empty")


def _offline_script(cache: Path, **kwargs: object) -> str:
    return textwrap.dedent(
        f"""
        import numpy as np
        from nkikit import kernels
        try:
            k = kernels.pull("nkikit/tiny-rmsnorm", endpoint={DEAD!r}, cache_dir={str(cache)!r}, **{kwargs!r})
        except kernels.NotInCacheError as e:
            print("NOT CACHED:", e)
        else:
            x = np.ones((3, 8), np.float32)
            print("OK", k.revision, round(float(k.rmsnorm(x, x[0]).sum()), 3))
        """
    )


def test_offline_after_one_pull(tiny_repo, hub_url: str, cache_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    env["NKIKIT_TRUSTED_ORGS"] = f"nkikit@{hub_url}"  # where the cached build came from
    for kwargs in ({"version": 1}, {}):
        out = subprocess.run(
            [sys.executable, "-c", _offline_script(cache_dir, **kwargs)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.stdout.startswith(f"OK {tiny_repo.commit} 24.0"), out.stderr
    out = subprocess.run(
        [sys.executable, "-c", _offline_script(tmp_path / "other", version=1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "NOT CACHED: offline and not cached" in out.stdout, out.stderr


def test_offline_flag_in_process(
    tiny_repo, hub_url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(NotInCacheError, match="offline"):
        pull("nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir)


def test_server_killed_mid_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub dies half way through sending a (large) file: a clear error, a cache holding only
    complete files, and the next pull - hub restarted - completes and verifies."""
    # huggingface_hub retries a dead server 5 times with 1-8 s sleeps (23 s); the retries still
    # happen, over real HTTP, only without the waits.
    import types

    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(hf_http, "time", types.SimpleNamespace(sleep=lambda _s: None))
    folder = copy_fixture(tmp_path)
    (folder / "weights.bin").write_bytes(np.random.default_rng(0).bytes(8 << 20))
    root, cache = tmp_path / "hub", tmp_path / "cache"
    hub = HubProcess(root)
    try:
        publish(folder, "nkikit/big", endpoint=hub.url, run_tests=False, neuron=False)
    finally:
        hub.stop()
    hub = HubProcess(root, env={"NKIKIT_HUB_FAILPOINT": "mid-download:exit"})
    try:
        with pytest.raises(
            DownloadError,
            match=r"nkikit/big@[0-9a-f]{12} \(torch-cpu\) was interrupted.*pull again",
        ):
            pull("nkikit/big", version=1, endpoint=hub.url, cache_dir=cache, trust_remote_code=True)
        assert hub.wait_dead() == 75
    finally:
        hub.stop()
    snapshots = repo_cache_dir(cache, _repo("nkikit/big")) / "snapshots"
    from nkikit.registry.digests import file_digest

    for f in snapshots.rglob("*"):  # whatever made it into a snapshot is complete and correct
        if f.is_file() and f.name != "metadata.json":
            meta = (
                json.loads((f.parent / "metadata.json").read_text())
                if (f.parent / "metadata.json").exists()
                else None
            )
            if meta and f.name in meta["digest"]["files"]:
                assert file_digest(f.read_bytes()) == meta["digest"]["files"][f.name]
    hub = HubProcess(root)
    try:
        k = pull("nkikit/big", version=1, endpoint=hub.url, cache_dir=cache, trust_remote_code=True)
        assert (k.path / "weights.bin").stat().st_size == 8 << 20
    finally:
        hub.stop()


def test_neuron_backend(tiny_repo, hub_url: str, cache_dir: Path) -> None:  # noqa: ANN001
    path, found, meta = locate(
        "nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=cache_dir, backend="neuron"
    )
    assert (
        path.name == "torch-neuron"
        and meta["backend"] == {"type": "neuron"}
        and found.sha == tiny_repo.commit
    )
    with pytest.raises(BackendUnavailableError, match="runs only with the AWS Neuron SDK"):
        pull(
            "nkikit/tiny-rmsnorm",
            version=1,
            endpoint=hub_url,
            cache_dir=cache_dir,
            backend="neuron",
        )


def test_missing_variant_is_named(hub_url: str, cache_dir: Path) -> None:
    publish(TINY, "nkikit/cpu-only", endpoint=hub_url, run_tests=False, neuron=False)
    with pytest.raises(
        VariantNotFoundError, match=r"has no build 'torch-neuron' \(builds: torch-cpu\)"
    ):
        locate(
            "nkikit/cpu-only", version=1, endpoint=hub_url, cache_dir=cache_dir, backend="neuron"
        )


def test_cli_pull(
    tiny_repo, hub_url: str, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # noqa: ANN001
    assert (
        main_pull(
            [
                "nkikit/tiny-rmsnorm",
                "--version",
                "1",
                "--endpoint",
                hub_url,
                "--cache-dir",
                str(cache_dir),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        f"nkikit/tiny-rmsnorm v1 @ {tiny_repo.commit} (torch-cpu)" in out
        and "rmsnorm(x, weight, eps=1e-06)" in out
    )
    assert main_pull(["nkikit/nope", "--endpoint", hub_url, "--cache-dir", str(cache_dir)]) == 1
    assert "error: kernel repo nkikit/nope not found" in capsys.readouterr().err
    assert (
        main_pull(
            [
                "nkikit/tiny-rmsnorm",
                "--backend",
                "neuron",
                "--download-only",
                "--endpoint",
                hub_url,
                "--cache-dir",
                str(cache_dir),
            ]
        )
        == 0
    )
    assert "verified" in capsys.readouterr().out


@pytest.mark.slow
def test_server_sigkilled_during_a_large_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like test_server_killed_mid_download, but a real SIGKILL from outside, timed by watching
    the partial download grow in the cache (no failpoint)."""
    import threading
    import types

    import huggingface_hub.utils._http as hf_http
    from hubfixtures import wait_for

    monkeypatch.setattr(hf_http, "time", types.SimpleNamespace(sleep=lambda _s: None))
    folder = copy_fixture(tmp_path)
    size = 192 << 20
    (folder / "weights.bin").write_bytes(np.random.default_rng(0).bytes(size))
    root, cache = tmp_path / "hub", tmp_path / "cache"
    hub = HubProcess(root)
    try:
        publish(folder, "nkikit/huge", endpoint=hub.url, run_tests=False, neuron=False)
    finally:
        hub.stop()
    hub = HubProcess(root)
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(
                pull(
                    "nkikit/huge",
                    version=1,
                    endpoint=hub.url,
                    cache_dir=cache,
                    trust_remote_code=True,
                )
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)

    blobs = repo_cache_dir(cache, _repo("nkikit/huge")) / "blobs"

    def downloading() -> bool:
        # a partial file may be renamed between glob() and stat(): that is not an error
        for p in blobs.glob("*.incomplete") if blobs.is_dir() else ():
            try:
                if p.stat().st_size > 0:
                    return True
            except FileNotFoundError:
                continue
        return False

    thread = threading.Thread(target=run)
    thread.start()
    try:
        started = wait_for(downloading, timeout=60)
        hub.proc.kill()  # SIGKILL: no shutdown, sockets die mid-transfer
        thread.join(120)
    finally:
        hub.stop()
    if not started or not isinstance(outcome[0], BaseException):
        pytest.skip("the download finished before the kill could land")
    assert isinstance(outcome[0], DownloadError), outcome[0]
    assert not any(
        p for p in (repo_cache_dir(cache, _repo("nkikit/huge")) / "snapshots").rglob("weights.bin")
    )
    hub = HubProcess(root)
    try:
        k = pull(
            "nkikit/huge", version=1, endpoint=hub.url, cache_dir=cache, trust_remote_code=True
        )  # resumes, verifies
        assert (k.path / "weights.bin").stat().st_size == size
    finally:
        hub.stop()


def test_nkikits_own_nki_alias_is_not_the_neuron_sdk(monkeypatch) -> None:  # noqa: ANN001
    # after nkikit.nki.install_alias() `import nki` works, but the torch-neuron build still needs
    # AWS's SDK: the pull says so instead of failing inside the build's import of neuronxcc
    import importlib.util
    import sys

    import nkikit.nki
    from nkikit.registry import pull as pull_module

    monkeypatch.setitem(sys.modules, "nki", nkikit.nki)
    assert importlib.util.find_spec("nki") is not None
    with pytest.raises(BackendUnavailableError, match="runs only with the AWS Neuron SDK"):
        pull_module._check_backend("torch-neuron", Path("."))
