"""NKI 0.x registers and loops with run-time trip counts: ``nisa.register_alloc / load / store /
move``, a register as ``.ap(scalar_offset=)``, ``nl.fori_loop`` / ``nl.dynamic_range`` with a
register bound and ``nl.while_loop``, each against numpy; Python cannot branch on a register."""

import inspect

import numpy as np
import pytest

import nkikit
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError
from nkikit.ir.core import Loop, Op

ROWS, W = 6, 4
X = np.arange(ROWS * W, dtype=np.float32).reshape(ROWS, W)


def _n(v: int) -> np.ndarray:
    return np.array([[v]], np.int32)


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


def _row(x, i):
    """Row ``i`` (an int or a register) of the HBM tensor ``x`` as a (1, W) access."""
    return x.ap([[x.shape[1], 1], [1, x.shape[1]]], offset=0, scalar_offset=i, indirect_dim=0)


@nki.jit
def register_roundtrip(x, n):
    """n -> SBUF -> register -> register (move) -> SBUF -> HBM; and the register as an offset."""
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    r = nisa.register_alloc()
    nisa.register_load(r, s)
    r2 = nisa.register_alloc(0)
    nisa.register_move(r2, r)
    back = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(back, r2)
    out_n = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_n, src=back)
    row = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=_row(x, r2))
    out_row = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_row, src=row)
    return out_n, out_row


def test_a_register_carries_a_value_from_memory_to_memory_and_into_an_offset():
    for v in (0, 3, 5):
        got_n, got_row = register_roundtrip(X, _n(v))
        assert int(got_n[0, 0]) == v
        np.testing.assert_array_equal(got_row[0], X[v])


@nki.jit
def prefilled(n):
    r = nisa.register_alloc(7)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(s, r)
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    return out


def test_register_alloc_sets_its_initial_value():
    assert int(prefilled(_n(0))[0, 0]) == 7


@nki.jit
def sum_first_rows(x, n, use_range):
    """out = x[:n].sum(0), ``n`` known only when the kernel runs."""
    acc = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, 0.0)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    r = nisa.register_alloc(s)
    row = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)

    def body(i):
        nisa.dma_copy(dst=row, src=_row(x, i))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)

    if use_range:
        for i in nl.dynamic_range(0, r):
            body(i)
    else:
        nl.fori_loop(0, r, body)
    out = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("use_range", [False, True], ids=["fori_loop", "dynamic_range"])
@pytest.mark.parametrize("n", [0, 1, 4, ROWS])
def test_a_register_bound_loop_runs_as_many_times_as_the_register_says(n, use_range):
    got = sum_first_rows(X, _n(n), use_range)
    np.testing.assert_array_equal(got[0], X[:n].sum(axis=0))


def test_one_trace_serves_every_trip_count():
    a = sum_first_rows.ir(X, _n(1), False)
    assert sum_first_rows.ir(X, _n(5), False) is a
    assert "device_range" in str(a)


@nki.jit
def countdown(n):
    """Counts the iterations of ``while c != 0: c -= 1`` (c = n)."""
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n)
    count = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(count, 0.0)

    def body(cond):
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=1)
        nisa.tensor_scalar(dst=count, data=count, op0=nl.add, operand0=1.0)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, c)
        return nxt

    nl.while_loop(nisa.register_alloc(c), body)
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=count)
    return out


@pytest.mark.parametrize("n", [0, 1, 5])
def test_while_loop_runs_until_its_register_is_zero(n):
    assert float(countdown(_n(n))[0, 0]) == n


def test_register_loops_compile_and_profile():
    for prog in (
        nkikit.compile(sum_first_rows, X, _n(3), False, target="trn2"),
        nkikit.compile(countdown, _n(3), target="trn2"),
    ):
        assert prog.profile().total_us > 0


# -- bad uses: named errors at the user's line ----------------------------------------------


@nki.jit
def python_if_on_register(n):
    r = nisa.register_alloc(1)
    if r:  # bad
        pass
    return n


@nki.jit
def python_range_on_register(n):
    r = nisa.register_alloc(3)
    for _ in range(r):  # bad
        pass
    return n


@nki.jit
def register_step(n):
    r = nisa.register_alloc(3)
    nl.fori_loop(0, 10, lambda i: None, step=r)  # bad
    return n


@nki.jit
def body_returns_a_value(x, n):
    r = nisa.register_alloc(3)
    nl.fori_loop(0, r, lambda i: 1)  # bad
    return n


@nki.jit
def while_body_returns_nothing(n):
    nl.while_loop(nisa.register_alloc(1), lambda r: None)  # bad
    return n


@nki.jit
def load_of_a_wide_tensor(x, n):
    s = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(s, 0)
    r = nisa.register_alloc()
    nisa.register_load(r, s)  # bad
    return n


@pytest.mark.parametrize(
    "kernel,args,name",
    [
        (python_if_on_register, (_n(0),), "err_unsupported_api"),
        (python_range_on_register, (_n(0),), "err_unsupported_api"),
        (register_step, (_n(0),), "err_invalid_argument"),
        (body_returns_a_value, (X, _n(0)), "err_invalid_argument"),
        (while_body_returns_nothing, (_n(0),), "err_invalid_argument"),
        (load_of_a_wide_tensor, (X, _n(0)), "err_invalid_argument"),
    ],
)
def test_bad_register_uses_are_named_errors_at_the_users_line(kernel, args, name):
    with pytest.raises(NkiError) as e:
        kernel(*args)
    assert e.value.name == name
    assert e.value.loc.line == _line_of(kernel.func, "# bad")


@nki.jit
def stuck_countdown(n, step):
    """``while c != 0: c -= step; count += 1``: with step 0 the condition never changes."""
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n)
    count = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(count, 0.0)

    def body(cond):
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=step)
        nisa.tensor_scalar(dst=count, data=count, op0=nl.add, operand0=1.0)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, c)
        return nxt

    nl.while_loop(nisa.register_alloc(c), body)  # bad
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=count)
    return out


def test_a_while_loop_whose_condition_cannot_change_is_refused_at_once():
    # the count changes every iteration, but nothing the condition is computed from does: the
    # reference interpreter (which runs register loops) stops after iteration 1, not 2**24
    with pytest.raises(NkiError, match="never ends") as e:
        stuck_countdown(_n(3), 0)
    assert e.value.name == "err_invalid_argument"
    assert e.value.loc.line == _line_of(stuck_countdown.func, "# bad")
    # a condition that moves, however slowly, runs to its end
    assert float(stuck_countdown(_n(600), 1)[0, 0]) == 600


@nki.jit
def legacy_while(n):
    """``while reg:`` (NKI 0.1 - 0.6, as the NKI Library writes it): count down to 0."""
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n)
    count = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(count, 0.0)
    reg = nisa.register_alloc()
    nisa.register_load(reg, c)
    while reg:
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=1)
        nisa.tensor_scalar(dst=count, data=count, op0=nl.add, operand0=1.0)
        nisa.register_load(reg, c)
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=count)
    return out


@pytest.mark.parametrize("n", [0, 1, 4])
def test_the_legacy_while_reg_loop_runs_until_the_register_is_zero(n):
    assert float(legacy_while(_n(n))[0, 0]) == n


@nki.jit
def break_in_while(n):
    reg = nisa.register_alloc(1)
    while reg:  # bad
        break
    return n


def test_break_inside_while_reg_is_a_named_error():
    with pytest.raises(NkiError) as e:
        break_in_while(_n(0))
    assert e.value.name == "err_unsupported_api"
    assert e.value.loc.line == _line_of(break_in_while.func, "# bad")


@nki.jit
def lnc_block_loop(x, n):
    """Each of the launch's 2 programs walks rows ``1 .. n[pid]`` of ``x`` twice, by an SBUF
    block index it bumps every iteration (the NKI Library MoE's dynamic block loop) and by the
    loop's induction register, meeting the other program at a barrier in every iteration;
    program p writes its sums to row p."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, W), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n[pid : pid + 1, :])
    stop = nisa.register_alloc(s)
    block = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(block, value=1)
    acc = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, value=0.0)
    row = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.dynamic_range(1, stop):
        nisa.dma_copy(dst=row, src=_row(x, block))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        nisa.dma_copy(dst=row, src=_row(x, i))  # the induction register: the same row
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        nisa.core_barrier(out, (0, 1))
        nisa.tensor_scalar(dst=block, data=block, op0=nl.add, operand0=1)
    nisa.dma_copy(dst=out[pid : pid + 1, :], src=acc)
    return out


@pytest.mark.parametrize("n", [1, 2, ROWS])
def test_an_lnc_launch_runs_one_device_loop_iteration_per_barrier(n):
    out = nki.cpu_simulate(lnc_block_loop)[2](x=X, n=np.array([[n], [n]], np.int32))
    want = 2 * X[1:n].sum(axis=0)
    np.testing.assert_array_equal(np.asarray(out), np.stack([want, want]))


def test_lnc_programs_whose_device_loops_differ_are_reported():
    with pytest.raises(NkiError) as e:
        nki.cpu_simulate(lnc_block_loop)[2](x=X, n=np.array([[3], [4]], np.int32))
    assert e.value.name == "err_invalid_argument"
    assert "range(1, 3) and range(1, 4)" in str(e.value)
    assert e.value.loc.line == _line_of(lnc_block_loop.func, "nl.dynamic_range(1, stop)")


@nki.jit
def lnc_while_loop(x, n):
    """Each of the launch's 2 programs counts ``c`` down from ``n[pid]`` with ``nl.while_loop``,
    adding row ``c`` of ``x`` (rows n .. 1) and meeting the other program at a barrier in every
    iteration; program p writes its sum to row p."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, W), dtype=nl.float32, buffer=nl.shared_hbm)
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n[pid : pid + 1, :])
    acc = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, value=0.0)
    row = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)

    def body(cond):
        nisa.dma_copy(dst=row, src=_row(x, c))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        nisa.core_barrier(out, (0, 1))
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=1)
        nxt = nisa.register_alloc()
        nisa.register_load(nxt, c)
        return nxt

    nl.while_loop(nisa.register_alloc(c), body)  # the loop
    nisa.dma_copy(dst=out[pid : pid + 1, :], src=acc)
    return out


@pytest.mark.parametrize("n", [0, 1, ROWS - 1])
def test_an_lnc_launch_runs_one_while_loop_iteration_per_barrier(n):
    out = nki.cpu_simulate(lnc_while_loop)[2](x=X, n=np.array([[n], [n]], np.int32))
    want = X[1 : n + 1].sum(axis=0)
    np.testing.assert_array_equal(np.asarray(out), np.stack([want, want]))


def test_an_lnc_while_loop_is_one_ir_loop_testing_both_programs_conditions():
    ir = lnc_while_loop[2].ir(X, np.array([[2], [2]], np.int32))
    loops = [s for s, _ in ir.walk() if isinstance(s, Loop) and s.device is not None]
    assert len(loops) == 1 and len(loops[0].device.peer_conds) == 1
    prims = [s.prim for s in loops[0].body if isinstance(s, Op)]
    # both programs' reads come before either's count-down: they meet at the barrier inside
    # the one loop, once per iteration
    reads = [i for i, p in enumerate(prims) if p == "dma_copy"]
    steps = [i for i, p in enumerate(prims) if p == "tensor_scalar"]
    assert len(reads) == 2 and len(steps) == 2 and max(reads) < min(steps)


@pytest.mark.parametrize("n0, n1", [(2, 3), (3, 0)])
def test_lnc_programs_whose_while_conditions_differ_are_reported(n0, n1):
    with pytest.raises(NkiError) as e:
        nki.cpu_simulate(lnc_while_loop)[2](x=X, n=np.array([[n0], [n1]], np.int32))
    assert e.value.name == "err_invalid_argument"
    assert f"before iteration {min(n0, n1)} of the while loop" in str(e.value)
    assert e.value.loc.line == _line_of(lnc_while_loop.func, "# the loop")


@nki.jit
def lnc_legacy_while(x, n):
    """``lnc_while_loop`` written with the NKI 0.1 - 0.6 ``while reg:`` loop."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, W), dtype=nl.float32, buffer=nl.shared_hbm)
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=n[pid : pid + 1, :])
    acc = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, value=0.0)
    row = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)
    reg = nisa.register_alloc()
    nisa.register_load(reg, c)
    while reg:  # the loop
        nisa.dma_copy(dst=row, src=_row(x, c))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        nisa.core_barrier(out, (0, 1))
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=1)
        nisa.register_load(reg, c)
    nisa.dma_copy(dst=out[pid : pid + 1, :], src=acc)
    return out


@pytest.mark.parametrize("n", [0, 2, ROWS - 1])
def test_an_lnc_launch_runs_one_legacy_while_iteration_per_barrier(n):
    out = nki.cpu_simulate(lnc_legacy_while)[2](x=X, n=np.array([[n], [n]], np.int32))
    want = X[1 : n + 1].sum(axis=0)
    np.testing.assert_array_equal(np.asarray(out), np.stack([want, want]))
    ir = lnc_legacy_while[2].ir(X, np.array([[n], [n]], np.int32))
    loops = [s for s, _ in ir.walk() if isinstance(s, Loop) and s.device is not None]
    assert len(loops) == 1 and len(loops[0].device.peer_conds) == 1


def test_lnc_programs_whose_legacy_while_conditions_differ_are_reported():
    with pytest.raises(NkiError) as e:
        nki.cpu_simulate(lnc_legacy_while)[2](x=X, n=np.array([[1], [3]], np.int32))
    assert e.value.name == "err_invalid_argument"
    assert "before iteration 1 of the while loop" in str(e.value)
    assert e.value.loc.line == _line_of(lnc_legacy_while.func, "# the loop")


def test_a_loop_over_a_register_never_written_is_refused_not_run():
    # an unwritten register reads 2147483647: the loop would run for hours, so it is refused
    @nki.jit
    def k(a):
        acc = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        n = nisa.register_alloc()

        def body(i):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)

        nl.fori_loop(0, n, body)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    with pytest.raises(NkiError, match="2147483647 iterations") as e:
        k(np.zeros((1, 1), np.float32))
    assert e.value.name == "err_invalid_argument"
