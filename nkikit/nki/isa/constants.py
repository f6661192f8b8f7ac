"""``nki.isa.constants``: the ISA's enums (the NKI Library imports them from here)."""

import enum

from ...isa import engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd


class dge_mode(enum.IntEnum):  # noqa: N801 - NKI's name
    """How a DMA's descriptors are made, numbered as in NKI 0.x [reference/nki-0x.md §4,
    ``dge_mode``]: the compiler picks (``unknown``), the GpSimd software DGE, the hardware
    DGE block, or descriptors precomputed by the runtime (``none``).  Beta 1 numbered them
    differently (``nkikit.isa.dge_mode``: none=0, unknown=3), so a kernel passing a raw
    integer (the NKI Library passes ``dge_mode=3``) means what NKI 0.x means by it."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


__all__ = ["dge_mode", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd"]
