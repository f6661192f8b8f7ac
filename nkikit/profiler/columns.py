"""Column (numpy) view of a Profile's instructions, so metrics scale to 10^5-10^6 of them.

The data model stays a list of :class:`~nkikit.profiler.model.Instruction` objects, which is
what a scheduler naturally produces; every aggregate (summary, warnings, per-line times,
timeline bins) is computed from this view instead, once per Profile.
Strings become integer codes into a table in first-seen order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from .model import is_dma_engine

if TYPE_CHECKING:
    from .model import Instruction

UNKNOWN_SOURCE = "<unknown>"

_FLOAT_FIELDS = ("start_ns", "end_ns", "flops", "model_flops")
_INT_FIELDS = (
    "id",
    "hbm_read_bytes",
    "hbm_write_bytes",
    "sbuf_read_bytes",
    "sbuf_write_bytes",
    "psum_read_bytes",
    "psum_write_bytes",
    "partitions",
    "elements",
    "hbm_offset",
)


def _numeric(
    instructions: list[Instruction], names: tuple[str, ...], dtype: type
) -> dict[str, np.ndarray]:
    # One pass over the objects for all fields is the cheapest way out of Python objects.
    flat = chain.from_iterable(map(attrgetter(*names), instructions))
    table = np.fromiter(flat, dtype=dtype, count=len(instructions) * len(names))
    table = table.reshape(len(instructions), len(names))
    return {name: np.ascontiguousarray(table[:, k]) for k, name in enumerate(names)}


def _encode(values: list[str]) -> tuple[np.ndarray, list[str]]:
    table = {v: k for k, v in enumerate(dict.fromkeys(values))}
    codes = np.fromiter(map(table.__getitem__, values), dtype=np.int64, count=len(values))
    return codes, list(table)


@dataclass(slots=True)
class Columns:
    """One numpy array per instruction field; string fields as codes plus a table.

    ``sources`` maps an empty source to ``"<unknown>"``; ``source_text[k]`` is the first
    non-empty text seen for ``sources[k]``.
    """

    n: int
    start: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    flops: np.ndarray
    model_flops: np.ndarray
    ints: dict[str, np.ndarray]
    engine: np.ndarray
    engines: list[str]
    opcode: np.ndarray
    opcodes: list[str]
    source: np.ndarray
    sources: list[str]
    source_text: list[str]
    tensor: np.ndarray
    tensors: list[str]
    dtype: np.ndarray
    dtypes: list[str]
    memo: dict = field(default_factory=dict)  # aggregates computed once (see metrics)

    @classmethod
    def build(cls, instructions: list[Instruction]) -> Columns:
        """The columns of ``instructions``.  A sequence that can make its own (``columns()``:
        the compiler's instructions, which live in columns already) is asked to, so the
        summary of a million instructions never makes a million objects."""
        own = getattr(instructions, "columns", None)
        if callable(own):
            return own()
        n = len(instructions)
        floats = _numeric(instructions, _FLOAT_FIELDS, np.float64)
        ints = _numeric(instructions, _INT_FIELDS, np.int64)
        engine, engines = _encode(list(map(attrgetter("engine"), instructions)))
        opcode, opcodes = _encode(list(map(attrgetter("opcode"), instructions)))
        src_values = [s or UNKNOWN_SOURCE for s in map(attrgetter("source"), instructions)]
        source, sources = _encode(src_values)
        tensor, tensors = _encode(list(map(attrgetter("tensor_name"), instructions)))
        dtype, dtypes = _encode(list(map(attrgetter("dtype"), instructions)))
        # Walking backwards lets the earliest non-empty text win.
        text: dict[str, str] = {}
        for src, t in zip(
            reversed(src_values), reversed(list(map(attrgetter("source_text"), instructions)))
        ):
            if t:
                text[src] = t
        return cls(
            n=n,
            start=floats["start_ns"],
            end=floats["end_ns"],
            dur=floats["end_ns"] - floats["start_ns"],
            flops=floats["flops"],
            model_flops=floats["model_flops"],
            ints=ints,
            engine=engine,
            engines=engines,
            opcode=opcode,
            opcodes=opcodes,
            source=source,
            sources=sources,
            source_text=[text.get(s, "") for s in sources],
            tensor=tensor,
            tensors=tensors,
            dtype=dtype,
            dtypes=dtypes,
        )

    # -- masks ----------------------------------------------------------------------------

    def on(self, engine: str) -> np.ndarray:
        """Boolean mask of instructions on ``engine``; ``"dma"`` means every DMA queue."""
        if engine == "dma":
            is_dma = np.array([is_dma_engine(e) for e in self.engines], dtype=bool)
            return is_dma[self.engine] if self.n else np.zeros(0, dtype=bool)
        if engine not in self.engines:
            return np.zeros(self.n, dtype=bool)
        return self.engine == self.engines.index(engine)

    def opcode_contains(self, word: str) -> np.ndarray:
        """Mask of instructions whose upper-cased opcode contains ``word``."""
        hit = np.array([word in op.upper() for op in self.opcodes], dtype=bool)
        return hit[self.opcode] if self.n else np.zeros(0, dtype=bool)

    def matmul_mask(self) -> np.ndarray:
        """TensorE matmuls (transposes excluded), as :attr:`Instruction.is_matmul` defines."""
        return (
            self.on("tensor") & self.opcode_contains("MATMUL") & ~self.opcode_contains("TRANSPOSE")
        )

    def transpose_mask(self) -> np.ndarray:
        return self.on("tensor") & self.opcode_contains("TRANSPOSE")

    def transfer_bytes(self) -> np.ndarray:
        """Per instruction: the larger of bytes read and bytes written (DMA size)."""
        i = self.ints
        read = i["hbm_read_bytes"] + i["sbuf_read_bytes"] + i["psum_read_bytes"]
        write = i["hbm_write_bytes"] + i["sbuf_write_bytes"] + i["psum_write_bytes"]
        return np.maximum(read, write)

    # -- aggregates -----------------------------------------------------------------------

    def per_source(
        self, mask: np.ndarray | None = None, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """Sum of ``weights`` (or counts) per source line over ``mask``, largest first.

        Ties are broken by line name so the order is deterministic.
        """
        src = self.source if mask is None else self.source[mask]
        w = None if weights is None else (weights if mask is None else weights[mask])
        sums = np.bincount(src, weights=w, minlength=len(self.sources))
        keep = np.flatnonzero(sums > 0)
        pairs = [(self.sources[k], float(sums[k])) for k in keep]
        pairs.sort(key=lambda kv: (-kv[1], kv[0]))
        return dict(pairs)


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint union of half-open intervals ``[starts[k], ends[k])``.

    Empty intervals are dropped; touching ones merge.
    """
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    first = np.empty(s.size, dtype=bool)
    first[0] = True
    first[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    lasts = np.append(heads[1:] - 1, s.size - 1)
    return s[heads], reach[lasts]


def union_ns(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of half-open intervals."""
    s, e = merge_intervals(starts, ends)
    return float((e - s).sum())
