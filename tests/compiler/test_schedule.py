"""Scheduling: exact timelines worked out by hand, dependencies across engines, WAR and
multi-buffering, in-order engines."""

from __future__ import annotations

import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.compiler import compile
from nkikit.targets import get_target

from . import kernels as K

F32, BF16 = nl.float32, nl.bfloat16


def _ops(program, opcode):
    return [i for i in range(len(program)) if program.infos[program.sid[i]].opcode == opcode]


def _span(program, ids):
    return min(program.start[i] for i in ids), max(program.end[i] for i in ids)


def test_load_activation_store_by_hand():
    """[128, 512] fp32 on trn2, every number from the target table:

    load:  16 queues x 8 partitions x 2 KiB; rate = min(23, 362.5 / 16) B/ns x efficiency 1.0
           x row efficiency 2048 / (2048 + 64); the transfer starts after the 1300 ns DMA
           fixed cost, which the idle queue shows as busy.
    exp:   ScalarE max(64, 512) + 60 access cycles at 1.2 GHz, after a 100-cycle semaphore.
    store: the same transfer, 1300 ns after the activation ends.
    """
    t = get_target("trn2")
    p = compile(K.load_act_store, nt.tensor[[128, 512], F32], target=t)
    rate = min(23.0, 362.5 / 16) * 1.0 * 2048 / (2048 + 64)
    piece = 8 * 2048 / rate
    load_start, load_end = 0.0, 1300.0 + piece
    act_start = load_end + 100 / 1.2
    act_end = act_start + (512 + 60) / 1.2
    store_start = act_end + 1300.0
    store_end = store_start + piece

    loads, (act,), stores = (
        _ops(p, "DMA_HBM_TO_SBUF"),
        _ops(p, "ACTIVATE"),
        _ops(p, "DMA_SBUF_TO_HBM"),
    )
    for i in loads:
        assert p.start[i] == pytest.approx(load_start) and p.end[i] == pytest.approx(load_end)
    assert p.engine[act] == "scalar"
    assert p.start[act] == pytest.approx(act_start) and p.end[act] == pytest.approx(act_end)
    for i in stores:
        assert p.start[i] == pytest.approx(act_end) and p.end[i] == pytest.approx(store_end)
    assert p.total_ns == pytest.approx(store_end)
    assert p.total_ns == pytest.approx(4651.51, abs=0.01)
    # the activation waits on the load's semaphore, the store on the activation's
    assert set(p.deps[act]) & set(loads)
    assert all(p.deps[i] == (act,) for i in stores)
    prof = p.profile()
    prof.validate()
    assert prof.total_ns == pytest.approx(store_end)


def test_summary_metrics_by_hand():
    t = get_target("trn2")
    p = compile(K.load_act_store, nt.tensor[[128, 512], F32], target=t)
    s = p.profile().summary
    total = p.total_ns
    piece = p.end[0] - p.start[0]  # fixed cost + transfer: the queues were idle
    act = (512 + 60) / 1.2
    assert piece == pytest.approx(1300 + 8 * 2048 / (362.5 / 16 * 2048 / 2112))
    assert s["scalar_active_percent"] == pytest.approx(100 * act / total)
    assert s["dma_active_percent"] == pytest.approx(100 * 2 * piece / total)
    assert s["hbm_read_bytes"] == s["hbm_write_bytes"] == 128 * 512 * 4
    assert s["mbu"] == pytest.approx(2 * 128 * 512 * 4 / (362.5 * total))
    assert s["hfu"] == s["mfu"] == 0
    assert s["dma_transfer_count"] == 32
    assert s["tensor_instruction_count"] == 0 and s["scalar_instruction_count"] == 1


def test_flops_metrics():
    t = get_target("trn2")
    p = compile(
        K.transpose_and_matmul, nt.tensor[[128, 128], BF16], nt.tensor[[128, 512], BF16], target=t
    )
    s = p.profile().summary
    hw = 2 * 128 * 128 * 128 + 2 * 128 * 128 * 512
    model = 2 * 128 * 128 * 512
    peak = 128 * 128 * 2 * 2.4e9
    assert s["hardware_flops"] == hw and s["model_flops"] == model
    assert s["hfu"] == pytest.approx(hw / (peak * p.total_ns * 1e-9))
    assert s["mfu"] == pytest.approx(model / (peak * p.total_ns * 1e-9))
    assert s["transpose_instruction_count"] == 1 and s["matmul_instruction_count"] == 1


def test_raw_across_engines():
    t = get_target("trn1")
    p = compile(K.matmul_small, nt.tensor[[256, 128], BF16], nt.tensor[[256, 512], BF16], target=t)
    loads = _ops(p, "DMA_HBM_TO_SBUF")
    mm = _ops(p, "MATMUL")
    (cp,) = _ops(p, "TENSOR_COPY")
    sem_tensor = 100 / 2.8
    # matmul k waits for the last piece of both of its loads (lhsT tile, rhs tile)
    first_two = [i for i in loads if p.sid[i] in (0, 1) and i < mm[0]]
    last_piece_end = max(p.end[i] for i in first_two[:32])
    assert p.start[mm[0]] == pytest.approx(last_piece_end + sem_tensor)
    assert {d for d in p.deps[mm[0]]} <= set(loads)
    # the PSUM -> SBUF copy waits for the accumulation chain
    # (an unassigned copy: the compiler puts it on VectorE or ScalarE; the wait is on its clock)
    ghz = {"vector": 1.12, "scalar": 1.4}[p.engine[cp]]
    assert p.start[cp] == pytest.approx(p.end[mm[-1]] + 100 / ghz)
    assert mm[-1] in p.deps[cp]
    # the accumulation chain stays on TensorE in order without semaphores
    assert p.start[mm[1]] >= p.end[mm[0]]


def test_write_after_read_with_one_buffer():
    t = get_target("trn2")
    p = compile(K.reuse_one_buffer, nt.tensor[[256, 512], F32], target=t)
    loads, stores = _ops(p, "DMA_HBM_TO_SBUF"), _ops(p, "DMA_SBUF_TO_HBM")
    first_store, second_load = stores[:16], loads[16:]
    # iteration 1 overwrites the tile iteration 0's store reads: it waits for the store
    transfer = [p.end[i] - 1300 for i in second_load]
    assert (
        min(transfer) - (p.end[second_load[0]] - p.start[second_load[0]])
        <= _span(p, first_store)[1]
    )
    assert _span(p, second_load)[0] == pytest.approx(_span(p, first_store)[1])
    assert set(p.deps[second_load[0]]) & set(first_store)


def test_multi_buffering_lets_iterations_overlap():
    t = get_target("trn2")
    p = compile(K.fresh_each_iteration, nt.tensor[[256, 512], F32], target=t)
    loads, stores = _ops(p, "DMA_HBM_TO_SBUF"), _ops(p, "DMA_SBUF_TO_HBM")
    first_load, second_load, first_store = loads[:16], loads[16:], stores[:16]
    # the second load uses the second buffer: its transfer follows the first load's on each
    # queue, before the first store's (which waits for the first load, then 1300 ns)
    assert _span(p, second_load)[1] == pytest.approx(
        _span(p, first_load)[1] + (p.end[0] - p.start[0] - 1300)
    )
    assert _span(p, second_load)[1] < _span(p, first_store)[1] - 1000
    assert not set(p.deps[second_load[0]]) & set(first_store)


def test_same_engine_dependency_overhead():
    t = get_target("trn2")
    p = compile(K.scalar_chain, nt.tensor[[128, 512], F32], target=t)
    a1, a2, a3 = _ops(p, "ACTIVATE")
    assert p.start[a2] == pytest.approx(p.end[a1])  # independent: back to back
    assert p.start[a3] == pytest.approx(p.end[a2] + t.dependent_overhead_cycles / 1.2)
    assert a2 in p.deps[a3]


def test_engines_run_in_program_order_without_overlap():
    p = compile(
        K.matmul_small, nt.tensor[[512, 256], BF16], nt.tensor[[512, 512], BF16], target="trn2"
    )
    for engine, ids in p.streams().items():
        if engine.startswith("dma"):
            continue
        for a, b in zip(ids, ids[1:]):
            assert p.start[b] >= p.end[a] - 1e-9
    p.profile().validate()


def test_reused_memory_orders_the_two_tenants():
    t = get_target("trn2")
    p = compile(K.two_phases, nt.tensor[[512, 256], F32], target=t)
    first_store = [
        i
        for i in _ops(p, "DMA_SBUF_TO_HBM")
        if p.infos[p.sid[i]].source.endswith(":" + str(K.line_of("nl.store(out[i * 128")))
    ]
    second_load = [
        i
        for i in _ops(p, "DMA_HBM_TO_SBUF")
        if p.infos[p.sid[i]].source.endswith(":" + str(K.line_of("second = nl.load")))
    ]
    # 'second' reuses the bytes of 'first': its first load waits for first's last store
    # that used the same buffer
    assert min(p.start[i] for i in second_load) >= min(p.end[i] for i in first_store)


def test_read_after_write_through_hbm():
    t = get_target("trn2")
    p = compile(K.hbm_round_trip, nt.tensor[[128, 256], F32], target=t)
    line = lambda m: f"kernels.py:{K.line_of(m)}"  # noqa: E731
    store = [
        i
        for i in _ops(p, "DMA_SBUF_TO_HBM")
        if p.infos[p.sid[i]].source == line("# @scratch-store")
    ]
    load = [i for i in range(len(p)) if p.infos[p.sid[i]].source == line("# @scratch-load")]
    assert len(store) == len(load) == 16
    transfer = p.infos[p.sid[load[0]]].duration_ns * 8
    # the load's transfers start 1300 ns after the store's last piece
    assert min(p.end[i] - transfer for i in load) == pytest.approx(
        max(p.end[i] for i in store) + 1300
    )


@nki.jit
def _two_evacuations(a, b):
    out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    p = nisa.nc_matmul(x, y[:, 0:512])
    q = nisa.nc_matmul(x, y[:, 512:1024])
    r = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)
    r[:, 0:512] = nisa.tensor_copy(p, engine=nisa.engine.vector)
    r[:, 512:1024] = nisa.tensor_copy(q, engine=nisa.engine.scalar)
    nl.store(out, r)
    return out


def test_vector_and_scalar_take_turns_on_psum_on_nc_v2():
    # [A2]: on NC-v2 VectorE and ScalarE cannot access PSUM in parallel; NC-v3 lifts it [A3]
    spans = {}
    for name in ("trn1", "trn2"):
        p = compile(
            _two_evacuations, nt.tensor[[128, 128], F32], nt.tensor[[128, 1024], F32], target=name
        )
        spans[name] = sorted((p.start[i], p.end[i]) for i in _ops(p, "TENSOR_COPY"))
    (s0, e0), (s1, e1) = spans["trn1"]
    assert s1 >= e0  # one after the other
    (s0, e0), (s1, e1) = spans["trn2"]
    assert s1 < e0  # side by side
