"""The fast path's table-driven mode (unrolled kernels: one compiled template per distinct
statement, bodies as loops over argument tables) stays bit-identical to the reference
interpreter.  The differential suite's deterministic kernels run with the mode forced on
for every kernel and every loop body; an unrolled kernel above the threshold gets it by
default."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")

# The differential suite beside this file (pytest puts this folder on sys.path).
import test_differential as D  # noqa: E402

import nkikit as nki  # noqa: E402
import nkikit.language as nl  # noqa: E402
import nkikit.sim.interp as interp  # noqa: E402
from nkikit.sim import fast, same_bits  # noqa: E402
from nkikit.sim.fast import table as fast_table  # noqa: E402
from nkikit.trace import reroll  # noqa: E402


@pytest.fixture
def table_mode(monkeypatch):
    """Every kernel and every loop body table-driven, every op rendered even where the
    memo has its row, and the two rows compared; programs compiled before are dropped
    (the cache is keyed by kernel, and the JIT caches kernels)."""
    monkeypatch.setattr(fast_table, "TABLE_ABOVE", -1)
    monkeypatch.setattr(fast_table, "TABLE_BODY", 1)
    monkeypatch.setattr(fast_table, "CHECK_MEMO", True)
    fast._CACHE.clear()
    yield
    fast._CACHE.clear()


@pytest.fixture
def differential(monkeypatch):
    import nkikit.sim as sim_pkg

    monkeypatch.setattr(interp, "simulate", lambda k, a, **kw: D.run_both(k, a))
    monkeypatch.setattr(sim_pkg, "simulate", lambda k, a, **kw: D.run_both(k, a))
    return D.run_both


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_differential_kernels_table_driven(table_mode, differential, dt):
    D.test_benchmark_norm_kernels(differential, dt, 300)
    D.test_benchmark_matmul_and_attention(differential, dt)
    D.test_tutorial_style_kernels(differential, dt)
    D.test_indirect_dma_kernels(differential, dt)


def test_library_kernels_table_driven(table_mode, differential):
    for param in D._library_functions()[:6]:
        D.test_library_kernels(differential, *param.values)


def test_forced_mode_is_table_driven(table_mode):
    from benchmarks.scale.kernels import make_unrolled

    k = make_unrolled(3, 2)
    a = np.zeros((256, 128), np.float32)
    w = np.zeros((128, 128), np.float32)
    source = fast.explain(k._trace(k.bind((a, w), {}), "trn2"))
    assert "for a in TABLE" in source and "def _t0(" in source


def test_unrolled_kernel_is_table_driven_and_identical():
    from benchmarks.scale.kernels import make_unrolled

    steps = fast_table.TABLE_ABOVE // 7 + 10  # 7 statements per step (3 allocs, 4 ops)
    k = make_unrolled(steps, 4)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4 * 128, 128), dtype=np.float32)
    w = rng.standard_normal((128, 128), dtype=np.float32)
    ir = k._trace(k.bind((a, w), {}), "trn2")
    prog = fast.compile_kernel(ir)
    # a handful of templates for thousands of statements
    assert prog.source.count("\ndef _t") < 40 and "TABLE" in prog.source
    got = prog.run([a, w])
    ref = interp.simulate(ir, [a, w])
    assert all(same_bits(x, y) for x, y in zip(got, ref))


def _benchmark_kernel(steps: int):
    """The NKI 0.x size benchmark's kernel of ``steps`` steps, traced as written: unrolled,
    not re-rolled (``nkikit/trace/reroll.py``)."""
    from benchmarks.nki0x.run import BLOCKS, TARGET, F, P, make_kernel

    k = make_kernel(steps)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((BLOCKS * P, F), dtype=np.float32)
    w = rng.standard_normal((P, P), dtype=np.float32)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reroll, "ROLL_ABOVE", math.inf)
        return k._trace(k.bind((a, w), {}), TARGET), [a, w]


def _checked_and_plain(ir, monkeypatch):
    """``ir`` compiled twice: rendering every op and checking the memo's rows against the
    renders (the checked compiler), then as usual (the compiler and its program)."""
    from nkikit.sim.fast.codegen import Compiler

    monkeypatch.setattr(fast_table, "CHECK_MEMO", True)
    checked = Compiler(ir)
    checked.build()
    monkeypatch.setattr(fast_table, "CHECK_MEMO", False)
    c = Compiler(ir)
    return checked, c, c.build()


def test_repeated_ops_replay_their_rows(monkeypatch):
    """The NKI 0.x size benchmark's kernel: after the first steps, every op's row comes from
    the memo; rendered anyway, each equals the memo's; the program matches the reference."""

    ir, args = _benchmark_kernel(fast_table.TABLE_ABOVE // 4 + 40)
    checked, c, prog = _checked_and_plain(ir, monkeypatch)
    n_ops = sum(1 for _ in ir.ops())
    assert c.n_replayed == checked.n_replayed > n_ops * 0.9
    assert prog.n_fallback == checked.n_fallback
    got = prog.run(args)
    ref = interp.simulate(ir, args)
    assert all(same_bits(x, y) for x, y in zip(got, ref))


def test_table_driven_kernels_forward_no_tile(monkeypatch):
    """Load and store forwarding apply to a straight-line kernel; a table-driven one keeps
    every tile in its own buffer (the analysis costs more than it saves a first run) and
    computes the same bits."""
    from nkikit.sim.fast.codegen import Compiler

    ir, args = _benchmark_kernel(40)
    straight = Compiler(ir)
    straight.build()
    assert straight.forwarded and straight.load_fwd and straight.store_fwd
    monkeypatch.setattr(fast_table, "TABLE_ABOVE", -1)
    table = Compiler(ir)
    prog = table.build()
    assert table.chunked and not table.forwarded
    ref = interp.simulate(ir, args)
    assert all(same_bits(x, y) for x, y in zip(prog.run(args), ref))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_scalar_operands(value):
    """A Python inf/nan scalar operand is embedded in the generated program by name."""

    @nki.jit
    def clamp(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nl.maximum(t, value))
        return out

    a = np.random.default_rng(2).standard_normal((128, 64), dtype=np.float32)
    ir = clamp._trace(clamp.bind((a,), {}), "trn2")
    got = fast.compile_kernel(ir).run([a])
    ref = interp.simulate(ir, [a])
    assert all(same_bits(x, y) for x, y in zip(got, ref))
    assert np.array_equal(got[0], np.maximum(a, np.float32(value)), equal_nan=True)


def _gather_and_accumulate(blocks: int, ksteps: int):
    """The NKI Library's MoE pattern, unrolled: per output block a PSUM tile that ``ksteps``
    matmuls accumulate into, each of a row block gathered from HBM by a runtime index tile
    (indirect DMA), then copied out -- so consecutive matmuls share their PSUM tile and the
    next block's use another one."""
    import nkikit.nki as nki0
    import nkikit.nki.isa as nisa
    import nkikit.nki.language as nl0

    @nki0.jit
    def k(table, idx, w):
        out = nl0.ndarray((blocks * 128, 128), dtype=nl0.float32, buffer=nl0.shared_hbm)
        ws = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.sbuf)
        nisa.dma_copy(dst=ws, src=w)
        for b in range(blocks):
            acc = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.psum)
            for s in range(ksteps):
                ix = nl0.ndarray((128, 1), dtype=nl0.int32, buffer=nl0.sbuf)
                nisa.dma_copy(
                    dst=ix, src=idx[(b * ksteps + s) * 128 : (b * ksteps + s + 1) * 128, :]
                )
                rows = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.sbuf)
                src = table.ap([[128, 128], [1, 128]], offset=0, vector_offset=ix, indirect_dim=0)
                nisa.dma_copy(dst=rows, src=src)
                nisa.nc_matmul(dst=acc, stationary=ws, moving=rows)
            res = nl0.ndarray((128, 128), dtype=nl0.float32, buffer=nl0.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[b * 128 : (b + 1) * 128, :], src=res)
        return out

    rng = np.random.default_rng(2)
    table = rng.integers(-3, 4, (512, 128)).astype(np.float32)
    idx = rng.integers(0, 512, (blocks * ksteps * 128, 1)).astype(np.int32)
    w = rng.integers(-3, 4, (128, 128)).astype(np.float32)
    args = [table, idx, w]
    return k._trace(k.bind(args, {}), "trn2"), args


def test_recipes_generalize_across_psum_tiles_and_gathers(monkeypatch):
    """A recipe learnt from two matmuls into one PSUM tile holds for the next tile's too (it
    is relearnt without that tile fixed), and gathers of one kind share their index-grid
    constants: every row is replayed but those of the index and output DMAs (each at an
    offset of its own) and a few teaching ones per kind; rendered anyway, each equals the
    memo's.  (Before, 174 of these 410 statements were replayed.)"""

    monkeypatch.setattr(fast_table, "TABLE_ABOVE", -1)
    blocks, ksteps = 12, 6
    ir, args = _gather_and_accumulate(blocks, ksteps)
    checked, c, prog = _checked_and_plain(ir, monkeypatch)
    n_statements = sum(1 for _ in ir.walk())
    unique = blocks * ksteps + blocks  # the index loads and the output stores
    assert c.n_replayed == checked.n_replayed >= n_statements - unique - 30
    got = prog.run(args)
    ref = interp.simulate(ir, args)
    assert all(same_bits(x, y) for x, y in zip(got, ref))
    table, idx, w = args
    gathered = table[idx[:, 0]].reshape(blocks, ksteps, 128, 128)
    want = np.einsum("pk,bspf->bkf", w, gathered).reshape(blocks * 128, 128)
    np.testing.assert_array_equal(got[0], want)
