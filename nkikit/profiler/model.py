"""The Profile data model: what the compiler's scheduler fills and every output reads.

Contract for producers (the scheduler):

* Times are nanoseconds on one clock shared by all engines. ``start_ns``/``end_ns`` of an
  instruction is the time its engine (or DMA queue) is *busy* with it; waiting on a
  semaphore is a gap between instructions, not part of one. The kernel's duration is the
  span from the earliest start to the latest end.
* Compute engines are in-order: instructions of one engine must not overlap in time
  (:meth:`Profile.validate` checks it). DMA queues may overlap.
* ``engine`` is one of :data:`COMPUTE_ENGINES` or a DMA queue ``"dma0"`` ..
  ``"dma{target.dma_queues - 1}"``.
* Opcodes are upper case; a TensorE opcode containing ``MATMUL`` is a matmul and one
  containing ``TRANSPOSE`` is a transpose (the metrics rely on both).

Everything in this package treats a Profile as immutable once built: the summary is
computed once and cached.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the engines and the target numbers live in a leaf module shared with nkikit.targets
from ..target_info import COMPUTE_ENGINES, TargetInfo

if TYPE_CHECKING:
    from .metrics import Analysis, LineStat

ENGINE_LABELS: dict[str, str] = {
    "tensor": "Tensor",
    "vector": "Vector",
    "scalar": "Scalar",
    "gpsimd": "GpSimd",
    "sync": "Sync",
}

FORMAT_NAME = "nkikit-profile"
FORMAT_VERSION = 1


def is_dma_engine(engine: str) -> bool:
    """True for a DMA queue name ``dma<N>``."""
    return engine.startswith("dma") and engine[3:].isdigit()


def engine_label(engine: str) -> str:
    """Human-readable track name: ``"Tensor"``, ``"DMA q3"``; unknown names pass through."""
    if is_dma_engine(engine):
        return f"DMA q{engine[3:]}"
    if engine == "dma":  # all queues together, as the summary's "dma" resource
        return "DMA"
    if engine == "latency":  # the summary's bound_by when no resource is saturated
        return "latency"
    return ENGINE_LABELS.get(engine, engine)


def engine_sort_key(engine: str) -> tuple[int, int, str]:
    """Sort key putting Tensor, Vector, Scalar, GpSimd, Sync, then DMA queues by number."""
    if engine in COMPUTE_ENGINES:
        return (0, COMPUTE_ENGINES.index(engine), engine)
    if is_dma_engine(engine):
        return (1, int(engine[3:]), engine)
    return (2, 0, engine)


@dataclass(slots=True)
class Instruction:
    """One scheduled instruction on one engine or DMA queue.

    Byte counts are what the instruction moves through each memory (a DMA load of N bytes
    from HBM into SBUF has ``hbm_read_bytes == sbuf_write_bytes == N``). ``flops`` is the
    work TensorE executes (``2*M*K*N`` for a matmul, also for a transpose done as a matmul
    against identity); ``model_flops`` is the useful part (0 for a transpose).

    For a DMA that reads or writes an HBM tensor, ``tensor_name`` names it and
    ``hbm_offset`` is the byte offset of the first byte touched; the input-reload warning
    treats two reads as the same data when tensor, offset, byte count and shape
    (``partitions`` x ``elements``) match.
    """

    id: int
    engine: str
    opcode: str
    start_ns: float
    end_ns: float
    source: str = ""
    source_text: str = ""
    flops: float = 0.0
    model_flops: float = 0.0
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    sbuf_read_bytes: int = 0
    sbuf_write_bytes: int = 0
    psum_read_bytes: int = 0
    psum_write_bytes: int = 0
    partitions: int = 0
    elements: int = 0
    dtype: str = ""
    deps: tuple[int, ...] = ()
    operands: str = ""
    tensor_name: str = ""
    hbm_offset: int = 0

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def is_dma(self) -> bool:
        return is_dma_engine(self.engine)

    @property
    def is_matmul(self) -> bool:
        return self.engine == "tensor" and "MATMUL" in self.opcode.upper()

    @property
    def is_transpose(self) -> bool:
        return self.engine == "tensor" and "TRANSPOSE" in self.opcode.upper()

    @property
    def transfer_bytes(self) -> int:
        """Bytes a DMA moves: the larger of what it reads and what it writes."""
        read = self.hbm_read_bytes + self.sbuf_read_bytes + self.psum_read_bytes
        write = self.hbm_write_bytes + self.sbuf_write_bytes + self.psum_write_bytes
        return max(read, write)


_INSTRUCTION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Instruction))


@dataclass(slots=True, repr=False)
class Profile:
    """A scheduled kernel: its instructions on a target, plus whatever the compiler adds.

    ``meta`` must hold JSON-serializable values only (it is written by :meth:`to_json`).
    """

    kernel: str
    target: TargetInfo
    instructions: list[Instruction] = field(default_factory=list)
    spill_bytes: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    _analysis: Analysis | None = field(default=None, init=False, compare=False)
    _summary: dict[str, Any] | None = field(default=None, init=False, compare=False)
    _lines: list[LineStat] | None = field(default=None, init=False, compare=False)

    # -- time ---------------------------------------------------------------------------

    @property
    def start_ns(self) -> float:
        """Earliest instruction start (0 for an empty profile)."""
        return self.analysis().start_ns

    @property
    def end_ns(self) -> float:
        """Latest instruction end (0 for an empty profile)."""
        return self.analysis().end_ns

    @property
    def total_ns(self) -> float:
        """Kernel duration: latest end minus earliest start."""
        return self.analysis().total_ns

    @property
    def total_us(self) -> float:
        return self.total_ns / 1000.0

    # -- metrics ------------------------------------------------------------------------

    def analysis(self) -> Analysis:
        """Column view and busy times shared by every output (computed once, cached)."""
        if self._analysis is None:
            from .metrics import analyze

            self._analysis = analyze(self)
        return self._analysis

    @property
    def summary(self) -> dict[str, Any]:
        """Neuron-Explorer-style summary metrics (see :mod:`nkikit.profiler.metrics`)."""
        if self._summary is None:
            from .metrics import compute_summary

            self._summary = compute_summary(self, self.analysis())
        return self._summary

    @property
    def bound_by(self) -> str | None:
        """The saturated engine (or ``"dma"``), ``"latency"`` when none is; None when empty."""
        return self.summary["bound_by"]

    @property
    def warnings(self) -> list[dict[str, Any]]:
        return self.summary["warnings"]

    def per_line(self) -> list[LineStat]:
        """Engine time per source line, hottest first (see :func:`metrics.per_line`)."""
        if self._lines is None:
            from .metrics import per_line

            self._lines = per_line(self, self.analysis())
        return self._lines

    def validate(self) -> None:
        """Raise ValueError listing every way the instructions break the producer contract."""
        from .metrics import validate_profile

        problems = validate_profile(self)
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise ValueError(f"invalid profile for {self.kernel!r}:\n  {shown}{more}")

    # -- outputs ------------------------------------------------------------------------

    def to_perfetto(self, path: str | Path, *, flows: bool | None = None) -> Path:
        """Write Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing)."""
        from .perfetto import write_perfetto

        return write_perfetto(self, path, flows=flows)

    def to_html(self, path: str | Path, *, max_events: int | None = None) -> Path:
        """Write a self-contained HTML report (no network resources)."""
        from .html import write_html

        if max_events is None:
            return write_html(self, path)
        return write_html(self, path, max_events=max_events)

    def table(self) -> Any:
        """A rich renderable with the terminal summary (``rich.print(profile.table())``)."""
        from .terminal import summary_renderable

        return summary_renderable(self)

    def __rich__(self) -> Any:
        return self.table()

    def __str__(self) -> str:
        from .terminal import summary_text

        return summary_text(self)

    def __repr__(self) -> str:
        return (
            f"Profile(kernel={self.kernel!r}, target={self.target.name!r}, "
            f"instructions={len(self.instructions)}, total_us={self.total_us:.3f})"
        )

    # -- serialization ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; instructions are stored column names + rows to stay compact."""
        # json writes tuples (deps too) as arrays, so the getter's tuples are rows as they are.
        rows = list(map(attrgetter(*_INSTRUCTION_FIELDS), self.instructions))
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kernel": self.kernel,
            "target": self.target.to_dict(),
            "spill_bytes": self.spill_bytes,
            "meta": self.meta,
            "instructions": {"fields": list(_INSTRUCTION_FIELDS), "rows": rows},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """Inverse of :meth:`to_dict`; unknown instruction fields are ignored."""
        if d.get("format") != FORMAT_NAME:
            raise ValueError(f"not an nkikit profile (format={d.get('format')!r})")
        if d.get("version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"profile format version {d['version']} is newer than this nkikit "
                f"understands ({FORMAT_VERSION}); upgrade nkikit"
            )
        table = d["instructions"]
        names = list(table["fields"])
        deps_at = names.index("deps") if "deps" in names else -1
        if names == list(_INSTRUCTION_FIELDS):  # same version wrote it: positional is fastest
            instructions = []
            for row in table["rows"]:
                ins = Instruction(*row)
                ins.deps = tuple(ins.deps)
                instructions.append(ins)
        else:
            known = [(k, name) for k, name in enumerate(names) if name in _INSTRUCTION_FIELDS]
            instructions = []
            for row in table["rows"]:
                kwargs = {name: row[k] for k, name in known}
                if deps_at >= 0:
                    kwargs["deps"] = tuple(kwargs["deps"])
                instructions.append(Instruction(**kwargs))
        return cls(
            kernel=d["kernel"],
            target=TargetInfo.from_dict(d["target"]),
            instructions=instructions,
            spill_bytes=int(d.get("spill_bytes", 0)),
            meta=dict(d.get("meta", {})),
        )

    def to_json(self, path: str | Path) -> Path:
        """Write the profile as JSON; :meth:`from_json` reads it back equal."""
        path = Path(path)
        with path.open("w", encoding="utf-8") as f:
            # dumps, not dump: only the one-shot encoder runs in C (10x faster on big profiles).
            f.write(json.dumps(self.to_dict(), separators=(",", ":")))
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> Profile:
        with Path(path).open(encoding="utf-8") as f:
            return cls.from_dict(json.load(f))
