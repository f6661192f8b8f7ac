"""The engines' accumulator registers carried between instructions (``reduce_cmd``)
[reference/nki-0x.md §4.1, §4.10, §6.3]: the ScalarE ones shared by activation,
activation_reduce and activate2, the VectorE ones by exponential, range_select,
select_reduce, tensor_scalar_reduce and tensor_scalar_cumulative.  Each chain is checked
against a numpy model of the registers; the directory's conftest runs every kernel on both
simulators, which must agree bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nki0x_helpers import load as _load
from nki0x_helpers import store as _store

import nkikit
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

rng = np.random.default_rng(11)
CMD = nisa.reduce_cmd
P = 32


@pytest.fixture(autouse=True)
def _trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


def _col():
    return nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- ScalarE: activation / activation_reduce / activate2 share one register per lane ------------

_STEPS = ("reset_reduce", "reduce", "reset", "idle", "read")


@settings(max_examples=15, deadline=None)
@given(steps=st.lists(st.sampled_from(_STEPS), min_size=1, max_size=6), seed=st.integers(0, 999))
def test_scalar_register_follows_each_command(steps, seed):
    """A random program of ScalarE instructions: each adds its row sum of exp(x_i) to the
    register, resets it, or leaves it; every instruction reads the register out."""
    r = np.random.default_rng(seed)
    # start with a reset_reduce so that no step reads the poisoned register
    steps = ["reset_reduce", *steps]
    x = r.standard_normal((P, 16 * len(steps))).astype(np.float32)
    xs = [x[:, 16 * i : 16 * (i + 1)] for i in range(len(steps))]

    @nki.jit
    def k(x):
        outs = []
        for i, step in enumerate(steps):
            a = _load(x[:, 16 * i : 16 * (i + 1)])
            y = nl.ndarray((P, 16), dtype=nl.float32, buffer=nl.sbuf)
            res = _col()
            if step == "read":  # activate2 with reset: the register becomes 0
                nisa.activate2(
                    dst=y,
                    op=nl.exp,
                    data=a,
                    imm0=0.0,
                    imm1=0.0,
                    op0=None,
                    op1=None,
                    reduce_op=nl.add,
                    reduce_res=res,
                    reduce_cmd=CMD.reset,
                )
                continue
            nisa.activation(
                dst=y,
                op=nl.exp,
                data=a,
                reduce_op=nl.add,
                reduce_res=res,
                reduce_cmd=getattr(CMD, step),
            )
            outs.append(_store(res))
        return tuple(outs)

    got = k(x)
    got = got if isinstance(got, tuple) else (got,)
    reg = np.full(P, np.nan, np.float32)
    want = []
    for step, x in zip(steps, xs):
        s = np.exp(x).sum(axis=1)
        if step == "read":
            reg = np.zeros(P, np.float32)  # reset -> the identity of add
            continue
        if step == "reset_reduce":
            reg = s
        elif step == "reduce":
            reg = (reg + s).astype(np.float32)
        elif step == "reset":
            reg = np.zeros(P, np.float32)
        # idle: the instruction's own sum is read out, the register is left as it was
        want.append(s if step == "idle" else reg.copy())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g[:, 0], w, rtol=1e-5)


def test_activation_reduce_starts_a_chain_that_activation_continues():
    @nki.jit
    def k(x, y):
        a, b = _load(x), _load(y)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        r1, r2 = _col(), _col()
        nisa.activation_reduce(dst=t, op=nl.exp, data=a, reduce_op=nl.add, reduce_res=r1)
        nisa.activation(dst=t, op=nl.exp, data=b, reduce_op=nl.add, reduce_res=r2,
                        reduce_cmd=CMD.reduce)  # fmt: skip
        return _store(r1), _store(r2)

    x, y = f32(P, 24), f32(P, 24)
    r1, r2 = k(x, y)
    np.testing.assert_allclose(r1[:, 0], np.exp(x).sum(1), rtol=1e-5)
    np.testing.assert_allclose(r2[:, 0], np.exp(x).sum(1) + np.exp(y).sum(1), rtol=1e-5)


def test_activate2_keeps_a_running_maximum_over_tiles():
    @nki.jit
    def k(x):
        m = _col()
        for j in range(4):
            a = _load(x[:, j * 16 : (j + 1) * 16])
            y = nl.ndarray((P, 16), dtype=nl.float32, buffer=nl.sbuf)
            cmd = CMD.reset_reduce if j == 0 else CMD.reduce
            nisa.activate2(dst=y, op=nl.copy, data=a, imm0=2.0, imm1=1.0, op0=nl.multiply,
                           op1=nl.add, reduce_op=nl.maximum, reduce_cmd=cmd,
                           reduce_res=m if j == 3 else None)  # fmt: skip
        return _store(m)

    x = f32(P, 64)
    np.testing.assert_allclose(k(x)[:, 0], (x * 2 + 1).max(1), rtol=1e-6)


def test_a_chain_that_starts_with_reduce_reads_the_poisoned_register():
    # fresh memory reads as NaN: a kernel that forgets reset_reduce shows it
    @nki.jit
    def k(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        r = _col()
        nisa.activation(dst=y, op=nl.exp, data=a, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=CMD.reduce)  # fmt: skip
        return _store(r)

    assert np.isnan(k(f32(P, 8))).all()


# -- VectorE: exponential, tensor_scalar_reduce, select_reduce, range_select, cumulative --------


def test_exponential_sum_runs_over_tiles_from_reduce_init():
    @nki.jit
    def k(x):
        s = _col()
        for j in range(3):
            a = _load(x[:, j * 20 : (j + 1) * 20])
            y = nl.ndarray((P, 20), dtype=nl.bfloat16, buffer=nl.sbuf)
            cmd = CMD.load_reduce if j == 0 else CMD.reduce
            nisa.exponential(dst=y, src=a, max_value=1.0, reduce_cmd=cmd,
                             reduce_init=5.0 if j == 0 else 0.0,
                             reduce_res=s if j == 2 else None)  # fmt: skip
        return _store(s)

    x = f32(P, 60)
    np.testing.assert_allclose(k(x)[:, 0], 5.0 + np.exp(x - 1.0).sum(1), rtol=1e-5)


@pytest.mark.parametrize(
    ("op", "model"),
    [(nl.add, np.sum), (nl.maximum, np.max), (nl.minimum, np.min), (nl.multiply, np.prod)],
)
def test_tensor_scalar_reduce_chains_load_and_negates_the_read_out(op, model):
    @nki.jit
    def k(x, y, init):
        a, b, i = _load(x), _load(y), _load(init)
        d = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        r = _col()
        nisa.tensor_scalar_reduce(dst=d, data=a, op0=nl.add, operand0=0.5, reduce_op=op,
                                  reduce_cmd=CMD.load_reduce, reduce_init=i)  # fmt: skip
        nisa.tensor_scalar_reduce(dst=d, data=b, op0=nl.add, operand0=0.5, reduce_op=op,
                                  reduce_cmd=CMD.reduce, reduce_res=r,
                                  reduce_res_negate=True)  # fmt: skip
        return _store(r)

    x, y = f32(P, 6) * 0.5, f32(P, 6) * 0.5
    init = f32(P, 1)
    both = np.concatenate([init, x + 0.5, y + 0.5], axis=1)
    np.testing.assert_allclose(k(x, y, init)[:, 0], -model(both, axis=1), rtol=1e-5)


def test_select_and_range_select_share_the_vector_register_with_exponential():
    @nki.jit
    def k(x, pred):
        a, p = _load(x), _load(pred)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        r = _col()
        nisa.exponential(dst=y, src=a, reduce_cmd=CMD.reset)  # register = 0
        nisa.select_reduce(dst=y, predicate=p, on_true=a, on_false=-9.0, reduce_cmd=CMD.reduce)
        nisa.range_select(dst=y, on_true_tile=a, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=2.0, bound1=6.0, reduce_cmd=CMD.reduce,
                          reduce_res=r)  # fmt: skip
        return _store(r)

    x = f32(P, 16)
    pred = (rng.random((P, 16)) < 0.5).astype(np.uint8)
    sel = np.where(pred != 0, x, np.float32(-9.0)).max(1)
    rng_max = x[:, 2:6].max(1)
    want = np.maximum(np.maximum(0.0, sel), rng_max)
    np.testing.assert_array_equal(k(x, pred)[:, 0], want.astype(np.float32))


def test_cumulative_continues_from_the_exponential_sum():
    # tensor_scalar_cumulative(reduce) starts its scan at the VectorE register
    @nki.jit
    def k(x, z):
        a, b = _load(x), _load(z)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        c = nl.ndarray(z.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=y, src=a, reduce_cmd=CMD.reset_reduce)
        nisa.tensor_scalar_cumulative(dst=c, src=b, op0=nl.multiply, op1=nl.add, imm0=1.0,
                                      reduce_cmd=CMD.reduce)  # fmt: skip
        return _store(c)

    x, z = f32(P, 8), f32(P, 5)
    start = np.exp(x).sum(1, keepdims=True)
    np.testing.assert_allclose(k(x, z), start + np.cumsum(z, axis=1), rtol=1e-5)


# -- arguments a command does not read, and the cost model --------------------------------------


def test_reduce_commands_need_what_they_read():
    @nki.jit
    def no_op(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=y, op=nl.exp, data=a, imm0=1.0, imm1=1.0, op0=None, op1=None,
                       reduce_cmd=CMD.reduce)  # fmt: skip
        return _store(y)

    @nki.jit
    def bad_cmd(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=y, src=a, reduce_cmd=7)
        return _store(y)

    with pytest.raises(NkiError, match="needs reduce_op") as e:
        no_op(f32(P, 8))
    assert e.value.name == "err_invalid_argument" and "test_isa_accumulators.py" in str(e.value)
    with pytest.raises(NkiError, match="reduce_cmd=7") as e:
        bad_cmd(f32(P, 8))
    assert e.value.name == "err_invalid_argument"


def test_the_read_out_is_its_own_instruction_charged_once():
    @nki.jit
    def k(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        r = _col()
        nisa.activation(dst=y, op=nl.exp, data=a, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=CMD.reset_reduce)  # fmt: skip
        return _store(r)

    x = f32(P, 512)
    prof = nkikit.profile_kernel(k, x, target="trn2")
    (act,) = [i for i in prof.instructions if i.opcode == "ACTIVATE"]
    (out,) = [i for i in prof.instructions if i.opcode == "TENSOR_COPY"]
    assert act.engine.lower().startswith("scalar") and out.engine.lower().startswith("scalar")
    # the activation streams 512 elements, the read-out one per partition
    assert act.duration_ns > out.duration_ns > 0


def test_a_reduction_the_accumulators_cannot_hold_is_a_named_error():
    @nki.jit
    def k(x):
        a = _load(x)
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=a, reduce_op=nl.bitwise_or,
                        reduce_cmd=CMD.reset_reduce)  # fmt: skip
        return _store(y)

    # activation's reduce_op must be nl.add [ISA activation]
    with pytest.raises(NkiError, match="reduce_op must be nl.add") as e:
        k(f32(P, 8))
    assert e.value.name == "err_invalid_argument" and "test_isa_accumulators.py" in str(e.value)
