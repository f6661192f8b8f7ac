"""The primitive records (nkikit/ir/prims.py) and the layer tables keyed by them.

Adding an instruction means one record plus one entry in each layer's table; the
completeness tests here fail when a table misses a primitive (or names one that does not
exist).  The engine test holds the lowering to an engine the verifier checked, for every op
of every kernel the differential suite (tests/sim/test_differential.py) traces: the one engine
of an op whose engine is fixed, one of the candidates of an op the compiler places (a copy
the kernel leaves unassigned, which the verifier checks on every candidate).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.compiler import lower as lowering
from nkikit.compiler.allocate import allocate
from nkikit.errors import NkiError
from nkikit.ir import prims, verify
from nkikit.ir.core import Access, Op
from nkikit.ir.prims import PRIMS, PrimError
from nkikit.sim import rules
from nkikit.sim.fast import executors
from nkikit.targets import get_target
from nkikit.trace.builder import current

DIFFERENTIAL = Path(__file__).resolve().parents[1] / "sim" / "test_differential.py"


# ---------------------------------------------------------------------------------------------
# completeness: every primitive in every layer table, nothing else there


def test_every_primitive_has_a_simulation_rule():
    assert set(rules.RULES) == set(PRIMS)


def test_every_primitive_has_a_lowering_and_cost():
    for name, p in PRIMS.items():
        if not p.engines:  # simulation only: lowers to nothing
            assert name in lowering.SKIPPED
        elif p.engines == ("dma",):  # the DMA queues: _lower_dma
            assert name not in lowering.PRIMS
        else:
            entry = lowering.PRIMS[name]
            assert entry.opcode and callable(entry.cost), name
    assert set(lowering.PRIMS) <= set(PRIMS)
    compute = {e for p in PRIMS.values() for e in p.engines} - {"dma"}
    assert compute <= set(lowering.ENGINES)


def test_every_engine_has_its_memories_in_the_verifier():
    engines = {e for p in PRIMS.values() for e in p.engines}
    assert engines <= set(verify._ENGINE_MEMORIES)
    assert set(verify.PRIM_RULES) <= set(PRIMS)
    for name, roles in verify._MEMORY_OVERRIDES.items():
        assert set(roles) <= set(PRIMS[name].ins) | set(PRIMS[name].outs), name


def test_every_primitive_has_a_fast_path_entry():
    # generic rule call, special code or an explicit "run on the reference" entry
    assert set(executors.EXECUTORS) == set(PRIMS)


def test_records_are_consistent():
    for name, p in PRIMS.items():
        assert p.name == name
        assert set(p.engines) <= set(prims.ENGINES), name
        assert p.immediates <= set(p.ins), name
        assert {r for r, _ in p.in_dtypes} <= set(p.ins), name
        assert len(set(p.ins)) == len(p.ins) and len(set(p.outs)) == len(p.outs), name
        for attr, _, eng in p.engine_rules:
            assert attr in p.attr_index and eng in p.engines, name
        for flag in (p.reads_dst, p.accumulate_attr):
            if isinstance(flag, str):
                assert flag in p.attr_index, name
        assert set(p.balance) <= set(p.engines), name
        if len(p.engines) > 1:
            default = prims.ANY_ENGINE if p.balance else p.engines[0]
            assert p.attr_index["engine"].default == default, name
        ind = p.indirection
        if ind is not None:  # tensor indirection: roles, engines and pairs of this record
            assert ind.roles <= set(p.ins) | set(p.outs), name
            assert set(ind.engines) <= set(p.engines), name
            assert all(e in prims.SNAKE_GROUP for e in ind.engines or p.engines), name
            assert all({x, y} <= ind.roles for x, y in ind.pairs), name


# ---------------------------------------------------------------------------------------------
# the differential suite's kernels


def _load_differential():
    spec = importlib.util.spec_from_file_location("_prims_differential", DIFFERENTIAL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


DIFF = _load_differential()  # its kernels and its random-kernel strategy


def _record_runs(monkeypatch) -> list:
    """Collect every kernel simulated while the fixture is active (traced now or cached)."""
    import nkikit.sim as sim

    seen: list = []
    real = sim.simulate

    def recording(kernel, args, **kw):
        seen.append(kernel)
        return real(kernel, args, **kw)

    monkeypatch.setattr(sim, "simulate", recording)
    return seen


def _run_differential_kernels(mod) -> None:
    """The differential suite's deterministic tests, on the default simulator."""
    for dt in ("float32", "bfloat16"):
        for rows in (128, 300):
            mod.test_benchmark_norm_kernels(None, dt, rows)
        mod.test_benchmark_matmul_and_attention(None, dt)
    for param in mod._library_functions():
        mod.test_library_kernels(None, *param.values)
    for dt in ("float32", "bfloat16", "float16"):
        mod.test_tutorial_style_kernels(None, dt)
        mod.test_indirect_dma_kernels(None, dt)


_VERIFIER_ENGINES = verify.engines_of  # the engines the verifier checks memories on


def _check_engines(kernel, seen: dict) -> None:
    """Lower ``kernel``: each instruction runs on an engine the verifier checked it on -- the
    very engine when the op's engine is fixed, one of the candidates when it is not."""
    target = get_target("trn2")
    lk = lowering.lower(kernel, target, allocate(kernel, target))
    for si in lk.instrs:
        lowered = "dma" if si.engine == lowering.DMA else lowering.ENGINES[si.engine]
        checked = _VERIFIER_ENGINES(si.op)
        if si.opcode == "BROADCAST_EVACUATE":
            # a broadcast wider than a PSUM bank: TensorE writes PSUM (verified), the cost
            # model charges the VectorE evacuation that bounds it (compiler/lower.py)
            assert checked == ("tensor",) and lowered == "vector"
            continue
        assert lowered in checked, (
            f"{si.op.prim} {si.op.attrs}: lowered {lowered}, verified {checked}"
        )
        if si.op.attrs.get("engine") != prims.ANY_ENGINE:
            assert checked == (prims.engine_of(si.op),), si.op.prim
        key = (si.op.prim, tuple(sorted((k, repr(v)) for k, v in si.op.attrs.items())))
        seen[key] = lowered
    for op, _ in kernel.ops():  # every op's spec has one entry per output role
        p = PRIMS[op.prim]
        assert len(p.out_spec(op.ins, op.attrs)) == len(p.outs)


def test_verifier_and_lowering_agree_on_every_engine(monkeypatch):
    kernels = _record_runs(monkeypatch)
    _run_differential_kernels(DIFF)
    seen: dict = {}
    for k in kernels:
        _check_engines(k, seen)
    prims_seen = {prim for prim, _ in seen}
    # the suite covers (nearly) every instruction, and some with several engines
    assert len(prims_seen) >= 24, sorted(set(PRIMS) - prims_seen)
    engines_seen = {(prim, eng) for (prim, _), eng in seen.items()}
    assert ("tensor_scalar", "gpsimd") in engines_seen  # gelu's power on the GpSimd
    assert ("nc_transpose", "tensor") in engines_seen


@given(spec=DIFF.specs())
@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
def test_verifier_and_lowering_agree_on_random_kernels(spec):
    mod = DIFF
    x = np.zeros((spec.n, spec.f), np.float32)
    w = np.zeros((128, 128), np.float32)
    jk = mod.random_kernel[math.ceil(spec.n / 128)] if spec.loop == "grid" else mod.random_kernel
    try:
        kernel, _ = jk.specialize(x, x, w, spec)
    except NkiError:
        return  # a spec the verifier rejects is not a legal kernel
    _check_engines(kernel, {})


@nki.jit
def engine_choices(a, b):
    out = nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    p = nisa.tensor_tensor(x, y, np.power)  # power: the GpSimd, whatever engine= says
    q = nisa.tensor_copy(p, engine=nisa.engine.gpsimd)
    r = nisa.tensor_scalar(q, np.multiply, 2.0, engine=nisa.engine.scalar)
    t = nisa.nc_transpose(nl.copy(r, dtype=nl.float32))
    s = nisa.nc_transpose(t, engine=nisa.engine.vector)
    nl.store(out, nl.copy(s))
    return out


def test_engine_choices_and_rules_lower_where_they_are_verified():
    a = np.full((32, 32), 2.0, np.float32)
    k = engine_choices.ir(a, a)
    engines = {op.prim + "/" + str(prims.engine_of(op)) for op, _ in k.ops()}
    assert {"tensor_tensor/gpsimd", "tensor_copy/gpsimd", "tensor_scalar/scalar"} <= engines
    assert {"nc_transpose/tensor", "nc_transpose/vector"} <= engines
    (tt,) = [op for op, _ in k.ops() if op.prim == "tensor_tensor"]
    assert tt.attrs["engine"] == "gpsimd"  # emit wrote the engine that runs it
    _check_engines(k, {})
    np.testing.assert_allclose(engine_choices(a, a), 8.0 * np.ones((32, 32)))


# ---------------------------------------------------------------------------------------------
# Builder.emit checks every op against its record


def _emit_in_kernel(fn):
    """Trace a one-tile kernel whose body calls ``fn(builder, tile_access)``."""

    @nki.jit
    def kern(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        fn(current(), t.access)
        nl.store(out, t)
        return out

    return kern.ir(np.zeros((128, 64), np.float32))


def test_emit_rejects_an_unknown_primitive():
    with pytest.raises(PrimError, match="unknown primitive 'tensor_frobnicate'"):
        _emit_in_kernel(lambda b, t: b.emit("tensor_frobnicate", [t], [t]))


@pytest.mark.parametrize(
    "outs, ins, attrs, match",
    [
        (1, [], {"op": "exp"}, "0 inputs"),
        (0, ["t", 0.0, 1.0], {"op": "exp"}, "0 outputs"),
        (1, ["t", "t", 1.0, 2.0], {"op": "exp"}, "4 inputs"),
        (1, [0.0, 0.0, 1.0], {"op": "exp"}, "input data must be a tile"),
        (1, ["t", 0.0, 1.0], {}, "missing attribute 'op'"),
        (1, ["t", 0.0, 1.0], {"op": "exp", "color": 1}, "unknown attribute 'color'"),
        (1, ["t", 0.0, 1.0], {"op": np.exp}, "attribute op="),
    ],
)
def test_emit_rejects_an_op_its_record_does_not_allow(outs, ins, attrs, match):
    def body(b, t):
        b.emit("activation", [t] * outs, [t if x == "t" else x for x in ins], attrs)

    with pytest.raises(PrimError, match=match):
        _emit_in_kernel(body)


def test_emit_fills_defaults_in_order():
    got: list[Op] = []
    _emit_in_kernel(lambda b, t: got.append(b.emit("tensor_scalar", [t], [t, 2.0], {"op0": "add"})))
    (op,) = got
    assert list(op.attrs) == [
        "op0",
        "reverse0",
        "op1",
        "reverse1",
        "reduce_op",
        "accumulate",
        "engine",
    ]
    assert op.attrs["engine"] == "vector" and op.attrs["op1"] is None


@nki.jit
def scalar_engine_memset(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nisa.memset((128, 64), 0.0, dtype=nl.float32, engine=nisa.engine.scalar)  # BAD
    nl.store(out, t)
    return out


def test_an_engine_the_instruction_cannot_run_on_is_the_users_error():
    with pytest.raises(NkiError) as e:
        scalar_engine_memset.ir(np.zeros((128, 64), np.float32))
    assert e.value.name == "err_invalid_argument"
    assert "engine=scalar" in str(e.value) and "vector, gpsimd" in str(e.value)
    assert e.value.loc.file == __file__


def test_emit_reports_an_engine_outside_the_choices_at_the_users_line():
    with pytest.raises(NkiError) as e:
        _emit_in_kernel(
            lambda b, t: b.emit("tensor_tensor", [t], [t, t], {"op": "add", "engine": "tensor"})
        )
    assert e.value.name == "err_invalid_argument" and "(vector, gpsimd)" in str(e.value)


# ---------------------------------------------------------------------------------------------
# the records' facts


def test_flags_by_attribute():
    def op(prim, **attrs):
        defaults = {a.name: a.default for a in PRIMS[prim].attrs if not a.required}
        return Op(prim, [], [], defaults | attrs, None)

    assert prims.reads_dst(op("nc_stream_shuffle", shuffle_mask=()))
    assert not prims.accumulates(op("nc_stream_shuffle", shuffle_mask=()))
    assert prims.reads_dst(op("nc_matmul", accumulate=True))
    assert not prims.reads_dst(op("nc_matmul", accumulate=False))
    assert prims.reads_dst(op("dma_copy", rmw_op="add")) and prims.accumulates(
        op("dma_copy", rmw_op="add")
    )
    # tensor_tensor += reads dst as an explicit input: an accumulation, no hidden read
    assert prims.accumulates(op("tensor_tensor", op="add", accumulate=True))
    assert not prims.reads_dst(op("tensor_tensor", op="add", accumulate=True))
    assert prims.resolve_engine("tensor_tensor", {"op": "power", "engine": "vector"}) == "gpsimd"
    assert prims.resolve_engine("device_print", {}) is None


def test_output_specs():
    def tile(*shape):
        from nkikit.ir.core import Tensor

        return Access.whole(Tensor("t", shape, np.dtype(np.float32), "sbuf"))

    (mm,) = prims.out_specs("nc_matmul", [tile(128, 64), tile(128, 4, 128)], {})
    assert (mm.partitions, mm.free, str(mm.dtype)) == (64, 512, "float32")
    (red,) = prims.out_specs("tensor_reduce", [tile(128, 4, 64)], {"axes": (2,)})
    assert (red.partitions, red.free) == (128, 4)
    (dma,) = prims.out_specs("dma_copy", [tile(128, 256)], {})
    assert dma.elements == 128 * 256 and dma.partitions is None
    dst, res = prims.out_specs("activation", [tile(128, 8), 0.0, 1.0], {})
    assert (dst.free, res.free) == (8, 1)


@nki.jit
def unassigned_copies(a):
    """Eight PSUM evacuations by nl.copy (engine left to the compiler), then a VectorE add."""
    out = nl.ndarray((128, 8 * 128), dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    res = nl.ndarray((128, 8 * 128), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.affine_range(8):
        t = nisa.nc_transpose(x[:, j * 128 : (j + 1) * 128])
        res[:, j * 128 : (j + 1) * 128] = nl.copy(t)
    nl.store(out, nl.add(res, 1.0))
    return out


def test_unassigned_copies_are_verified_on_every_candidate_and_placed_by_load():
    a = np.arange(128 * 8 * 128, dtype=np.float32).reshape(128, 8 * 128) / 1024.0
    k = unassigned_copies.ir(a)
    copies = [op for op, _ in k.ops() if op.prim == "tensor_copy"]
    assert copies and all(op.attrs["engine"] == prims.ANY_ENGINE for op in copies)
    assert all(verify.engines_of(op) == ("vector", "scalar") for op in copies)
    assert all(prims.engine_of(op) == "vector" for op in copies)  # the nominal engine
    _check_engines(k, {})
    # VectorE has the add, ScalarE nothing: the compiler puts the copies on ScalarE
    target = get_target("trn1")
    lk = lowering.lower(k, target, allocate(k, target))
    placed = {lowering.ENGINES[si.engine] for si in lk.instrs if si.op.prim == "tensor_copy"}
    assert placed == {"scalar"}
    blocks = np.concatenate([a[:, j * 128 : (j + 1) * 128].T for j in range(8)], axis=1)
    np.testing.assert_allclose(unassigned_copies(a), blocks + 1.0)
