"""The verifier's output-spec rule (``rule_spec``): an instruction's output access holds what
its primitive produces -- the same partitions and elements per partition (free shapes may
differ), all of a DMA's elements -- in a dtype the instruction can write, and its inputs
have dtypes it reads.  Bad kernels are rejected at their ``# BAD`` line; legal free-shape
differences pass and simulate the same on both simulators."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import NkiError
from nkikit.sim import fast, interp
from nkikit.trace.builder import current

HERE = os.path.abspath(__file__)
rng = np.random.default_rng(0)


def rejects(kernel: nki.JitKernel, name: str, *args) -> NkiError:
    """Trace ``kernel`` and expect ``name`` at the line marked ``# BAD`` (as in test_verify)."""
    with pytest.raises(NkiError) as info:
        kernel.ir(*args)
    err = info.value
    lines, start = inspect.getsourcelines(kernel.func)
    (bad,) = [start + i for i, text in enumerate(lines) if "# BAD" in text]
    assert err.name == name, str(err)
    assert (os.path.abspath(err.loc.file), err.loc.line) == (HERE, bad), str(err)
    return err


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@nki.jit
def dma_into_a_wider_window(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    nisa.dma_copy(dst=out[0:128, 0:64], src=t)  # BAD
    return out


def test_a_dma_moves_as_many_elements_as_its_source():
    err = rejects(
        dma_into_a_wider_window, "err_store_dst_shape_smaller_than_other_shape", f32(128, 32)
    )
    assert "[128, 64]" in str(err) and "[128, 32]" in str(err)


@nki.jit
def wide_reduce_res(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray((128, 2), dtype=nl.float32)
    e = nisa.activation(op=nl.exp, data=t, reduce_op=nl.add, reduce_res=r)  # BAD
    nl.store(out, e)
    return out


def test_reduce_res_holds_one_value_per_partition():
    err = rejects(wide_reduce_res, "err_store_dst_shape_smaller_than_other_shape", f32(128, 64))
    assert "reduce_res" in str(err) and "produces 1" in str(err)


@nki.jit
def short_reduce_res(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    r = nl.ndarray((64, 1), dtype=nl.float32)
    e = nisa.activation(op=nl.exp, data=t, reduce_op=nl.add, reduce_res=r)  # BAD
    nl.store(out, e)
    return out


def test_reduce_res_has_the_datas_partitions():
    rejects(short_reduce_res, "err_num_partition_mismatch", f32(128, 64))


@nki.jit
def shuffle_into_another_dtype(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    d = nl.zeros((128, 64), dtype=nl.bfloat16)
    nisa.nc_stream_shuffle(src=t, dst=d, shuffle_mask=list(range(32)))  # BAD
    nl.store(out, d)
    return out


@nki.jit
def shuffle_into_a_narrower_tile(a):
    out = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    d = nl.zeros((128, 32), dtype=nl.float32)
    nisa.nc_stream_shuffle(src=t, dst=d, shuffle_mask=list(range(32)))  # BAD
    nl.store(out, d)
    return out


def test_a_shuffle_keeps_dtype_and_elements_per_partition():
    err = rejects(shuffle_into_another_dtype, "err_unsupported_dtype", f32(128, 64))
    assert "dst" in str(err) and "float32" in str(err)
    rejects(
        shuffle_into_a_narrower_tile, "err_store_dst_shape_smaller_than_other_shape", f32(128, 64)
    )


@nki.jit
def float_indices(a):
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(a)
    m = nisa.max8(src=t)
    i = nl.ndarray((128, 8), dtype=nl.float32)
    current().emit("nc_find_index8", [i.access], [t.access, m.access])  # BAD
    nl.store(out, i)
    return out


def test_find_index8_writes_unsigned_indices():
    err = rejects(float_indices, "err_unsupported_dtype", f32(128, 64))
    assert "dst 'i' must be uint16 or uint32" in str(err)


@nki.jit
def integer_matmul(a, b):
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    p = nisa.nc_matmul(x, y)  # BAD
    nl.store(out, nl.copy(p))
    return out


def test_matmul_reads_float_operands():
    ints = np.ones((128, 128), np.int8)
    err = rejects(integer_matmul, "err_unsupported_dtype", ints, ints)
    assert "stationary" in str(err)


# ---------------------------------------------------------------------------------------------
# legal: operands match by partitions x elements per partition


@nki.jit
def exp_into_a_3d_tile(a):
    out = nl.ndarray((128, 4, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)  # (128, 256)
    # emitted directly, as the NKI 0.x front end does: its dst may have another free shape
    d = nl.ndarray((128, 4, 64), dtype=nl.float32)
    current().emit("activation", [d.access], [t.access, 0.0, 1.0], {"op": "exp"})
    s = nl.ndarray((128, 4, 64), dtype=nl.float32)
    current().emit("dma_copy", [s.access], [a.access])  # HBM (128, 256) -> SBUF (128, 4, 64)
    nl.store(out, nl.add(d, s))
    return out


@pytest.mark.parametrize("simulate", [interp.simulate, fast.simulate], ids=["reference", "fast"])
def test_free_shapes_may_differ(simulate):
    x = f32(128, 256)
    kernel, _ = exp_into_a_3d_tile.specialize(x)
    (got,) = simulate(kernel, [x])
    np.testing.assert_allclose(got, (np.exp(x) + x).reshape(128, 4, 64), rtol=1e-6)
