"""`nkikit hub serve` refuses option values that would serve the wrong folder or no request:
an empty --root (the current folder), a non-positive or non-finite --max-upload-mb or
--timeout, each named with its value."""

import pytest

from nkikit.hub.server import main


@pytest.mark.parametrize(
    "args, says",
    [
        (["--root", ""], "--root: expected a folder path, got an empty one"),
        (["--root", "  "], "--root: expected a folder path"),
        (
            ["--root", "r", "--max-upload-mb", "-1"],
            "--max-upload-mb: expected a size in MiB above 0, got '-1'",
        ),
        (
            ["--root", "r", "--max-upload-mb", "0"],
            "--max-upload-mb: expected a size in MiB above 0, got '0'",
        ),
        (["--root", "r", "--max-upload-mb", "inf"], "got 'inf'"),
        (
            ["--root", "r", "--timeout", "nan"],
            "--timeout: expected a number of seconds above 0, got 'nan'",
        ),
        (["--root", "r", "--timeout", "-5"], "got '-5'"),
        (["--root", "r", "--timeout", "soon"], "got 'soon'"),
    ],
)
def test_bad_option_values_are_refused_by_name(args, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing served, nothing created
