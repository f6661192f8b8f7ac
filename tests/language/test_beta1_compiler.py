"""NKI Beta-1's ``nki.compiler`` names and the placement rules of the Beta-1 front end:

- direct allocation (``nki.compiler.sbuf`` / ``psum`` with ``mod_alloc`` and ``alloc``) places a
  tensor in that memory and is checked against the target's capacity at the user's line;
- the kernel decorators and loop ``directives=`` are accepted and change no result;
- ``nisa``'s Beta-1 engine constants name the ``nisa.engine`` members;
- language-level calls feed each other as on hardware (a PSUM result of ``nl.transpose`` or
  ``nl.matmul`` into ``nl.matmul`` goes through SBUF);
- a jitted function called inside a kernel is traced inline on the caller's tiles.

Bad kernels mark the offending line ``# BAD``.
"""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import ErrInvalidArgument
from nkikit.language.compiler import Allocation, user_allocation

rng = np.random.default_rng(3)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# -- direct allocation ---------------------------------------------------------------------


@nki.compiler.skip_middle_end_transformations
@nki.jit
def scale_rows_allocated(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    blocks = a.shape[0] // 128
    buf = nl.ndarray(
        (blocks, nl.par_dim(128), a.shape[1]),
        dtype=a.dtype,
        buffer=nki.compiler.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)),
    )
    acc = nl.ndarray(
        (blocks, nl.par_dim(128), 128),
        dtype=nl.float32,
        buffer=nki.compiler.psum.mod_alloc(base_bank=0, num_bank_tiles=(2,)),
    )
    for i in nl.affine_range(blocks):
        buf[i] = nl.load(a[i * 128 : (i + 1) * 128, :])
        acc[i] = nisa.nc_matmul(buf[i][:, 0:128], buf[i][:, 0:128])
        nl.store(out[i * 128 : (i + 1) * 128, :], value=nl.multiply(buf[i], 2.0))
    return out


def test_mod_alloc_places_tensors_and_changes_no_result():
    a = f32(512, 256)
    np.testing.assert_array_equal(scale_rows_allocated(a), a * 2)
    assert scale_rows_allocated.options["skip_middle_end_transformations"] is True
    ir = scale_rows_allocated.ir(a)
    placed = {t.name: user_allocation(t) for t in ir.tensors if user_allocation(t) is not None}
    assert {a.memory for a in placed.values()} == {"sbuf", "psum"}
    assert nki.profile_kernel(scale_rows_allocated, a, target="trn2").total_us > 0


@nki.jit
def sbuf_past_the_end(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    at = nki.compiler.sbuf.mod_alloc(base_addr=nl.tile_size.total_available_sbuf_size - 512)
    t = nl.ndarray((nl.par_dim(128), 256), dtype=nl.float32, buffer=at)  # BAD
    t[...] = nl.load(a)
    nl.store(out, value=t)
    return out


@nki.jit
def psum_past_the_last_bank(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    at = nki.compiler.psum.mod_alloc(base_bank=6, num_bank_tiles=(4,))
    t = nl.ndarray((4, nl.par_dim(128), 128), dtype=nl.float32, buffer=at)  # BAD
    t[0] = nl.load(a)
    nl.store(out, value=t[0])
    return out


@nki.jit
def func_alloc_off_the_partitions(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    at = nki.compiler.sbuf.alloc(lambda idx, pdim, fdim: (idx[0] * 64, 0))
    t = nl.ndarray((2, nl.par_dim(128), 128), dtype=nl.float32, buffer=at)  # BAD
    t[0] = nl.load(a)
    nl.store(out, value=t[0])
    return out


@pytest.mark.parametrize(
    "kernel", [sbuf_past_the_end, psum_past_the_last_bank, func_alloc_off_the_partitions]
)
def test_allocations_outside_the_memory_are_rejected(rejects, kernel):
    err = rejects(
        kernel,
        "err_allocation_out_of_bounds",
        f32(128, 128 if kernel is not sbuf_past_the_end else 256),
    )
    assert "out of bounds" in str(err)


@nki.jit
def func_alloc_in_bounds(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    at = nki.compiler.sbuf.alloc(lambda idx, pdim, fdim: (0, idx[0] * fdim))
    t = nl.ndarray((2, nl.par_dim(128), 128), dtype=nl.float32, buffer=at)
    t[0] = nl.load(a)
    t[1] = nl.exp(t[0])
    nl.store(out, value=t[1])
    return out


def test_func_alloc_in_bounds_runs():
    a = f32(128, 128)
    np.testing.assert_allclose(func_alloc_in_bounds(a), np.exp(a), rtol=1e-6)


def test_allocation_objects():
    at = nki.compiler.psum.mod_alloc(base_bank=1, num_bank_tiles=(2,))
    assert at == Allocation("psum", "mod", 1, (2,))
    assert nki.compiler.sbuf.auto_alloc() is nl.sbuf and nki.compiler.psum.auto_alloc() is nl.psum
    with pytest.raises(TypeError):
        nki.compiler.sbuf.alloc(3)


# -- directives and decorators -------------------------------------------------------------


@nki.compiler.enable_stack_allocator
@nki.compiler.force_auto_alloc
@nki.jit
def running_sum(a):
    out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((nl.par_dim(128), 1), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.sequential_range(a.shape[1] // 128, directives=nki.compiler.no_reorder()):
        t = nl.load(a[:, j * 128 : (j + 1) * 128])
        acc[...] = nl.add(acc, nl.sum(t, axis=1, keepdims=True))
    for _ in nl.affine_range(1, directives=[nki.compiler.multi_buffer(2)]):
        nl.store(out, value=acc)
    return out


def test_directives_and_decorators_change_no_result():
    a = f32(128, 512)
    np.testing.assert_allclose(running_sum(a), a.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-4)
    assert running_sum.options["force_auto_alloc"] is True
    assert running_sum.options["enable_stack_allocator"] == {"log_level": 50}


def test_a_directive_must_be_one():
    # named NKI errors, not Python's TypeError / ValueError from inside nkikit (issue #12)
    with pytest.raises(ErrInvalidArgument, match="directives="):
        nl.affine_range(4, directives="no_reorder")
    with pytest.raises(ErrInvalidArgument, match="factor"):
        nki.compiler.multi_buffer(0)


# -- engine constants ----------------------------------------------------------------------


def test_engine_constants_are_the_engine_members():
    assert nisa.tensor_engine is nisa.engine.tensor
    assert nisa.vector_engine is nisa.engine.vector
    assert nisa.scalar_engine is nisa.engine.scalar
    assert nisa.gpsimd_engine is nisa.engine.gpsimd
    assert nisa.unknown_engine is nisa.engine.unknown


@nki.jit
def scale_on(a, engine):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    nl.store(out, value=nisa.tensor_scalar(t, op0=nl.multiply, operand0=3.0, engine=engine))
    return out


@pytest.mark.parametrize("engine", ["vector_engine", "scalar_engine", "gpsimd_engine"])
def test_engine_constants_select_the_engine(engine):
    a = f32(128, 64)
    np.testing.assert_allclose(scale_on(a, getattr(nisa, engine)), a * 3, rtol=1e-6)


# -- placement of language-level results ---------------------------------------------------


@nki.jit
def chained_language_calls(x, y):
    out = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    xt = nl.transpose(nl.load(x))  # PSUM
    xy = nl.matmul(xt, nl.load(y), transpose_x=True)  # a PSUM operand of nl.matmul
    z = nl.matmul(nl.transpose(xy), nl.load(y), transpose_x=True)
    nl.store(out, value=z)
    return out


def test_psum_results_feed_the_next_language_call():
    x, y = f32(128, 128), f32(128, 128)
    want = (x @ y).T.T @ y
    np.testing.assert_allclose(chained_language_calls(x, y), want, rtol=1e-4, atol=1e-2)
    ops = [getattr(s, "prim", None) for s, _ in chained_language_calls.ir(x, y).walk()]
    assert ops.count("tensor_copy") >= 2  # each PSUM operand passed through SBUF


# -- a jitted function called inside a kernel ----------------------------------------------


@nki.jit
def add_into(a_tile, b_tile, out_tile):
    out_tile[...] = a_tile + b_tile


@nki.jit
def add_blocks(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0] // 128):
        at = nl.load(a[i * 128 : (i + 1) * 128, :])
        bt = nl.load(b[i * 128 : (i + 1) * 128, :])
        res = nl.ndarray((nl.par_dim(128), a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        add_into(at, bt, res)
        nl.store(out[i * 128 : (i + 1) * 128, :], value=res)
    return out


def test_a_jitted_function_is_traced_inline_on_the_callers_tiles():
    a, b = f32(384, 64), f32(384, 64)
    np.testing.assert_array_equal(add_blocks(a, b), a + b)


# -- nl.static_cast ------------------------------------------------------------------------


def test_static_cast_rounds_on_the_host():
    x = np.array([1.0, 1.00390625, 3.14159], dtype=np.float64)
    got = nl.static_cast(x, nl.bfloat16)
    assert got.dtype == nl.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), x.astype(nl.bfloat16).astype(np.float32))


@nki.jit
def mixed_precision_matmul(x, y):
    out = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.matmul(nl.load(x), nl.load(y), transpose_x=True))
    return out


def test_a_16_bit_operand_beside_a_float32_one_is_promoted():
    x, y = f32(128, 64), f32(128, 96).astype(nl.bfloat16)
    want = x.T @ y.astype(np.float32)
    np.testing.assert_allclose(mixed_precision_matmul(x, y), want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(mixed_precision_matmul(y, x), want.T, rtol=1e-4, atol=1e-3)


# -- direct allocation decides the footprint ------------------------------------------------


def _psum_blocks(a, b, acc):
    """acc[i] = a.T @ b[:, block i] for 16 bank-sized blocks, all written before any is read
    (so all 16 are live at once unless they alias)."""
    out = nl.ndarray((16, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    ta = nl.load(a)
    for i in nl.affine_range(16):
        acc[i] = nisa.nc_matmul(ta, nl.load(b[:, nl.ds(i * 512, 512)]))
    for i in nl.affine_range(16):
        nl.store(out[i], value=nl.copy(acc[i]))
    return out


@nki.jit
def sixteen_banks_mod_alloc(a, b):
    at = nki.compiler.psum.mod_alloc(base_bank=0, num_bank_tiles=(4,))
    acc = nl.ndarray((16, nl.par_dim(128), 512), dtype=nl.float32, buffer=at)
    return _psum_blocks(a, b, acc)


@nki.jit
def sixteen_banks_auto(a, b):
    acc = nl.ndarray((16, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    return _psum_blocks(a, b, acc)


def test_mod_alloc_footprint_is_the_allocated_banks(monkeypatch):
    """16 bank-sized blocks in 4 banks (blocks aliasing modulo 4) fit PSUM's 8 banks; the same
    tensor allocated automatically needs 16 banks, so the compiler keeps it in SBUF
    (``nkikit/language/eviction.py``).  Both simulators agree bit for bit (they
    keep every block apart: this kernel would read aliased blocks on hardware, which nkikit
    does not model)."""
    a, b = f32(128, 128), f32(128, 16 * 512)
    monkeypatch.setenv("NKIKIT_SIM", "check")
    want = np.stack([a.T @ b[:, i * 512 : (i + 1) * 512] for i in range(16)])
    np.testing.assert_allclose(sixteen_banks_mod_alloc(a, b), want, rtol=1e-4, atol=1e-3)
    acc = next(t for t in sixteen_banks_mod_alloc.ir(a, b).tensors if t.buffer == "psum")
    assert acc.user_span == (0, 4 * 2048)
    np.testing.assert_allclose(sixteen_banks_auto(a, b), want, rtol=1e-4, atol=1e-3)
    auto = next(t for t in sixteen_banks_auto.ir(a, b).tensors if t.name == "acc")
    assert auto.buffer == "sbuf"
