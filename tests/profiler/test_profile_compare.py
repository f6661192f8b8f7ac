"""``nkikit compare A B``: kernel profiles per metric, engine and line; system profiles per
kernel and operation; the CLI on the folders ``nkikit profile`` writes; the side-by-side HTML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nkikit.cli import main as cli_main
from nkikit.profiler import Profile
from nkikit.profiler.compare import compare, load, render_text


@pytest.fixture
def pair(make_profile) -> tuple[Profile, Profile]:
    a = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 100, dict(hbm_read_bytes=4096, partitions=2, source="k.py:1")),
            ("vector", "TENSOR_TENSOR", 100, 300, dict(source="k.py:2")),
        ],
        kernel="slow",
    )
    b = make_profile(
        [
            ("dma0", "DMA_LOAD", 0, 100, dict(hbm_read_bytes=4096, partitions=2, source="k.py:1")),
            ("vector", "TENSOR_TENSOR", 100, 150, dict(source="k.py:2")),
        ],
        kernel="fast",
    )
    return a, b


def test_kernel_deltas(pair) -> None:  # noqa: ANN001
    a, b = pair
    c = compare(a, b)
    assert c["kind"] == "kernel" and c["speedup"] == pytest.approx(2.0)
    m = {x["key"]: x for x in c["metrics"]}
    assert m["total_ns"]["a"] == 300 and m["total_ns"]["b"] == 150
    assert m["total_ns"]["delta"] == -150 and m["total_ns"]["text"] == "-150 ns (-50.0%)"
    assert m["hbm_bytes"]["delta"] == 0
    e = {x["engine"]: x for x in c["engines"]}
    assert e["vector"]["busy_a_ns"] == 200 and e["vector"]["busy_delta_ns"] == -150
    assert e["dma"]["busy_delta_ns"] == 0
    assert e["vector"]["active_b"] == pytest.approx(100 * 50 / 150)
    assert c["lines"][0] == {"source": "k.py:2", "a_ns": 200.0, "b_ns": 50.0}
    text = render_text(c)
    assert "B is 2.00x the speed of A" in text and "Vector" in text


def _system(device: dict[str, float], calls: int = 2) -> dict:
    return {
        "device_total_us": sum(device.values()),
        "key_averages": [
            {
                "kind": "kernel",
                "name": k,
                "calls": calls,
                "device_total_us": v,
                "host_total_us": 1.0,
            }
            for k, v in device.items()
        ],
    }


def test_system_deltas() -> None:
    c = compare(_system({"rmsnorm_kernel": 10.0, "add_one": 2.0}), _system({"rmsnorm_kernel": 5.0}))
    assert c["kind"] == "system" and c["speedup"] == pytest.approx(12 / 5)
    rows = {r["name"]: r for r in c["rows"]}
    assert (
        rows["rmsnorm_kernel"]["device_a_us"] == 10 and rows["rmsnorm_kernel"]["device_b_us"] == 5
    )
    assert rows["add_one"]["calls_b"] == 0  # gone in B


def test_mixed_kinds_are_refused(pair) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="kernel profile with a kernel profile"):
        compare(pair[0], _system({"k": 1.0}))


def test_cli_on_folders_and_html(pair, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    a, b = pair
    for name, p in (("A", a), ("B", b)):
        (tmp_path / name).mkdir()
        p.to_json(tmp_path / name / "profile.nkikit.json")
    assert isinstance(load(tmp_path / "A"), Profile)
    html, out = tmp_path / "cmp.html", tmp_path / "cmp.json"
    code = cli_main(
        [
            "compare",
            str(tmp_path / "A"),
            str(tmp_path / "B"),
            "--html",
            str(html),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "B is 2.00x the speed of A" in printed and "-150 ns (-50.0%)" in printed
    page = html.read_text()
    assert 'data-kind="kernel"' in page and "2.00× the speed of A" in page and "Vector" in page
    assert json.loads(out.read_text())["speedup"] == pytest.approx(2.0)
    # system profiles: the key_averages.json a NeuronProfiler writes
    for name, dev in (("SA", 10.0), ("SB", 4.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "key_averages.json").write_text(json.dumps(_system({"k": dev})))
    assert cli_main(["compare", str(tmp_path / "SA"), str(tmp_path / "SB")]) == 0
    assert "B is 2.50x the speed of A" in capsys.readouterr().out
    assert cli_main(["compare", str(tmp_path / "A"), str(tmp_path / "nowhere")]) == 1
