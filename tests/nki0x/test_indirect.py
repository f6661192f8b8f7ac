"""NeuronCore-v4 tensor indirection, ``NkiTensor.indirect(index, num_elem=None)``
[reference/nki-0x.md §3.8]: column ``i`` of the view is the column of the tensor at offset
``index[i % G, i // G]``, G = 16 on the Vector/Scalar/GpSimd engines and 32 on the Tensor
engine.  Gathers and scatters against numpy models written here (the directory's conftest runs
every kernel on both simulators, which must agree bit for bit), and every rule refused with
its named error at the kernel's own line."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nki0x_helpers import evacuate as _evacuate
from nki0x_helpers import load as _load
from nki0x_helpers import rejects
from nki0x_helpers import store as _store

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

rng = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


def snake(index: np.ndarray, n: int, g: int) -> np.ndarray:
    """The offsets an indirect view of ``n`` elements reads on an engine of group ``g``."""
    return np.array([index[i % g, i // g] for i in range(n)], dtype=np.int64)


def offsets(p: int, k: int, width: int) -> np.ndarray:
    """A (p, k) uint16 index tile of offsets below ``width``."""
    return rng.integers(0, width, size=(p, k)).astype(np.uint16)


def distinct(p: int, k: int, width: int, n: int, g: int) -> np.ndarray:
    """``offsets`` whose first ``n`` in snake order (group ``g``) differ: a scatter through
    them writes each column once."""
    idx = offsets(p, k, width)
    for i, c in enumerate(rng.permutation(width)[:n]):
        idx[i % g, i // g] = c
    return idx


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- gathers and scatters on the Vector / Scalar engines (G = 16) ------------------------------


@nki.jit
def copy_gather(x, idx, n: int, engine=nisa.engine.vector):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], n), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i, num_elem=n), engine=engine)
    return _store(d)


@pytest.mark.parametrize("n", [1, 5, 16, 48, 128])
@pytest.mark.parametrize("engine", [nisa.engine.vector, nisa.engine.scalar])
def test_tensor_copy_gathers_columns_in_snake_order(n, engine):
    x, idx = f32(128, 96), offsets(128, 8, 96)
    got = copy_gather(x, idx, n, engine)
    np.testing.assert_array_equal(got, x[:, snake(idx, n, 16)])


def test_num_elem_defaults_to_the_index_size():
    @nki.jit
    def k(x, idx):
        t, i = _load(x), _load(idx)
        v = t.indirect(i)
        assert v.shape == (16, idx.size) and v.is_indirect()
        d = nl.ndarray(v.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=d, src=v)
        return _store(d)

    x, idx = f32(16, 40), offsets(16, 3, 40)
    np.testing.assert_array_equal(k(x, idx), x[:, snake(idx, 48, 16)])


def test_tensor_copy_scatters_into_the_indirect_columns():
    @nki.jit
    def k(x, v, idx):
        t, s, i = _load(x), _load(v), _load(idx)
        nisa.tensor_copy(dst=t.indirect(i, num_elem=v.shape[1]), src=s)
        return _store(t)

    x, v, idx = f32(64, 80), f32(64, 32), distinct(64, 2, 80, 32, 16)
    want = x.copy()
    want[:, snake(idx, 32, 16)] = v
    np.testing.assert_array_equal(k(x, v, idx), want)


def test_a_view_with_free_dimensions_counts_its_elements_row_major():
    @nki.jit
    def k(x, idx):
        t, i = _load(x), _load(idx)
        view = t[:, 1:3, :]  # (P, 2, 12): 24 contiguous elements from column 12
        d = nl.ndarray((x.shape[0], 4, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=d, src=view.indirect(i, num_elem=32))
        return _store(d)

    x, idx = f32(32, 4, 12), offsets(32, 2, 24)
    flat = x[:, 1:3, :].reshape(32, 24)
    np.testing.assert_array_equal(k(x, idx), flat[:, snake(idx, 32, 16)].reshape(32, 4, 8))


def test_tensor_tensor_reads_data1_through_the_index():
    @nki.jit
    def k(x, y, idx):
        t, b, i = _load(x), _load(y), _load(idx)
        d = nl.ndarray(y.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=t.indirect(i, num_elem=y.shape[1]), data2=b, op=nl.add)
        return _store(d)

    x, y, idx = f32(128, 64), f32(128, 64), offsets(128, 4, 64)
    np.testing.assert_array_equal(k(x, y, idx), x[:, snake(idx, 64, 16)] + y)


def test_activation_gathers_and_scatters_on_the_scalar_engine():
    @nki.jit
    def k(x, idx_in, idx_out):
        t, i, o = _load(x), _load(idx_in), _load(idx_out)
        d = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=d, value=0.0)
        nisa.activation(
            dst=d.indirect(o, num_elem=32), op=nl.exp, data=t.indirect(i, num_elem=32), scale=0.5
        )
        return _store(d)

    x, ii, io = f32(32, 48), offsets(32, 2, 48), distinct(32, 2, 48, 32, 16)
    got = k(x, ii, io)
    want = np.zeros_like(x)
    want[:, snake(io, 32, 16)] = np.exp(x[:, snake(ii, 32, 16)] * np.float32(0.5))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_activation_reduce_sums_the_gathered_columns():
    # the accumulator reset is an instruction of its own, emitted before the activation
    @nki.jit
    def k(x, idx):
        t, i = _load(x), _load(idx)
        y = nl.ndarray((x.shape[0], 32), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=y,
            op=nl.copy,
            data=t.indirect(i, num_elem=32),
            reduce_res=r,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        return _store(y), _store(r)

    x, idx = f32(64, 50), offsets(64, 2, 50)
    y, r = k(x, idx)
    cols = x[:, snake(idx, 32, 16)]
    np.testing.assert_array_equal(y, cols)
    np.testing.assert_allclose(r[:, 0], cols.sum(axis=1), rtol=1e-5, atol=1e-4)


def test_tensor_scalar_and_tensor_reduce_take_indirect_data():
    @nki.jit
    def k(x, idx):
        t, i = _load(x), _load(idx)
        s = nl.ndarray((x.shape[0], 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s, data=t.indirect(i, num_elem=32), op0=nl.multiply, operand0=2.0)
        r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t.indirect(i, num_elem=32), axis=1)
        return _store(s), _store(r)

    x, idx = f32(128, 40), offsets(128, 2, 40)
    s, r = k(x, idx)
    cols = x[:, snake(idx, 32, 16)]
    np.testing.assert_array_equal(s, cols * 2)
    np.testing.assert_allclose(r[:, 0], cols.sum(axis=1), rtol=1e-5, atol=1e-4)


def test_tensor_copy_predicated_and_exponential_on_indirect_views():
    @nki.jit
    def k(x, pred, idx):
        t, pr, i = _load(x), _load(pred), _load(idx)
        e = nl.ndarray((x.shape[0], 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=e, src=t.indirect(i, num_elem=16), max_value=1.0)
        nisa.tensor_copy_predicated(
            dst=t.indirect(i, num_elem=16), src=e, predicate=pr.indirect(i, num_elem=16)
        )
        return _store(t)

    x, idx = f32(16, 24), offsets(16, 1, 24)
    pred = rng.integers(0, 2, size=(16, 24)).astype(np.uint8)
    cols = snake(idx, 16, 16)
    want = x.copy()
    keep = pred[:, cols] != 0
    want[:, cols] = np.where(keep, np.exp(x[:, cols] - np.float32(1.0)), x[:, cols])
    np.testing.assert_allclose(k(x, pred, idx), want, rtol=1e-6)


# -- the Tensor engine (G = 32) -------------------------------------------------------------------


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


@nki.jit
def matmul_gather(s, m, idx_s, idx_m, ns: int, nm: int):
    st, mv = _load(s, nl.bfloat16), _load(m, nl.bfloat16)
    i_s, i_m = _load(idx_s), _load(idx_m)
    acc = nl.ndarray((ns, nm), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(
        dst=acc, stationary=st.indirect(i_s, num_elem=ns), moving=mv.indirect(i_m, num_elem=nm)
    )
    out = nl.ndarray((ns, nm), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    return _store(out)


def test_nc_matmul_reads_stationary_and_moving_in_groups_of_32():
    s, m = f32(128, 100), f32(128, 200)
    i_s, i_m = offsets(128, 2, 100), offsets(128, 4, 200)
    got = matmul_gather(s, m, i_s, i_m, 64, 128)
    want = _bf16(s)[:, snake(i_s, 64, 32)].T @ _bf16(m)[:, snake(i_m, 128, 32)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_nc_matmul_scatters_into_a_bf16_psum_dst():
    @nki.jit
    def k(s, m, idx):
        st, mv, i = _load(s, nl.bfloat16), _load(m, nl.bfloat16), _load(idx)
        acc = nl.ndarray((64, 96), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.memset(dst=acc, value=0.0)
        nisa.nc_matmul(
            dst=acc.indirect(i, num_elem=m.shape[1]), stationary=st, moving=mv, accumulate=False
        )
        out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=acc)
        return _store(out)

    s, m, idx = f32(128, 64), f32(128, 64), distinct(64, 2, 96, 64, 32)
    want = np.zeros((64, 96), np.float32)
    want[:, snake(idx, 64, 32)] = _bf16(_bf16(s).T @ _bf16(m))
    np.testing.assert_allclose(k(s, m, idx), want, rtol=1e-2, atol=1e-2)


def test_one_view_reads_by_the_engine_that_runs_the_instruction():
    @nki.jit
    def k(x, idx):
        t, i = _load(x, nl.bfloat16), _load(idx)
        v = t.indirect(i, num_elem=64)
        copied = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=copied, src=v)  # VectorE: G = 16
        ones = nl.ndarray((128, 1), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        acc = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=v, moving=ones)  # TensorE: G = 32
        col = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=col, src=acc)
        return _store(copied), _store(col)

    x, idx = f32(128, 80), offsets(128, 4, 80)  # G = 16 reads 16 x 4 of it, G = 32 32 x 2
    copied, col = k(x, idx)
    assert not np.array_equal(snake(idx, 64, 16), snake(idx, 64, 32))
    xb = _bf16(x)
    np.testing.assert_array_equal(copied.astype(np.float32), xb[:, snake(idx, 64, 16)])
    np.testing.assert_allclose(
        col[:, 0], xb[:, snake(idx, 64, 32)].sum(axis=0), rtol=1e-5, atol=1e-4
    )


def test_nc_matmul_mx_reads_a_data_tensor_and_its_scales_through_one_index():
    from test_mx import E4M3, in_layout, model_matmul_mx, mx_data

    @nki.jit
    def k(st, st_scale, mv, mv_scale, idx):
        s, ss = _load(st.view(nl.float8_e4m3fn_x4)), _load(st_scale)
        v, vs = _load(mv.view(nl.float8_e4m3fn_x4)), _load(mv_scale)
        i = _load(idx)
        acc = nl.ndarray((32, v.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(
            dst=acc,
            stationary=s.indirect(i, num_elem=32),
            moving=v,
            stationary_scale=ss.indirect(i, num_elem=32),
            moving_scale=vs,
        )
        return _store(_evacuate(acc))

    m, n = 48, 16
    st, mv = mx_data((128, 4 * m), E4M3), mx_data((128, 4 * n), E4M3)
    st_scale = in_layout(rng.integers(120, 134, (16, m)).astype(np.uint8), 128, 0)
    mv_scale = in_layout(rng.integers(120, 134, (16, n)).astype(np.uint8), 128, 0)
    idx = offsets(128, 1, m)
    cols = snake(idx, 32, 32)
    got = k(st, st_scale, mv, mv_scale, idx)
    want = model_matmul_mx(st[:, cols], mv, st_scale[:, cols], mv_scale, E4M3, E4M3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# -- refused kernels --------------------------------------------------------------------------


@nki.jit
def on_trn2(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i, num_elem=16))  # BAD
    return _store(d)


def test_an_nc_v3_target_has_no_tensor_indirection(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    err = rejects(on_trn2, "err_unsupported_instruction_on_target", f32(16, 32), offsets(16, 1, 32))
    assert "trn3" in str(err)


@nki.jit
def data2_indirect(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d, data1=d, data2=t.indirect(i, num_elem=16), op=nl.add)  # BAD
    return _store(d)


@nki.jit
def dma_indirect(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=t.indirect(i, num_elem=16))  # BAD
    return _store(d)


@nki.jit
def gpsimd_copy(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i, num_elem=16), engine=nisa.engine.gpsimd)  # BAD
    return _store(d)


@nki.jit
def transpose_moving(x, idx):
    t, i = _load(x, nl.bfloat16), _load(idx)
    acc = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(  # BAD
        dst=acc, stationary=t[:, 0:16], moving=t.indirect(i, num_elem=16), is_transpose=True
    )
    return _store(_evacuate(acc))


@pytest.mark.parametrize("kernel", [data2_indirect, dma_indirect, gpsimd_copy, transpose_moving])
def test_an_operand_without_tensor_indirection_is_refused(kernel):
    rejects(kernel, "err_indirect_operand_not_supported", f32(16, 32), offsets(16, 1, 32))


@nki.jit
def mx_scale_direct(st, st_scale, idx):
    s, ss = _load(st.view(nl.float8_e4m3fn_x4)), _load(st_scale)
    i = _load(idx)
    acc = nl.ndarray((32, s.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(  # BAD
        dst=acc,
        stationary=s.indirect(i, num_elem=32),
        moving=s,
        stationary_scale=ss,
        moving_scale=ss,
    )
    return _store(_evacuate(acc))


def test_an_mx_data_tensor_is_indirect_together_with_its_scales():
    st = np.zeros((128, 32), np.uint32)
    scale = np.full((128, 32), 127, np.uint8)
    err = rejects(
        mx_scale_direct, "err_indirect_operand_not_supported", st, scale, offsets(128, 1, 32)
    )
    assert "stationary_scale" in str(err)


@nki.jit
def float_index(x, idx):
    t, i = _load(x), _load(idx, nl.float32)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i, num_elem=16))  # BAD
    return _store(d)


@nki.jit
def psum_index(x, idx):
    t, i = _load(x), _load(idx, nl.float32)
    p = nl.ndarray(idx.shape, dtype=nl.int32, buffer=nl.psum)
    nisa.tensor_copy(dst=p, src=i)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(p, num_elem=16))  # BAD
    return _store(d)


@nki.jit
def few_partitions(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i[0:8], num_elem=8))  # BAD
    return _store(d)


@nki.jit
def hbm_data(x, idx):
    i = _load(idx)
    d = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=x.indirect(i, num_elem=8))  # BAD
    return _store(d)


@pytest.mark.parametrize(
    ("kernel", "name"),
    [
        (float_index, "err_unsupported_dtype"),
        (psum_index, "err_unsupported_memory"),
        (few_partitions, "err_num_partition_mismatch"),
        (hbm_data, "err_unsupported_memory"),
    ],
)
def test_the_index_is_an_sbuf_integer_tile_of_the_tensors_partitions(kernel, name):
    rejects(kernel, name, f32(16, 32), offsets(16, 1, 32))


@nki.jit
def fp32_stationary(s, m, idx):
    st, mv, i = _load(s), _load(m), _load(idx)
    acc = nl.ndarray((32, m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st.indirect(i, num_elem=32), moving=mv)  # BAD
    return _store(_evacuate(acc))


def test_indirect_tensor_engine_operands_are_16_or_8_bit_floats():
    err = rejects(
        fp32_stationary, "err_unsupported_dtype", f32(32, 40), f32(32, 8), offsets(32, 1, 40)
    )
    assert "float32" in str(err)


@nki.jit
def tiled_matmul(s, m, idx):
    st, mv, i = _load(s, nl.bfloat16), _load(m, nl.bfloat16), _load(idx)
    acc = nl.ndarray((32, m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(  # BAD
        dst=acc,
        stationary=st.indirect(i, num_elem=32),
        moving=mv,
        tile_position=(0, 0),
        tile_size=(32, 32),
    )
    return _store(_evacuate(acc))


def test_tensor_indirection_leaves_the_pe_array_untiled():
    rejects(tiled_matmul, "err_invalid_argument", f32(32, 40), f32(32, 8), offsets(32, 1, 40))


@nki.jit
def offset_out_of_range(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t[:, 0:20].indirect(i, num_elem=16))  # BAD
    return _store(d)


@pytest.mark.parametrize("bad", [20, 31, 60000])
def test_an_offset_outside_the_view_is_a_runtime_error(bad):
    # offset 20..31 lies inside the tensor's 32 columns but outside the 20-column view
    idx = offsets(16, 1, 20)
    idx[7, 0] = bad
    err = rejects(offset_out_of_range, "err_tensor_access_out_of_bound", f32(16, 32), idx)
    assert f"{bad} (the offset index tile" in str(err) and "element 7" in str(err)


@nki.jit
def scatter_out_of_range(x, idx):
    t, i = _load(x), _load(idx)
    s = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=s, value=1.0)
    nisa.tensor_copy(dst=t.indirect(i, num_elem=16), src=s)  # BAD
    return _store(t)


def test_a_negative_scatter_offset_is_a_runtime_error():
    idx = offsets(16, 1, 32).astype(np.int32)
    idx[3, 0] = -1
    rejects(scatter_out_of_range, "err_tensor_access_out_of_bound", f32(16, 32), idx)


@nki.jit
def partial_group(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 20), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i, num_elem=20))  # BAD
    return _store(d)


@nki.jit
def default_too_many(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], idx.size), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i))  # BAD
    return _store(d)


@nki.jit
def sliced_view(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t.indirect(i, num_elem=16)[:, 0:8])  # BAD
    return _store(d)


@pytest.mark.parametrize(
    ("kernel", "name", "p"),
    [
        (partial_group, "err_unsupported_api", 32),
        # 32 partitions x 2 columns = 64 offsets by default; the snake reads 16 x 2 of them
        (default_too_many, "err_invalid_argument", 32),
        (sliced_view, "err_unsupported_api", 32),
    ],
)
def test_views_the_snake_cannot_read_are_refused(kernel, name, p):
    rejects(kernel, name, f32(p, 40), offsets(p, 2, 40))


@nki.jit
def scalar_psum_scatter(x, idx):
    t, i = _load(x), _load(idx)
    acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=acc, value=0.0)
    nisa.activation(dst=acc.indirect(i, num_elem=16), op=nl.exp, data=t[:, 0:16])  # BAD
    return _store(t)


@nki.jit
def copy_psum_scatter(x, idx, engine=None):
    t, i = _load(x), _load(idx)
    acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=acc, value=0.0)
    nisa.tensor_copy(dst=acc.indirect(i, num_elem=16), src=t[:, 0:16], engine=engine)  # BAD
    return _store(_evacuate(acc))


def test_the_scalar_engine_does_not_scatter_into_psum():
    x, idx = f32(16, 32), distinct(16, 1, 32, 16, 16)
    rejects(scalar_psum_scatter, "err_unsupported_memory", x, idx)
    # a copy the compiler may place on the ScalarE neither; on the VectorE it scatters
    err = rejects(copy_psum_scatter, "err_unsupported_memory", x, idx)
    assert "engine=nisa.engine.vector" in str(err)
    want = np.zeros_like(x)
    want[:, snake(idx, 16, 16)] = x[:, 0:16]
    np.testing.assert_array_equal(copy_psum_scatter(x, idx, nisa.engine.vector), want)


@nki.jit
def matmul_after_psum_scatter(x, idx, accumulate=None):
    t, i = _load(x), _load(idx)
    s = _load(x[:, 0:16], nl.bfloat16)
    acc = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=acc, value=0.0)
    nisa.tensor_copy(dst=acc.indirect(i, num_elem=16), src=t[:, 0:16], engine=nisa.engine.vector)
    w = _load(x, nl.bfloat16)
    nisa.nc_matmul(dst=acc, stationary=s, moving=w, accumulate=accumulate)  # BAD
    return _store(_evacuate(acc))


def test_a_matmul_after_a_psum_scatter_says_whether_it_accumulates():
    """Where a runtime-offset write landed is unknown until the kernel runs, so the
    first-write-overwrites rule cannot pick accumulate for the region it may touch."""
    x, idx = f32(16, 32), distinct(16, 1, 32, 16, 16)
    rejects(matmul_after_psum_scatter, "err_unsupported_api", x, idx, match="runtime-offset")
    s = x[:, 0:16].astype(ml_dtypes.bfloat16).astype(np.float32)
    w = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = matmul_after_psum_scatter(x, idx, False)
    np.testing.assert_allclose(got, s.T @ w, rtol=1e-5, atol=1e-5)


@nki.jit
def unaligned_index(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((16, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t[16:32].indirect(i[16:32], num_elem=16))  # BAD
    return _store(d)


@nki.jit
def data_off_its_index(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=t[32:64].indirect(i[0:32], num_elem=16))  # BAD
    return _store(d)


@nki.jit
def dst_index_off_the_input(x, idx):
    t, i = _load(x), _load(idx)
    s = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=s, value=1.0)
    nisa.tensor_copy(dst=t[32:64].indirect(i[32:64], num_elem=16), src=s)  # BAD
    return _store(t)


@pytest.mark.parametrize("kernel", [unaligned_index, data_off_its_index, dst_index_off_the_input])
def test_indexes_start_on_quadrants_and_on_their_operands_partitions(kernel):
    err = rejects(kernel, "err_invalid_argument", f32(64, 32), offsets(64, 1, 32))
    assert "partition" in str(err)


def test_a_view_in_the_second_quadrant_reads_through_an_index_there():
    @nki.jit
    def k(x, idx):
        t, i = _load(x), _load(idx)
        d = nl.ndarray((64, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=d, value=0.0)
        nisa.tensor_copy(dst=d[32:64], src=t[32:64].indirect(i[32:64], num_elem=16))
        return _store(d)

    x, idx = f32(64, 32), offsets(64, 1, 32)
    want = np.zeros((64, 16), np.float32)
    want[32:] = x[32:, snake(idx[32:], 16, 16)]
    np.testing.assert_array_equal(k(x, idx), want)


# -- the IR ------------------------------------------------------------------------------------


def test_the_snake_order_is_an_access_of_the_index_tile_per_engine():
    x, idx = f32(128, 96), offsets(128, 8, 96)
    text = str(copy_gather.ir(x, idx, 48))
    # 48 offsets in 3 groups of 16: element (p, j, r) reads column idx[r, j] of t
    assert "tensor_copy(%t[a0, %t.1[a2, a1]]<128x3x16>, %t.1[a2, a1]<1x3x16>)" in text
    s, m = f32(128, 100), f32(128, 200)
    text = str(matmul_gather.ir(s, m, offsets(128, 2, 100), offsets(128, 4, 200), 64, 128))
    assert "<128x2x32>" in text and "<128x4x32>" in text  # groups of 32 on the TensorE


def test_the_index_tile_is_an_input_of_the_instruction_not_one_of_its_operands():
    from nkikit.ir.core import declared_inputs

    @nki.jit
    def k(x, idx):
        t, i = _load(x), _load(idx)
        s = nl.ndarray((x.shape[0], 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s, data=t.indirect(i, num_elem=32), op0=nl.add, operand0=1.0)
        return _store(s)

    x, idx = f32(16, 40), offsets(16, 2, 40)
    (op,) = [op for op, _ in k.ir(x, idx).ops() if op.prim == "tensor_scalar"]
    # data and operand0; the index tile after them is no operand1 (tensor_scalar's optional
    # role), though it sits where one would
    assert declared_inputs(op) == 2 and op.ins[2] == op.ins[0].indirect
    np.testing.assert_array_equal(k(x, idx), x[:, snake(idx, 32, 16)] + 1)


def test_indirect_instructions_have_a_cost_model_entry():
    import nkikit

    s, m = f32(128, 100), f32(128, 200)
    args = (s, m, offsets(128, 2, 100), offsets(128, 4, 200), 64, 128)
    prof = nkikit.profile_kernel(matmul_gather, *args, target="trn3")
    (mm,) = [i for i in prof.instructions if i.opcode == "MATMUL"]
    assert mm.engine == "tensor" and mm.duration_ns > 0


@nki.jit
def indirect_bias(x, idx):
    t, i = _load(x), _load(idx)
    d = nl.ndarray((x.shape[0], 4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(  # BAD
        dst=d,
        op=nl.exp,
        data=t[:, 0:32].reshape((x.shape[0], 4, 8)),
        bias=t.indirect(i, num_elem=1),
    )
    return _store(d)


def test_a_per_partition_operand_keeps_its_indirection_to_be_refused():
    # a (P, 1) operand broadcast along 3-D data is re-ranked; its indirection must not be lost
    err = rejects(
        indirect_bias, "err_indirect_operand_not_supported", f32(16, 40), offsets(16, 1, 40)
    )
    assert "bias" in str(err)
