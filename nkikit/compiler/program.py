"""The compiled, scheduled kernel: per-engine instruction streams with times and dependencies.

A :class:`Program` is plain data: a table of static instructions (one per IR op: engine,
opcode, bytes, FLOPs, source line) and the dynamic instruction stream in columns (static
index, engine or DMA queue, start and end in ns, partitions, HBM offset, dependency ids).
It round-trips through JSON and turns into the profiler's
:class:`~nkikit.profiler.Profile` with :meth:`Program.profile`.
"""

from __future__ import annotations

import gc
import json
from dataclasses import asdict, dataclass, field, fields
from operator import itemgetter
from pathlib import Path
from typing import Any

from ..profiler.model import COMPUTE_ENGINES, Instruction, Profile
from ..targets import Target, get_target

FORMAT_NAME = "nkikit-program"
FORMAT_VERSION = 1

# The profiler's Instruction takes 22 fields; building a million of them by keyword costs
# 4x more than positionally, so values are produced in this order and permuted once.
_ORDER = (
    "id",
    "engine",
    "opcode",
    "start_ns",
    "end_ns",
    "source",
    "source_text",
    "flops",
    "model_flops",
    "hbm_read_bytes",
    "hbm_write_bytes",
    "sbuf_read_bytes",
    "sbuf_write_bytes",
    "psum_read_bytes",
    "psum_write_bytes",
    "partitions",
    "elements",
    "dtype",
    "deps",
    "operands",
    "tensor_name",
    "hbm_offset",
)
_INIT_FIELDS = tuple(f.name for f in fields(Instruction) if f.init)
_PERMUTE = (
    itemgetter(*(_ORDER.index(f) for f in _INIT_FIELDS))
    if set(_INIT_FIELDS) <= set(_ORDER)
    else None
)

BYTE_FIELDS = (
    "hbm_read_bytes",
    "hbm_write_bytes",
    "sbuf_read_bytes",
    "sbuf_write_bytes",
    "psum_read_bytes",
    "psum_write_bytes",
)


@dataclass(slots=True)
class InstrInfo:
    """What every dynamic instance of one static instruction shares.

    ``engine`` is a compute engine name or ``"dma"``; byte counts are for all
    ``partitions`` (a DMA piece on fewer partitions gets its share).
    """

    engine: str
    opcode: str
    partitions: int
    elements: int
    bytes: dict[str, int]
    flops: float
    model_flops: float
    dtype: str
    source: str
    text: str
    operands: str
    tensor_name: str = ""
    cycles: float = 0.0
    duration_ns: float = 0.0


@dataclass(slots=True)
class Program:
    """A scheduled kernel for one target.  Instruction ids are positions in program order."""

    kernel: str
    target: Target
    infos: list[InstrInfo]
    engine: list[str]  # per instruction: "tensor" ... or "dma<q>"
    sid: list[int]
    start: list[float]
    end: list[float]
    partitions: list[int]
    hbm_offset: list[int]
    deps: list[tuple[int, ...]]
    meta: dict[str, Any] = field(default_factory=dict)

    # -- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sid)

    @property
    def total_ns(self) -> float:
        if not self.sid:
            return 0.0
        return max(self.end) - min(self.start)

    @property
    def total_us(self) -> float:
        return self.total_ns / 1000.0

    def streams(self) -> dict[str, list[int]]:
        """Instruction ids per engine / DMA queue, in program order."""
        out: dict[str, list[int]] = {}
        for i, e in enumerate(self.engine):
            out.setdefault(e, []).append(i)
        return out

    def instruction(self, i: int, _cache: dict | None = None) -> Instruction:
        """Instruction ``i`` as the profiler's record."""
        sid = self.sid[i]
        info = self.infos[sid]
        parts = self.partitions[i]
        key = (sid, parts)
        by = _cache.get(key) if _cache is not None else None
        if by is None:
            scale = parts / info.partitions if info.partitions else 1.0
            by = tuple(int(round(info.bytes[k] * scale)) for k in BYTE_FIELDS)
            if _cache is not None:
                _cache[key] = by
        values = (
            i,
            self.engine[i],
            info.opcode,
            self.start[i],
            self.end[i],
            info.source,
            info.text,
            info.flops,
            info.model_flops,
            *by,
            parts,
            info.elements,
            info.dtype,
            self.deps[i],
            info.operands,
            info.tensor_name,
            self.hbm_offset[i],
        )
        if _PERMUTE is not None:
            return Instruction(*_PERMUTE(values))
        return Instruction(**{k: v for k, v in zip(_ORDER, values) if k in _INIT_FIELDS})

    def profile(self) -> Profile:
        """The profiler's view: every instruction with engine, opcode, times, bytes, FLOPs and
        source line.  Times start at 0."""
        t0 = min(self.start) if self.start else 0.0
        cache: dict = {}
        enabled = gc.isenabled()
        gc.disable()  # a million young objects otherwise trigger repeated full collections
        try:
            instrs = [self.instruction(i, cache) for i in range(len(self.sid))]
        finally:
            if enabled:
                gc.enable()
        if t0:
            for ins in instrs:
                ins.start_ns -= t0
                ins.end_ns -= t0
        meta = {
            k: v
            for k, v in self.meta.items()
            if k in ("allocation", "notes", "compile_s", "target_description")
        }
        return Profile(
            kernel=self.kernel, target=self.target.target_info(), instructions=instrs, meta=meta
        )

    # -- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        streams: dict[str, dict[str, list]] = {}
        for i, e in enumerate(self.engine):
            s = streams.get(e)
            if s is None:
                s = streams[e] = {
                    k: [] for k in ("id", "sid", "start", "end", "partitions", "hbm_offset", "deps")
                }
            s["id"].append(i)
            s["sid"].append(self.sid[i])
            s["start"].append(self.start[i])
            s["end"].append(self.end[i])
            s["partitions"].append(self.partitions[i])
            s["hbm_offset"].append(self.hbm_offset[i])
            s["deps"].append(list(self.deps[i]))
        order = sorted(streams, key=_engine_order)
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kernel": self.kernel,
            "target": self.target.name,
            "instructions": len(self.sid),
            "static": [asdict(x) for x in self.infos],
            "streams": {e: streams[e] for e in order},
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Program:
        if d.get("format") != FORMAT_NAME:
            raise ValueError(f"not an nkikit program (format={d.get('format')!r})")
        if d.get("version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"program format version {d['version']} is newer than this nkikit understands"
            )
        n = int(d["instructions"])
        engine = [""] * n
        sid = [0] * n
        start = [0.0] * n
        end = [0.0] * n
        parts = [0] * n
        hoff = [0] * n
        deps: list[tuple[int, ...]] = [()] * n
        for e, s in d["streams"].items():
            for k, i in enumerate(s["id"]):
                engine[i] = e
                sid[i] = s["sid"][k]
                start[i] = float(s["start"][k])
                end[i] = float(s["end"][k])
                parts[i] = s["partitions"][k]
                hoff[i] = s["hbm_offset"][k]
                deps[i] = tuple(s["deps"][k])
        infos = [InstrInfo(**x) for x in d["static"]]
        return cls(
            d["kernel"],
            get_target(d["target"]),
            infos,
            engine,
            sid,
            start,
            end,
            parts,
            hoff,
            deps,
            dict(d.get("meta", {})),
        )

    def to_json(self, path: str | Path | None = None) -> str | Path:
        """The program as JSON text, or written to ``path`` (then the path is returned)."""
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is None:
            return text
        p = Path(path)
        p.write_text(text, encoding="utf-8")
        return p

    @classmethod
    def from_json(cls, source: str | Path) -> Program:
        """Read a program from JSON text or a file written by :meth:`to_json`."""
        if isinstance(source, Path) or (
            isinstance(source, str) and not source.lstrip().startswith("{")
        ):
            source = Path(source).read_text(encoding="utf-8")
        return cls.from_dict(json.loads(source))

    def __repr__(self) -> str:
        return f"Program(kernel={self.kernel!r}, target={self.target.name!r}, instructions={len(self)}, total_us={self.total_us:.3f})"


def _engine_order(e: str) -> tuple[int, int]:
    if e in COMPUTE_ENGINES:
        return (0, COMPUTE_ENGINES.index(e))
    if e.startswith("dma") and e[3:].isdigit():
        return (1, int(e[3:]))
    return (2, 0)
