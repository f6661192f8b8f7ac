"""The fast path's executor table (nkikit/sim/fast/executors.py) against the primitive records.

Every primitive has exactly one entry -- special code, the generic rule call, or an explicit
"run on the reference interpreter" -- and a primitive without one is reported by name when a
kernel using it is compiled, never silently run some other way.  Each kind of entry is
bit-identical to the reference on its own: the differential kernels run with every special
emitter turned off (the generic path for the hottest primitives) and with every primitive
sent to the reference.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")

# The differential suite beside this file (pytest puts this folder on sys.path).
import test_differential as D  # noqa: E402

import nkikit as nki  # noqa: E402
import nkikit.language as nl  # noqa: E402
import nkikit.sim.interp as interp  # noqa: E402
from nkikit.ir.prims import PRIMS, PrimError  # noqa: E402
from nkikit.sim import fast, rules  # noqa: E402
from nkikit.sim.fast import executors  # noqa: E402
from nkikit.sim.fast.executors import EXECUTORS, REFERENCE, Executor  # noqa: E402


def _table_missing(table) -> set[str]:
    return set(PRIMS) - set(table)


def test_every_primitive_has_one_fast_path_entry():
    assert _table_missing(EXECUTORS) == set()
    assert set(EXECUTORS) <= set(PRIMS)
    assert set(EXECUTORS) == set(rules.RULES)  # each generic entry has a rule to call
    for name, ex in EXECUTORS.items():
        assert isinstance(ex, Executor), name
        if ex.reference:  # sent to the reference: no compiled form may be declared
            assert ex.special is ex.results is ex.indirect is None, name
            assert not ex.copy, name


def test_completeness_check_sees_a_missing_entry():
    table = dict(EXECUTORS)
    del table["tensor_tensor"]
    assert _table_missing(table) == {"tensor_tensor"}


@pytest.fixture
def fresh_programs():
    fast._CACHE.clear()
    yield
    fast._CACHE.clear()


@nki.jit
def add_tiles(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def _add_kernel():
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    kern, _ = add_tiles.specialize(x, x)
    return kern, x


def test_a_primitive_without_an_entry_is_reported_by_name(monkeypatch, fresh_programs):
    kern, _ = _add_kernel()
    prims_used = {op.prim for op, _ in kern.ops()}
    assert "tensor_tensor" in prims_used
    monkeypatch.delitem(EXECUTORS, "tensor_tensor")
    with pytest.raises(PrimError, match="tensor_tensor"):
        fast.compile_kernel(kern)


def test_entries_decide_the_generated_code(monkeypatch, fresh_programs):
    kern, x = _add_kernel()
    special = fast.compile_kernel(kern)
    assert special.n_fallback == 0 and "RULE" not in special.source  # np.add(..., out=)
    fast._CACHE.clear()
    monkeypatch.setitem(EXECUTORS, "tensor_tensor", executors.GENERIC)
    generic = fast.compile_kernel(kern)
    assert generic.n_fallback == 0 and "RULE" in generic.source
    fast._CACHE.clear()
    monkeypatch.setitem(EXECUTORS, "tensor_tensor", REFERENCE)
    reference = fast.compile_kernel(kern)
    assert reference.n_fallback == 1 and "interp.exec_op" in reference.source
    want = interp.simulate(kern, [x, x])
    for prog in (special, generic, reference):
        assert all(D._same(a, b) for a, b in zip(prog.run([x, x]), want))


@pytest.fixture
def differential(monkeypatch):
    import nkikit.sim as sim_pkg

    monkeypatch.setattr(interp, "simulate", lambda k, a, **kw: D.run_both(k, a))
    monkeypatch.setattr(sim_pkg, "simulate", lambda k, a, **kw: D.run_both(k, a))
    return D.run_both


def _run_kernels(differential, dt: str) -> None:
    D.test_benchmark_norm_kernels(differential, dt, 300)
    D.test_benchmark_matmul_and_attention(differential, dt)
    D.test_tutorial_style_kernels(differential, dt)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_generic_path_of_special_primitives(monkeypatch, fresh_programs, differential, dt):
    for name, ex in list(EXECUTORS.items()):
        if ex.special is not None:
            monkeypatch.setitem(EXECUTORS, name, dataclasses.replace(ex, special=None))
    _run_kernels(differential, dt)


def test_every_primitive_on_the_reference(monkeypatch, fresh_programs, differential):
    for name in list(EXECUTORS):
        monkeypatch.setitem(EXECUTORS, name, REFERENCE)
    _run_kernels(differential, "bfloat16")
