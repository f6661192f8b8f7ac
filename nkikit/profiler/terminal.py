"""Compact terminal summary of a Profile with rich: headline, engines, top lines, warnings."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from .model import COMPUTE_ENGINES, engine_label
from .units import fmt_bytes, fmt_ns, fmt_percent

if TYPE_CHECKING:
    from .model import Profile

TOP_LINES = 5
BAR_WIDTH = 20


def _bar(p: float) -> str:
    filled = round(BAR_WIDTH * min(max(p, 0.0), 100.0) / 100.0)
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def summary_renderable(profile: Profile) -> Any:
    """A rich Group: headline, a metrics+engines table, hottest lines, warnings."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    s = profile.summary
    bound = s["bound_by"]
    bound_label = engine_label(bound) if bound else "—"
    head = Text.assemble(
        (profile.kernel, "bold"),
        f" on {profile.target.name}: ",
        (fmt_ns(s["total_ns"]), "bold cyan"),
        f" · {s['instruction_count']:,} instructions · bound by ",
        (bound_label, "bold"),
    )

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("engine")
    t.add_column("active", justify="right")
    t.add_column("", no_wrap=True)
    metrics = [
        ("MFU", fmt_percent(s["mfu_percent"])),
        ("HFU", fmt_percent(s["hfu_percent"])),
        ("MBU", fmt_percent(s["mbu_percent"])),
        ("HBM read", fmt_bytes(s["hbm_read_bytes"])),
        ("HBM write", fmt_bytes(s["hbm_write_bytes"])),
        ("DMA transfers", f"{s['dma_transfer_count']:,}"),
        ("avg transfer", fmt_bytes(s["dma_transfer_average_bytes"])),
    ]
    engines = [(engine_label(e), s["engine_active_percent"][e]) for e in COMPUTE_ENGINES]
    engines.append(("DMA", s["dma_active_percent"]))
    for k in range(max(len(metrics), len(engines))):
        m = metrics[k] if k < len(metrics) else ("", "")
        e = engines[k] if k < len(engines) else None
        t.add_row(
            m[0], m[1], e[0] if e else "", fmt_percent(e[1]) if e else "", _bar(e[1]) if e else ""
        )

    parts: list[Any] = [head, t]
    lines = profile.per_line()[:TOP_LINES]
    if lines:
        lt = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")
        lt.add_column("line", no_wrap=True)
        lt.add_column("code", overflow="ellipsis", no_wrap=True, max_width=48)
        lt.add_column("time", justify="right")
        lt.add_column("share", justify="right")
        for ln in lines:
            # Text(), not str: kernel code like "a[i]" must not be read as rich markup.
            lt.add_row(
                Text(ln.source), Text(ln.code), fmt_ns(ln.time_ns), fmt_percent(100 * ln.share)
            )
        parts.append(lt)
    for w in s["warnings"]:
        parts.append(Text.assemble(("⚠ " + w["name"], "bold yellow"), ": ", w["message"]))
    if not s["warnings"]:
        parts.append(Text("no warnings", style="green"))
    return Group(*parts)


def summary_text(profile: Profile, width: int = 100) -> str:
    """The summary as plain text (no colours), as ``str(profile)`` returns it."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, highlight=False
    )
    console.print(summary_renderable(profile))
    return buf.getvalue().rstrip() + "\n"
