"""Human-readable numbers shared by warnings, the terminal table and the HTML report."""

from __future__ import annotations


def fmt_ns(ns: float) -> str:
    """``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``: three significant figures."""
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns" if a >= 10 or ns == 0 else f"{ns:.2g} ns"
    if a < 1e6:
        return f"{_sig3(ns / 1e3)} µs"
    if a < 1e9:
        return f"{_sig3(ns / 1e6)} ms"
    return f"{_sig3(ns / 1e9)} s"


def fmt_bytes(n: float) -> str:
    """``512 B``, ``2.0 KiB``, ``1.5 MiB``, ``3.2 GiB``."""
    a = abs(n)
    if a < 1024:
        return f"{n:.0f} B"
    for unit, scale in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3)):
        if a < scale * 1024 or unit == "GiB":
            return f"{n / scale:.1f} {unit}"
    raise AssertionError("unreachable")


def fmt_percent(p: float) -> str:
    """A percentage already scaled to 0..100: ``87.3%``, ``0.04%``."""
    if p != 0 and abs(p) < 0.1:
        return f"{p:.2f}%"
    return f"{p:.1f}%"


def fmt_flops(f: float) -> str:
    """``1.2 TFLOP``, ``340 MFLOP`` (an amount, not a rate)."""
    a = abs(f)
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if a >= scale:
            return f"{_sig3(f / scale)} {unit}"
    return f"{f:.0f} FLOP"


def fmt_rate(bytes_per_s: float) -> str:
    """``362 GB/s`` (decimal units, as bandwidth is quoted)."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(bytes_per_s) >= scale:
            return f"{_sig3(bytes_per_s / scale)} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _sig3(x: float) -> str:
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"
