"""Self-contained HTML report rendered with jinja2 from ``templates/report.html.j2``.

The page loads nothing from the network: styles and the timeline script are inline and the
timeline data is embedded as JSON. Large profiles are binned (see :mod:`.timeline`) and the
page says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .metrics import SATURATED_PERCENT
from .model import COMPUTE_ENGINES, engine_label, is_dma_engine
from .timeline import DEFAULT_BINS, DEFAULT_MAX_EVENTS, build_timeline
from .units import fmt_bytes, fmt_flops, fmt_ns, fmt_percent, fmt_rate

if TYPE_CHECKING:
    from .model import Profile

TEMPLATES = Path(__file__).parent / "templates"
TOP_LINES = 25


def _json_for_script(obj: Any) -> str:
    # Escaping <, > and & keeps "</script>" or "<!--" in source text from ending the block.
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ns=fmt_ns, bytes=fmt_bytes, pct=fmt_percent, flops=fmt_flops, rate=fmt_rate)
    return env


def _engine_breakdown(engines: dict[str, float]) -> str:
    """``Tensor 1.2 µs, DMA 54 µs (16 queues)``: queues merged so the cell stays short."""
    parts: dict[str, float] = {}
    queues = 0
    for e, ns in engines.items():
        if is_dma_engine(e):
            queues += 1
            parts["DMA"] = parts.get("DMA", 0.0) + ns
        else:
            parts[engine_label(e)] = ns
    text = [f"{name} {fmt_ns(ns)}" for name, ns in parts.items()]
    if queues > 1:
        text[list(parts).index("DMA")] += f" ({queues} queues)"
    return ", ".join(text)


def render_html(
    profile: Profile,
    *,
    max_events: int = DEFAULT_MAX_EVENTS,
    bins: int = DEFAULT_BINS,
    top_lines: int = TOP_LINES,
) -> str:
    """The report as a string; see :func:`write_html`."""
    s = profile.summary
    timeline = build_timeline(profile, max_events=max_events, bins=bins)
    engines = [(engine_label(e), e, s["engine_active_percent"][e]) for e in COMPUTE_ENGINES]
    engines.append(("DMA (all queues)", "dma", s["dma_active_percent"]))
    queues = [(engine_label(q), q, p) for q, p in s["dma_queue_active_percent"].items() if p > 0]
    lines = profile.per_line()
    metrics = [
        ("HBM read", fmt_bytes(s["hbm_read_bytes"])),
        ("HBM write", fmt_bytes(s["hbm_write_bytes"])),
        ("Achieved HBM bandwidth", fmt_rate(s["achieved_hbm_bytes_per_s"])),
        ("Useful HBM reads", fmt_percent(s["useful_read_percent"])),
        (
            "SBUF read / write",
            f"{fmt_bytes(s['sbuf_read_bytes'])} / {fmt_bytes(s['sbuf_write_bytes'])}",
        ),
        (
            "PSUM read / write",
            f"{fmt_bytes(s['psum_read_bytes'])} / {fmt_bytes(s['psum_write_bytes'])}",
        ),
        ("Model FLOPs", fmt_flops(s["model_flops"])),
        ("Hardware FLOPs", fmt_flops(s["hardware_flops"])),
        (
            "Transpose FLOPs",
            f"{fmt_flops(s['transpose_flops'])} ({fmt_percent(s['transpose_flops_percent'])})",
        ),
        (
            "Matmul dtype / peak",
            f"{s['matmul_dtype']} / {s['peak_flops_per_s'] / 1e12:.1f} TFLOP/s",
        ),
        ("MM arithmetic intensity", f"{s['mm_arithmetic_intensity']:.1f} FLOP/B"),
        ("Matmul instructions", f"{s['matmul_instruction_count']:,}"),
        ("DMA transfers", f"{s['dma_transfer_count']:,}"),
        ("DMA average transfer", fmt_bytes(s["dma_transfer_average_bytes"])),
        ("Spilled", fmt_bytes(s["spill_bytes"])),
        ("Instructions", f"{s['instruction_count']:,}"),
        *(
            (f"{engine_label(e)} instructions", f"{s['instruction_count_by_engine'][e]:,}")
            for e in (*COMPUTE_ENGINES, "dma")
        ),
    ]
    bound = s["bound_by"]
    context = {
        "profile": profile,
        "s": s,
        "bound_label": engine_label(bound) if bound else "—",
        "busiest_label": engine_label(s["busiest"]) if s["busiest"] else "—",
        "saturated": SATURATED_PERCENT,
        "engines": engines,
        "queues": queues,
        "metrics": metrics,
        "lines": [(ln, _engine_breakdown(ln.engines)) for ln in lines[:top_lines]],
        "line_count": len(lines),
        "timeline": timeline,
        "timeline_json": _json_for_script(timeline),
        "meta": {
            k: (f"{v:.4g}" if isinstance(v, float) else v)
            for k, v in profile.meta.items()
            if isinstance(v, str | int | float | bool)
        },
    }
    return _environment().get_template("report.html.j2").render(**context)


def write_html(
    profile: Profile,
    path: str | Path,
    *,
    max_events: int = DEFAULT_MAX_EVENTS,
    bins: int = DEFAULT_BINS,
) -> Path:
    """Write the report to ``path``.

    Profiles with more than ``max_events`` instructions draw their timeline as at most
    ``bins`` bins per track.
    """
    path = Path(path)
    path.write_text(render_html(profile, max_events=max_events, bins=bins), encoding="utf-8")
    return path
