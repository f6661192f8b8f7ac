"""The compiler pipeline on IR: allocate -> lower -> schedule -> Program."""

from __future__ import annotations

import time

import numpy as np

from ..collector import gc_paused
from ..ir.core import Kernel
from ..ir.unrolled import unroll
from ..targets import Target, get_target
from .allocate import allocate
from .lower import DMA, ENGINES, count_instructions, lower
from .program import Deps, EngineNames, InstrInfo, Program
from .schedule import schedule

__all__ = ["MAX_INSTRUCTIONS", "build_program", "gc_paused"]

MAX_INSTRUCTIONS = 20_000_000  # below 2^31: the schedule's columns are 32-bit


def build_program(
    kernel: Kernel,
    target: str | Target | None = None,
    *,
    max_instructions: int = MAX_INSTRUCTIONS,
    rotation: bool = True,
) -> Program:
    """Compile a traced, verified kernel for ``target`` (default: see ``default_target_name``).

    Kernels that would execute more than ``max_instructions`` instructions (DMA pieces
    included) are refused before scheduling, with the count; the real compiler refuses such
    kernels too ("Too many instructions", usually from tiny DMA tiles).  ``rotation=False``
    turns address rotation of unrolled allocations off (see :mod:`.allocate`).
    """
    t0 = time.perf_counter()
    tgt = get_target(target)
    with gc_paused():
        kernel = unroll(kernel)  # the compiler places and schedules the steps themselves
        alloc = allocate(kernel, tgt, rotation=rotation)
        lk = lower(kernel, tgt, alloc)
        n = count_instructions(lk.steps, tgt)
        if n > max_instructions:
            raise ValueError(
                f"{kernel.name}: {n:,} instructions to schedule, more than max_instructions="
                f"{max_instructions:,}; use larger tiles (especially for DMA) or pass a higher "
                "limit"
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
    engine = EngineNames(np.frombuffer(tr.engine, np.int8), names)
    meta = {
        # one entry per placement: the tensors of a rotation group share theirs
        "allocation": [p.to_dict() for p in alloc.groups()],
        "allocation_mode": alloc.mode,
        "address_rotation": alloc.rotation,
        "spills": [
            {"tensor": sp.tensor.name, "after": sp.save_after, "before": sp.reload_before}
            for sp in alloc.spills
        ],
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
        np.frombuffer(tr.sid, np.int32),
        np.frombuffer(tr.start, np.float64),
        np.frombuffer(tr.end, np.float64),
        np.frombuffer(tr.parts, np.int32),
        np.frombuffer(tr.hbm_offset, np.int64),
        Deps(np.frombuffer(tr.dep_ptr, np.int64), np.frombuffer(tr.dep_ids, np.int32)),
        meta,
    )
