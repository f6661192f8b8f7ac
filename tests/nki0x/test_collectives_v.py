"""NKI 0.x variable-length and ring collectives: ``ncc.all_gather_v``, ``ncc.all_to_all_v``,
``ncc.collective_permute_implicit`` (and ``_reduce``) and
``collective_permute_implicit_current_processing_rank_id``, each rank's result against numpy
(semantics: AWS's ``nki.collectives`` API docs).  Every rank runs on both simulators, which
must agree bit for bit (``conftest.py``)."""

import inspect

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.collectives as ncc
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

RNG = np.random.default_rng(11)
N = 24  # elements of each flat buffer


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


def _hbm(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=t, src=x)
    return t


@nki.jit
def gather_v(x, meta, groups, flags):
    src, m = _hbm(x), _hbm(meta)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dst, src=src)  # elements no chunk lands on keep this
    known, rdispls = flags
    ncc.all_gather_v(
        srcs=[src],
        dsts=[dst],
        replica_group=groups,
        metadata_tensor=m,
        recv_counts_known=known,
        has_rdispls=rdispls,
    )
    return _hbm(dst)


def _meta(rows):
    return np.array(rows, dtype=np.uint32)


def test_all_gather_v_puts_each_ranks_chunk_at_the_start_of_its_slot():
    n, slot = 3, N // 3
    xs = [RNG.standard_normal((1, N)).astype(np.float32) for _ in range(n)]
    counts, displs = [5, 8, 0], [2, 0, 7]
    metas = [_meta([[counts[r]] * n, [displs[r]] * n]) for r in range(n)]
    groups = [[0, 1, 2]]
    outs = nki.simulate_ranks(
        gather_v,
        [dict(x=xs[r], meta=metas[r], groups=groups, flags=(False, False)) for r in range(n)],
    )
    for r in range(n):
        want = xs[r].reshape(-1).copy()  # dst started as this rank's own data
        for s in range(n):
            want[s * slot : s * slot + counts[s]] = xs[s].reshape(-1)[
                displs[s] : displs[s] + counts[s]
            ]
        np.testing.assert_array_equal(outs[r].reshape(-1), want)


def test_all_gather_v_with_receive_counts_and_displacements():
    n = 2
    xs = [RNG.standard_normal((1, N)).astype(np.float32) for _ in range(n)]
    # rank s sends 6 elements from 0; receivers take 4 from rank 0 at 10, 6 from rank 1 at 0
    metas = [_meta([[6, 6], [0, 0], [4, 6], [10, 0]]) for _ in range(n)]
    outs = nki.simulate_ranks(
        gather_v,
        [dict(x=xs[r], meta=metas[r], groups=[[0, 1]], flags=(True, True)) for r in range(n)],
    )
    for r in range(n):
        want = xs[r].reshape(-1).copy()
        want[10:14] = xs[0].reshape(-1)[:4]
        want[0:6] = xs[1].reshape(-1)[:6]
        np.testing.assert_array_equal(outs[r].reshape(-1), want)


@nki.jit
def to_all_v(x, meta, groups):
    src, m = _hbm(x), _hbm(meta)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dst, src=src)
    ncc.all_to_all_v(
        srcs=[src], dsts=[dst], replica_group=groups, metadata_tensor=m, has_rdispls=True
    )
    return _hbm(dst)


def test_all_to_all_v_sends_each_rank_its_own_chunk():
    n = 3
    xs = [np.arange(N, dtype=np.int32).reshape(1, N) + 100 * r for r in range(n)]
    # rank r sends (r + j + 1) elements from 4 * j to rank j; receiver k places the chunk
    # from rank s at 8 * s
    metas = [
        _meta(
            [
                [r + j + 1 for j in range(n)],
                [4 * j for j in range(n)],
                [0] * n,
                [8 * s for s in range(n)],
            ]
        )
        for r in range(n)
    ]
    outs = nki.simulate_ranks(
        to_all_v, [dict(x=xs[r], meta=metas[r], groups=[[0, 1, 2]]) for r in range(n)]
    )
    for k in range(n):
        want = xs[k].reshape(-1).copy()
        for s in range(n):
            c = s + k + 1
            want[8 * s : 8 * s + c] = xs[s].reshape(-1)[4 * k : 4 * k + c]
        np.testing.assert_array_equal(outs[k].reshape(-1), want)


@nki.jit
def ring(x, groups, steps):
    """``steps`` ring steps: each rank passes on what it received; out[i] = the rank whose
    data step i holds (current_processing_rank_id) and the data itself."""
    a, b = _hbm(x), nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    who = nl.ndarray((steps, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    data = nl.ndarray((steps, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(steps):
        r = ncc.collective_permute_implicit_current_processing_rank_id(i, groups)
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(t, r)
        nisa.dma_copy(dst=who[i : i + 1, :], src=t)
        nisa.dma_copy(dst=data[i : i + 1, :], src=a)
        ncc.collective_permute_implicit(
            srcs_by_channel=[[a]], dsts_by_channel=[[b]], replica_group=groups
        )
        a, b = b, a
    return who, data


def test_the_ring_passes_data_to_the_successor_and_names_its_origin():
    n, steps = 4, 4
    xs = [np.full((1, 5), float(r), np.float32) for r in range(n)]
    groups = [[0, 2, 1, 3]]  # the ring follows the group's order
    outs = nki.simulate_ranks(ring, [dict(x=xs[r], groups=groups, steps=steps) for r in range(n)])
    g = groups[0]
    for r in range(n):
        who, data = outs[r]
        k = g.index(r)
        origin = [g[(k - i) % n] for i in range(steps)]
        assert who.reshape(-1).tolist() == origin
        np.testing.assert_array_equal(data[:, 0], np.array(origin, np.float32))


@nki.jit
def ring_reduce(x, y, groups):
    a, b = _hbm(x), _hbm(y)
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.collective_permute_implicit_reduce(
        srcs0_by_channel=[[a]],
        srcs1_by_channel=[[b]],
        dsts_by_channel=[[d]],
        replica_group=groups,
        op=nl.add,
    )
    return _hbm(d)


def test_the_reducing_ring_sends_the_sum_of_both_sources():
    n = 3
    xs = [RNG.standard_normal((2, 4)).astype(np.float32) for _ in range(n)]
    ys = [RNG.standard_normal((2, 4)).astype(np.float32) for _ in range(n)]
    outs = nki.simulate_ranks(
        ring_reduce, [dict(x=xs[r], y=ys[r], groups=[[0, 1, 2]]) for r in range(n)]
    )
    for r in range(n):
        p = (r - 1) % n
        np.testing.assert_array_equal(outs[r], xs[p] + ys[p])


# ---------------------------------------------------------------------------------------------
# named errors at the user's line


@nki.jit
def to_all_v_without_rdispls(x, meta):
    src, m = _hbm(x), _hbm(meta)
    ncc.all_to_all_v(srcs=[src], dsts=[src], replica_group=[[0]], metadata_tensor=m)  # bad
    return x


@nki.jit
def gather_v_from_sbuf(x, meta):
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=x)
    ncc.all_gather_v(srcs=[s], dsts=[s], replica_group=[[0]], metadata_tensor=_hbm(meta))  # bad
    return x


@nki.jit
def gather_v_short_metadata(x, meta):
    src, m = _hbm(x), _hbm(meta)
    ncc.all_gather_v([src], [src], [[0]], m, has_rdispls=True)  # bad
    return x


@nki.jit
def gather_v_signed_metadata(x, meta):
    src = _hbm(x)
    m = _hbm(meta)
    ncc.all_gather_v(srcs=[src], dsts=[src], replica_group=[[0]], metadata_tensor=m)  # bad
    return x


@nki.jit
def gather_v_overflowing_chunk(x, meta):
    src = _hbm(x)
    m = _hbm(meta)
    ncc.all_gather_v(srcs=[src], dsts=[src], replica_group=[[0]], metadata_tensor=m)  # bad
    return _hbm(src)


@nki.jit
def ring_with_five_channels(x):
    a = _hbm(x)
    ncc.collective_permute_implicit([[a]] * 5, [[a]] * 5, [[0]], channel_ids=[0, 1, 2, 3, 4])  # bad
    return x


X = np.zeros((1, N), np.float32)


@pytest.mark.parametrize(
    "kernel,meta,name",
    [
        (to_all_v_without_rdispls, _meta([[1], [0]]), "err_unsupported_api"),
        (gather_v_from_sbuf, _meta([[1], [0]]), "err_unsupported_memory"),
        (gather_v_short_metadata, _meta([[1], [0]]), "err_invalid_argument"),
        (gather_v_signed_metadata, np.array([[1], [0]], np.int32), "err_unsupported_dtype"),
        (gather_v_overflowing_chunk, _meta([[10], [20]]), "err_invalid_argument"),
        (ring_with_five_channels, None, "err_invalid_argument"),
    ],
)
def test_bad_calls_are_named_errors_at_the_users_line(kernel, meta, name):
    with pytest.raises(NkiError) as e:
        kernel(X) if meta is None else kernel(X, meta)
    assert e.value.name == name, str(e.value)
    assert e.value.loc.line == _line_of(kernel.func, "# bad")
