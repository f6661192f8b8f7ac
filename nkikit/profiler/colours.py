"""One colour per opcode, the same in every report: derived from the opcode's name alone.

Reports used to colour opcodes by their rank in the kernel's time, so ``MATMUL`` was blue in
one report and red in the next.  Here the colour is a hash of the name (CRC-32, stable across
runs and Python versions) picked from a palette of distinguishable colours; a few well-known
opcodes have fixed entries so that the commonest ones never share a colour.
"""

from __future__ import annotations

import zlib

PALETTE: tuple[str, ...] = (
    "#0969da",
    "#cf222e",
    "#1a7f37",
    "#8250df",
    "#bf8700",
    "#0598bc",
    "#e16f24",
    "#bf3989",
    "#57606a",
    "#4ac26b",
    "#a475f9",
    "#d4a72c",
    "#6e7781",
    "#fb8f44",
    "#218bff",
    "#a40e26",
    "#116329",
    "#6639ba",
    "#7d4e00",
    "#1b7c83",
)

FIXED: dict[str, str] = {
    "MATMUL": PALETTE[0],
    "TRANSPOSE": PALETTE[3],
    "DMA_HBM_TO_SBUF": PALETTE[2],
    "DMA_SBUF_TO_HBM": PALETTE[1],
    "ACTIVATION": PALETTE[4],
    "TENSOR_TENSOR": PALETTE[5],
    "TENSOR_SCALAR": PALETTE[6],
    "TENSOR_REDUCE": PALETTE[7],
    "SCALAR_TENSOR_TENSOR": PALETTE[9],
    "TENSOR_COPY": PALETTE[10],
    "ACTIVATION_REDUCE": PALETTE[11],
    "MEMSET": PALETTE[12],
}
"""Opcodes common enough to deserve a colour of their own (no hash collision among them)."""


def opcode_colour(opcode: str) -> str:
    """``#rrggbb`` for ``opcode``: the same string always gets the same colour."""
    fixed = FIXED.get(opcode)
    if fixed is not None:
        return fixed
    return PALETTE[zlib.crc32(opcode.encode("utf-8")) % len(PALETTE)]
