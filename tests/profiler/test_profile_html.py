"""HTML report, timeline binning and the terminal summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from nkikit.profiler import Instruction, Profile, TargetInfo
from nkikit.profiler.html import render_html
from nkikit.profiler.timeline import build_timeline, busy_per_bin
from nkikit.targets import get_target


def big_profile(iterations: int) -> Profile:
    """A pipelined loop, 6 instructions per iteration, ~1.1 µs per iteration."""
    ins: list[Instruction] = []
    t = 0.0
    append = ins.append
    for it in range(iterations):
        b = len(ins)
        q = it % 16
        append(
            Instruction(
                b,
                f"dma{q}",
                "DMA_LOAD",
                t,
                t + 900,
                "mm.py:20",
                "a = nl.load(a_hbm[i])",
                hbm_read_bytes=65536,
                sbuf_write_bytes=65536,
                partitions=128,
                elements=256,
                dtype="bf16",
                tensor_name="a",
                hbm_offset=65536 * it,
            )
        )
        append(
            Instruction(
                b + 1,
                "tensor",
                "MATMUL",
                t + 900,
                t + 1000,
                "mm.py:22",
                "c = nisa.nc_matmul(a, b)",
                flops=2 * 128 * 128 * 512,
                model_flops=2 * 128 * 128 * 512,
                dtype="bf16",
                deps=(b,),
            )
        )
        append(
            Instruction(
                b + 2,
                "vector",
                "TENSOR_COPY",
                t + 1000,
                t + 1040,
                "mm.py:23",
                "o = nl.copy(c)",
                deps=(b + 1,),
            )
        )
        append(
            Instruction(
                b + 3,
                "scalar",
                "ACTIVATE",
                t + 1000,
                t + 1030,
                "mm.py:24",
                "e = nl.exp(c)",
                deps=(b + 1,),
            )
        )
        append(
            Instruction(
                b + 4, "sync", "EVENT_SEMAPHORE", t + 1040, t + 1045, "mm.py:25", "", deps=(b + 2,)
            )
        )
        append(
            Instruction(
                b + 5,
                f"dma{(q + 8) % 16}",
                "DMA_STORE",
                t + 1045,
                t + 1300,
                "mm.py:26",
                "nl.store(out[i], o)",
                hbm_write_bytes=65536,
                sbuf_read_bytes=65536,
                partitions=128,
                elements=256,
                tensor_name="out",
                hbm_offset=65536 * it,
                deps=(b + 4,),
            )
        )
        t += 1100.0
    return Profile("big_matmul", get_target("trn2").target_info(), ins)


def test_html_contains_the_numbers(paper_profile: Profile, tmp_path: Path) -> None:
    path = paper_profile.to_html(tmp_path / "r.html")
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "paper_kernel" in page
    # cards: time, MFU 25 %, HFU 30 %, MBU 40.96 %, bound by latency (busiest DMA, 50 %)
    assert re.search(r'id="card-time".*?400 ns', page, re.S)
    assert re.search(r'id="card-mfu".*?25\.0%', page, re.S)
    assert re.search(r'id="card-hfu".*?30\.0%', page, re.S)
    assert re.search(r'id="card-mbu".*?41\.0%', page, re.S)
    assert re.search(r'id="card-bound".*?latency.*?busiest DMA 50\.0%', page, re.S)
    # engine bars: Tensor 37.5 %, DMA 50 %
    assert re.search(r"Tensor</div>.*?37\.5%", page, re.S)
    assert re.search(r"DMA \(all queues\)</div>.*?50\.0%", page, re.S)
    # every warning, with its lines
    for w in paper_profile.summary["warnings"]:
        assert f'data-name="{w["name"]}"' in page
        assert w["source"] in page
    # hottest lines table: line, code, time, share
    assert "k.py:12" in page and "c = nisa.nc_matmul(a_t, b_t)" in page
    assert "20.4%" in page  # 100 ns of 490 ns engine-time
    assert "aggregated-note" not in page


def test_html_shows_scalar_meta(paper_profile: Profile) -> None:
    paper_profile.meta = {
        "compile_s": 0.101618121999,
        "target_description": "Trainium2",
        "big": [1],
    }
    page = render_html(paper_profile)
    assert "compile_s: 0.1016" in page and "target_description: Trainium2" in page
    assert "big:" not in page


def test_html_is_self_contained(paper_profile: Profile) -> None:
    page = render_html(paper_profile)
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page)
    assert "@import" not in page and "url(" not in page
    assert "<link" not in page


def test_html_escapes_source_text(make_profile) -> None:
    evil = "x = '</script><script>alert(1)</script>' & <b>"
    p = make_profile([("vector", "TENSOR_COPY", 0, 10, dict(source_text=evil))])
    page = render_html(p)
    assert "<script>alert(1)" not in page
    assert "&lt;/script&gt;" in page  # in the lines table
    data = re.search(
        r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S
    )
    assert data is not None and json.loads(data.group(1))["code"] == [evil]


def test_timeline_raw_keeps_every_instruction(paper_profile: Profile) -> None:
    tl = build_timeline(paper_profile)
    assert not tl["aggregated"]
    tracks = {t["engine"]: t for t in tl["tracks"]}
    # every compute engine gets a row, DMA queues only when used
    assert list(tracks) == ["tensor", "vector", "scalar", "gpsimd", "sync", "dma0", "dma1", "dma2"]
    assert sum(t["count"] for t in tl["tracks"]) == 7
    t = tracks["tensor"]
    assert t["s"] == [150.0, 250.0] and t["d"] == [100.0, 50.0]
    assert [tl["opcodes"][k] for k in t["o"]] == ["MATMUL", "TRANSPOSE"]
    assert [tl["lines"][k] for k in t["l"]] == ["k.py:12", "k.py:13"]


def test_busy_per_bin() -> None:
    # bins of 10 ns: [5, 27) puts 5 in bin 0, 10 in bin 1, 7 in bin 2; [24, 30) overlaps it;
    # [39, 40) ends exactly at the last edge and stays in the last bin
    busy = busy_per_bin(np.array([5.0, 24.0, 39.0]), np.array([27.0, 30.0, 40.0]), 10.0, 4)
    assert busy.tolist() == [5.0, 10.0, 10.0, 1.0]


def test_timeline_bins_preserve_busy_time() -> None:
    p = big_profile(2000)  # 12k instructions
    tl = build_timeline(p, max_events=1000, bins=500)
    assert tl["aggregated"] and tl["bins"] == 500
    s = p.summary
    for t in tl["tracks"]:
        assert len(t["i"]) <= 500 and all(0 < b <= 1 for b in t["b"])
        busy = sum(t["b"]) * tl["bin_ns"]
        engine = t["engine"]
        expected = s["engine_active_percent"].get(
            engine, s["dma_queue_active_percent"].get(engine, 0)
        )
        # each bin's fraction is rounded to 3 decimals (floored at 0.001)
        slack = 0.001 * tl["bin_ns"] * len(t["i"])
        assert busy == pytest.approx(expected / 100 * p.total_ns, abs=slack + 1e-6)


def test_aggregated_html_for_300k_instructions(tmp_path: Path) -> None:
    p = big_profile(50_000)  # 300k instructions
    path = p.to_html(tmp_path / "big.html")
    page = path.read_text()
    assert 'id="aggregated-note"' in page and "300,000 instructions" in page
    assert path.stat().st_size < 3_000_000
    s = p.summary
    assert s["instruction_count"] == 300_000
    assert s["tensor_active_percent"] == pytest.approx(100 * 50_000 * 100 / p.total_ns)
    # the report's rendering time is measured by benchmarks/, not asserted here


def test_max_events_switches_to_bins(paper_profile: Profile, tmp_path: Path) -> None:
    page = paper_profile.to_html(tmp_path / "r.html", max_events=3).read_text()
    assert 'id="aggregated-note"' in page and "7 instructions" in page


def test_empty_profile_renders(paper_target: TargetInfo, tmp_path: Path) -> None:
    p = Profile("empty", paper_target, [])
    page = p.to_html(tmp_path / "e.html").read_text()
    assert "No warnings." in page
    assert "empty" in str(p)


def test_terminal_summary(paper_profile: Profile) -> None:
    text = str(paper_profile)
    assert text.startswith("paper_kernel on paper: 400 ns")
    assert "bound by latency" in text
    for part in ("MFU", "25.0%", "HFU", "30.0%", "MBU", "41.0%", "Tensor", "37.5%", "k.py:10"):
        assert part in text, part
    for w in paper_profile.summary["warnings"]:
        assert w["name"] in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_table_is_a_rich_renderable(paper_profile: Profile) -> None:
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=True).print(paper_profile.table())
    assert "\x1b[" in buf.getvalue()  # coloured when the console is a terminal
    buf2 = io.StringIO()
    Console(file=buf2, width=120).print(paper_profile)  # via __rich__
    assert "MFU" in buf2.getvalue()


def test_terminal_prints_code_verbatim(make_profile) -> None:
    p = make_profile([("vector", "TENSOR_COPY", 0, 10, dict(source_text="x = a[i] + b[bold]"))])
    assert "x = a[i] + b[bold]" in str(p)


def test_opcode_colours_are_the_same_in_every_report(make_profile) -> None:
    from nkikit.profiler.colours import opcode_colour
    from nkikit.profiler.timeline import build_timeline

    # MATMUL has the most time in one profile and the least in the other
    a = make_profile([("tensor", "MATMUL", 0, 100), ("vector", "TENSOR_COPY", 100, 110)])
    b = make_profile([("tensor", "MATMUL", 0, 10), ("vector", "TENSOR_COPY", 10, 110)])
    ta, tb = build_timeline(a), build_timeline(b)
    assert ta["opcodes"] == ["MATMUL", "TENSOR_COPY"] and tb["opcodes"] == ["TENSOR_COPY", "MATMUL"]
    colour_a = dict(zip(ta["opcodes"], ta["colours"]))
    colour_b = dict(zip(tb["opcodes"], tb["colours"]))
    assert colour_a == colour_b == {o: opcode_colour(o) for o in ("MATMUL", "TENSOR_COPY")}
    assert colour_a["MATMUL"] != colour_a["TENSOR_COPY"]
    assert opcode_colour("SOME_NEW_OPCODE") == opcode_colour("SOME_NEW_OPCODE")
