"""The verifier's indirect-DMA rule (``rule_indirect``) and how the other rules treat an
access with a runtime index: every bad kernel is rejected with the NKI error name at the
line marked ``# BAD``; the legal forms pass."""

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

HERE = os.path.abspath(__file__)
F32, I32 = nl.float32, nl.int32
DATA = nt.tensor[[128, 64], F32]


def bad_line(kernel: nki.JitKernel) -> int:
    lines, start = inspect.getsourcelines(kernel.func)
    (hit,) = [start + i for i, text in enumerate(lines) if "# BAD" in text]
    return hit


def rejects(kernel: nki.JitKernel, name: str, *args) -> NkiError:
    with pytest.raises(NkiError) as info:
        kernel.ir(*args)
    err = info.value
    assert err.name == name, str(err)
    assert os.path.abspath(err.loc.file) == HERE, str(err)
    assert err.loc.line == bad_line(kernel), str(err)
    return err


def _iota(n: int, dtype=nl.int32):
    return nisa.iota(nl.arange(n)[:, None], dtype=dtype)


# ---------------------------------------------------------------------------------------------
# free dimensions


@nki.jit
def index_on_free_dim(data):
    out = nl.ndarray((64, 1), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    it = _iota(64)
    nl.store(out, value=nl.load(data[i_p, it]))  # BAD
    return out


@nki.jit
def index_varies_along_free_axis(data):
    out = nl.ndarray((1, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    it = nisa.iota(nl.arange(64)[None, :] + 0 * nl.arange(1)[:, None], dtype=nl.int32)
    nl.store(out, value=nl.load(data[0 * nl.arange(1)[:, None], it]))  # BAD
    return out


def test_index_tile_on_a_free_dimension_is_rejected():
    err = rejects(index_on_free_dim, "err_indirect_indices_free_dim", DATA)
    assert "dimension 0 already takes the partition axis" in str(err)


def test_index_tile_varying_along_a_free_axis_is_rejected():
    err = rejects(index_varies_along_free_axis, "err_indirect_indices_free_dim", DATA)
    assert "free tile axis 1" in str(err)


# ---------------------------------------------------------------------------------------------
# the index tile: SBUF, integers, one per partition


@nki.jit
def float_index(data):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    it = _iota(64, nl.float32)
    nl.store(out, value=nl.load(data[it, nl.arange(64)[None, :]]))  # BAD
    return out


@nki.jit
def hbm_index(data, idx):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(data[idx, nl.arange(64)[None, :]]))  # BAD
    return out


@nki.jit
def one_index_for_many_partitions(data):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    it = nisa.iota(0 * nl.arange(1)[:, None], dtype=nl.int32)
    blocks = data.reshape((2, 64, 64))
    nl.store(out, value=nl.load(blocks[it, nl.arange(64)[:, None], nl.arange(64)[None, :]]))  # BAD
    return out


def test_index_tile_must_hold_integers():
    err = rejects(float_index, "err_unsupported_dtype", DATA)
    assert "float32" in str(err) and "int32" in str(err)


@pytest.mark.parametrize("dtype", [nl.int32, nl.uint32, nl.int16, nl.uint16])
def test_integer_index_tiles_pass(dtype):
    @nki.jit
    def gather(data):
        out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
        it = _iota(64, dtype)
        nl.store(out, value=nl.load(data[it, nl.arange(64)[None, :]]))
        return out

    gather.ir(DATA)


def test_index_tile_must_be_in_sbuf():
    err = rejects(hbm_index, "err_unsupported_memory", DATA, nt.tensor[[64, 1], I32])
    assert "index tile 'idx'" in str(err) and "SBUF" in str(err)


def test_index_tile_must_give_every_partition_its_index():
    err = rejects(one_index_for_many_partitions, "err_num_partition_mismatch", DATA)
    assert "1 and 64" in str(err)


# ---------------------------------------------------------------------------------------------
# only DMAs, only HBM


@nki.jit
def compute_on_indirect(data):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    x = nl.load(data[0:64, 0:64])
    it = _iota(64)
    nl.store(out, value=nl.exp(x[it, nl.arange(64)[None, :]]))  # BAD
    return out


@nki.jit
def transpose_indirect(data):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    it = _iota(64)
    nl.store(out, value=nl.load_transpose2d(data[it, nl.arange(64)[None, :]]))  # BAD
    return out


@nki.jit
def sbuf_to_sbuf_indirect(data):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    x = nl.load(data[0:64, 0:64])
    y = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.sbuf)
    it = _iota(64)
    nisa.dma_copy(dst=y, src=x[it, nl.arange(64)[None, :]])  # BAD
    nl.store(out, value=y)
    return out


def test_compute_instructions_cannot_take_an_index_tile():
    err = rejects(compute_on_indirect, "err_indirect_indices_are_not_supported_with_nki_api", DATA)
    assert "activation" in str(err)


def test_load_transpose2d_cannot_take_an_index_tile():
    err = rejects(transpose_indirect, "err_indirect_indices_are_not_supported_with_nki_api", DATA)
    assert "load_transpose2d" in str(err)


def test_indirect_dma_gathers_from_hbm_only():
    err = rejects(sbuf_to_sbuf_indirect, "err_unsupported_memory", DATA)
    assert "indirectly indexed" in str(err)


# ---------------------------------------------------------------------------------------------
# the other rules on indirect accesses


@nki.jit
def static_part_out_of_bounds(data):
    out = nl.ndarray((64, 65), dtype=data.dtype, buffer=nl.shared_hbm)
    it = _iota(64)
    nl.store(out, value=nl.load(data[it, nl.arange(65)[None, :]]))  # BAD
    return out


@nki.jit
def big_static_offset(data):
    out = nl.ndarray((64, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    it = _iota(64)
    nl.store(out, value=nl.load(data[1000:1064][it, nl.arange(64)[None, :]]))
    return out


def test_free_dimensions_of_an_indirect_access_are_still_bounds_checked():
    rejects(static_part_out_of_bounds, "err_tensor_access_out_of_bound", DATA)


def test_the_indirect_dimension_is_checked_at_run_time_not_when_verifying():
    big_static_offset.ir(nt.tensor[[2000, 64], F32])  # rows 1000 + idx: fine statically


@nki.jit
def scatter_fixed_index_in_loop(src):
    out = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.shared_hbm)
    it = _iota(64)
    for i in nl.affine_range(2):
        x = nl.load(src[i * 64 : (i + 1) * 64, 0:64])
        nl.store(out[it, nl.arange(64)[None, :]], value=x)  # BAD
    return out


@nki.jit
def scatter_index_loaded_in_loop(src, idx):
    out = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    for i in nl.affine_range(2):
        it = nl.load(idx[i * 64 + i_p])
        x = nl.load(src[i * 64 : (i + 1) * 64, 0:64])
        nl.store(out[it, nl.arange(64)[None, :]], value=x)
    return out


def test_a_scatter_with_the_same_indices_in_every_iteration_is_an_output_dependency():
    rejects(scatter_fixed_index_in_loop, "err_unexpected_output_dependencies", DATA)


def test_a_scatter_whose_indices_are_loaded_in_the_loop_passes():
    k = scatter_index_loaded_in_loop.ir(DATA, nt.tensor[[128], I32])
    src = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    idx = np.random.default_rng(0).permutation(128).astype(np.int32)
    got = scatter_index_loaded_in_loop(src, idx)
    np.testing.assert_array_equal(got[idx], src)
    assert k.name == "scatter_index_loaded_in_loop"


@nki.jit
def gather_in_spmd(data, idx):
    out = nl.ndarray((128, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    pid = nl.program_id(0)
    it = nl.load(idx[pid * 64 + i_p])
    nl.store(
        out[it, nl.arange(64)[None, :]], value=nl.load(data[pid * 64 + i_p, nl.arange(64)[None, :]])
    )
    return out


def test_a_scatter_in_an_spmd_launch_writes_where_its_indices_say():
    data = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    idx = np.random.default_rng(1).permutation(128).astype(np.int32)
    got = gather_in_spmd[2](data, idx)
    np.testing.assert_array_equal(got[idx], data)
