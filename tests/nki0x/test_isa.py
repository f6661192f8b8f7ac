"""NKI 0.x instructions: each writes its dst with the documented semantics (checked against
numpy), and the same computation written in both dialects traces to the same IR ops."""

import numpy as np
import pytest
from nki0x_helpers import load as _load
from nki0x_helpers import store as _store

import nkikit as nki1
import nkikit.isa as nisa1
import nkikit.language as nl1
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError, NkiWarning
from nkikit.sim import fast
from nkikit.sim.interp import simulate as reference

P, F = 128, 64


rng = np.random.default_rng(0)
X = rng.standard_normal((P, F)).astype(np.float32)
Y = rng.standard_normal((P, F)).astype(np.float32)
COL = rng.standard_normal((P, 1)).astype(np.float32)


def test_tensor_tensor_and_scalar_ops():
    @nki.jit
    def k(x, y, c):
        a, b, s = _load(x), _load(y), _load(c)
        r1 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r1, data1=a, data2=b, op=nl.multiply)
        r2 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r2, data=a, op0=nl.add, operand0=s, op1=nl.multiply, operand1=2.0)
        r3 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=r3, data=a, op0=nl.subtract, operand0=1.0, op1=nl.maximum, operand1=b
        )
        r4 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r4, data=a, op0=nl.subtract, operand0=3.0, reverse0=True)
        return _store(r1), _store(r2), _store(r3), _store(r4)

    r1, r2, r3, r4 = k(X, Y, COL)
    np.testing.assert_array_equal(r1, X * Y)
    np.testing.assert_allclose(r2, (X + COL) * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(r3, np.maximum(X - 1.0, Y))
    np.testing.assert_array_equal(r4, 3.0 - X)


@pytest.mark.parametrize(
    ("op", "fn"),
    [(None, lambda v: v), (nl.abs, abs), (nl.reciprocal, lambda v: 1 / v),
     (nl.logical_not, lambda v: np.float32(v == 0))],
)  # fmt: skip
def test_a_reversed_unary_operator_reads_only_the_operand(op, fn):
    # reversed, operand0 is the operator's first input: a unary one fills the tile with op(operand0)
    @nki.jit
    def k(x, c):
        a, b = _load(x), _load(c)
        by_scalar = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=by_scalar, data=a, op0=op, operand0=-4.0, reverse0=True)
        by_vector = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=by_vector, data=a, op0=op, operand0=b, reverse0=True)
        return _store(by_scalar), _store(by_vector)

    scalar, vector = k(X, COL)
    np.testing.assert_array_equal(scalar, np.full((P, F), fn(-4.0), np.float32))
    np.testing.assert_array_equal(vector, np.broadcast_to(fn(COL), (P, F)).astype(np.float32))
    ir, _ = k.specialize(X, COL)
    (want_s, want_v), (got_s, got_v) = reference(ir, [X, COL]), fast.simulate(ir, [X, COL])
    assert np.array_equal(want_s, got_s) and np.array_equal(want_v, got_v)


def test_activation_with_reduce_and_bias():
    @nki.jit
    def k(x, c):
        a, b = _load(x), _load(c)
        r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=r,
            op=nl.exp,
            data=a,
            bias=b,
            scale=0.5,
            reduce_op=nl.add,
            reduce_res=s,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        return _store(r), _store(s)

    r, s = k(X, COL)
    ref = np.exp(X * 0.5 + COL)
    np.testing.assert_allclose(r, ref, rtol=1e-5)
    np.testing.assert_allclose(s[:, 0], ref.sum(axis=1), rtol=1e-5)


def test_matmul_accumulates_after_first_write_and_transpose():
    K, M, N = 256, 64, 32
    a = rng.standard_normal((K, M)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)

    @nki.jit
    def k(lhsT, rhs):
        acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        for i in range(K // 128):  # the first matmul overwrites, the second adds
            s = _load(lhsT[i * 128 : (i + 1) * 128, :])
            m = _load(rhs[i * 128 : (i + 1) * 128, :])
            nisa.nc_matmul(dst=acc, stationary=s, moving=m)
        res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        t = nl.ndarray((N, M), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=res)
        tt = nl.ndarray((N, M), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=tt, src=t)
        return _store(res), _store(tt)

    res, tt = k(a, b)
    np.testing.assert_allclose(res, a.T @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tt, res.T)


def test_matmul_over_regions_written_in_parts():
    """A matmul whose PSUM region earlier writes covered piece by piece: it accumulates where
    matmuls wrote every element, overwrites where another instruction wrote last."""
    M, N = 64, 32
    a = rng.standard_normal((128, M)).astype(np.float32)
    b = rng.standard_normal((128, N)).astype(np.float32)

    @nki.jit
    def k(lhsT, rhs):
        s, m = _load(lhsT), _load(rhs)
        acc = nl.ndarray((M, 2 * N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[:, 0:N], stationary=s, moving=m)
        nisa.nc_matmul(dst=acc[:, N : 2 * N], stationary=s, moving=m)
        both = nl.ndarray((128, 2 * N), dtype=nl.float32, buffer=nl.sbuf)  # rhs twice
        nisa.tensor_copy(dst=both[:, 0:N], src=m)
        nisa.tensor_copy(dst=both[:, N : 2 * N], src=m)
        nisa.nc_matmul(dst=acc, stationary=s, moving=both)  # every element: a matmul's
        first = nl.ndarray((M, 2 * N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=first, src=acc)
        nisa.memset(dst=acc[:, 0:N], value=0.0)
        nisa.memset(dst=acc[:, N : 2 * N], value=0.0)
        nisa.nc_matmul(dst=acc[:, N // 2 : N + N // 2], stationary=s, moving=both[:, 0:N])
        second = nl.ndarray((M, 2 * N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=second, src=acc)
        return _store(first), _store(second)

    first, second = k(a, b)
    ab = a.T @ b
    np.testing.assert_allclose(first, np.hstack([2 * ab, 2 * ab]), rtol=1e-4, atol=1e-4)
    want = np.zeros((M, 2 * N), np.float32)
    want[:, N // 2 : N + N // 2] = ab
    np.testing.assert_allclose(second, want, rtol=1e-4, atol=1e-4)


def test_reduce_iota_select_memset_reciprocal():
    @nki.jit
    def k(x):
        a = _load(x)
        red = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=red, op=nl.maximum, data=a.reshape((P, 4, 16)), axis=(2,))
        io = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=io, pattern=[[1, F]], offset=3, channel_multiplier=F)
        sel = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        # keep the upper triangle: column - partition >= 0
        nisa.affine_select(
            dst=sel,
            pattern=[[1, F]],
            channel_multiplier=-1,
            on_true_tile=a,
            on_false_value=-9.0,
            cmp_op=nl.greater_equal,
        )
        m = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=m, value=2.0)
        rc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=rc, data=m)
        return _store(red), _store(io), _store(sel), _store(rc)

    red, io, sel, rc = k(X)
    np.testing.assert_array_equal(red, X.reshape(P, 4, 16).max(axis=2))
    expect_iota = 3 + np.arange(P)[:, None] * F + np.arange(F)[None, :]
    np.testing.assert_array_equal(io, expect_iota)
    keep = (np.arange(F)[None, :] - np.arange(P)[:, None]) >= 0
    np.testing.assert_array_equal(sel, np.where(keep, X, -9.0))
    np.testing.assert_array_equal(rc, np.full((P, F), 0.5, np.float32))


def test_bf16_rounding_on_write_and_dma_cast():
    x = rng.standard_normal((P, F)).astype(np.float32)

    @nki.jit
    def k(x):
        a = _load(x, dtype=nl.bfloat16)  # the DMA converts fp32 -> bf16
        r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=a)
        return _store(r)

    import ml_dtypes

    np.testing.assert_array_equal(k(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_fresh_sbuf_is_poisoned():
    @nki.jit
    def k(x):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
        return _store(t)

    out = k(X)
    assert np.isnan(out[:, 32:]).all() and (out[:, :32] == X[:, :32]).all()


def test_lnc2_programs_write_their_halves_of_one_shared_output():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        half = x.shape[0] // nl.num_programs()
        rows = slice(nl.program_id(0) * half, (nl.program_id(0) + 1) * half)
        t = _load(x[rows, :])
        r = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.add, operand0=float(nl.program_id(0)))
        nisa.dma_copy(dst=out[rows, :], src=r)
        return out

    x = rng.standard_normal((256, 8)).astype(np.float32)
    out = nki.cpu_simulate(k)[2](x=x)
    np.testing.assert_array_equal(out[:128], x[:128])
    np.testing.assert_array_equal(out[128:], x[128:] + 1.0)


def test_in_place_input_update_is_returned():
    @nki.jit
    def k(x, out):
        t = _load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    out = np.zeros_like(X)
    r = k(X, out)
    np.testing.assert_array_equal(r, X * 3.0)


def test_same_ir_in_both_dialects():
    """tensor_tensor written dst-first (0.x) and tile-returning (Beta 1) prints the same ops."""

    @nki.jit
    def k0(a, b):
        x = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        y = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        z = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
        out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=z)
        return out

    @nki1.jit
    def k1(a, b):
        x = nl1.load(a)
        y = nl1.load(b)
        z = nisa1.tensor_tensor(x, y, op=np.add)
        out = nl1.ndarray((P, F), dtype=nl1.float32, buffer=nl1.shared_hbm)
        nl1.store(out, value=z)
        return out

    def ops(kernel):
        return [
            (op.prim, [o.shape for o in op.outs], {k: v for k, v in op.attrs.items()})
            for op, _ in kernel.ops()
        ]

    assert ops(k0.ir(X, Y)) == ops(k1.ir(X, Y))
    np.testing.assert_array_equal(k0(X, Y), k1(X, Y))


@pytest.mark.parametrize(
    "body, name",
    [
        # a DMA cannot read PSUM (NKI 0.3+)
        (
            lambda x: nisa.dma_copy(
                dst=x, src=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
            ),
            "err_unsupported_memory",
        ),
        # element counts must match
        (
            lambda x: nisa.dma_copy(
                dst=nl.ndarray((4, 2), dtype=nl.float32, buffer=nl.sbuf), src=x
            ),
            "same number of elements",
        ),
        # matmul writes PSUM only
        (
            lambda x: nisa.nc_matmul(
                dst=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                stationary=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                moving=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
            ),
            "err_unsupported_memory",
        ),
        # operands must match partitions
        (
            lambda x: nisa.tensor_tensor(
                dst=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                data1=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                data2=nl.ndarray((2, 8), dtype=nl.float32, buffer=nl.sbuf),
                op=nl.add,
            ),
            "err_num_partition_mismatch",
        ),
        # an argument the command does not read is a named error, not silently ignored
        (
            lambda x: nisa.tensor_scalar_reduce(
                dst=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                data=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                op0=nl.add,
                operand0=1.0,
                reduce_op=nl.add,
                reduce_res=nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf),
                reduce_init=2.0,
            ),
            "err_invalid_argument",
        ),
        # a TensorE tile must hold the stationary operand
        (
            lambda x: nisa.nc_matmul(
                dst=nl.ndarray((64, 4), dtype=nl.float32, buffer=nl.psum),
                stationary=nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.sbuf),
                moving=nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf),
                tile_position=(0, 32),
                tile_size=(32, 32),
            ),
            "does not fit",
        ),
        (lambda x: nisa.sendrecv(x, x, 1, 1, 0), "err_unsupported_memory"),
    ],
)
def test_bad_instructions_are_named_errors_at_the_user_line(body, name):
    @nki.jit
    def k(x):
        body(x)
        return nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)

    with pytest.raises(NkiError, match=name) as e:
        k(np.zeros((4, 4), np.float32))
    assert "test_isa.py" in str(e.value)


def test_tensor_copy_dtype_is_the_tutorials_leftover_and_dst_decides():
    @nki.jit
    def k(x):
        t = _load(x)
        r = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=t, dtype=nl.bfloat16)  # as the matmul tutorial writes it
        return _store(r)

    np.testing.assert_array_equal(k(X), X)


def test_profile_and_torch_tensors_work_on_a_0x_kernel():
    import nkikit

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in range(a.shape[0] // 128):
            t = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i * 128 : (i + 1) * 128])
            nisa.activation(dst=t, op=nl.exp, data=t)
            nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128], src=t)
        return out

    x = rng.standard_normal((512, 256)).astype(np.float32)
    profile = nkikit.profile_kernel(k, x, target="trn2")
    assert profile.total_us > 0 and 0 < profile.summary["mbu"] <= 1
    torch = pytest.importorskip("torch")
    r = k(torch.from_numpy(x))
    assert isinstance(r, torch.Tensor)
    np.testing.assert_allclose(r.numpy(), np.exp(x), rtol=1e-5)


def test_a_psum_tensor_may_span_banks_each_matmul_writes_one():
    @nki.jit
    def k(a, b):
        acc = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.psum)  # 4 banks
        s, m = _load(a), _load(b)
        for j in range(4):
            nisa.nc_matmul(dst=acc[:, j * 512 : (j + 1) * 512], stationary=s, moving=m)
        res = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        return _store(res)

    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_allclose(k(a, b), np.tile(a.T @ b, (1, 4)), rtol=1e-4, atol=1e-4)


def test_sendrecv_and_core_barrier_between_the_two_programs():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        me = nl.program_id(0)
        mine = _load(x[me * 128 : (me + 1) * 128, :])
        theirs = nl.ndarray(mine.shape, dtype=mine.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
        nisa.dma_copy(dst=out[me * 128 : (me + 1) * 128, :], src=theirs)  # the halves swap
        nisa.core_barrier(out, (0, 1))
        # after the barrier each program sees the other's write: copy it back to itself
        back = _load(out[(1 - me) * 128 : (2 - me) * 128, :])
        scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=scratch[me * 128 : (me + 1) * 128, :], src=back)
        return out, scratch

    x = rng.standard_normal((256, 16)).astype(np.float32)
    out, scratch = nki.cpu_simulate(k)[2](x=x)
    np.testing.assert_array_equal(out, np.concatenate([x[128:], x[:128]]))
    np.testing.assert_array_equal(scratch, np.concatenate([x[:128], x[128:]]))


def test_sendrecv_with_uneven_shards_matches_each_src_to_the_peers_dst():
    # program 0 owns 2 rows and program 1 owns 3: each sends its own and receives the other's
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        me = nl.program_id(0)
        start, n, other = (0, 2, 3) if me == 0 else (2, 3, 2)
        mine = _load(x[start : start + n, :])
        theirs = nl.ndarray((other, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
        first = 0 if me == 0 else 3  # out is x with its two shards swapped
        nisa.dma_copy(dst=out[first : first + other, :], src=theirs)
        return out

    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(nki.cpu_simulate(k)[2](x=x), np.concatenate([x[2:], x[:2]]))


def test_a_barrier_only_one_program_reaches_is_an_error():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(out, (0, 1))
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(NkiError, match="ended while another waits"):
        nki.cpu_simulate(k)[2](x=np.zeros((4, 4), np.float32))


def test_keepdims_reduce_into_a_view_without_the_unit_dims():
    x = rng.standard_normal((128, 4, 3, 5)).astype(np.float32)

    @nki.jit
    def k(x):
        t = _load(x)
        r = nl.ndarray((128, 4, 5), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=t.permute((0, 1, 3, 2)), axis=3)
        return _store(r)

    np.testing.assert_array_equal(k(x), x.max(axis=2))


def test_a_column_operand_broadcasts_over_every_free_dimension():
    x = rng.standard_normal((64, 3, 5)).astype(np.float32)
    c = rng.standard_normal((64, 1)).astype(np.float32)

    @nki.jit
    def k(x, c):
        t, b = _load(x), _load(c)
        r = nl.ndarray((64, 3, 5), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.exp, data=t, bias=b, scale=b)
        r2 = nl.ndarray((64, 3, 5), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r2, data=t, op0=nl.subtract, operand0=b)
        return _store(r), _store(r2)

    r, r2 = k(x, c)
    np.testing.assert_allclose(r, np.exp(x * c[:, :, None] + c[:, :, None]), rtol=1e-5)
    np.testing.assert_array_equal(r2, x - c[:, :, None])


def test_a_kernel_too_large_for_memory_stops_with_a_named_error(monkeypatch):
    import nkikit.nki.isa as isa_mod

    monkeypatch.setenv("NKIKIT_MEMORY_LIMIT_MB", "1")  # any real process is over 1 MiB
    monkeypatch.setattr(isa_mod, "_GUARD_EVERY", 8)

    @nki.jit
    def k(x):
        t = _load(x)
        for _ in range(20):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
        return _store(t)

    with pytest.raises(NkiError, match="err_kernel_too_large_to_simulate") as e:
        k(X)
    assert "test_isa.py" in str(e.value)


def test_reduce_res_with_more_partitions_receives_the_data_partitions():
    @nki.jit
    def k(x):
        t = _load(x[0:64, :])
        r = nl.ndarray((64, F), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=-1.0)
        nisa.activation(
            dst=r,
            op=nl.copy,
            data=t,
            reduce_op=nl.add,
            reduce_res=s,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        return _store(s)

    s = k(X)
    np.testing.assert_allclose(s[:64, 0], X[:64].sum(axis=1), rtol=1e-5)
    assert (s[64:] == -1.0).all()


def test_range_select_bounds_with_more_partitions_give_the_data_partitions_theirs():
    # a whole (128, 1) bound tile with a 104-row data tile, as the NKI Library's attention
    # passes it: row p is compared with bound row p
    lo = np.zeros((128, 1), np.float32)
    hi = rng.integers(0, F, (128, 1)).astype(np.float32)

    @nki.jit
    def k(x, lo, hi):
        t = _load(x[0:104, :])
        b0, b1 = _load(lo), _load(hi)
        r = nl.ndarray((104, F), dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((104, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(
            dst=r,
            on_true_tile=t,
            comp_op0=nl.greater_equal,
            comp_op1=nl.less_equal,
            bound0=b0,
            bound1=b1,
            reduce_res=m,
            reduce_op=nl.maximum,
            range_start=0,
        )
        return _store(r), _store(m)

    r, m = k(X, lo, hi)
    j = np.arange(F)[None, :]
    want = np.where(j <= hi[:104], X[:104], np.float32(-3.4028235e38))
    np.testing.assert_array_equal(r, want)
    np.testing.assert_array_equal(m[:, 0], want.max(axis=1))


@nki.jit
def _double_row_matmul(a, b):
    sa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb, src=b)
    acc = nl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, sa, sb, perf_mode=nisa.matmul_perf_mode.double_row)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_nc_matmul_double_row_contracts_over_both_rows(monkeypatch):
    import ml_dtypes

    rng = np.random.default_rng(5)
    a = rng.standard_normal((128, 2, 64)).astype(ml_dtypes.float8_e4m3)
    b = rng.standard_normal((128, 2, 256)).astype(ml_dtypes.float8_e4m3)
    want = np.einsum("prm,prn->mn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(_double_row_matmul(a, b), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(NkiError, match=r"takes fp8 operands .* stationary is float32"):
        _double_row_matmul(a.astype(np.float32), b)
    with pytest.raises(NkiError, match=r"takes moving as \[P, 2, F\]"):
        _double_row_matmul(a, b[:, :1, :].astype(ml_dtypes.float8_e4m3))
    monkeypatch.setenv("NKI_NC_VERSION", "gen2")  # trn1: no double-row mode
    with pytest.raises(NkiError, match="double_row needs NeuronCore-v3"):
        _double_row_matmul(a, b)


@pytest.mark.parametrize("axis", [1, [4], (2,), -1])
def test_tensor_reduce_reads_one_axis_of_3d_data_as_the_last(axis):
    # NKI 0.2's reading, which the NKI Library of early 2026 relies on: axis=1 of a 3-D view
    # (cascaded max), axis=[4] (attention_tkg: the last axis of the 5-D access pattern)
    @nki.jit
    def k(x):
        a = _load(x)
        red = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=red, op=nl.maximum, data=a.reshape((P, 4, 16)), axis=axis)
        return _store(red)

    x = np.random.default_rng(5).standard_normal((P, 64)).astype(np.float32)
    np.testing.assert_array_equal(k(x), x.reshape(P, 4, 16).max(axis=2))


def test_a_single_axis_of_3d_data_reads_as_nki_0_2_did_and_warns():
    # NKI 0.2 reduced the last dimension for axis=1 of 3-D data (the NKI Library of early 2026
    # relies on it); 0.3+ refuses the axis, so the trace says so at the line
    @nki.jit
    def k(x):
        t = nl.ndarray((16, 2, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        d = nl.ndarray((16, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.maximum, data=t, axis=1)
        return _store(d)

    x = np.arange(64, dtype=np.float32).reshape(16, 2, 2)
    with pytest.warns(NkiWarning, match=r"axis=1\) of 3-D data reduces its last dimension"):
        got = k(x)
    np.testing.assert_array_equal(got, x.max(axis=2))


def test_stream_shuffle_moves_partitions_whatever_the_free_shapes():
    # dst (32, 16) from a (32, 8, 2) view of src: partition by partition (it crashed the
    # simulators' rule when the two free shapes differed)
    mask = list(range(31, -1, -1))

    @nki.jit
    def k(x):
        a = _load(x)
        d = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=d, src=a.reshape((32, 8, 2)), shuffle_mask=mask)
        return _store(d)

    x = X[:32, :16].copy()
    np.testing.assert_array_equal(k(x), x[mask])
    ir, _ = k.specialize(x)
    assert np.array_equal(reference(ir, [x])[0], fast.simulate(ir, [x])[0])
