"""What an autotuning search found: every config's outcome, the winner, the winner's profile.

A :class:`TuneReport` renders as a rich table (``rich.print(report)``, or ``str(report)`` for
plain text): one row per config, fastest first, then the configs that were pruned (with the
hardware rule that pruned them), failed or computed wrong numbers; then the winner's profile
summary.  ``to_json`` / ``from_json`` are what the disk cache stores (the profile is not stored:
a report read back models its winner again when ``profile`` is first asked for).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..profiler.model import Profile


@dataclass
class Candidate:
    """One config's outcome.  ``status``: ``ok`` (``total_us`` is its modeled time),
    ``pruned`` (``rule`` is the NKI error name, or ``prune_configs_by``; ``detail`` where),
    ``error`` (``rule`` is the exception type, ``detail`` its message) or ``wrong`` (it ran,
    but its outputs did not match the reference; ``detail`` says how)."""

    index: int
    config: dict[str, Any]
    status: str
    total_us: float | None = None
    rule: str | None = None
    detail: str | None = None
    stage: str | None = None
    checked: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TuneReport:
    """The outcome of tuning one kernel for one key: ``candidates`` (one per config, in the
    order given), ``best_index`` (the winner's), ``cached`` (read from the disk cache)."""

    def __init__(
        self,
        kernel: str,
        key: dict[str, Any],
        candidates: list[Candidate],
        best_index: int,
        profile: Profile | Callable[[dict[str, Any]], Profile] | None = None,
        cached: bool = False,
    ) -> None:
        self.kernel, self.key, self.candidates = kernel, key, candidates
        self.best_index, self.cached = best_index, cached
        self._profile = profile if isinstance(profile, Profile) else None
        self._modeler = None if isinstance(profile, Profile) else profile

    @property
    def winner(self) -> Candidate:
        return next(c for c in self.candidates if c.index == self.best_index)

    @property
    def best(self) -> dict[str, Any]:
        """The winning config."""
        return self.winner.config

    @property
    def baseline(self) -> Candidate | None:
        """The first config that ran: what speedups are measured against (list the kernel's
        hand-tuned values, or ``{}`` for its defaults, first)."""
        return next((c for c in self.candidates if c.status in ("ok", "wrong")), None)

    @property
    def speedup(self) -> float:
        """Modeled time of the baseline over the winner's (1.0 when the baseline won)."""
        base = self.baseline
        if base is None or base.total_us is None or not self.winner.total_us:
            return 1.0
        return base.total_us / self.winner.total_us

    @property
    def pruned(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "pruned"]

    @property
    def profile(self) -> Profile:
        """The winner's modeled profile (modeled again if this report came from the cache)."""
        if self._profile is None:
            if self._modeler is None:
                raise ValueError("this report has no way to model its winner")
            self._profile = self._modeler(self.best)
        return self._profile

    # -- rendering ----------------------------------------------------------------------------
    def table(self) -> Any:
        """A rich table of every config, fastest first."""
        from rich.table import Table

        where = ", ".join(f"{k}={_short(v)}" for k, v in self.key["args"].items())
        title = f"nki.autotune {self.kernel} on {self.key['target']} ({where})"
        if self.cached:
            title += " [cached]"
        t = Table(title=title, title_justify="left")
        for col, justify in (("#", "right"), ("config", "left"), ("status", "left")):
            t.add_column(col, justify=justify)
        t.add_column("modeled µs", justify="right")
        t.add_column("vs baseline", justify="right")
        t.add_column("rule / note", justify="left")
        base = self.baseline
        order = {"ok": 0, "wrong": 1, "error": 2, "pruned": 3}
        rows = sorted(
            self.candidates,
            key=lambda c: (order[c.status], c.total_us if c.total_us is not None else 0, c.index),
        )
        for c in rows:
            mark = "★ " if c.index == self.best_index else ""
            us = f"{c.total_us:.2f}" if c.total_us is not None else "-"
            vs = (
                f"{base.total_us / c.total_us:.2f}×"
                if base is not None and base.total_us and c.total_us
                else "-"
            )
            note = c.rule or ""
            if c.detail:
                note = f"{note} {c.detail}".strip()
            if c.checked:
                note = "matches the reference"
            t.add_row(str(c.index), mark + _config_text(c.config), c.status, us, vs, note)
        return t

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        return Group(self.table(), Text(f"winner: {_config_text(self.best)}"), self.profile.table())

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=110, record=True, file=io.StringIO(), color_system=None)
        console.print(self.table())
        console.print(f"winner: {_config_text(self.best)} ({self.speedup:.2f}× the baseline)")
        return console.export_text() + str(self.profile)

    # -- serialization ------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "key": self.key,
            "candidates": [c.to_json() for c in self.candidates],
            "best_index": self.best_index,
        }

    @classmethod
    def from_json(
        cls, d: dict[str, Any], modeler: Callable[[dict[str, Any]], Profile] | None = None
    ) -> TuneReport | None:
        """A report read from the cache; None if ``d`` is not one (a damaged entry)."""
        try:
            cands = [Candidate(**c) for c in d["candidates"]]
            report = cls(d["kernel"], d["key"], cands, int(d["best_index"]), modeler, cached=True)
            report.winner  # noqa: B018 - raises StopIteration if best_index names no candidate
            return report
        except (KeyError, TypeError, ValueError, StopIteration):
            return None


def _short(v: Any) -> str:
    if isinstance(v, dict) and "shape" in v:
        return f"{'x'.join(map(str, v['shape']))}:{v['dtype']}"
    return repr(v)


def _config_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in config.items()) or "(defaults)"
