"""With a token configured: writes and private repos need it, public reads do not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from nkikit.hub import running_hub

TOKEN = "team-secret-token"


@pytest.fixture
def secured(hub_root: Path) -> Iterator[str]:
    with running_hub(hub_root, token=TOKEN) as url:
        owner = HfApi(endpoint=url, token=TOKEN)
        owner.create_repo("team/public")
        owner.upload_file(path_or_fileobj=b"pub", path_in_repo="p.txt", repo_id="team/public")
        owner.create_repo("team/secret", private=True)
        owner.upload_file(path_or_fileobj=b"sec", path_in_repo="s.txt", repo_id="team/secret")
        yield url


def _status(excinfo: pytest.ExceptionInfo) -> int:
    return excinfo.value.response.status_code


def test_writes_need_the_token(secured: str):
    for token in (False, "wrong-token"):
        api = HfApi(endpoint=secured, token=token)
        with pytest.raises(HfHubHTTPError) as e:
            api.create_repo("team/new")
        assert _status(e) == 401
        with pytest.raises(HfHubHTTPError) as e:
            api.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="team/public")
        assert _status(e) == 401
        with pytest.raises(HfHubHTTPError) as e:
            api.create_branch("team/public", branch="v1")
        assert _status(e) == 401
        with pytest.raises(HfHubHTTPError) as e:
            api.delete_repo("team/public")
        assert _status(e) == 401
    with pytest.raises(HfHubHTTPError) as e:
        HfApi(endpoint=secured, token="wrong-token").whoami()
    assert _status(e) == 401
    owner = HfApi(endpoint=secured, token=TOKEN)
    assert owner.list_repo_files("team/public") == ["p.txt"]
    assert owner.whoami()["name"]


def test_public_reads_need_no_token(secured: str, cache_dir: Path):
    anon = HfApi(endpoint=secured, token=False)
    assert anon.list_repo_files("team/public") == ["p.txt"]
    path = hf_hub_download(
        "team/public", "p.txt", cache_dir=cache_dir, endpoint=secured, token=False
    )
    assert Path(path).read_bytes() == b"pub"
    # A wrong token does not spoil a public read (it may be a huggingface.co token sent by habit).
    wrong = HfApi(endpoint=secured, token="hf_from_elsewhere")
    assert wrong.list_repo_files("team/public") == ["p.txt"]


def test_private_repos_are_invisible_without_the_token(secured: str, cache_dir: Path):
    for token in (False, "wrong-token"):
        api = HfApi(endpoint=secured, token=token)
        with pytest.raises(RepositoryNotFoundError):
            api.repo_info("team/secret")
        with pytest.raises(RepositoryNotFoundError):
            api.list_repo_refs("team/secret")
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download(
                "team/secret", "s.txt", cache_dir=cache_dir, endpoint=secured, token=token
            )
        assert [m.id for m in api.list_models(author="team")] == ["team/public"]
    owner = HfApi(endpoint=secured, token=TOKEN)
    assert owner.repo_info("team/secret").private is True
    folder = snapshot_download("team/secret", cache_dir=cache_dir, endpoint=secured, token=TOKEN)
    assert (Path(folder) / "s.txt").read_bytes() == b"sec"
    # Making it public opens it to everyone.
    owner.update_repo_settings("team/secret", private=False)
    assert HfApi(endpoint=secured, token=False).list_repo_files("team/secret") == ["s.txt"]


def test_without_a_token_everything_is_open(api: HfApi):
    anon = HfApi(endpoint=api.endpoint, token=False)
    anon.create_repo("team/open", private=True)
    anon.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="team/open")
    assert anon.list_repo_files("team/open") == ["x"]
