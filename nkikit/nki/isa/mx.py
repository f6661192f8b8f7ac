"""``nisa.quantize_mx`` and ``nisa.nc_matmul_mx``: NC-v4's MX (microscaling) instructions
[reference/nki-0x.md §4.5, §4.11].  Argument parsing only: the IR primitives' records, the
verifier and the numerics (``nkikit/sim/mx.py``) hold the rest."""

from __future__ import annotations

from ...errors import NkiError, SourceLoc, caller_loc
from ...ir.core import Access
from ...trace import instructions as E
from ..indirection import check_tensor_engine
from ..tensor import access_of, require_tensor


def _operand(x, loc: SourceLoc, op: str, what: str) -> Access:
    """An operand's access in its own shape: the instructions read their operands' free
    elements in access order (quantize_mx groups 4 consecutive ones), so any view will do."""
    require_tensor(x, loc, f"nisa.{op}", what)
    return access_of(x, loc, f"{op} {what}")


def _row_tiling(tile_position, tile_size, stationary: Access, loc: SourceLoc) -> None:
    """nc_matmul_mx tiles rows only: ``tile_size=(rows, 128)``, ``tile_position=(row, 0)``;
    tiling picks the PE rows that do the work, not the result [nki-0x.md §4.5]."""
    if not tile_position and not tile_size:
        return
    why = None
    if not (tile_position and tile_size) or len(tile_position) != 2 or len(tile_size) != 2:
        why = "tile_position and tile_size are given together, each as (row, column)"
    else:
        rows, cols = (int(v) for v in tile_size)
        r0, c0 = (int(v) for v in tile_position)
        if cols != 128 or c0 != 0:
            why = f"only rows are tiled: tile_size=(rows, 128), tile_position=(row, 0); got {tile_size}, {tile_position}"
        elif rows not in (32, 64, 128) or r0 % rows or r0 + rows > 128:
            why = f"tile_size rows {rows} must be 32, 64 or 128 and tile_position row {r0} a multiple of it inside 128"
        elif stationary.shape[0] > rows:
            why = f"stationary {stationary.shape} does not fit {rows} PE rows"
    if why is not None:
        raise NkiError("err_invalid_argument", loc, op="nisa.nc_matmul_mx", why=why)


def nc_matmul_mx(
    dst,
    stationary,
    moving,
    stationary_scale,
    moving_scale,
    tile_position=None,
    tile_size=None,
    accumulate=None,
    name=None,
):
    """``dst = stationary.T @ moving`` on MX operands (NC-v4 only): ``stationary`` [K, M] and
    ``moving`` [K, N] hold ``float8_e5m2_x4`` / ``float8_e4m3fn_x4`` / ``float4_e2m1fn_x4``
    containers, contracted over the K partitions and the 4 values of each container after
    multiplying each 8-partition x 4-value group by ``2^(scale - 127)``; the scale tiles
    (``float8_e8m0fnu`` or uint8) hold the scale of data partitions ``8i .. 8i + 7`` at
    partition ``(i // 4) * 32 + i % 4``.  ``dst`` [M, N] in PSUM (fp32 or bf16) accumulates as
    ``nc_matmul``'s: ``accumulate=None`` overwrites on the first matmul write, adds later."""
    from . import _done, _dst_chip, _tile_pair, resolve_accumulate

    loc = caller_loc()
    accumulate = E.flag(accumulate, "accumulate", "nc_matmul_mx", loc, none=True)
    tile_position = _tile_pair(tile_position, "tile_position", "nc_matmul_mx", loc)
    tile_size = _tile_pair(tile_size, "tile_size", "nc_matmul_mx", loc)
    _dst_chip(dst, loc, "nc_matmul_mx")
    check_tensor_engine(
        "nc_matmul_mx",
        loc,
        dst,
        moving,
        tiled=bool(tile_position or tile_size),
        accumulate=accumulate,
        inputs=(stationary, stationary_scale, moving_scale),
    )
    s = _operand(stationary, loc, "nc_matmul_mx", "stationary")
    m = _operand(moving, loc, "nc_matmul_mx", "moving")
    ss = _operand(stationary_scale, loc, "nc_matmul_mx", "stationary_scale")
    ms = _operand(moving_scale, loc, "nc_matmul_mx", "moving_scale")
    _row_tiling(tile_position, tile_size, s, loc)
    # dst holds M partitions x N elements in any free shape (the verifier checks the spec)
    d = _operand(dst, loc, "nc_matmul_mx", "dst")
    acc = resolve_accumulate(d, accumulate, loc, "nc_matmul_mx")
    return _done(E.emit_nc_matmul_mx(d, s, m, ss, ms, accumulate=acc, loc=loc))


def quantize_mx(dst, src, dst_scale, name=None):
    """Quantize ``src`` [P, F] (bf16/fp16 in SBUF; P a multiple of 32, F of 4) to MXFP8 on the
    VectorE (NC-v4 only): ``dst`` [P, F / 4] ``float8_e4m3fn_x4`` / ``float8_e5m2_x4``
    containers (4 consecutive values each) and ``dst_scale`` (``float8_e8m0fnu`` or uint8) one
    scale per 8 partitions x 4 values, at partition ``(i // 4) * 32 + i % 4`` for data
    partitions ``8i .. 8i + 7`` (slice ``dst_scale`` to start at partition 4, 8 or 12 to share
    a tile); the other partitions of ``dst_scale`` keep their values."""
    from . import _done, _dst_chip

    loc = caller_loc()
    _dst_chip(dst, loc, "quantize_mx", ("sbuf",))
    _dst_chip(dst_scale, loc, "quantize_mx", ("sbuf",))
    a = _operand(src, loc, "quantize_mx", "src")
    d = _operand(dst, loc, "quantize_mx", "dst")
    sc = _operand(dst_scale, loc, "quantize_mx", "dst_scale")
    return _done(E.emit_quantize_mx(d, sc, a, loc=loc))
