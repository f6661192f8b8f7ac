"""The compiled, scheduled kernel: per-engine instruction streams with times and dependencies.

A :class:`Program` is plain data: a table of static instructions (one per kind of lowered
op -- the steps of unrolled code share one: engine, opcode, bytes, FLOPs, source line) and
the dynamic instruction stream in numpy columns (static index, engine or DMA queue, start and
end in ns, partitions, HBM offset, dependency ids), so that millions of instructions take
tens of bytes each.  It round-trips through JSON and turns into the profiler's
:class:`~nkikit.profiler.Profile` with :meth:`Program.profile`, whose instructions are
made from the columns when read (the summary metrics never make them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from ..profiler.columns import UNKNOWN_SOURCE, Columns
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


def _ints(x) -> np.ndarray:
    """``x`` as an integer array, without a copy when it is one already (any width)."""
    a = np.asarray(x)
    return a if a.dtype.kind in "iu" else a.astype(np.int64)


class EngineNames(Sequence[str]):
    """Per instruction, the name of its engine or DMA queue (``"tensor"``, ``"dma3"``),
    kept as one byte of code each."""

    __slots__ = ("codes", "names")

    def __init__(self, codes: np.ndarray, names: Sequence[str]) -> None:
        self.codes = np.asarray(codes, dtype=np.int8)
        self.names = tuple(names)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.names[c] for c in self.codes[i].tolist()]
        return self.names[self.codes[i]]

    def __iter__(self) -> Iterator[str]:
        names = self.names
        return (names[c] for c in self.codes.tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    @classmethod
    def of(cls, names: Sequence[str]) -> EngineNames:
        table = {n: k for k, n in enumerate(dict.fromkeys(names))}
        return cls(np.fromiter(map(table.__getitem__, names), np.int8, len(names)), list(table))


class Deps(Sequence[tuple[int, ...]]):
    """Per instruction, the ids it depends on: ``ids[ptr[i]:ptr[i + 1]]`` as a tuple."""

    __slots__ = ("ptr", "ids")

    def __init__(self, ptr: np.ndarray, ids: np.ndarray) -> None:
        self.ptr = _ints(ptr)
        self.ids = _ints(ids)

    def __len__(self) -> int:
        return len(self.ptr) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return tuple(self.ids[self.ptr[i] : self.ptr[i + 1]].tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    @classmethod
    def of(cls, deps: Sequence[Sequence[int]]) -> Deps:
        ptr = np.zeros(len(deps) + 1, np.int64)
        np.cumsum([len(d) for d in deps], out=ptr[1:])
        ids = np.fromiter((x for d in deps for x in d), np.int64, int(ptr[-1]))
        return cls(ptr, ids)


@dataclass(slots=True)
class Program:
    """A scheduled kernel for one target.  Instruction ids are positions in program order.

    Per instruction: ``engine`` (names), ``sid`` (its row of ``infos``), ``start`` /
    ``end`` (ns), ``partitions``, ``hbm_offset`` (numpy arrays) and ``deps`` (tuples)."""

    kernel: str
    target: Target
    infos: list[InstrInfo]
    engine: EngineNames
    sid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    partitions: np.ndarray
    hbm_offset: np.ndarray
    deps: Deps
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # lists are accepted (JSON, hand-built programs); the columns are numpy arrays
        if not isinstance(self.engine, EngineNames):
            self.engine = EngineNames.of(list(self.engine))
        if not isinstance(self.deps, Deps):
            self.deps = Deps.of(list(self.deps))
        self.sid = _ints(self.sid)
        self.start = np.asarray(self.start, dtype=np.float64)
        self.end = np.asarray(self.end, dtype=np.float64)
        self.partitions = _ints(self.partitions)
        self.hbm_offset = _ints(self.hbm_offset)

    # -- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sid)

    @property
    def total_ns(self) -> float:
        if not len(self.sid):
            return 0.0
        return float(self.end.max() - self.start.min())

    @property
    def total_us(self) -> float:
        return self.total_ns / 1000.0

    def streams(self) -> dict[str, list[int]]:
        """Instruction ids per engine / DMA queue, in program order."""
        codes = self.engine.codes
        order = np.argsort(codes, kind="stable")
        cuts = np.flatnonzero(np.diff(codes[order])) + 1
        out = {}
        for ids in np.split(order, cuts) if len(order) else ():
            out[self.engine.names[codes[ids[0]]]] = ids.tolist()
        return dict(sorted(out.items(), key=lambda kv: kv[1][0]))

    def instruction(self, i: int, _cache: dict | None = None) -> Instruction:
        """Instruction ``i`` as the profiler's record."""
        sid = int(self.sid[i])
        info = self.infos[sid]
        parts = int(self.partitions[i])
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
            float(self.start[i]),
            float(self.end[i]),
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
            int(self.hbm_offset[i]),
        )
        if _PERMUTE is not None:
            return Instruction(*_PERMUTE(values))
        return Instruction(**{k: v for k, v in zip(_ORDER, values) if k in _INIT_FIELDS})

    def profile(self) -> Profile:
        """The profiler's view: every instruction with engine, opcode, times, bytes, FLOPs and
        source line.  Times start at 0.  The instructions are made when read; the summary
        metrics are computed from the columns directly."""
        meta = {
            k: v
            for k, v in self.meta.items()
            if k in ("allocation", "notes", "compile_s", "target_description")
        }
        return Profile(
            kernel=self.kernel,
            target=self.target.target_info(),
            instructions=ProgramInstructions(self),
            spill_bytes=self.spill_bytes(),
            meta=meta,
        )

    def spill_bytes(self) -> int:
        """HBM bytes the spill saves and reloads move (Neuron's spill_save_bytes +
        spill_reload_bytes): every execution of an instruction whose opcode says SPILL."""
        spill = np.array(["SPILL" in x.opcode for x in self.infos], bool)
        if not spill.any():
            return 0
        per_part = np.array(
            [
                (x.bytes["hbm_read_bytes"] + x.bytes["hbm_write_bytes"]) / max(x.partitions, 1)
                for x in self.infos
            ]
        )
        mine = spill[self.sid]
        return int(round(float((per_part[self.sid[mine]] * self.partitions[mine]).sum())))

    # -- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        streams: dict[str, dict[str, list]] = {}
        for e, ids in self.streams().items():
            idx = np.asarray(ids, dtype=np.int64)
            streams[e] = {
                "id": ids,
                "sid": self.sid[idx].tolist(),
                "start": self.start[idx].tolist(),
                "end": self.end[idx].tolist(),
                "partitions": self.partitions[idx].tolist(),
                "hbm_offset": self.hbm_offset[idx].tolist(),
                "deps": [list(self.deps[i]) for i in ids],
            }
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
        sid = np.zeros(n, np.int64)
        start = np.zeros(n, np.float64)
        end = np.zeros(n, np.float64)
        parts = np.zeros(n, np.int64)
        hoff = np.zeros(n, np.int64)
        deps: list[tuple[int, ...]] = [()] * n
        for e, s in d["streams"].items():
            ids = np.asarray(s["id"], dtype=np.int64)
            for i in s["id"]:
                engine[i] = e
            sid[ids] = s["sid"]
            start[ids] = s["start"]
            end[ids] = s["end"]
            parts[ids] = s["partitions"]
            hoff[ids] = s["hbm_offset"]
            for k, i in enumerate(s["id"]):
                deps[i] = tuple(s["deps"][k])
        infos = [InstrInfo(**x) for x in d["static"]]
        return cls(
            d["kernel"],
            get_target(d["target"]),
            infos,
            EngineNames.of(engine),
            sid,
            start,
            end,
            parts,
            hoff,
            Deps.of(deps),
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


class ProgramInstructions(Sequence[Instruction]):
    """A Program's instructions as the profiler's records, times from the first start,
    made when read (a million Instruction objects would take gigabytes).  ``columns()``
    gives the profiler its column view straight from the Program's arrays."""

    __slots__ = ("program", "t0", "_cache")

    def __init__(self, program: Program) -> None:
        self.program = program
        self.t0 = float(program.start.min()) if len(program) else 0.0
        self._cache: dict = {}

    def __len__(self) -> int:
        return len(self.program)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        ins = self.program.instruction(i % n, self._cache)
        ins.start_ns -= self.t0
        ins.end_ns -= self.t0
        return ins

    def __iter__(self) -> Iterator[Instruction]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def columns(self) -> Columns:
        """The :class:`~nkikit.profiler.columns.Columns` of these instructions, computed
        with numpy from the Program's columns and static table."""
        p = self.program
        infos = p.infos
        sid = p.sid
        parts = p.partitions
        start = p.start - self.t0
        end = p.end - self.t0
        # ids, counts and string codes in 32 bits (millions of instructions, a few hundred
        # distinct strings); bytes in 32 bits when every count fits, else 64
        ints: dict[str, np.ndarray] = {"id": np.arange(len(sid), dtype=np.int32)}
        ints.update(_byte_columns(infos, sid, parts))
        ints["partitions"] = parts.astype(np.int32, copy=False)
        ints["elements"] = np.array([x.elements for x in infos], np.int32)[sid]
        ints["hbm_offset"] = p.hbm_offset.astype(np.int64, copy=False)
        engine, engines = _first_seen(p.engine.codes.astype(np.int32), list(p.engine.names))
        opcode, opcodes = _by_sid(sid, [x.opcode for x in infos])
        source, sources = _by_sid(sid, [x.source or UNKNOWN_SOURCE for x in infos])
        # per line, the earliest instruction's non-empty text (as Columns.build keeps it)
        has_text = np.array([bool(x.text) for x in infos], bool)[sid]
        first = np.full(len(sources), len(sid), np.int64)
        np.minimum.at(first, source[has_text], np.flatnonzero(has_text))
        source_text = [infos[int(sid[i])].text if i < len(sid) else "" for i in first.tolist()]
        tensor, tensors = _by_sid(sid, [x.tensor_name for x in infos])
        dtype, dtypes = _by_sid(sid, [x.dtype for x in infos])
        return Columns(
            n=len(sid),
            start=start,
            end=end,
            dur=end - start,
            flops=np.array([x.flops for x in infos], np.float64)[sid],
            model_flops=np.array([x.model_flops for x in infos], np.float64)[sid],
            ints=ints,
            engine=engine,
            engines=engines,
            opcode=opcode,
            opcodes=opcodes,
            source=source,
            sources=sources,
            source_text=source_text,
            tensor=tensor,
            tensors=tensors,
            dtype=dtype,
            dtypes=dtypes,
        )


# The byte columns come from a table by (static row, partitions) when it has at most this
# many entries per instruction (a few hundred rows x 129 partition counts, usually).
_BYTE_TABLE_PER_INSTR = 1


def _byte_columns(
    infos: list[InstrInfo], sid: np.ndarray, parts: np.ndarray
) -> dict[str, np.ndarray]:
    """Per instruction, the bytes of each memory field: a DMA piece on fewer partitions than
    its static row gets its share, rounded as :meth:`Program.instruction` rounds it (half to
    even).  The bytes depend only on (row, partitions), so they are computed once per pair in
    a table and gathered, not per instruction in floats (this view's peak memory is the
    profile's at 10^6 instructions)."""
    info_parts = np.array([x.partitions for x in infos], np.float64)
    top = int(parts.max()) if len(parts) else 0
    width = top + 1
    if (
        len(parts)
        and int(parts.min()) >= 0
        and len(infos) * width <= max(_BYTE_TABLE_PER_INSTR * len(sid), 1 << 16)
    ):
        # scale[row, p] = p / partitions of the row (1 where the row has none), as below
        p = np.arange(width, dtype=np.float64)
        scale = np.where(
            info_parts[:, None] > 0,
            p[None, :] / np.where(info_parts > 0, info_parts, 1)[:, None],
            1.0,
        )
        index = sid.astype(np.int64) * width + parts
        out = {}
        for k in BYTE_FIELDS:
            table = np.array([x.bytes[k] for x in infos], np.float64)
            lut = np.rint(table[:, None] * scale).ravel()
            fits = not len(lut) or float(np.abs(lut).max()) < 2**31
            out[k] = lut.astype(np.int32 if fits else np.int64)[index]
        return out
    scale = np.where(info_parts[sid] > 0, parts / np.where(info_parts > 0, info_parts, 1)[sid], 1.0)
    out = {}
    for k in BYTE_FIELDS:
        table = np.array([x.bytes[k] for x in infos], np.float64)
        out[k] = np.rint(table[sid] * scale).astype(np.int64)
    return out


def _first_seen(codes: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Re-code ``codes`` (into ``names``) so that codes number names in order of first
    appearance, as :class:`~nkikit.profiler.columns.Columns` numbers its strings."""
    if not len(codes):
        return codes, []
    used, first = np.unique(codes, return_index=True)
    order = used[np.argsort(first, kind="stable")]
    remap = np.zeros(max(int(codes.max()) + 1, 1), np.int32)
    remap[order] = np.arange(len(order))
    return remap[codes], [names[c] for c in order.tolist()]


def _by_sid(sid: np.ndarray, per_sid: list[str]) -> tuple[np.ndarray, list[str]]:
    """Per instruction, the code of its static row's string, numbered in first-seen order."""
    table = {v: k for k, v in enumerate(dict.fromkeys(per_sid))}
    codes = np.array([table[v] for v in per_sid], np.int32)
    return _first_seen(codes[sid] if len(sid) else np.zeros(0, np.int32), list(table))


def _engine_order(e: str) -> tuple[int, int]:
    if e in COMPUTE_ENGINES:
        return (0, COMPUTE_ENGINES.index(e))
    if e.startswith("dma") and e[3:].isdigit():
        return (1, int(e[3:]))
    return (2, 0)
