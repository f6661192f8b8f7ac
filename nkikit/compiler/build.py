"""The compiler pipeline on IR: allocate -> lower -> schedule -> Program."""

from __future__ import annotations

import time

from ..ir.core import Kernel
from ..targets import Target, get_target
from .allocate import allocate
from .lower import DMA, ENGINES, count_instructions, lower
from .program import InstrInfo, Program
from .schedule import schedule

MAX_INSTRUCTIONS = 20_000_000


def build_program(
    kernel: Kernel, target: str | Target | None = None, *, max_instructions: int = MAX_INSTRUCTIONS
) -> Program:
    """Compile a traced, verified kernel for ``target`` (default: see ``default_target_name``).

    Kernels that would execute more than ``max_instructions`` instructions (DMA pieces
    included) are refused before scheduling, with the count; the real compiler refuses such
    kernels too ("Too many instructions", usually from tiny DMA tiles).
    """
    t0 = time.perf_counter()
    tgt = get_target(target)
    alloc = allocate(kernel, tgt)
    lk = lower(kernel, tgt, alloc)
    n = count_instructions(lk.steps, tgt)
    if n > max_instructions:
        raise ValueError(
            f"{kernel.name}: {n:,} instructions to schedule, more than max_instructions="
            f"{max_instructions:,}; use larger tiles (especially for DMA) or pass a higher limit"
        )
    tr = schedule(lk)
    # one static row per instruction kind (the ops lowered alike: unrolled steps share one)
    infos = [
        InstrInfo(
            engine="dma" if k.engine == DMA else ENGINES[k.engine],
            opcode=k.opcode,
            partitions=k.partitions,
            elements=k.elements,
            bytes=dict(k.bytes),
            flops=k.flops,
            model_flops=k.model_flops,
            dtype=k.dtype,
            source=k.source,
            text=k.text,
            operands=k.operands,
            tensor_name=k.tensor_name,
            cycles=k.cycles,
            duration_ns=k.duration_ns,
        )
        for k in lk.kinds
    ]
    names = list(ENGINES) + [f"dma{q}" for q in range(tgt.dma_queues)]
    engine = [names[e] for e in tr.engine]
    meta = {
        "allocation": [p.to_dict() for p in alloc.placements.values()],
        "allocation_mode": alloc.mode,
        "sbuf_bytes_used": alloc.used.get("sbuf", 0),
        "psum_bytes_used": alloc.used.get("psum", 0),
        "notes": list(lk.notes),
        "target_description": tgt.description,
        "compile_s": time.perf_counter() - t0,
    }
    return Program(
        kernel.name,
        tgt,
        infos,
        engine,
        tr.sid,
        tr.start,
        tr.end,
        tr.parts,
        tr.hbm_offset,
        tr.deps,
        meta,
    )
