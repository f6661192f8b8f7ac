"""`nkikit --help` and each command's help: one tree, one spelling of each shared option."""

from __future__ import annotations

import re

import pytest
from clihelp import nkikit

from nkikit.cli import COMMANDS, build_parser

COMMAND_NAMES = [func.removeprefix("add_") for _, func in COMMANDS]


def test_top_level_help_lists_every_command_in_order():
    p = nkikit("--help")
    assert p.returncode == 0
    listed = re.findall(r"^    (\w+)\s", p.stdout, flags=re.M)
    assert listed == COMMAND_NAMES
    assert set(COMMAND_NAMES) >= {
        "run", "ir", "profile", "test", "new", "publish", "pull", "lock", "hub", "demo"
    }  # fmt: skip


@pytest.mark.parametrize("command", ["run", "ir", "profile"])
def test_kernel_commands_share_one_spelling(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    assert f"usage: nkikit {command} [-h]" in text
    assert "KERNEL" in text and "FILE.py::KERNEL or MODULE:KERNEL" in text
    assert "--args ARGS" in text and "'x=128x64:bfloat16,eps=1e-6'" in text
    assert "--grid GRID" in text and "e.g. 2x4" in text
    assert "--shapes" not in text and "--arg " not in text


@pytest.mark.parametrize("command", ["profile", "lock", "demo", "new"])
def test_every_output_option_is_dash_o_or_dash_dash_out(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert "-o PATH, --out PATH" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["publish", "pull", "lock"])
def test_hub_commands_take_endpoint_and_token(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    assert "--endpoint ENDPOINT" in text and "--token TOKEN" in text


def test_test_help_says_pytest_options_pass_through():
    p = nkikit("test", "--help")
    assert p.returncode == 0
    assert "usage: nkikit test [PATH ...] [PYTEST OPTIONS]" in p.stdout
    assert "-k" in p.stdout and "summary line" in p.stdout


def test_hub_serve_help_is_the_servers():
    p = nkikit("hub", "serve", "--help")
    assert p.returncode == 0 and "--root" in p.stdout and "--port" in p.stdout
