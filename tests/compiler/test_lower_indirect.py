"""Lowering and scheduling of indirect (runtime-index) DMA: opcodes, the modeled cost
(costs.py: a runtime descriptor per row, the DGE start latency), bytes, dependencies through
the whole destination, and no HBM offsets (so no input-reload warning)."""

from __future__ import annotations

import numpy as np
import pytest

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.compiler import compile
from nkikit.compiler.costs import dma_ns_per_partition
from nkikit.targets import get_target

TRN2 = get_target("trn2")
INDIRECT_DESCRIPTOR_BYTES = TRN2.dma_indirect_descriptor_bytes
INDIRECT_DGE_NS = TRN2.dma_dge_ns

F32, I32 = nl.float32, nl.int32


def _ops(program, opcode):
    return [i for i in range(len(program)) if program.infos[program.sid[i]].opcode == opcode]


def _info(program, opcode):
    (info,) = [x for x in program.infos if x.opcode == opcode]
    return info


@nki.jit
def gather_vs_load(data):
    """The same [128, 512] fp32 rows, once by a contiguous load, once by an index tile."""
    out = nl.ndarray((256, 512), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(512)[None, :]
    it = nisa.iota(i_p, dtype=nl.int32)
    nl.store(out[i_p, i_f], value=nl.load(data[i_p, i_f]))
    nl.store(out[128 + i_p, i_f], value=nl.load(data[it, i_f]))
    return out


def test_indirect_dma_lowering_cost_and_bytes():
    t = get_target("trn2")
    p = compile(gather_vs_load, nt.tensor[[128, 512], F32], target=t)
    direct, ind = _info(p, "DMA_HBM_TO_SBUF"), _info(p, "DMA_HBM_TO_SBUF_INDIRECT")
    row = 512 * 4
    assert direct.duration_ns == pytest.approx(dma_ns_per_partition(t, row, hbm=True))
    assert ind.duration_ns == pytest.approx(dma_ns_per_partition(t, row, hbm=True, indirect=True))
    # by hand: every row also carries its runtime descriptor
    rate = min(23.0, 362.5 / 16) * 1.0
    assert ind.duration_ns == pytest.approx((row + 64 + INDIRECT_DESCRIPTOR_BYTES) / rate)
    assert ind.duration_ns > direct.duration_ns
    # the index tile is read from SBUF by the descriptor generator; it is not transferred
    assert ind.bytes["hbm_read_bytes"] == direct.bytes["hbm_read_bytes"] == 128 * row
    assert ind.bytes["sbuf_read_bytes"] == 128 * 4
    assert ind.tensor_name == "" and direct.tensor_name == "data"


def test_one_element_per_partition_is_overhead_bound():
    t = get_target("trn2")
    one = dma_ns_per_partition(t, 2, hbm=True, indirect=True)
    assert one == pytest.approx((2 + 64 + INDIRECT_DESCRIPTOR_BYTES) / min(23.0, 362.5 / 16))


@nki.jit
def gather_only(data):
    out = nl.ndarray((128, 512), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    it = nisa.iota(i_p, dtype=nl.int32)
    nl.store(out, value=nl.load(data[it, nl.arange(512)[None, :]]))
    return out


def test_indirect_dma_waits_for_its_index_tile_plus_the_dge():
    t = get_target("trn2")
    p = compile(gather_only, nt.tensor[[128, 512], F32], target=t)
    (iota,) = _ops(p, "IOTA")
    pieces = _ops(p, "DMA_HBM_TO_SBUF_INDIRECT")
    first_transfer = min(p.end[i] - p.infos[p.sid[i]].duration_ns * p.partitions[i] for i in pieces)
    assert first_transfer == pytest.approx(p.end[iota] + INDIRECT_DGE_NS + t.dma_fixed_ns)
    assert all(iota in p.deps[i] for i in pieces)


@nki.jit
def store_then_scatter(src, idx):
    out = nl.ndarray((256, 64), dtype=src.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    x = nl.load(src)
    nl.store(out[i_p, i_f], value=x)  # rows 0..127
    it = nl.load(idx[i_p])
    nl.store(out[it, i_f], value=x)  # rows known at run time
    nl.store(out[128 + i_p, i_f], value=x)  # rows 128..255
    return out


def test_a_scatter_is_ordered_against_every_write_to_its_tensor():
    p = compile(store_then_scatter, nt.tensor[[128, 64], F32], nt.tensor[[128], I32])
    stores = _ops(p, "DMA_SBUF_TO_HBM")
    scatter = _ops(p, "DMA_SBUF_TO_HBM_INDIRECT")
    by_line = {}
    for i in stores:
        by_line.setdefault(p.infos[p.sid[i]].source, []).append(i)
    first, last = sorted(by_line.values(), key=lambda ids: min(p.start[i] for i in ids))
    assert min(p.start[i] for i in scatter) >= max(p.end[i] for i in first)
    # the later store, to other rows, still waits: the scatter's rows are not known
    assert min(p.end[i] - p.infos[p.sid[i]].duration_ns * p.partitions[i] for i in last) >= max(
        p.end[i] for i in scatter
    )


@nki.jit
def gather_in_loop(data, idx):
    out = nl.ndarray((4 * 128, 64), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    for k in nl.affine_range(4):
        it = nl.load(idx[k * 128 + i_p])
        nl.store(out[k * 128 + i_p, i_f], value=nl.load(data[it, i_f]))
    return out


def test_repeated_gathers_are_not_reported_as_input_reloads():
    prof = nki.profile_kernel(
        gather_in_loop, nt.tensor[[1000, 64], F32], nt.tensor[[512], I32], target="trn2"
    )
    names = [w["name"] for w in prof.summary["warnings"]]
    assert "input_reload" not in names


@nki.jit
def scatter_add(table, idx, val):
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(table))
    i_p = nl.arange(128)[:, None]
    it = nl.load(idx[i_p])
    nl.atomic_rmw(out[it, nl.arange(64)[None, :]], value=nl.load(val), op=np.add)
    return out


def test_atomic_rmw_lowers_to_an_indirect_read_modify_write_dma():
    p = compile(
        scatter_add,
        nt.tensor[[128, 64], F32],
        nt.tensor[[128], I32],
        nt.tensor[[128, 64], F32],
    )
    info = _info(p, "DMA_SBUF_TO_HBM_RMW_INDIRECT")
    assert info.bytes["hbm_read_bytes"] == info.bytes["hbm_write_bytes"] == 128 * 64 * 4
