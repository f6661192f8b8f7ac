"""NKI 0.x ``nl.ndarray(address=)`` in PSUM: tensors placed on the same bytes share them in the
verifier's capacity rule (a kernel that places a tile per step on one of a few banks fits),
while unplaced tensors and distinct placements still add up."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

BANK = 2048  # bytes of one PSUM bank per partition [reference/nki-0x.md §3]


def _products(n_tiles: int, banks: int, placed: bool):
    """A kernel that creates ``n_tiles`` PSUM tiles up front (all alive at once), tile ``i``
    on bank ``i % banks`` when ``placed``, then fills each with ``x.T @ w`` scaled by i + 1
    and stores it to its own output row block."""

    @nki.jit
    def k(x, w):
        out = nl.ndarray((n_tiles * 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        ws = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ws, src=w)
        tiles = []
        for i in range(n_tiles):
            where = (0, (i % banks) * BANK) if placed else None
            tiles.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=where))
        for i in range(n_tiles):
            nisa.nc_matmul(dst=tiles[i], stationary=xs, moving=ws)
            res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=res, data=tiles[i], op0=nl.multiply, operand0=float(i + 1))
            nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=res)
        return out

    return k


def _inputs():
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (128, 128)).astype(np.float32)
    w = rng.integers(-2, 3, (128, 512)).astype(np.float32)
    return x, w


def test_tiles_placed_on_shared_banks_fit_and_compute():
    x, w = _inputs()
    out = _products(12, 4, placed=True)(x, w)
    want = np.concatenate([(x.T @ w) * (i + 1) for i in range(12)])
    np.testing.assert_array_equal(np.asarray(out), want)


def test_the_same_tiles_unplaced_leave_psum_once_written():
    # unplaced, the twelve tiles would need 24 KiB of PSUM at once: each is evicted to SBUF
    # after its matmul, as the compiler spills what PSUM cannot hold
    x, w = _inputs()
    k = _products(12, 4, placed=False)
    out = k(x, w)
    want = np.concatenate([(x.T @ w) * (i + 1) for i in range(12)])
    np.testing.assert_array_equal(np.asarray(out), want)
    tensors = k.ir(x, w).tensors
    staged = {t.name.rsplit(".psum", 1)[0] for t in tensors if ".psum" in t.name}
    assert staged  # written through a PSUM staging tile each, then held in SBUF
    assert all(t.buffer == "sbuf" for t in tensors if t.name in staged)


def test_a_placement_past_psum_is_out_of_bounds():
    # the ninth tile of nine distinct banks starts at byte 16384, past the 16 KiB of PSUM
    x, w = _inputs()
    with pytest.raises(NkiError) as e:
        _products(9, 9, placed=True)(x, w)
    assert e.value.name == "err_allocation_out_of_bounds"
    assert "[16384, 18432)" in str(e.value) and "test_psum_address.py" in str(e.value)


def test_placed_and_unplaced_tiles_add_up():
    @nki.jit
    def k(x, w):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        ws = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ws, src=w)
        # 16 tiles on banks 0..7, all alive: PSUM is full while the unplaced one is written
        tiles = [
            nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, (i % 8) * BANK))
            for i in range(16)
        ]
        extra = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in [*tiles, extra]:  # every tile written before any is read
            nisa.nc_matmul(dst=t, stationary=xs, moving=ws)
        for t in [extra, *tiles]:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    x, w = _inputs()
    with pytest.raises(NkiError) as e:
        k(x, w)
    assert e.value.name == "err_psum_total_capacity_exceeded"
    assert "18432 bytes" in str(e.value)


def test_address_must_be_a_pair():
    @nki.jit
    def k(x):
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 0, 0))
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(NkiError) as e:
        k(np.zeros((1, 1), np.float32))
    assert e.value.name == "err_invalid_argument"
    assert "(partition, byte_offset)" in str(e.value)


def _accumulated(n_tiles: int, read_between: bool):
    """``n_tiles`` unplaced PSUM tiles created up front; tile ``i`` accumulates ``x0.T @ w``
    and ``x1.T @ w`` (two matmuls into one dst), the tiles one after the other, and every
    tile is read once all are written.  ``read_between``: each tile is also read between its
    two matmuls (not a finished accumulation when it is read)."""

    @nki.jit
    def k(x0, x1, w):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        a0 = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        a1 = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        ws = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a0, src=x0)
        nisa.dma_copy(dst=a1, src=x1)
        nisa.dma_copy(dst=ws, src=w)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(n_tiles)]
        for t in tiles:
            nisa.nc_matmul(dst=t, stationary=a0, moving=ws)
            if read_between:
                nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
            nisa.nc_matmul(dst=t, stationary=a1, moving=ws)
        for t in tiles:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return k


def test_finished_accumulations_leave_psum():
    rng = np.random.default_rng(1)
    x0, x1 = (rng.integers(-2, 3, (128, 128)).astype(np.float32) for _ in range(2))
    w = rng.integers(-2, 3, (128, 512)).astype(np.float32)
    out = _accumulated(12, read_between=False)(x0, x1, w)
    np.testing.assert_array_equal(np.asarray(out), 12 * (x0.T @ w + x1.T @ w))


def test_accumulations_read_midway_stay_in_psum():
    rng = np.random.default_rng(1)
    x0, x1 = (rng.integers(-2, 3, (128, 128)).astype(np.float32) for _ in range(2))
    w = rng.integers(-2, 3, (128, 512)).astype(np.float32)
    with pytest.raises(NkiError) as e:
        _accumulated(12, read_between=True)(x0, x1, w)
    assert e.value.name == "err_psum_total_capacity_exceeded"


def test_the_allocator_keeps_placed_tiles_at_their_bytes_and_packs_around_them():
    from nkikit.compiler.allocate import allocate
    from nkikit.targets import get_target

    @nki.jit
    def k(x, w):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        ws = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ws, src=w)
        # twelve tiles over banks 0..6 (byte 0 .. 14 KiB), all written before any is read,
        # and one unplaced tile alive with them: only bank 7 is left for it
        tiles = [
            nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, (i % 7) * BANK))
            for i in range(12)
        ]
        free = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, name="free")
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in [*tiles, free]:
            nisa.nc_matmul(dst=t, stationary=xs, moving=ws)
        for t in [free, *tiles]:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    x, w = _inputs()
    ir = k.ir(x, w)
    alloc = allocate(ir, get_target("trn2"))
    psum = [p for p in alloc.placements.values() if p.memory == "psum"]
    placed = {p.tensor.name: p.offset for p in psum if p.tensor.address is not None}
    assert sorted(placed.values()) == sorted((i % 7) * BANK for i in range(12))
    assert all(p.offset == p.tensor.address for p in psum if p.tensor.address is not None)
    (auto,) = [p for p in psum if p.tensor.name == "free"]
    assert auto.offset == 7 * BANK
    np.testing.assert_array_equal(np.asarray(k(x, w)), 13 * (x.T @ w))


def _overlapping(spanning: bool):
    """PSUM tiles placed on overlapping bytes, all alive at once, and a half-bank tile at byte
    0.  Without ``spanning``: eight whole-bank tiles, one per bank -- PSUM exactly.  With it:
    four two-bank tiles at banks 0-3 (each shares a bank with the next) and three whole-bank
    tiles at banks 5-7: 22 KiB of tiles on a 14 KiB union, which fits."""

    @nki.jit
    def k(x, w):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        ws = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ws, src=w)
        if spanning:
            wide = [(b, 2) for b in range(4)] + [(b, 1) for b in (5, 6, 7)]
        else:
            wide = [(b, 1) for b in range(8)]
        tiles = [
            nl.ndarray((128, 512 * n), nl.float32, buffer=nl.psum, address=(0, b * BANK))
            for b, n in wide
        ]
        half = nl.ndarray((128, 256), nl.float32, buffer=nl.psum, address=(0, 0))
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in tiles:
            for j in range(t.shape[1] // 512):
                nisa.nc_matmul(dst=t[:, j * 512 : (j + 1) * 512], stationary=xs, moving=ws)
        nisa.nc_matmul(dst=half, stationary=xs, moving=ws[:, 0:256])
        for t in tiles:
            for j in range(t.shape[1] // 512):
                part = t[:, j * 512 : (j + 1) * 512]
                nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)
        nisa.tensor_tensor(dst=acc[:, 0:256], data1=acc[:, 0:256], data2=half, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return k


def test_overlapping_placements_count_their_union():
    # eight full banks and a half tile inside the first: 16 KiB in all, which fits; the
    # simulator gives every tensor its own storage, so the values are the plain sums
    x, w = _inputs()
    out = np.asarray(_overlapping(False)(x, w))
    want = 8 * (x.T @ w)
    want[:, :256] += (x.T @ w)[:, :256]
    np.testing.assert_array_equal(out, want)


def test_multi_bank_placements_overlap_and_fit():
    # two-bank tiles at banks 0-3 cover bytes [0, 10240), whole-bank ones at banks 5-7 cover
    # [10240, 16384): 22 KiB of tiles, a 14 KiB union with the half tile inside bank 0
    x, w = _inputs()
    out = np.asarray(_overlapping(True)(x, w))
    want = 11 * (x.T @ w)
    want[:, :256] += (x.T @ w)[:, :256]
    np.testing.assert_array_equal(out, want)


def test_psum_placement_off_a_bank_boundary_is_refused_at_its_line():
    # the compiler places PSUM tensors at bank boundaries only [reference/nki-0x.md §3.2]
    @nki.jit
    def k(x):
        nl.ndarray((128, 256), nl.float32, buffer=nl.psum, address=(0, 1024))  # <- here
        return x

    with pytest.raises(NkiError) as e:
        k(np.zeros((1, 1), np.float32))
    assert e.value.name == "err_invalid_argument"
    assert "bank boundary" in str(e.value) and "got 1024" in str(e.value)
    line = next(n for n, text in enumerate(open(__file__), 1) if "# <- here" in text)
    assert e.value.loc.line == line


def test_placed_union_over_capacity_names_the_users_line():
    # placed tiles cover bytes [0, 1024) and [2048, 16384) (union 15 KiB); an unplaced 2 KiB
    # tile created while they live needs 17 KiB: the error is at the line that created it
    @nki.jit
    def k(x, w):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        xs = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        ws = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        nisa.dma_copy(dst=ws, src=w)
        # two-bank tiles at banks 1-6 cover bytes [2048, 16384); a quarter-bank tile at byte
        # 0 adds [0, 1024)
        tiles = [
            nl.ndarray((128, 1024), nl.float32, buffer=nl.psum, address=(0, b * BANK))
            for b in range(1, 7)
        ] + [nl.ndarray((128, 256), nl.float32, buffer=nl.psum, address=(0, 0))]
        extra = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # the line reported
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in [*tiles, extra]:
            for j in range(0, t.shape[1], 512):
                n = min(512, t.shape[1] - j)
                nisa.nc_matmul(dst=t[:, j : j + n], stationary=xs, moving=ws[:, 0:n])
        for t in [extra, *tiles]:
            for j in range(0, t.shape[1], 512):
                n = min(512, t.shape[1] - j)
                part = acc[:, 0:n]
                nisa.tensor_tensor(dst=part, data1=part, data2=t[:, j : j + n], op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    x, w = _inputs()
    with pytest.raises(NkiError) as e:
        k(x, w)
    assert e.value.name == "err_psum_total_capacity_exceeded"
    assert "17408 bytes" in str(e.value)
    line = next(n for n, text in enumerate(open(__file__), 1) if "# the line reported" in text)
    assert e.value.loc.file.endswith("test_psum_address.py") and e.value.loc.line == line
    assert "(4096 B at byte 2048, line" in str(e.value)  # placed tiles shown with their bytes
