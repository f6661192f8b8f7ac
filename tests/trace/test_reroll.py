"""Re-rolling (``nkikit/trace/reroll.py``): the steps of an unrolled NKI 0.x trace folded into
loops of kind ``"unrolled"`` mean exactly what the steps meant -- the same bits on both
simulators, the same verdicts, the same compiled program -- and runs that cannot be folded
(a step's tile used after it, immediates that differ, 0.0 against -0.0) stay unrolled."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.compiler.build import build_program
from nkikit.ir.core import Loop
from nkikit.ir.unrolled import UNROLLED, unroll
from nkikit.sim import fast, interp, same_bits
from nkikit.trace import reroll

P, F = 128, 64


def traced(fn, args, *, roll: bool, grid: int = 0):
    """The IR of NKI 0.x function ``fn`` on ``args`` (launched on ``grid`` programs), re-rolled
    whatever its size (``roll``) or not at all."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reroll, "ROLL_ABOVE", 0 if roll else math.inf)
        kernel = nki.jit(fn)
        return (kernel[grid] if grid else kernel).ir(*args)


def loops(ir) -> list[Loop]:
    return [s for s in ir.body if type(s) is Loop and s.kind == UNROLLED]


def runs_alike(fn, args, grid: int = 0) -> tuple:
    """Trace ``fn`` re-rolled and not; both give the same bits on both simulators.  Returns
    (re-rolled IR, unrolled IR)."""
    rolled = traced(fn, args, roll=True, grid=grid)
    flat = traced(fn, args, roll=False, grid=grid)
    want = interp.simulate(flat, [a.copy() for a in args])
    for ir in (rolled, flat):
        for sim in (fast.simulate, interp.simulate):
            got = sim(ir, [a.copy() for a in args])
            assert all(same_bits(g, w) for g, w in zip(got, want))
    return rolled, flat


def _data(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, F), dtype=np.float32)


def scale_steps(a):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(a.shape[0] // P):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * P : (i + 1) * P, :])
        u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=u)
    return out


def test_steps_fold_into_one_loop_with_offsets_affine_in_its_variable():
    rolled, flat = runs_alike(scale_steps, [_data(8 * P)])
    (loop,) = loops(rolled)
    assert loop.trip == 8 and len(loop.body) == 5  # two allocations, three instructions
    assert len(rolled.body) == 1 and sum(1 for _ in flat.ops()) == 24
    assert f"for {loop.var.name} in range(8):" in str(rolled)
    # the steps' own tiles are gone from the kernel; the loop's tiles live inside it
    assert len(rolled.tensors) == len(flat.tensors) - 2 * 7
    assert all(loop.var in x.tensor.scope for x in loop.body if not hasattr(x, "prim"))


def test_the_compiler_gets_the_steps_back():
    args = [_data(8 * P)]
    rolled, flat = traced(scale_steps, args, roll=True), traced(scale_steps, args, roll=False)
    assert str(unroll(rolled)) == str(flat)
    a, b = build_program(rolled, "trn2"), build_program(flat, "trn2")
    assert len(a) == len(b)
    assert a.profile().summary["total_us"] == b.profile().summary["total_us"]


def wrapping_steps(a):
    out = nl.ndarray((4 * P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for i in range(16):
        rows = slice((i % 4) * P, (i % 4 + 1) * P)
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[rows, :])
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.dma_copy(dst=out[rows, :], src=acc)
    return out


def test_offsets_that_wrap_fold_as_longer_steps():
    """``i % 4``: four steps of the Python loop are one step of the folded loop."""
    rolled, _ = runs_alike(wrapping_steps, [_data(4 * P)])
    (loop,) = loops(rolled)
    assert loop.trip == 4 and sum(1 for x in loop.body if hasattr(x, "prim")) == 12


def carried_steps(a):
    out = nl.ndarray((7 * P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    cur = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cur, src=a[0:P, :])
    for i in range(1, 8):
        nxt = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=nxt, src=a[i * P : (i + 1) * P, :])
        s = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=cur, data2=nxt, op=nl.add)
        nisa.dma_copy(dst=out[(i - 1) * P : i * P, :], src=s)
        cur = nxt
    return out


def test_a_step_reading_the_tile_of_the_step_before_stays_unrolled():
    rolled, _ = runs_alike(carried_steps, [_data(8 * P)])
    assert not loops(rolled)


def last_tile_read_after(a):
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(8):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * P : (i + 1) * P, :])
        u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=u, op=nl.exp, data=t)
    nisa.dma_copy(dst=out, src=u)  # the last step's tile, after the steps
    return out


def test_the_step_whose_tile_is_read_after_the_steps_stays_unrolled():
    """The loop's tile holds the last iteration's data once the loop ends: the step whose
    tile is read later is left out of the loop, and so is every step after it."""
    rolled, _ = runs_alike(last_tile_read_after, [_data(8 * P)])
    (loop,) = loops(rolled)
    assert loop.trip == 7 and len(rolled.body) == 1 + 4 + 1  # the loop, step 8, the copy


def first_tile_read_after(a):
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    first = None
    for i in range(8):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * P : (i + 1) * P, :])
        u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=u, op=nl.exp, data=t)
        first = u if first is None else first
    nisa.dma_copy(dst=out, src=first)  # the first step's tile, after the steps
    return out


def test_steps_whose_first_tile_is_read_after_them_stay_unrolled():
    rolled, flat = runs_alike(first_tile_read_after, [_data(8 * P)])
    assert not loops(rolled) and len(rolled.body) == len(flat.body)


def multiplied_steps(factors: list[float]):
    """A kernel whose step ``i`` multiplies its rows by ``factors[i]``."""

    def kernel(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(len(factors)):
            t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i * P : (i + 1) * P, :])
            u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=factors[i])
            nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=u)
        return out

    return kernel


def test_steps_whose_immediates_differ_only_in_sign_of_zero_fold_apart():
    # 0.0 and -0.0 are equal numbers with other bits: the two halves fold apart
    rolled, _ = runs_alike(multiplied_steps([0.0] * 4 + [-0.0] * 4), [_data(8 * P)])
    assert [loop.trip for loop in loops(rolled)] == [4, 4]


def test_steps_with_their_own_immediates_stay_unrolled():
    rolled, _ = runs_alike(multiplied_steps([float(i) for i in range(8)]), [_data(8 * P)])
    assert not loops(rolled)


def matmul_steps(a, w):
    out = nl.ndarray((a.shape[0], P), dtype=nl.float32, buffer=nl.shared_hbm)
    ws = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ws, src=w)
    for i in range(a.shape[0] // P):
        t = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * P : (i + 1) * P, :])
        acc = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=ws, moving=t)
        nisa.nc_matmul(dst=acc, stationary=t, moving=ws)  # accumulates into acc
        res = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=res)
    return out


def test_psum_accumulation_folds_with_its_flags():
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((6 * P, P), dtype=np.float32)]
    args.append(rng.standard_normal((P, P), dtype=np.float32))
    rolled, _ = runs_alike(matmul_steps, args)
    (loop,) = loops(rolled)
    assert loop.trip == 6


def gather_steps(a, idx):
    out = nl.ndarray((4 * P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(4):
        ix = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ix, src=idx[i * P : (i + 1) * P, :])
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[F, P], [1, F]], offset=0, vector_offset=ix, indirect_dim=0))
        nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=t)
    return out


def test_indirect_dma_with_each_step_its_own_index_tile_folds():
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 3 * P, size=(4 * P, 1)).astype(np.int32)
    rolled, _ = runs_alike(gather_steps, [_data(3 * P), idx])
    (loop,) = loops(rolled)
    assert loop.trip == 4


def test_a_run_time_error_in_a_folded_step_names_the_users_line():
    from nkikit.errors import NkiError

    idx = np.zeros((4 * P, 1), np.int32)
    idx[3 * P + 5] = 10**6  # step 3 gathers a row past the end
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reroll, "ROLL_ABOVE", 0)
        kernel = nki.jit(gather_steps)
        assert loops(kernel.ir(_data(3 * P), idx))
        with pytest.raises(NkiError, match="index 1000000") as info:
            kernel(_data(3 * P), idx)
    assert info.value.name == "err_tensor_access_out_of_bound"
    assert "vector_offset=ix" in info.value.loc.text


def test_small_kernels_stay_as_traced_and_large_ones_are_rerolled():
    """By default only bodies of more than ``ROLL_ABOVE`` statements are re-rolled."""
    small = nki.jit(scale_steps).ir(_data(8 * P))
    assert not loops(small)
    steps = reroll.ROLL_ABOVE // 5 + 1  # five statements a step
    big = nki.jit(scale_steps).ir(_data(steps * P))
    assert [loop.trip for loop in loops(big)] == [steps]


def reshaped_steps(a):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(8):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * P : (i + 1) * P, :])
        u = nl.ndarray((P, 2, F // 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=u, op=nl.exp, data=t.reshape((P, 2, F // 2)))
        nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=u.reshape((P, F)))
    return out


def test_steps_that_reshape_their_own_tiles_fold_with_their_views():
    args = [_data(8 * P)]
    rolled, flat = runs_alike(reshaped_steps, args)
    (loop,) = loops(rolled)
    assert loop.trip == 8
    assert str(unroll(rolled)) == str(flat)
    a, b = build_program(rolled, "trn2"), build_program(flat, "trn2")
    assert a.profile().summary["total_us"] == b.profile().summary["total_us"]


def program_steps(a):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    half = a.shape[0] // 2
    base = nl.program_id(0) * half
    for i in range(half // P):
        rows = slice(base + i * P, base + (i + 1) * P)
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[rows, :])
        u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[rows, :], src=u)
    return out


def test_the_steps_of_each_program_of_an_lnc_launch_fold():
    rolled, flat = runs_alike(program_steps, [_data(16 * P)], grid=2)
    assert sum(loop.trip for loop in loops(rolled)) in (8, 16)
    assert str(unroll(rolled)) == str(flat)


def test_folding_leaves_the_trace_as_it_was():
    args = [_data(8 * P)]
    flat = traced(scale_steps, args, roll=False)
    before = str(flat), [t.scope for t in flat.tensors]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reroll, "ROLL_ABOVE", 0)
        body, tensors = reroll.reroll(flat.body, flat.tensors)
    assert body is not flat.body and any(type(s) is Loop for s in body)
    assert (str(flat), [t.scope for t in flat.tensors]) == before


def test_a_folded_kernel_the_verifier_refuses_is_verified_as_traced(monkeypatch):
    """Folding never changes a verdict: were the verifier to refuse the loop, the steps as
    traced are verified (and simulated) instead."""
    import nkikit.ir.verify as verify_module
    from nkikit.errors import NkiError
    from nkikit.ir.unrolled import has_unrolled

    real = verify_module.verify

    def refuses_loops(kernel, target=None):
        if has_unrolled(kernel):
            raise NkiError("err_invalid_argument", kernel.loc, op="test", why="a folded loop")
        return real(kernel, target)

    monkeypatch.setattr(verify_module, "verify", refuses_loops)
    monkeypatch.setattr(reroll, "ROLL_ABOVE", 0)
    args = [_data(8 * P)]
    kernel = nki.jit(scale_steps)
    ir = kernel.ir(*args)
    assert not loops(ir) and sum(1 for _ in ir.ops()) == 24
    assert same_bits(kernel(*args), args[0] * np.float32(3.0))


def oversized_steps(a):
    out = nl.ndarray((8 * P, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(8):
        t = nl.ndarray((P, 40000), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        u = nl.ndarray((P, 40000), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)  # two 160 KB tiles at once
        nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=u[:, 0:4])
    return out


def test_a_kernel_the_verifier_refuses_gets_the_same_message_folded_or_not():
    from nkikit.errors import NkiError

    messages = []
    for limit in (0, math.inf):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(reroll, "ROLL_ABOVE", limit)
            with pytest.raises(NkiError) as info:
                nki.jit(oversized_steps)(_data(P))
        messages.append((info.value.name, str(info.value)))
    assert messages[0] == messages[1]
    assert messages[0][0] == "err_sbuf_capacity_exceeded"


def accumulating_steps(a):
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[0:P, :])
    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for _ in range(8):  # steps with no tile of their own
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_steps_that_allocate_nothing_fold_too():
    rolled, _ = runs_alike(accumulating_steps, [_data(P)])
    (loop,) = loops(rolled)
    assert loop.trip == 8 and len(loop.body) == 1
