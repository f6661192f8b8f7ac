"""NKI 0.x collectives across ranks (``nki.collectives``): every rank runs the kernel on its
own data and the collectives exchange tiles between the ranks of each replica group.  Each
rank's result is checked against numpy; ``nki.simulate_ranks`` gives every rank its own
inputs, an ordinary call runs every rank on the same inputs and returns rank 0's results."""

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.collectives as ncc
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError
from nkikit.ir.prims import COLLECTIVES
from nkikit.sim.ranks import world_size

RNG = np.random.default_rng(7)
H, W = 8, 6


def _hbm_collective(x, fn, out_shape):
    """src/dst in shared HBM around ``fn(src, dst)``, as the hardware wants (a collective does
    not touch the kernel's own inputs and outputs)."""
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray(out_shape, dtype=x.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray(out_shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    fn(src, dst)
    nisa.dma_copy(dst=out, src=dst)
    return out


@nki.jit
def all_reduce_k(x, groups, op):
    return _hbm_collective(
        x,
        lambda s, d: ncc.all_reduce(srcs=[s], dsts=[d], replica_group=groups, op=op),
        x.shape,
    )


@nki.jit
def all_gather_k(x, groups, n):
    shape = (x.shape[0] * n, x.shape[1])
    return _hbm_collective(
        x,
        lambda s, d: ncc.all_gather(srcs=[s], dsts=[d], replica_group=groups, collective_dim=0),
        shape,
    )


@nki.jit
def reduce_scatter_k(x, groups, n):
    shape = (x.shape[0], x.shape[1] // n)
    return _hbm_collective(
        x,
        lambda s, d: ncc.reduce_scatter(
            srcs=[s], dsts=[d], replica_group=groups, collective_dim=1, op=nl.add
        ),
        shape,
    )


@nki.jit
def all_to_all_k(x, groups):
    return _hbm_collective(
        x,
        lambda s, d: ncc.all_to_all(srcs=[s], dsts=[d], replica_group=groups, collective_dim=0),
        x.shape,
    )


@nki.jit
def permute_k(x, pairs):
    def fn(s, d):
        nisa.dma_copy(dst=d, src=s)  # a rank nobody sends to keeps its own data
        ncc.collective_permute(srcs=[s], dsts=[d], source_target_pairs=pairs)

    return _hbm_collective(x, fn, x.shape)


@nki.jit
def sbuf_all_gather_k(x, groups, n):
    """SBUF to SBUF along the free dimension, as the NKI Library's sb2sb all-gather does."""
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    g = nl.ndarray((x.shape[0], x.shape[1] * n), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    ncc.all_gather(srcs=[a], dsts=[g], replica_group=groups, collective_dim=1)
    out = nl.ndarray(g.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=g)
    return out


def _per_rank(n, shape=(H, W), dtype=np.float32):
    return [RNG.standard_normal(shape).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("op,ref", [(nl.add, np.sum), (nl.maximum, np.max), (nl.minimum, np.min)])
def test_all_reduce_gives_every_rank_the_reduction(op, ref):
    xs = _per_rank(3)
    groups = ncc.ReplicaGroup([[0, 1, 2]])
    outs = nki.simulate_ranks(all_reduce_k, [dict(x=x, groups=groups, op=op) for x in xs])
    want = ref(np.stack(xs), axis=0) if ref is not np.sum else xs[0] + xs[1] + xs[2]
    for got in outs:
        np.testing.assert_array_equal(got, want)


def test_all_reduce_within_each_group_only():
    xs = _per_rank(4)
    groups = ncc.ReplicaGroup([[0, 1], [2, 3]])
    outs = nki.simulate_ranks(all_reduce_k, [dict(x=x, groups=groups, op=nl.add) for x in xs])
    for r, got in enumerate(outs):
        lo = r // 2 * 2
        np.testing.assert_array_equal(got, xs[lo] + xs[lo + 1])


def test_all_reduce_of_bf16_rounds_once_after_an_fp32_sum():
    xs = _per_rank(2, dtype=nl.bfloat16)
    groups = ncc.ReplicaGroup([[0, 1]])
    outs = nki.simulate_ranks(all_reduce_k, [dict(x=x, groups=groups, op=nl.add) for x in xs])
    want = (xs[0].astype(np.float32) + xs[1].astype(np.float32)).astype(nl.bfloat16)
    assert outs[0].dtype == want.dtype
    np.testing.assert_array_equal(outs[1].astype(np.float32), want.astype(np.float32))


def test_all_gather_concatenates_in_group_order():
    xs = _per_rank(4)
    groups = ncc.ReplicaGroup([[3, 1, 0, 2]])  # group order, not rank order
    outs = nki.simulate_ranks(all_gather_k, [dict(x=x, groups=groups, n=4) for x in xs])
    want = np.concatenate([xs[3], xs[1], xs[0], xs[2]], axis=0)
    for got in outs:
        np.testing.assert_array_equal(got, want)


def test_sbuf_all_gather_along_the_free_dimension():
    xs = _per_rank(2, shape=(16, 4))
    groups = ncc.ReplicaGroup([[0, 1]])
    outs = nki.simulate_ranks(sbuf_all_gather_k, [dict(x=x, groups=groups, n=2) for x in xs])
    for got in outs:
        np.testing.assert_array_equal(got, np.concatenate(xs, axis=1))


def test_reduce_scatter_gives_each_rank_its_chunk_of_the_sum():
    xs = _per_rank(3)
    groups = ncc.ReplicaGroup([[0, 1, 2]])
    outs = nki.simulate_ranks(reduce_scatter_k, [dict(x=x, groups=groups, n=3) for x in xs])
    total = xs[0] + xs[1] + xs[2]
    for r, got in enumerate(outs):
        np.testing.assert_array_equal(got, np.split(total, 3, axis=1)[r])


def test_all_to_all_exchanges_chunks():
    n = 4
    xs = _per_rank(n, shape=(4 * n, W))
    groups = ncc.ReplicaGroup([list(range(n))])
    outs = nki.simulate_ranks(all_to_all_k, [dict(x=x, groups=groups) for x in xs])
    for r, got in enumerate(outs):
        want = np.concatenate([np.split(xs[j], n, axis=0)[r] for j in range(n)], axis=0)
        np.testing.assert_array_equal(got, want)


def test_collective_permute_sends_along_the_pairs():
    xs = _per_rank(3)
    pairs = ((0, 1), (1, 2))  # rank 0 receives nothing and keeps its own data
    outs = nki.simulate_ranks(permute_k, [dict(x=x, pairs=pairs) for x in xs])
    for got, want in zip(outs, (xs[0], xs[0], xs[1])):
        np.testing.assert_array_equal(got, want)


def test_an_ordinary_call_runs_every_rank_on_the_same_inputs_and_returns_rank_0s_result():
    x = _per_rank(1)[0]
    got = all_reduce_k(x, ncc.ReplicaGroup([[0, 1, 2, 3]]), nl.add)
    np.testing.assert_array_equal(got, x + x + x + x)
    # all_to_all with the same data everywhere: rank 0 receives chunk 0 of every rank
    y = _per_rank(1, shape=(8, W))[0]
    got = all_to_all_k(y, ncc.ReplicaGroup([[0, 1, 2, 3]]))
    np.testing.assert_array_equal(got, np.tile(y[:2], (4, 1)))


def test_collectives_on_two_logical_cores():
    """An LNC=2 launch: both programs run the collective, on the shared HBM tensors."""
    x = _per_rank(1)[0]
    got = nki.cpu_simulate(all_reduce_k)[2](x=x, groups=ncc.ReplicaGroup([[0, 1]]), op=nl.add)
    np.testing.assert_array_equal(got, x + x)


def test_the_world_is_as_large_as_the_groups_name():
    x = _per_rank(1)[0]
    ir = all_reduce_k.ir(x, ncc.ReplicaGroup([[0, 1], [2, 3], [4, 5]]), nl.add)
    assert world_size(ir) == 6
    assert [op.prim for op, _ in ir.ops() if op.prim in COLLECTIVES] == ["all_reduce"]


# -- rank_id --------------------------------------------------------------------------------


@nki.jit
def my_slice(t):
    """Each rank copies its own slice: ``rank_id()`` as a runtime offset."""
    _, h, w = t.shape
    out = nl.ndarray((h, w), dtype=t.dtype, buffer=nl.shared_hbm)
    r = ncc.rank_id()
    nisa.dma_copy(dst=out, src=t.ap(pattern=[[w, h], [1, w]], scalar_offset=r, indirect_dim=0))
    return out


def test_rank_id_as_scalar_offset_selects_each_ranks_slice():
    t = RNG.standard_normal((3, H, W)).astype(np.float32)
    outs = nki.simulate_ranks(my_slice, [dict(t=t)] * 3)
    for r, got in enumerate(outs):
        np.testing.assert_array_equal(got, t[r])


def test_rank_id_is_0_in_a_kernel_without_collectives():
    t = RNG.standard_normal((2, H, W)).astype(np.float32)
    for lnc in (1, 2):
        np.testing.assert_array_equal(nki.cpu_simulate(my_slice)[lnc](t=t), t[0])


@nki.jit
def stored_rank(x, groups):
    """rank_id stored to memory through a register, next to a collective that sets the world."""
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(s, ncc.rank_id())
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    _hbm_collective(
        x, lambda a, b: ncc.all_reduce(srcs=[a], dsts=[b], replica_group=groups, op=nl.add), x.shape
    )
    return out


def test_every_rank_reads_its_own_id():
    x = _per_rank(1)[0]
    groups = ncc.ReplicaGroup([[0, 1, 2]])
    outs = nki.simulate_ranks(stored_rank, [dict(x=x, groups=groups)] * 3)
    assert [int(o[0, 0]) for o in outs] == [0, 1, 2]


# -- errors at the user's line --------------------------------------------------------------


def _line_of(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


@nki.jit
def bad_gather_shape(x, groups):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)  # needs 2x the rows
    nisa.dma_copy(dst=src, src=x)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=groups, collective_dim=0)  # bad
    return dst


@nki.jit
def mixed_memories(x, groups):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=groups, op=nl.add)  # bad
    return dst


@pytest.mark.parametrize(
    "kernel,groups,name,text",
    [
        (bad_gather_shape, [[0, 1]], "err_invalid_argument", "dst must have shape"),
        (mixed_memories, [[0, 1]], "err_unsupported_memory", "both HBM or both SBUF"),
        (bad_gather_shape, [[0, 1], [1, 2]], "err_invalid_argument", "must not overlap"),
        (bad_gather_shape, [[0, 1], [2]], "err_invalid_argument", "as many ranks"),
    ],
)
def test_bad_collectives_are_named_errors_at_the_users_line(kernel, groups, name, text):
    x = _per_rank(1)[0]
    with pytest.raises(NkiError) as e:
        kernel(x, ncc.ReplicaGroup(groups))
    assert e.value.name == name and text in str(e.value)
    assert e.value.loc.line == _line_of(kernel.func, "# bad")


def test_a_rank_outside_every_group_is_reported_at_the_collective():
    x = _per_rank(1)[0]
    groups = ncc.ReplicaGroup([[1, 2]])  # rank 0 runs the kernel too, in no group
    with pytest.raises(NkiError, match="rank 0 is in no replica group") as e:
        all_reduce_k(x, groups, nl.add)
    assert e.value.loc.line == _line_of(all_reduce_k.func, "ncc.all_reduce")


def test_per_rank_inputs_must_specialize_alike():
    groups = ncc.ReplicaGroup([[0, 1]])
    xs = [_per_rank(1)[0], _per_rank(1, shape=(H, W + 2))[0]]
    with pytest.raises(ValueError, match="specialize"):
        nki.simulate_ranks(all_reduce_k, [dict(x=x, groups=groups, op=nl.add) for x in xs])


def test_the_cost_model_charges_a_collective_as_data_movement():
    import nkikit

    x = _per_rank(1, shape=(128, 512))[0]
    small = nkikit.compile(all_gather_k, x, ncc.ReplicaGroup([[0, 1]]), 2, target="trn2")
    big = nkikit.compile(all_gather_k, x, ncc.ReplicaGroup([list(range(8))]), 8, target="trn2")
    assert big.profile().total_us > small.profile().total_us  # 8 ranks' data vs 2


@nki.jit
def collective_in_a_rank_dependent_loop(x, groups):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)

    def body(i):
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=groups, op=nl.add)  # waits

    nl.fori_loop(0, ncc.rank_id(), body)  # rank r runs the collective r times
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=src)
    return out


def test_ranks_that_diverge_around_a_collective_are_reported_not_hung():
    x = _per_rank(1)[0]
    with pytest.raises(NkiError, match="rank 0 finished the kernel without reaching") as e:
        collective_in_a_rank_dependent_loop(x, ncc.ReplicaGroup([[0, 1]]))
    assert e.value.loc.line == _line_of(collective_in_a_rank_dependent_loop.func, "# waits")


def test_census_finds_the_run_time_loop_and_the_collective():
    """``Kernel.census`` (tests/ir/test_census.py) of a kernel whose loop trip count is the
    rank: the simulators run it on the reference interpreter, on as many ranks as its
    groups name."""
    from tests.ir.test_census import by_walking

    ir = collective_in_a_rank_dependent_loop.ir(_per_rank(1)[0], ncc.ReplicaGroup([[0, 1, 2]]))
    c = ir.census()
    assert (c.ops, c.prims, c.device_loops) == by_walking(ir)
    assert c.device_loops and "all_reduce" in c.prims and world_size(ir) == 3


@nki.jit
def ranks_meet_at_different_collectives(x, groups):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)

    def body(i):
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=groups, op=nl.add)

    nl.fori_loop(0, ncc.rank_id(), body)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=groups, op=nl.maximum)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_ranks_waiting_at_different_collectives_are_reported_not_hung():
    x = _per_rank(1)[0]
    with pytest.raises(NkiError, match="wait at different collectives"):
        ranks_meet_at_different_collectives(x, ncc.ReplicaGroup([[0, 1]]))
