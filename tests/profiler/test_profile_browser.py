"""The HTML report in real headless Chromium: the inline script must run without errors.

The page's script sets ``data-rendered="ok"`` on <body> when it has drawn the timeline and
records any uncaught error in ``data-js-error``; ``--dump-dom`` shows the DOM after scripts
ran, and Chromium's console log (on stderr) must not mention an uncaught exception.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nkikit.profiler import Profile

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed"),
]


def run_chromium(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1800",
        "--enable-logging=stderr",
        "--v=0",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def body_tag(dom: str) -> str:
    m = re.search(r"<body[^>]*>", dom)
    assert m, dom[:2000]
    return m.group(0)


@pytest.mark.parametrize("aggregated", [False, True], ids=["raw", "aggregated"])
def test_report_renders_without_js_errors(
    paper_profile: Profile, tmp_path: Path, aggregated: bool
) -> None:
    page = paper_profile.to_html(tmp_path / "report.html", max_events=2 if aggregated else 20_000)
    result = run_chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert result.returncode == 0, result.stderr[-3000:]
    body = body_tag(result.stdout)
    assert 'data-rendered="ok"' in body, (body, result.stderr[-3000:])
    assert "data-js-error" not in body, body
    assert 'data-tracks="8"' in body  # 5 compute engines + 3 DMA queues
    assert 'data-hover="ok"' in body  # the tooltip lookup found the first instruction
    assert "Uncaught" not in result.stderr, result.stderr[-3000:]
    # the legend is built by the script, so its presence also proves it ran
    assert re.search(r'<div id="legend">.*MATMUL', result.stdout, re.S)
    if aggregated:
        assert 'id="aggregated-note"' in result.stdout


def test_screenshot(paper_profile: Profile, tmp_path: Path) -> None:
    page = paper_profile.to_html(tmp_path / "report.html")
    shot = tmp_path / "report.png"
    result = run_chromium(tmp_path, page.as_uri(), f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page compresses to a few KB


def test_broken_script_is_detected(tmp_path: Path) -> None:
    # The harness itself must notice a failing script, or the tests above prove nothing.
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body><script>"
        'window.addEventListener("error", function (e) {'
        ' document.body.setAttribute("data-js-error", String(e.message)); });'
        "</script><script>undefinedFunction();"
        'document.body.setAttribute("data-rendered", "ok");</script></body></html>'
    )
    result = run_chromium(tmp_path, page.as_uri(), "--dump-dom")
    body = body_tag(result.stdout)
    assert "data-js-error" in body and 'data-rendered="ok"' not in body
