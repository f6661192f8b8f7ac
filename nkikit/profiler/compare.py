"""Comparing two profiles: ``nkikit compare A B`` and its side-by-side HTML.

A and B are each a kernel profile (an ``nkikit-profile`` JSON from :meth:`Profile.to_json`, or
a folder ``nkikit profile`` wrote, which holds one) or a system profile (its
``key_averages.json``, or the folder holding it).  Two kernel profiles compare per engine
(active share and busy time), per headline metric and per source line; two system profiles
compare per kernel and per operation (calls, device and host time).  Every delta is B minus A.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .model import COMPUTE_ENGINES, FORMAT_NAME, Profile, engine_label
from .units import fmt_bytes, fmt_ns, fmt_percent

KERNEL_METRICS: tuple[tuple[str, str, str], ...] = (
    ("total_ns", "total time", "ns"),
    ("instruction_count", "instructions", "count"),
    ("mfu_percent", "MFU", "pct"),
    ("mbu_percent", "MBU", "pct"),
    ("hbm_bytes", "HBM bytes", "bytes"),
    ("dma_transfer_count", "DMA transfers", "count"),
    ("dma_transfer_average_bytes", "DMA average transfer", "bytes"),
    ("spill_bytes", "spilled", "bytes"),
)


def load(path: str | Path) -> Profile | dict[str, Any]:
    """A kernel :class:`Profile` or a system profile's summary dict (``key_averages.json``)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("*.nkikit.json")) or sorted(p.glob("key_averages*.json"))
        if not found:
            raise ValueError(f"{p}: no *.nkikit.json profile or key_averages.json in the folder")
        p = found[0]
    doc = json.loads(p.read_text(encoding="utf-8"))
    if isinstance(doc, dict) and doc.get("format") == FORMAT_NAME:
        return Profile.from_dict(doc)
    if isinstance(doc, dict) and "key_averages" in doc:
        return doc
    raise ValueError(f"{p}: neither an nkikit profile nor a system profile's key averages")


def _fmt(kind: str, v: float) -> str:
    if kind == "ns":
        return fmt_ns(v)
    if kind == "pct":
        return fmt_percent(v)
    if kind == "bytes":
        return fmt_bytes(v)
    return f"{v:,.0f}"


def _delta(kind: str, a: float, b: float) -> str:
    d = b - a
    sign = "+" if d > 0 else ("-" if d < 0 else "±")
    text = f"{sign}{_fmt(kind, abs(d))}" if kind != "pct" else f"{d:+.1f} pt"
    if kind != "pct" and a:
        text += f" ({100 * d / a:+.1f}%)"
    return text


def compare_kernels(a: Profile, b: Profile) -> dict[str, Any]:
    """Per-metric, per-engine and per-line deltas of two kernel profiles (B minus A)."""
    sa, sb = a.summary, b.summary
    metrics = [
        {
            "key": key,
            "label": label,
            "kind": kind,
            "a": float(sa[key]),
            "b": float(sb[key]),
            "delta": float(sb[key]) - float(sa[key]),
            "text": _delta(kind, float(sa[key]), float(sb[key])),
        }
        for key, label, kind in KERNEL_METRICS
    ]
    busy_a, busy_b = a.analysis().busy_ns, b.analysis().busy_ns
    engines = []
    for e in (*COMPUTE_ENGINES, "dma"):
        pa, pb = sa["engine_active_percent"][e], sb["engine_active_percent"][e]
        ba, bb = float(busy_a.get(e, 0.0)), float(busy_b.get(e, 0.0))
        engines.append(
            {
                "engine": e,
                "label": engine_label(e),
                "active_a": pa,
                "active_b": pb,
                "busy_a_ns": ba,
                "busy_b_ns": bb,
                "busy_delta_ns": bb - ba,
            }
        )
    lines_a = {ln.source: ln.time_ns for ln in a.per_line()}
    lines_b = {ln.source: ln.time_ns for ln in b.per_line()}
    lines = sorted(
        (
            {"source": s, "a_ns": lines_a.get(s, 0.0), "b_ns": lines_b.get(s, 0.0)}
            for s in set(lines_a) | set(lines_b)
        ),
        key=lambda d: -abs(d["b_ns"] - d["a_ns"]),
    )
    return {
        "kind": "kernel",
        "a": {"kernel": a.kernel, "target": a.target.name, "bound_by": sa["bound_by"]},
        "b": {"kernel": b.kernel, "target": b.target.name, "bound_by": sb["bound_by"]},
        "speedup": sa["total_ns"] / sb["total_ns"] if sb["total_ns"] else 0.0,
        "metrics": metrics,
        "engines": engines,
        "lines": lines[:20],
    }


def compare_systems(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per-kernel and per-operation deltas of two system profiles' key averages."""
    rows_a = {(d["kind"], d["name"]): d for d in a["key_averages"]}
    rows_b = {(d["kind"], d["name"]): d for d in b["key_averages"]}
    rows = []
    for key in sorted(set(rows_a) | set(rows_b), key=lambda k: (k[0] != "kernel", k[1])):
        ra, rb = rows_a.get(key, {}), rows_b.get(key, {})
        rows.append(
            {
                "kind": key[0],
                "name": key[1],
                "calls_a": ra.get("calls", 0),
                "calls_b": rb.get("calls", 0),
                "device_a_us": ra.get("device_total_us", 0.0),
                "device_b_us": rb.get("device_total_us", 0.0),
                "host_a_us": ra.get("host_total_us", 0.0),
                "host_b_us": rb.get("host_total_us", 0.0),
            }
        )
    da, db = a.get("device_total_us", 0.0), b.get("device_total_us", 0.0)
    return {
        "kind": "system",
        "device_total_a_us": da,
        "device_total_b_us": db,
        "speedup": da / db if db else 0.0,
        "rows": rows,
    }


def compare(a: Profile | dict[str, Any], b: Profile | dict[str, Any]) -> dict[str, Any]:
    """:func:`compare_kernels` or :func:`compare_systems`; both sides must be of one kind."""
    if isinstance(a, Profile) and isinstance(b, Profile):
        return compare_kernels(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return compare_systems(a, b)
    raise ValueError("compare a kernel profile with a kernel profile, a system with a system")


def render_text(c: dict[str, Any]) -> str:
    """The comparison as plain-text tables."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    con = Console(file=buf, width=120, color_system=None, force_terminal=False)
    if c["kind"] == "kernel":
        con.print(
            f"A: {c['a']['kernel']} on {c['a']['target']} (bound by {c['a']['bound_by']})\n"
            f"B: {c['b']['kernel']} on {c['b']['target']} (bound by {c['b']['bound_by']})\n"
            f"B is {c['speedup']:.2f}x the speed of A"
        )
        t = Table(box=box.SIMPLE_HEAD)
        for col in ("metric", "A", "B", "B - A"):
            t.add_column(col, justify="left" if col == "metric" else "right")
        for m in c["metrics"]:
            t.add_row(m["label"], _fmt(m["kind"], m["a"]), _fmt(m["kind"], m["b"]), m["text"])
        con.print(t)
        t = Table(box=box.SIMPLE_HEAD)
        for col in ("engine", "active A", "active B", "busy A", "busy B", "busy B - A"):
            t.add_column(col, justify="left" if col == "engine" else "right")
        for e in c["engines"]:
            t.add_row(
                e["label"],
                fmt_percent(e["active_a"]),
                fmt_percent(e["active_b"]),
                fmt_ns(e["busy_a_ns"]),
                fmt_ns(e["busy_b_ns"]),
                _delta("ns", e["busy_a_ns"], e["busy_b_ns"]),
            )
        con.print(t)
    else:
        con.print(
            f"device time A {fmt_ns(1000 * c['device_total_a_us'])}, B "
            f"{fmt_ns(1000 * c['device_total_b_us'])}: B is {c['speedup']:.2f}x the speed of A"
        )
        t = Table(box=box.SIMPLE_HEAD)
        for col in (
            "name",
            "calls A",
            "calls B",
            "device A",
            "device B",
            "device B - A",
            "host B - A",
        ):
            t.add_column(col, justify="left" if col == "name" else "right")
        for r in c["rows"]:
            t.add_row(
                ("kernel " if r["kind"] == "kernel" else "") + r["name"],
                str(r["calls_a"]),
                str(r["calls_b"]),
                fmt_ns(1000 * r["device_a_us"]),
                fmt_ns(1000 * r["device_b_us"]),
                _delta("ns", 1000 * r["device_a_us"], 1000 * r["device_b_us"]),
                _delta("ns", 1000 * r["host_a_us"], 1000 * r["host_b_us"]),
            )
        con.print(t)
    return buf.getvalue()


def write_html(c: dict[str, Any], path: str | Path, names: tuple[str, str] = ("A", "B")) -> Path:
    """The side-by-side HTML of a comparison (self-contained)."""
    from .html import _environment

    path = Path(path)
    page = (
        _environment()
        .get_template("compare.html.j2")
        .render(c=c, names=names, fmt=_fmt, delta=_delta)
    )
    path.write_text(page, encoding="utf-8")
    return path
