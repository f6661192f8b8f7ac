"""Small kernels the compiler tests share (their lines are looked up by marker comments)."""

from __future__ import annotations

from pathlib import Path

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl

HERE = Path(__file__)


def line_of(marker: str, path: Path = HERE) -> int:
    """Line number of the first line of ``path`` containing ``marker``."""
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if marker in text:
            return n
    raise LookupError(marker)


@nki.jit
def load_act_store(a):
    """One DMA load, one ScalarE activation, one store: a timeline computable by hand."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)  # @load
    y = nl.exp(x)  # @act
    nl.store(out, y)  # @store
    return out


@nki.jit
def two_live(a, b):
    """x and y are live together (both read by the add)."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)  # @x
    y = nl.load(b)  # @y
    nl.store(out, nl.add(x, y))
    return out


@nki.jit
def two_phases(a):
    """Two sibling loops: their tiles are never live together."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    n = a.shape[0] // 128
    for i in nl.affine_range(n):
        first = nl.load(a[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], first)
    for j in nl.affine_range(n):
        second = nl.load(a[j * 128 : (j + 1) * 128, :])
        nl.store(out[j * 128 : (j + 1) * 128, :], nl.multiply(second, 2.0))
    return out


@nki.jit
def buffering(a):
    """Tiles in loops of different kinds and trip counts."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    top = nl.load(a[0:128, :])
    nl.store(out[0:128, :], top)
    for i in nl.affine_range(8):
        many = nl.load(a[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], many)
    for i in nl.affine_range(2):
        pair = nl.load(a[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], pair)
    for i in nl.sequential_range(8):
        seq = nl.load(a[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], seq)
    return out


@nki.jit
def psum_tiles(a, b):
    """Three PSUM results of different sizes, all live at the end."""
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    big = nl.matmul(x, y, transpose_x=True)  # 128 x 512 fp32: a full bank
    mid = nisa.nc_matmul(x, x)  # 128 x 128 fp32: 512 B
    small = nisa.nc_matmul(x, x[:, 0:100])  # 128 x 100 fp32: 400 B, padded to 512
    s = nl.add(nl.copy(big[:, 0:128]), nl.add(nl.copy(mid), nl.copy(small[:, 0:100])[:, 0:1]))
    nl.store(out[:, 0:128], s)
    return out


@nki.jit
def quadrants(a):
    """Four 32-partition tiles live at once."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    q0 = nl.load(a[0:32, :])
    q1 = nl.load(a[32:64, :])
    q2 = nl.load(a[64:96, :])
    q3 = nl.load(a[96:128, :])
    nl.store(out[0:32, :], nl.add(nl.add(q0, q1), nl.add(q2, q3)))
    return out


@nki.jit
def matmul_small(lhsT, rhs):
    """One PSUM accumulation over K tiles, then copy and store: the tutorial's tiled step."""
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        acc = nl.zeros((128, N), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            a = nl.load(lhsT[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
            b = nl.load(rhs[k * 128 : (k + 1) * 128, :])
            acc += nl.matmul(a, b, transpose_x=True)  # @matmul
        nl.store(out[m * 128 : (m + 1) * 128, :], nl.copy(acc, dtype=out.dtype))
    return out


@nki.jit
def reuse_one_buffer(a):
    """A top-level tile reused by every iteration of a sequential loop (one buffer)."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((128, a.shape[1]), a.dtype, buffer=nl.sbuf)
    for i in nl.sequential_range(2):
        buf[...] = nl.load(a[i * 128 : (i + 1) * 128, :])  # @reuse-load
        nl.store(out[i * 128 : (i + 1) * 128, :], buf)  # @reuse-store
    return out


@nki.jit
def fresh_each_iteration(a):
    """The same copy through a tile declared in an affine loop body (multi-buffered)."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        buf = nl.load(a[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], buf)
    return out


@nki.jit
def transpose_and_matmul(a, b):
    """A TensorE transpose (no useful FLOPs) and a matmul (useful FLOPs)."""
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    xt = nl.copy(nisa.nc_transpose(x))  # @transpose
    y = nl.load(b)
    r = nisa.nc_matmul(xt, y)
    nl.store(out, nl.copy(r))
    return out


@nki.jit
def scalar_chain(a):
    """Three ScalarE instructions: an independent pair, then a dependent one."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.exp(x)  # @act1
    z = nl.tanh(x)  # @act2 (independent of act1)
    w = nl.exp(z)  # @act3 (reads act2's result)
    nl.store(out, nl.add(w, y))
    return out


@nki.jit
def spmd_exp(a):
    """Each SPMD instance handles 128 rows."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    x = nl.load(a[i * 128 : (i + 1) * 128, :])
    nl.store(out[i * 128 : (i + 1) * 128, :], nl.exp(x))
    return out


@nki.jit
def hbm_round_trip(a):
    """Writes an HBM scratch tensor (through a reshaped view) and reads it back."""
    scratch = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    flat = scratch.reshape((a.shape[0] * a.shape[1],))
    nl.store(scratch, nl.exp(x))  # @scratch-store
    y = nl.load(scratch)  # @scratch-load
    nl.store(out, y)
    _ = flat
    return out


@nki.jit
def unrolled_copies(a):
    """A Python loop of load -> exp -> store: each step allocates its tiles anew."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in range(a.shape[0] // 128):
        x = nl.load(a[i * 128 : (i + 1) * 128, :])  # @unrolled-load
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.exp(x))
    return out


@nki.jit
def carried_sum(a):
    """An unrolled running sum: each step's ``acc`` is read by the next step's add, so two
    tensors of the same line are live at once."""
    out = nl.ndarray((128, a.shape[1]), a.dtype, buffer=nl.shared_hbm)
    acc = nl.load(a[0:128, :])
    for i in range(1, a.shape[0] // 128):
        x = nl.load(a[i * 128 : (i + 1) * 128, :])
        acc = nl.add(acc, x)  # @carried-add
    nl.store(out, acc)
    return out


def _load_store(a, out, i):
    """One tile through SBUF; called twice, so both tiles come from the same line."""
    t = nl.load(a[i * 128 : (i + 1) * 128, 0:64])  # @helper-load
    nl.store(out[i * 128 : (i + 1) * 128, 0:64], t)


@nki.jit
def helper_around_big(a):
    """The helper's tiles before and after a big tile that needs (nearly) all of SBUF:
    rotating them (one placement for both, live across the big one) cannot fit in 2 KiB per
    partition; placing them one by one can."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    _load_store(a, out, 0)
    big = nl.load(a[128:256, :])  # 512 fp32: 2 KiB per partition
    nl.store(out[128:256, :], big)
    _load_store(a, out, 2)
    return out


@nki.jit
def unrolled_matmuls(a, w):
    """Unrolled matmuls into PSUM: the results rotate through banks."""
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    wt = nl.load(w)
    for i in range(a.shape[0] // 128):
        x = nl.load(a[i * 128 : (i + 1) * 128, :])
        p = nl.matmul(wt, x, transpose_x=True)  # @unrolled-matmul
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.copy(p, dtype=nl.float32))
    return out


@nki.jit
def spill_candidate(a):
    """``keep`` is used before and after a loop of big tiles: with room for the loop's tiles
    but not for ``keep`` too, it is saved to HBM before the loop and reloaded after."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    keep = nl.load(a[0:128, 0:256])  # @spill-keep
    nl.store(out[0:128, 0:256], keep)
    for i in nl.affine_range(4):
        big = nl.load(a[128 + i * 128 : 256 + i * 128, :])
        nl.store(out[128 + i * 128 : 256 + i * 128, :], nl.exp(big))
    nl.store(out[640:768, 0:256], nl.exp(keep))  # @spill-reuse
    return out
