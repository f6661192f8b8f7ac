"""Tracing indirect (runtime-index) DMA: a tile of integers inside an index tuple becomes an
access with an index operand (``Access.indirect``), on the tensor dimension its key position
walks; the op that uses it lists the index tile among its inputs."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.errors import NkiError
from nkikit.ir.affine import Affine, Axis
from nkikit.ir.core import Access, Op

HERE = os.path.abspath(__file__)
I32, F32 = nl.int32, nl.float32


def _dmas(kernel) -> list[Op]:
    return [op for op, _ in kernel.ops() if op.prim == "dma_copy"]


def _bad_line(jit) -> int:
    lines, start = inspect.getsourcelines(jit.func)
    (hit,) = [start + i for i, text in enumerate(lines) if "# BAD" in text]
    return hit


@nki.jit
def gather_rows(data, idx):
    out = nl.ndarray((64, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    idx_tile = nl.load(idx[i_p])  # [64] int32 -> [64, 1] in SBUF
    nl.store(out, value=nl.load(data[idx_tile[i_p, 0], i_f]))
    return out


@nki.jit
def gather_whole_tile(data):
    out = nl.ndarray((64, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    idx_tile = nisa.iota(2 * nl.arange(64)[:, None], dtype=nl.int32)
    nl.store(out, value=nl.load(data[idx_tile, nl.arange(data.shape[1])[None, :]]))
    return out


def test_index_tile_on_the_partition_dimension_makes_an_indirect_access():
    k = gather_rows.ir(nt.tensor[[128, 32], F32], nt.tensor[[64], I32])
    load = _dmas(k)[1]
    src, idx = load.ins
    assert src.tensor.name == "data" and src.shape == (64, 32)
    assert src.indirect_dim == 0
    assert src.index == (Affine(), Affine.of(Axis(1)))  # static offset 0 on dim 0
    assert src.indirect is not None and src.indirect.tensor.name == "idx_tile"
    assert src.indirect.shape == (64, 1)  # one index per partition
    assert src.indirect.index == (Affine.of(Axis(0)), Affine())
    assert idx == src.indirect  # the op reads the index tile: listed as an input
    assert not src.is_whole
    assert "%data[%idx_tile[a0, 0], a1]<64x32>" in repr(src)


def test_a_whole_index_tile_and_a_sliced_one_trace_the_same_way():
    k = gather_whole_tile.ir(nt.tensor[[128, 32], F32])
    src, idx = _dmas(k)[0].ins
    assert src.indirect == idx
    assert src.indirect.shape == (64, 1)
    assert src.indirect.index == (Affine.of(Axis(0)), Affine())


@nki.jit
def gather_from_view(data, idx):
    n, v = data.shape
    out = nl.ndarray((2 * n, 1), dtype=data.dtype, buffer=nl.shared_hbm)
    flat = data.reshape((n * v, 1))
    i_p = nl.arange(n)[:, None]
    i_0 = nl.arange(1)[None, :]
    for t in nl.affine_range(2):
        it = nl.load(idx.reshape((2 * n, 1))[t * n + i_p, i_0])
        rows = flat[nl.ds(t * 3, n * v), :]  # a view with a loop-dependent start
        nl.store(out[t * n + i_p, i_0], value=nl.load(rows[it, i_0]))
    return out


def test_an_index_tile_on_a_view_keeps_the_views_offset_as_the_static_part():
    k = gather_from_view.ir(nt.tensor[[8, 5], F32], nt.tensor[[16], I32])
    (_, load, _) = _dmas(k)
    src = load.ins[0]
    (t,) = [s for s in src.index[0].syms]
    assert src.tensor.name == "data.reshape" and src.indirect_dim == 0
    assert src.index[0] == Affine.of(t) * 3  # nl.ds(t * 3, ...) start, plus the index tile
    assert src.index[1] == Affine.of(Axis(1))


@nki.jit
def one_d_gather(data, idx):
    out = nl.ndarray((16, 1), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(16)[:, None]
    it = nl.load(idx[i_p])
    nl.store(out, value=nl.load(data[it]))
    return out


def test_a_one_dimensional_tensor_takes_an_index_tile_alone():
    k = one_d_gather.ir(nt.tensor[[100], F32], nt.tensor[[16], I32])
    src = _dmas(k)[1].ins[0]
    assert src.shape == (16, 1) and src.indirect_dim == 0 and src.indirect.shape == (16, 1)


@nki.jit
def scatter_by_assignment(src, idx):
    out = nl.ndarray((128, src.shape[1]), dtype=src.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(src.shape[0])[:, None]
    i_f = nl.arange(src.shape[1])[None, :]
    it = nl.load(idx[i_p])
    out[it, i_f] = nl.load(src)
    return out


def test_assigning_to_an_indirect_hbm_access_is_a_scatter():
    k = scatter_by_assignment.ir(nt.tensor[[32, 8], F32], nt.tensor[[32], I32])
    store = _dmas(k)[-1]
    (dst,) = store.outs
    assert dst.tensor.name == "out" and dst.indirect is not None
    assert store.ins[-1] == dst.indirect  # the scatter reads its index tile


@nki.jit
def scatter_add(table, idx, val):
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(table))
    i_p = nl.arange(idx.shape[0])[:, None]
    it = nl.load(idx[i_p])
    nl.atomic_rmw(out[it, nl.arange(table.shape[1])[None, :]], value=nl.load(val), op=np.add)
    return out


def test_atomic_rmw_is_a_read_modify_write_dma_with_an_index_tile():
    k = scatter_add.ir(nt.tensor[[10, 4], F32], nt.tensor[[6], I32], nt.tensor[[6, 4], F32])
    rmw = _dmas(k)[-1]
    assert rmw.attrs == {
        "rmw_op": "add",
        "transpose": False,
        "oob_skip": False,
    }  # completed from the record
    assert rmw.outs[0].indirect is not None and rmw.ins[-1] == rmw.outs[0].indirect
    assert "rmw_op=add" in str(k).replace("'", "")


# ---------------------------------------------------------------------------------------------
# errors raised while tracing, at the user's line


def _rejects(jit, name: str, *specs) -> NkiError:
    with pytest.raises(NkiError) as info:
        jit.ir(*specs)
    err = info.value
    assert err.name == name, str(err)
    assert os.path.abspath(err.loc.file) == HERE and err.loc.line == _bad_line(jit), str(err)
    return err


@nki.jit
def two_index_tiles(data):
    out = nl.ndarray((8, 8), dtype=data.dtype, buffer=nl.shared_hbm)
    it = nisa.iota(nl.arange(8)[:, None], dtype=nl.int32)
    nl.store(out, value=nl.load(data[it, it]))  # BAD
    return out


@nki.jit
def index_tile_with_a_slice(data):
    out = nl.ndarray((8, 8), dtype=data.dtype, buffer=nl.shared_hbm)
    it = nisa.iota(nl.arange(8)[:, None], dtype=nl.int32)
    nl.store(out, value=nl.load(data[it, 0:8]))  # BAD
    return out


@nki.jit
def rmw_without_index_tile(table, val):
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nl.atomic_rmw(out, value=nl.load(val), op=np.add)  # BAD
    return out


@nki.jit
def rmw_with_multiply(table, val):
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    it = nisa.iota(nl.arange(8)[:, None], dtype=nl.int32)
    nl.atomic_rmw(out[it, nl.arange(8)[None, :]], value=nl.load(val), op=np.multiply)  # BAD
    return out


def test_two_index_tiles_are_a_free_dimension_error():
    err = _rejects(two_index_tiles, "err_indirect_indices_free_dim", nt.tensor[[8, 8], F32])
    assert "only one dimension" in str(err)


def test_an_index_tile_cannot_be_mixed_with_slices():
    _rejects(
        index_tile_with_a_slice,
        "err_unsupported_mixing_basic_advanced_tensor_indexing",
        nt.tensor[[8, 8], F32],
    )


def test_atomic_rmw_needs_an_index_tile_and_np_add():
    specs = (nt.tensor[[8, 8], F32], nt.tensor[[8, 8], F32])
    err = _rejects(rmw_without_index_tile, "err_invalid_argument", *specs)
    assert "index tile" in str(err)
    err = _rejects(rmw_with_multiply, "err_invalid_argument", *specs)
    assert "np.add" in str(err)


def test_access_remap_carries_the_index_tile_along():
    from nkikit.ir.core import Tensor

    data = Tensor("d", (16, 4), np.dtype(np.float32), "hbm", kind="input")
    idx = Tensor("i", (8, 1), np.dtype(np.int32), "sbuf")
    ind = Access(idx, (8, 1), (Affine.of(Axis(0)), Affine()))
    a = Access(data, (8, 4), (Affine(), Affine.of(Axis(1))), ind, 0)
    # view the [8, 4] tile as [1, 8, 4]: tile axes shift by one, the index tile's too
    b = a.remap((1, 8, 4), {Axis(0): Affine.of(Axis(1)), Axis(1): Affine.of(Axis(2))})
    assert b.indirect.index == (Affine.of(Axis(1)), Affine())
    assert b.indirect.shape == (1, 8, 1)
    assert b.indirect_dim == 0 and b.index == (Affine(), Affine.of(Axis(2)))
