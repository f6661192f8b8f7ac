"""NKI 0.x random numbers: ``nisa.rng``, ``rand2``, ``set_rng_seed``, ``rand_set_state``,
``rand_get_state`` and ``dropout`` drawing from the same PRNG state [nki-0x.md §4.12].

The streams are nkikit's XORWOW model (not the hardware's bits), so the tests check what the
ISA promises: ranges, truncation, uniform statistics, reproducibility, the state round trip,
the dropout rate, and that every constraint is a named error at the kernel's line.  Both
simulators run every kernel here and must agree bit for bit (``conftest.py``)."""

import inspect

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError
from nkikit.sim.prng import draw, seed_state

P, F = 128, 512
ONE = np.zeros((1, 1), np.int32)


@pytest.fixture
def trn3(monkeypatch):
    """rand2 and the VectorE state moves are NC-v4 instructions."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


def _out(t):
    o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def _seed(seed):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=seed)
    nisa.set_rng_seed(s)


@nki.jit
def uniform(seed, lo, hi, reseed):
    if reseed:
        _seed(seed)
    u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(u, lo, hi)
    return _out(u)


def test_rand2_is_uniform_in_its_range_and_reproducible(trn3):
    a = uniform(ONE, -2.0, 6.0, False)
    assert a.min() >= -2.0 and a.max() <= 6.0
    assert abs(a.mean() - 2.0) < 0.05  # 65536 draws: standard error 8 / sqrt(12 * 65536)
    assert abs(a.std() - 8 / np.sqrt(12)) < 0.05
    hist, _ = np.histogram(a, bins=8, range=(-2.0, 6.0))
    assert (abs(hist / a.size - 1 / 8) < 0.01).all()
    np.testing.assert_array_equal(uniform(ONE, -2.0, 6.0, False), a)  # same call, same stream


def test_the_seed_decides_the_stream(trn3):
    s1, s2 = np.array([[1]], np.int32), np.array([[2]], np.int32)
    a, b = uniform(s1, 0.0, 1.0, True), uniform(s1, 0.0, 1.0, True)
    np.testing.assert_array_equal(a, b)
    c = uniform(s2, 0.0, 1.0, True)
    assert (a != c).mean() > 0.99
    assert (a != uniform(s1, 0.0, 1.0, False)).mean() > 0.99  # unseeded: the kernel's own
    # lanes are independent streams, not copies of one another
    assert len({row.tobytes() for row in a}) == P


@nki.jit
def seeded_by_language(seed):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=seed)
    nl.random_seed(s)
    u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(u, 0.0, 1.0)
    return _out(u)


def test_nl_random_seed_is_set_rng_seed(trn3):
    s = np.array([[5]], np.int32)
    np.testing.assert_array_equal(seeded_by_language(s), uniform(s, 0.0, 1.0, True))


@nki.jit
def bounds_per_partition(lo, hi):
    lo_t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    hi_t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=lo_t, src=lo)
    nisa.dma_copy(dst=hi_t, src=hi)
    u = nl.ndarray((P, 4, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.rand2(u, lo_t, hi_t)
    return _out(u)


def test_rand2_takes_bounds_per_partition_and_rounds_to_dst(trn3):
    lo = np.arange(P, dtype=np.float32).reshape(P, 1)
    got = bounds_per_partition(lo, lo + 1).astype(np.float32).reshape(P, -1)
    assert (got >= lo).all() and (got <= lo + 1).all()


@nki.jit
def bits(seed, dtype):
    _seed(seed)
    wide = nl.ndarray((P, 64), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(wide)
    _seed(seed)
    narrow = nl.ndarray((P, 64), dtype=dtype, buffer=nl.sbuf)
    nisa.rng(narrow)
    return _out(wide), _out(narrow)


@pytest.mark.parametrize("dtype", [nl.int8, nl.uint16, nl.int32])
def test_rng_truncates_32_random_bits_to_the_destination(dtype):
    wide, narrow = bits(np.array([[7]], np.int32), dtype)
    assert wide.dtype == np.uint32 and narrow.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(narrow, wide.astype(narrow.dtype))
    for b in range(32):  # every bit position is a fair coin
        assert abs(((wide >> b) & 1).mean() - 0.5) < 0.02


@nki.jit
def state_round_trip(x, engine):
    saved = nl.ndarray((P, 6 if engine == nisa.engine.gpsimd else 24), nl.uint32, nl.sbuf)
    nisa.rand_get_state(saved, engine=engine)
    first = nl.ndarray((P, 32), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(first, engine=engine)
    after = nl.ndarray(saved.shape, dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(after, engine=engine)
    nisa.rand_set_state(saved, engine=engine)
    again = nl.ndarray((P, 32), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(again, engine=engine)
    return _out(saved), _out(first), _out(after), _out(again)


@pytest.mark.parametrize("engine", ["gpsimd", "vector"])
def test_get_and_set_state_replay_a_stream(engine, trn3):
    saved, first, after, again = state_round_trip(ONE, getattr(nisa.engine, engine))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(saved, after)
    # the state is XORWOW words per lane (sim/prng.py): the model's own step reproduces it
    want, new = draw(saved, 32)
    np.testing.assert_array_equal(first, want)
    np.testing.assert_array_equal(after, new)


@nki.jit
def set_then_get(state):
    s = nl.ndarray((64, 6), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=state)
    nisa.rand_set_state(s)
    back = nl.ndarray((64, 6), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(back)
    return _out(back)


def test_rand_set_state_sets_the_lanes_it_is_given():
    state = seed_state(12345, 64, 6)
    np.testing.assert_array_equal(set_then_get(state), state)


@nki.jit
def drop(x, prob, seed):
    _seed(seed)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dropout(d, t, prob)
    _seed(seed)
    u = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(u, 0.0, 1.0)
    return _out(d), _out(u)


@pytest.mark.parametrize("prob", [0.1, 0.5, 0.8])
def test_dropout_rate_and_the_shared_stream(prob, trn3):
    x = np.random.default_rng(0).uniform(1, 2, (P, F)).astype(np.float32)
    d, u = drop(x, prob, np.array([[3]], np.int32))
    dropped = d == 0
    assert abs(dropped.mean() - prob) < 0.01
    np.testing.assert_array_equal(d[~dropped], x[~dropped])  # kept as is: no rescaling
    # dropout draws from the VectorE generator rand2 uses: same seed, same uniforms
    np.testing.assert_array_equal(dropped, u < prob)


@nki.jit
def drop_per_partition(x, prob):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    p = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=p, src=prob)
    nisa.dropout(t, t, p)
    return _out(t)


def test_dropout_takes_a_rate_per_partition():
    prob = np.where(np.arange(P) % 2, 0.9, 0.1).astype(np.float32).reshape(P, 1)
    got = drop_per_partition(np.ones((P, F), np.float32), prob)
    rate = (got == 0).mean(axis=1)
    assert abs(rate[1::2].mean() - 0.9) < 0.02 and abs(rate[::2].mean() - 0.1) < 0.02


@nki.jit
def draws_in_a_loop(x):
    out = nl.ndarray((4, P, 16), dtype=nl.uint32, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.ndarray((P, 16), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rng(t)
        nisa.dma_copy(dst=out[i], src=t)
    return out


def test_the_state_carries_across_loop_iterations():
    got = draws_in_a_loop(ONE)
    assert len({got[i].tobytes() for i in range(4)}) == 4
    np.testing.assert_array_equal(draws_in_a_loop(ONE), got)


# ---------------------------------------------------------------------------------------------
# constraints: named errors at the user's line


@nki.jit
def rng_into_floats(x):
    t = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rng(t)  # bad
    return x


@nki.jit
def rand2_empty_range(x):
    t = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(t, 1.0, 1.0)  # bad
    return x


@nki.jit
def rand2_wide_bound(x):
    t = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    lo = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(lo, 0.0)
    nisa.rand2(t, lo, 1.0)  # bad
    return x


@nki.jit
def rand2_into_a_bool(x):
    t = nl.ndarray((P, 8), dtype=nl.bool_, buffer=nl.sbuf)
    nisa.rand2(t, 0.0, 1.0)  # bad
    return x


@nki.jit
def rand2_on_trn2(x):
    t = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(t, 0.0, 1.0)  # bad
    return x


@nki.jit
def wide_seed(x):
    s = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(s, 1)
    nisa.set_rng_seed(s)  # bad
    return x


@nki.jit
def short_state(x):
    s = nl.ndarray((P, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.memset(s, 1)
    nisa.rand_set_state(s)  # bad
    return x


@nki.jit
def signed_state(x):
    s = nl.ndarray((P, 6), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(s, 1)
    nisa.rand_set_state(s)  # bad
    return x


@nki.jit
def vector_state_on_trn2(x):
    s = nl.ndarray((P, 24), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(s, engine=nisa.engine.vector)  # bad
    return x


@nki.jit
def gpsimd_rng_into_psum(x):
    t = nl.ndarray((P, 8), dtype=nl.int32, buffer=nl.psum)
    nisa.rng(t, engine=nisa.engine.gpsimd)  # bad
    return x


@nki.jit
def rng_on_the_scalar_engine(x):
    t = nl.ndarray((P, 8), dtype=nl.int32, buffer=nl.sbuf)
    nisa.rng(t, engine=nisa.engine.scalar)  # bad
    return x


@pytest.mark.parametrize(
    "kernel,name,target",
    [
        (rng_into_floats, "err_unsupported_dtype", None),
        (rand2_empty_range, "err_invalid_argument", "trn3"),
        (rand2_wide_bound, "err_invalid_argument", "trn3"),
        (rand2_into_a_bool, "err_unsupported_dtype", "trn3"),
        (rand2_on_trn2, "err_unsupported_instruction_on_target", "trn2"),
        (wide_seed, "err_invalid_argument", None),
        (short_state, "err_invalid_argument", None),
        (signed_state, "err_unsupported_dtype", None),
        (vector_state_on_trn2, "err_unsupported_instruction_on_target", "trn2"),
        (gpsimd_rng_into_psum, "err_unsupported_memory", None),
        (rng_on_the_scalar_engine, "err_invalid_argument", None),
    ],
)
def test_random_constraints_are_named_errors_at_the_users_line(kernel, name, target, monkeypatch):
    if target:
        monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    with pytest.raises(NkiError) as e:
        kernel(ONE)
    assert e.value.name == name, str(e.value)
    assert e.value.loc.line == _line_of(kernel.func, "# bad")


@nki.jit
def gpsimd_rng_on_trn1(x):
    t = nl.ndarray((P, 8), dtype=nl.int32, buffer=nl.sbuf)
    nisa.rng(t, engine=nisa.engine.gpsimd)  # bad
    return x


def test_the_gpsimd_generator_needs_nc_v3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NkiError) as e:
        gpsimd_rng_on_trn1(ONE)
    assert e.value.name == "err_unsupported_instruction_on_target"
    assert e.value.loc.line == _line_of(gpsimd_rng_on_trn1.func, "# bad")


@nki.jit
def rand_tile(x):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.rand((128, 512), dtype=nl.float32)
    nisa.dma_copy(dst=out, src=t)
    return out


# 65,536 draws of 2^16 values leave about 65,536 (1 - 1/e) = 41,427 distinct ones
@pytest.mark.parametrize(
    "target, resolution, distinct", [("trn2", 2.0**-16, 40_000), ("trn3", 2.0**-24, 65_000)]
)
def test_nl_rand_is_uniform_in_0_1_on_every_generation(target, resolution, distinct, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    monkeypatch.setenv("NKIKIT_SIM", "check")  # both simulators, bit for bit
    r = rand_tile(np.zeros(1, np.float32))
    assert r.min() >= 0.0 and r.max() < 1.0
    assert abs(float(r.mean()) - 0.5) < 0.01 and len(np.unique(r)) > distinct
    # values on the generator's grid: rng's 16 bits (NC-v2/v3), rand2's 24 bits (NC-v4)
    assert np.all(np.mod(r.astype(np.float64), resolution) == 0)
    np.testing.assert_array_equal(r, rand_tile(np.zeros(1, np.float32)))  # same seed


def test_nl_rand_makes_float_on_chip_tensors_only():
    @nki.jit
    def int_rand(x):
        t = nl.rand((128, 8), dtype=nl.int32)  # BAD
        return t

    with pytest.raises(NkiError) as e:
        int_rand(np.zeros(1, np.float32))
    assert e.value.name == "err_invalid_argument" and "int32" in str(e.value)
    assert "t = nl.rand(" in str(e.value)
