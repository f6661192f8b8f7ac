"""The verifier (nkikit/ir/verify.py): every rule rejects a small bad kernel with the NKI
error name and the line of the offending statement, and legal patterns pass (and simulate
correctly).

Each bad kernel marks its offending line with ``# BAD``; ``rejects`` checks that the error
points there.  Statements under test stay on one line so the line is unambiguous.
"""

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
from nkikit.ir.verify import verify
from nkikit.targets import TARGETS, get_target

HERE = os.path.abspath(__file__)
NKIKIT_DIR = os.path.dirname(os.path.abspath(nki.__file__))
rng = np.random.default_rng(0)


def bad_line(kernel: nki.JitKernel) -> int:
    """The line of ``kernel`` marked ``# BAD``."""
    lines, start = inspect.getsourcelines(kernel.func)
    hits = [start + i for i, text in enumerate(lines) if "# BAD" in text]
    assert len(hits) == 1, f"{kernel.func.__name__} must mark exactly one line with # BAD"
    return hits[0]


def rejects(kernel: nki.JitKernel, name: str, *args, **kwargs) -> NkiError:
    """Trace ``kernel`` and expect the verifier (or tracer) to raise ``name`` at ``# BAD``."""
    with pytest.raises(NkiError) as info:
        kernel.ir(*args, **kwargs)
    err = info.value
    assert err.name == name, str(err)
    assert os.path.abspath(err.loc.file) == HERE, str(err)
    assert err.loc.line == bad_line(kernel), str(err)
    return err


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# rule 1: partitions <= 128


@nki.jit
def big_partition_buffer(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.sbuf)  # BAD
    buf[0:128, :] = nl.load(a)
    nl.store(out, value=buf[0:128, :])
    return out


@nki.jit
def big_partition_tile(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)  # BAD
    nl.store(out, value=t[0:128, :])
    return out


def test_partition_limit_of_a_buffer():
    err = rejects(big_partition_buffer, "err_num_partition_exceed_arch_limit", f32(128, 64))
    assert "256" in str(err) and "128" in str(err)


def test_partition_limit_of_an_instruction_tile():
    rejects(big_partition_tile, "err_num_partition_exceed_arch_limit", f32(256, 64))


# ---------------------------------------------------------------------------------------------
# rule 2: PSUM tiles and matmul limits


@nki.jit
def psum_tile_too_wide(a):
    out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 1024), dtype=nl.float32, buffer=nl.psum)  # BAD
    nl.store(out, value=acc)
    return out


@nki.jit
def matmul_wide_stationary(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    p = nisa.nc_matmul(xs, ys)  # BAD
    nl.store(out, value=p[0:128, :])
    return out


@nki.jit
def matmul_wide_moving(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    p = nisa.nc_matmul(xs, ys)  # BAD
    nl.store(out, value=p[:, 0:512])
    return out


@nki.jit
def matmul_contraction_mismatch(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    p = nisa.nc_matmul(xs, ys)  # BAD
    nl.store(out, value=p)
    return out


@nki.jit
def matmul_reads_psum(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    xt = nisa.nc_transpose(xs)
    p = nisa.nc_matmul(xt, ys)  # BAD
    nl.store(out, value=p)
    return out


def test_psum_tile_is_one_bank():
    err = rejects(psum_tile_too_wide, "err_psum_capacity_exceeded", f32(1, 1))
    assert "4096" in str(err) and "2048" in str(err)


def test_matmul_stationary_free_size():
    err = rejects(
        matmul_wide_stationary,
        "err_size_of_dimension_exceed_arch_limit",
        f32(128, 256),
        f32(128, 512),
    )
    assert "stationary" in str(err) and "256" in str(err)


def test_matmul_moving_free_size():
    err = rejects(
        matmul_wide_moving, "err_size_of_dimension_exceed_arch_limit", f32(128, 128), f32(128, 1024)
    )
    assert "moving" in str(err) and "1024" in str(err)


def test_matmul_contraction_must_match():
    rejects(matmul_contraction_mismatch, "err_num_partition_mismatch", f32(128, 128), f32(64, 512))


def test_matmul_inputs_must_be_in_sbuf():
    err = rejects(matmul_reads_psum, "err_unsupported_memory", f32(128, 128), f32(128, 512))
    assert "stationary" in str(err) and "PSUM" in str(err)


# ---------------------------------------------------------------------------------------------
# rule 3: legal memories per engine


@nki.jit
def dma_from_psum(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    p = nisa.nc_matmul(nl.load(x), nl.load(y))
    nisa.dma_copy(dst=out, src=p)  # BAD
    return out


@nki.jit
def exp_of_hbm(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    e = nl.exp(a)  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def add_two_psum_tiles(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    p, q = nisa.nc_matmul(xs, ys), nisa.nc_matmul(xs, ys)
    s = nisa.tensor_tensor(p, q, op=nl.add)  # BAD
    nl.store(out, value=s)
    return out


@nki.jit
def gpsimd_reads_psum(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    p = nisa.nc_matmul(nl.load(x), nl.load(y))
    c = nisa.tensor_copy(p, engine=nisa.engine.gpsimd)  # BAD
    nl.store(out, value=c)
    return out


@nki.jit
def partition_reduce_of_psum(x, y):
    out = nl.ndarray((1, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    p = nisa.nc_matmul(nl.load(x), nl.load(y))
    r = nisa.tensor_partition_reduce(np.add, p)  # BAD
    nl.store(out, value=r)
    return out


def test_dma_cannot_touch_psum():
    err = rejects(dma_from_psum, "err_unsupported_memory", f32(128, 128), f32(128, 512))
    assert "dma_copy" in str(err) and "src" in str(err) and "PSUM" in str(err)


def test_compute_engines_cannot_read_hbm():
    err = rejects(exp_of_hbm, "err_unsupported_memory", f32(128, 64))
    assert "activation" in str(err) and "HBM" in str(err)


def test_tensor_tensor_inputs_not_both_in_psum():
    err = rejects(add_two_psum_tiles, "err_unsupported_memory", f32(128, 128), f32(128, 512))
    assert "both in PSUM" in str(err)


def test_gpsimd_cannot_read_psum():
    rejects(gpsimd_reads_psum, "err_unsupported_memory", f32(128, 128), f32(128, 512))
    rejects(partition_reduce_of_psum, "err_unsupported_memory", f32(128, 128), f32(128, 512))


# ---------------------------------------------------------------------------------------------
# rule 4: masks


@nki.jit
def mask_on_missing_axis(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    m = nl.mgrid[0:128, 0:64, 0:2]
    e = nl.exp(t, mask=(m.y < 1))  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def mask_not_equal(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    i = nl.arange(128)[:, None]
    e = nl.exp(t, mask=(i != 3))  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def affine_select_two_clauses(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:128, 0:64]
    m = nisa.affine_select((ip - jf >= 0) & (jf < 32), nl.load(a), -1.0)  # BAD
    nl.store(out, value=m)
    return out


def test_mask_axes_must_exist():
    err = rejects(mask_on_missing_axis, "err_unsupported_expression_in_mask", f32(128, 64))
    assert "tile axis 2" in str(err)


def test_mask_cannot_use_not_equal():
    rejects(mask_not_equal, "err_unsupported_expression_in_mask", f32(128, 64))


def test_affine_select_takes_one_comparison():
    rejects(affine_select_two_clauses, "err_unsupported_expression_in_mask", f32(128, 64))


# ---------------------------------------------------------------------------------------------
# rule 5: distinct writes per affine_range iteration (and per SPMD instance)


@nki.jit
def same_sbuf_location_every_iteration(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(4):
        buf[...] = nl.load(a[:, nl.ds(i * 64, 64)])  # BAD
    nl.store(out, value=buf)
    return out


@nki.jit
def same_sbuf_location_sequential(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.sequential_range(4):
        buf[...] = nl.load(a[:, nl.ds(i * 64, 64)])
    nl.store(out, value=buf)
    return out


@nki.jit
def same_output_location_every_iteration(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.load(a[:, nl.ds(i * 64, 64)])
        nl.store(out, value=t)  # BAD
    return out


@nki.jit
def spmd_instances_write_same_tile(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a[nl.ds(nl.program_id(0) * 128, 128), :])
    nl.store(out, value=t)  # BAD
    return out


@nki.jit
def one_iteration_writes(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.load(a[:, nl.ds(i * 64, 64)])
        nl.store(out, value=t, mask=(i == 2))
    return out


@nki.jit
def one_instance_writes(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a), mask=(nl.program_id(0) == 0))
    return out


def test_a_write_selected_by_a_mask_is_distinct():
    a = f32(128, 256)
    np.testing.assert_array_equal(one_iteration_writes(a), a[:, 128:192])
    np.testing.assert_array_equal(one_instance_writes[3](a[:, :64]), a[:, :64])


def test_affine_range_writes_must_be_distinct():
    err = rejects(
        same_sbuf_location_every_iteration, "err_unexpected_output_dependencies", f32(128, 256)
    )
    assert "'i'" in str(err) and "buf" in str(err)
    rejects(
        same_output_location_every_iteration, "err_unexpected_output_dependencies", f32(128, 256)
    )


def test_sequential_range_may_write_one_location():
    a = f32(128, 256)
    np.testing.assert_array_equal(same_sbuf_location_sequential(a), a[:, 192:256])


def test_spmd_instances_must_write_distinct_locations():
    rejects(spmd_instances_write_same_tile[2], "err_spmd_output_dependencies", f32(256, 64))


# ---------------------------------------------------------------------------------------------
# rule 6: scoping (tracer) and loop variables (verifier)


@nki.jit
def tile_used_out_of_scope(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(a[:, nl.ds(i * 64, 64)])
    nl.store(out, value=t)  # BAD
    return out


@nki.jit
def loop_variable_used_out_of_scope(a):
    out = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(a[:, nl.ds(i * 64, 64)])
        nl.store(out[:, nl.ds(i * 64, 64)], value=t)
    nl.store(out[:, nl.ds(i * 64, 64)], value=nl.load(a[:, 0:64]))  # BAD
    return out


def test_tile_used_outside_its_loop():
    rejects(tile_used_out_of_scope, "err_local_variable_used_out_of_scope", f32(128, 128))


def test_loop_variable_used_outside_its_loop():
    err = rejects(
        loop_variable_used_out_of_scope, "err_loop_variable_used_out_of_scope", f32(128, 128)
    )
    assert "'i'" in str(err)


# ---------------------------------------------------------------------------------------------
# rule 7: outputs are written


@nki.jit
def output_never_written(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)  # BAD
    nl.load(a)
    return out


@nki.jit
def output_written_in_dead_loop(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)  # BAD
    for _ in nl.affine_range(a.shape[0] // 256):
        nl.store(out, value=nl.load(a))
    return out


def test_output_must_be_written():
    rejects(output_never_written, "err_tensor_output_not_written_to", f32(128, 64))
    rejects(output_written_in_dead_loop, "err_tensor_output_not_written_to", f32(128, 64))


@nki.jit
def returns_a_reshape(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a))
    return out.reshape((64, 128))


def test_returned_reshape_is_written_through_its_base():
    a = f32(128, 64)
    np.testing.assert_array_equal(returns_a_reshape(a), a.reshape(64, 128))


# ---------------------------------------------------------------------------------------------
# rule 8: partition counts match


@nki.jit
def tensor_scalar_partition_mismatch(a, s):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t, st = nl.load(a), nl.load(s)
    r = nisa.tensor_scalar(t, np.multiply, st)  # BAD
    nl.store(out, value=r)
    return out


@nki.jit
def activation_bias_partition_mismatch(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t, bt = nl.load(a), nl.load(b)
    r = nisa.activation(np.exp, t, bias=bt)  # BAD
    nl.store(out, value=r)
    return out


def test_scalar_operand_partitions_match_data():
    rejects(
        tensor_scalar_partition_mismatch, "err_num_partition_mismatch", f32(128, 64), f32(64, 1)
    )
    rejects(
        activation_bias_partition_mismatch, "err_num_partition_mismatch", f32(128, 64), f32(64, 1)
    )


# ---------------------------------------------------------------------------------------------
# rule 9: activation bias and scale


@nki.jit
def activation_bias_int(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    b = nisa.memset((128, 1), 1, dtype=nl.int8)
    r = nisa.activation(np.exp, nl.load(a), bias=b)  # BAD
    nl.store(out, value=r)
    return out


@nki.jit
def activation_scale_fp16(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    s = nisa.memset((128, 1), 1.5, dtype=nl.float16)
    r = nisa.activation(np.exp, nl.load(a), scale=s)  # BAD
    nl.store(out, value=r)
    return out


@nki.jit
def activation_scale_matrix(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    s = nisa.memset((128, 4), 1.5, dtype=nl.float32)
    r = nisa.activation(np.exp, nl.load(a), scale=s)  # BAD
    nl.store(out, value=r)
    return out


@nki.jit
def activation_bias_and_scale_ok(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    b = nisa.memset((128, 1), 0.5, dtype=nl.bfloat16)
    s = nisa.memset((128, 1), 2.0, dtype=nl.float32)
    nl.store(out, value=nisa.activation(np.exp, nl.load(a), bias=b, scale=s))
    return out


def test_activation_bias_dtype():
    rejects(activation_bias_int, "err_activation_bias_invalid_type", f32(128, 8))


def test_activation_scale_dtype_and_shape():
    rejects(activation_scale_fp16, "err_activation_scale_invalid_type", f32(128, 8))
    rejects(activation_scale_matrix, "err_activation_scale_scalar_or_vector", f32(128, 8))


def test_activation_vector_bias_and_scale_pass():
    a = f32(128, 8)
    np.testing.assert_allclose(activation_bias_and_scale_ok(a), np.exp(a * 2 + 0.5), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# rule 10: static bounds


@nki.jit
def store_past_the_end(a):
    out = nl.ndarray((128, 4000), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range((4000 + 511) // 512):
        tile = nl.mgrid[0:128, 0:512]
        nl.store(out[tile.p, i * 512 + tile.x], value=0.0)  # BAD
    return out


@nki.jit
def store_past_the_end_masked(a):
    out = nl.ndarray((128, 4000), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range((4000 + 511) // 512):
        tile = nl.mgrid[0:128, 0:512]
        nl.store(out[tile.p, i * 512 + tile.x], value=1.0, mask=(i * 512 + tile.x < 4000))
    return out


@nki.jit
def spmd_read_past_the_end(a):
    out = nl.ndarray((384, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:128, 0:64]
    pid = nl.program_id(0)
    t = nl.load(a[pid * 128 + ip, jf])  # BAD
    nl.store(out[pid * 128 + ip, jf], value=t)
    return out


def test_out_of_bounds_names_tensor_dim_index_and_size():
    err = rejects(store_past_the_end, "err_tensor_access_out_of_bound", f32(1, 1))
    text = str(err)
    assert "out" in text and "dimension 1" in text and "4095" in text and "4000" in text


def test_masked_ragged_store_passes():
    out = store_past_the_end_masked(f32(1, 1))
    assert out.shape == (128, 4000) and (out == 1).all()


def test_out_of_bounds_over_the_spmd_grid():
    err = rejects(spmd_read_past_the_end[3], "err_tensor_access_out_of_bound", f32(256, 64))
    assert "383" in str(err) and "256" in str(err)


# ---------------------------------------------------------------------------------------------
# rule 11: immutable parameters


@nki.jit
def writes_its_input(a):
    t = nl.load(a)
    nl.store(a, value=nl.add(t, 1.0))  # BAD


@nki.jit
def writes_mutable_input(a: nt.mutable_tensor, b):
    t = nl.load(a)
    nl.store(a, value=nl.add(t, 1.0))
    out = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(b))
    return out


def test_parameters_are_immutable():
    rejects(writes_its_input, "err_cannot_update_immutable_parameter", f32(128, 8))


def test_mutable_parameters_can_be_written():
    a, b = f32(128, 8), f32(128, 8)
    expected = a + 1
    writes_mutable_input(a, b)
    np.testing.assert_allclose(a, expected)


# ---------------------------------------------------------------------------------------------
# rule 12: SBUF and PSUM capacity


@nki.jit
def sbuf_overflow(a):
    out = nl.ndarray((128, 24576), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.exp(x)
    z = nl.add(x, y)  # BAD
    nl.store(out, value=z)
    return out


@nki.jit
def sbuf_over_capacity_until_spilled(a):
    out = nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.shared_hbm)
    x0 = nl.load(a)
    x1 = nl.exp(x0)
    x2 = nl.exp(x1)
    x3 = nl.exp(x2)
    nl.store(out, value=nl.add(nl.add(x0, x1), nl.add(x2, x3)))
    return out


@nki.jit
def sbuf_reused_across_iterations(a):
    out = nl.ndarray((128, 8 * 16384), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(8):
        x = nl.load(a)
        nl.store(out[:, nl.ds(i * 16384, 16384)], value=nl.exp(x))
    return out


@nki.jit
def sbuf_dead_tiles_free_space(a):
    out = nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    for _ in nl.static_range(6):
        x = nl.exp(x)
    nl.store(out, value=x)
    return out


@nki.jit
def psum_overflow(x, y):
    # accumulation groups stay in PSUM (the compiler does not move a tensor that is added into),
    # so nine live 2 KiB groups cannot fit eight banks
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ys = nl.load(x), nl.load(y)
    groups = []
    for _ in range(8):
        g = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        g += nisa.nc_matmul(xs, ys)
        groups.append(g)
    last = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)  # BAD
    last += nisa.nc_matmul(xs, ys)
    acc = nl.copy(last)
    for g in groups:
        acc = nl.add(acc, g)
    nl.store(out, value=acc)
    return out


def test_sbuf_capacity_names_the_tensors_one_instruction_needs_at_once():
    # x, y and z (96 KiB per partition each) are all in use by the add: no spill can help
    err = rejects(sbuf_overflow, "err_sbuf_capacity_exceeded", f32(128, 24576))
    text = str(err)
    assert "294912" in text and "229376" in text  # trn2: 224 KiB per partition
    for name in ("x", "y", "z"):
        assert f"{name} (98304 B, test_verify.py:" in text
    assert "spilling cannot free them" in text


def test_sbuf_over_capacity_is_accepted_when_idle_tiles_can_spill():
    # four 64 KiB tiles are live at the first add (256 KiB > 224 KiB), but x2 and x3 are
    # idle there: the Neuron compiler spills them, so the kernel is legal and runs
    a = rng.uniform(-1, 0, (128, 16384)).astype(np.float32)
    x0 = a
    x1 = np.exp(x0)
    x2 = np.exp(x1)
    x3 = np.exp(x2)
    out = sbuf_over_capacity_until_spilled(a)
    np.testing.assert_allclose(out, (x0 + x1) + (x2 + x3), rtol=1e-5)


def test_sbuf_buffers_are_reused_by_loops_and_freed_when_dead():
    a = rng.random((128, 16384)).astype(np.float32)
    sbuf_reused_across_iterations.ir(a)
    sbuf_dead_tiles_free_space.ir(a)


def test_psum_capacity():
    err = rejects(psum_overflow, "err_psum_total_capacity_exceeded", f32(128, 128), f32(128, 512))
    assert "18432" in str(err) and "16384" in str(err)


def test_capacity_follows_the_target():
    a = rng.random((128, 16384)).astype(np.float32)
    kernel = sbuf_dead_tiles_free_space.ir(a)  # two 64 KiB tiles live at once
    verify(kernel, target="trn2")
    with pytest.raises(NkiError) as info:
        verify(kernel, target=TARGETS["trn2"].with_overrides(name="tiny", sbuf_bytes=100 * 1024))
    assert info.value.name == "err_sbuf_capacity_exceeded"
    assert get_target("gen3") is TARGETS["trn2"]
    with pytest.raises(ValueError, match="unknown target"):
        get_target("trn9")


# ---------------------------------------------------------------------------------------------
# rule 13: per-instruction sizes and dimensions


@nki.jit
def bn_stats_too_wide(a):
    out = nl.ndarray((128, 6), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nisa.bn_stats(nl.load(a))  # BAD
    nl.store(out, value=s)
    return out


@nki.jit
def vector_op_too_wide(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    e = nl.exp(t)  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def six_dim_tile(a):
    out = nl.ndarray((2, 2, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 2, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.sbuf)
    e = nl.exp(t)  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def transpose_too_wide(a):
    out = nl.ndarray((256, 128), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.transpose(nl.load(a))  # BAD
    nl.store(out, value=t)
    return out


def test_bn_stats_free_size():
    err = rejects(bn_stats_too_wide, "err_size_of_dimension_exceed_arch_limit", f32(128, 1024))
    assert "bn_stats" in str(err) and "512" in str(err)


def test_vector_scalar_free_size():
    a = np.zeros((128, 70000), dtype=nl.bfloat16)
    err = rejects(vector_op_too_wide, "err_size_of_dimension_exceed_arch_limit", a)
    assert "70000" in str(err) and "65536" in str(err)


def test_at_most_four_free_dimensions():
    rejects(six_dim_tile, "err_exceed_max_supported_dimension", f32(1, 1))


def test_tensor_engine_transpose_size():
    rejects(transpose_too_wide, "err_size_of_dimension_exceed_arch_limit", f32(128, 256))


# ---------------------------------------------------------------------------------------------
# rule 14: matmul dtypes


@nki.jit
def matmul_fp32_with_bf16(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    p = nisa.nc_matmul(nl.load(x), nl.load(y, dtype=nl.bfloat16))  # BAD
    nl.store(out, value=p)
    return out


@nki.jit
def matmul_fp8_with_bf16(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    p = nisa.nc_matmul(nl.load(x, dtype=nl.float8_e4m3), nl.load(y, dtype=nl.bfloat16))
    nl.store(out, value=p)
    return out


def test_matmul_fp32_only_with_fp32():
    err = rejects(matmul_fp32_with_bf16, "err_matmul_dtype_mismatch", f32(128, 128), f32(128, 512))
    assert "float32" in str(err) and "bfloat16" in str(err)


def test_matmul_low_precision_mix_passes():
    matmul_fp8_with_bf16.ir(f32(128, 128), f32(128, 512))


# ---------------------------------------------------------------------------------------------
# rule 15: tile axis 0 is the partition dimension


@nki.jit
def partition_strided_read(a):
    out = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    ip, jf = nl.mgrid[0:64, 0:64]
    e = nl.exp(t[2 * ip, jf])  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def transposed_sbuf_read(a):
    out = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    ip, jf = nl.mgrid[0:128, 0:128]
    e = nl.exp(t[jf, ip])  # BAD
    nl.store(out, value=e)
    return out


@nki.jit
def compute_on_blocked_tensor(a):
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.zeros((4, nl.par_dim(128), 64), dtype=nl.float32, buffer=nl.sbuf)
    e = nl.exp(buf)  # BAD
    nl.store(out, value=e[0])
    return out


@nki.jit
def transposed_hbm_read(a):
    out = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:64, 0:128]
    t = nl.load(a[jf, ip])
    nl.store(out, value=t)
    return out


def test_no_partition_striding():
    err = rejects(
        partition_strided_read, "err_leading_dimension_of_tensor_must_be_partition", f32(128, 64)
    )
    assert "stride 2" in str(err)


def test_partition_axis_of_an_sbuf_access():
    rejects(
        transposed_sbuf_read, "err_leading_dimension_of_tensor_must_be_partition", f32(128, 128)
    )
    rejects(
        compute_on_blocked_tensor, "err_leading_dimension_of_tensor_must_be_partition", f32(1, 1)
    )


def test_dma_may_read_hbm_in_any_order():
    a = f32(128, 64)
    np.testing.assert_array_equal(transposed_hbm_read(a), a.T)


# ---------------------------------------------------------------------------------------------
# legal patterns: each must verify and simulate correctly


@nki.jit
def psum_accumulation(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        acc = nl.zeros((128, N), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            a = nl.load(lhsT[nl.ds(k * 128, 128), nl.ds(m * 128, 128)])
            b = nl.load(rhs[nl.ds(k * 128, 128), :])
            acc += nl.matmul(a, b, transpose_x=True)
        nl.store(out[nl.ds(m * 128, 128), :], value=nl.copy(acc))
    return out


@nki.jit
def isa_psum_accumulation(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((M, N), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        acc[...] += nisa.nc_matmul(lhsT[nl.ds(k * 128, 128), :], rhs[nl.ds(k * 128, 128), :])
    nl.store(out, value=acc)
    return out


def test_psum_accumulation_in_affine_range():
    lhsT, rhs = f32(256, 256), f32(256, 512)
    ir = psum_accumulation.ir(lhsT, rhs)
    assert "nc_matmul" in str(ir) and "accumulate" in str(ir)
    np.testing.assert_allclose(psum_accumulation(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-3)


def test_isa_matmul_accumulation_reads_sbuf():
    @nki.jit
    def kernel(lhsT, rhs):
        K, M = lhsT.shape
        out = nl.ndarray((M, rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((M, rhs.shape[1]), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            a = nl.load(lhsT[nl.ds(k * 128, 128), :])
            b = nl.load(rhs[nl.ds(k * 128, 128), :])
            acc[...] += nisa.nc_matmul(a, b)
        nl.store(out, value=acc)
        return out

    lhsT, rhs = f32(384, 64), f32(384, 256)
    np.testing.assert_allclose(kernel(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-3)
    # the same kernel reading HBM directly is rejected: TensorE only reads SBUF
    with pytest.raises(NkiError) as info:
        isa_psum_accumulation.ir(lhsT, rhs)
    assert info.value.name == "err_unsupported_memory"


@nki.jit
def sbuf_accumulation(a):
    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(a.shape[1] // 64):
        x = nl.load(a[:, nl.ds(i * 64, 64)])
        acc[...] += x
    nl.store(out, value=acc)
    return out


def test_sbuf_accumulation_in_affine_range():
    a = f32(128, 256)
    np.testing.assert_allclose(
        sbuf_accumulation(a), a.reshape(128, 4, 64).sum(1), rtol=1e-5, atol=1e-5
    )


@nki.jit
def ragged_rows(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(a.shape[1])[None, :]
    for i in nl.affine_range((a.shape[0] + 127) // 128):
        rows = i * 128 + ip < a.shape[0]
        t = nl.load(a[i * 128 + ip, jf], mask=rows)
        r = nl.rsqrt(nl.mean(nl.square(t), axis=[1], mask=rows), mask=rows)
        nl.store(out[i * 128 + ip, jf], value=nl.multiply(t, r, mask=rows), mask=rows)
    return out


def test_masks_on_ragged_last_tile():
    a = f32(200, 96)
    ref = a / np.sqrt(np.mean(a * a, axis=1, keepdims=True))
    np.testing.assert_allclose(ragged_rows(a), ref, rtol=1e-4, atol=1e-5)


@nki.jit
def blocked_buffer(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nb = a.shape[0] // 128
    buf = nl.zeros((nb, nl.par_dim(128), a.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    for b in nl.affine_range(nb):
        buf[b] = nl.load(a[nl.ds(b * 128, 128), :])
    for b in nl.affine_range(nb):
        nl.store(out[nl.ds(b * 128, 128), :], value=nl.exp(buf[b]))
    return out


def test_block_dims_before_par_dim():
    a = f32(384, 32)
    np.testing.assert_allclose(blocked_buffer(a), np.exp(a), rtol=1e-5)


@nki.jit
def load_transposed(a):
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load_transpose2d(a))
    return out


def test_load_transpose2d():
    a = f32(64, 128)
    np.testing.assert_array_equal(load_transposed(a), a.T)


@nki.jit
def broadcast_rows(a, g):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    gt = nl.load(g.reshape((1, g.shape[0])))
    gb = gt.broadcast_to((128, g.shape[0]))
    cb = nl.load(a[:, 0:1]).broadcast_to((128, g.shape[0]))
    nl.store(out, value=nl.add(nl.multiply(nl.load(a), gb), cb))
    return out


def test_broadcast_to():
    a, g = f32(128, 32), f32(32)
    np.testing.assert_allclose(broadcast_rows(a, g), a * g + a[:, :1], rtol=1e-5, atol=1e-6)


@nki.jit
def spmd_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:128, 0:256]
    r, c = nl.program_id(0) * 128, nl.program_id(1) * 256
    nl.store(
        out[r + ip, c + jf], value=nl.add(nl.load(a[r + ip, c + jf]), nl.load(b[r + ip, c + jf]))
    )
    return out


def test_spmd_grid():
    a, b = f32(256, 512), f32(256, 512)
    np.testing.assert_allclose(spmd_add[2, 2](a, b), a + b, rtol=1e-6)


@nki.jit
def causal_mask_from_psum(q, k):
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nisa.nc_matmul(nl.load(q), nl.load(k))
    ip, jf = nl.mgrid[0:128, 0:128]
    m = nisa.affine_select(ip - jf >= 0, s, -1e4)
    nl.store(out, value=m)
    return out


def test_affine_select_of_a_psum_tile_is_staged_through_sbuf():
    q, k = f32(64, 128), f32(64, 128)
    ir = causal_mask_from_psum.ir(q, k)
    assert "tensor_copy" in str(ir)
    s = q.T @ k
    ref = np.where(np.tril(np.ones_like(s)) > 0, s, -1e4)
    np.testing.assert_allclose(causal_mask_from_psum(q, k), ref, rtol=1e-4, atol=1e-3)


@nki.jit
def transpose_into_sbuf(a):
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.sbuf)
    t[...] = nisa.nc_transpose(nl.load(a))
    nl.store(out, value=t)
    return out


def test_tensor_engine_result_assigned_into_sbuf_goes_through_psum():
    a = f32(64, 96)
    ir = str(transpose_into_sbuf.ir(a))
    assert "psum" in ir and "tensor_copy" in ir
    np.testing.assert_array_equal(transpose_into_sbuf(a), a.T)


@nki.jit
def hbm_scratch_per_iteration(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[1] // 64):
        scratch = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.hbm)
        nl.store(scratch, value=nl.load(a[:, nl.ds(i * 64, 64)]))
        nl.store(out[:, nl.ds(i * 64, 64)], value=nl.exp(nl.load(scratch)))
    return out


def test_private_hbm_scratch_created_inside_the_loop():
    a = f32(128, 192)
    np.testing.assert_allclose(hbm_scratch_per_iteration(a), np.exp(a), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# errors reach the user as their own line


def test_error_message_shows_the_users_line():
    with pytest.raises(NkiError) as info:
        exp_of_hbm.ir(f32(128, 64))
    text = str(info.value)
    line = bad_line(exp_of_hbm)
    assert text.startswith(f"test_verify.py:{line}: err_unsupported_memory: ")
    assert text.rstrip().endswith("e = nl.exp(a)  # BAD")


def test_calling_a_rejected_kernel_hides_nkikit_frames():
    with pytest.raises(NkiError) as info:
        writes_its_input(f32(128, 8))
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((os.path.abspath(code.co_filename), code.co_name))
        tb = tb.tb_next
    assert frames[0][0] == HERE, "the traceback starts at the caller"
    # Only the API boundary that re-raises (JitKernel.__call__, marked __tracebackhide__)
    # may remain: no frames of the tracer, verifier or simulator.
    internal = [f for f, fn in frames if f.startswith(NKIKIT_DIR + os.sep) and fn != "__call__"]
    assert not internal, frames
    assert info.value.__cause__ is None and info.value.__suppress_context__
