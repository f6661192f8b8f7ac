"""The fast path compiles accesses no slice expresses -- an ``.ap`` pattern that splits one
tensor dimension into several tile axes, a broadcast axis among them -- as the strided
view the reference builds, instead of handing the op to the reference: same bits, and no
``interp.exec_op`` in the generated program."""

import ml_dtypes
import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.sim import fast
from nkikit.sim.interp import simulate as reference

P, F = 16, 96  # the tile: partitions, free elements
ROWS = 4 * P  # rows of the HBM input


def _side(draw, n: int, m: int):
    """A pattern of ``n`` x ``m`` over one flat free dimension of ``F`` elements, its axes
    nested like the digits of a number (a write must reach distinct elements), with a gap
    between outer steps or not, and an offset that keeps it inside."""
    inner_step = draw(st.sampled_from([1, 2]))
    outer_step = inner_step * m * draw(st.integers(1, 2))
    reach = outer_step * (n - 1) + inner_step * (m - 1)
    assume(reach < F)
    return [[outer_step, n], [inner_step, m]], draw(st.integers(0, F - 1 - reach))


@st.composite
def _case(draw):
    n, m = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    return _side(draw, n, m), _side(draw, n, m)


def _kernel(src_pattern, src_offset, dst_pattern, dst_offset, broadcast):
    (so, sn), (si, sm) = src_pattern
    (do, dn), (di, dm) = dst_pattern

    @nki.jit
    def strided(x):
        out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        # HBM -> SBUF, the source rows strided by 4 and both free dimensions split
        nisa.dma_copy(
            dst=t.ap(pattern=[[F, P], [do, dn], [di, dm]], offset=dst_offset),
            src=x.ap(pattern=[[4 * F, P], [so, sn], [si, sm]], offset=src_offset),
        )
        r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=r, value=0.0)
        # a compute engine reads the split view (the reference copies it C-ordered), the
        # inner axis broadcast (step 0) when asked: a read of repeated elements
        step = 0 if broadcast else di
        nisa.activation(
            dst=r.ap(pattern=[[F, P], [1, dn * dm]], offset=0),
            op=nl.exp,
            data=t.ap(pattern=[[F, P], [do, dn], [step, dm]], offset=dst_offset),
        )
        nisa.tensor_copy(dst=t, src=r)
        nisa.dma_copy(dst=out, src=t)
        return out

    return strided


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    case=_case(),
    broadcast=st.booleans(),
    # float8_e5m2: numpy's as_strided cannot rebuild its views by itself (type string '<f1')
    dt=st.sampled_from(
        [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e5m2)]
    ),
)
def test_split_and_broadcast_axes_are_compiled_and_bit_identical(case, broadcast, dt):
    (src_pattern, src_offset), (dst_pattern, dst_offset) = case
    kernel = _kernel(src_pattern, src_offset, dst_pattern, dst_offset, broadcast)
    x = np.random.default_rng(1).standard_normal((ROWS, F)).astype(dt)
    ir, _ = kernel.specialize(x)
    source = fast.explain(ir)
    assert "interp.exec_op" not in source
    assert "_sv(" in source
    want = reference(ir, [x.copy()])
    got = fast.simulate(ir, [x.copy()])
    assert want[0].dtype == got[0].dtype
    assert np.array_equal(want[0].view(np.uint8), got[0].view(np.uint8))


def test_fp8_weights_loaded_through_a_split_pattern():
    """The NKI Library's MLP loads fp8 weights into bf16 tiles with one ``.ap`` per side."""

    @nki.jit
    def load(w):
        out = nl.ndarray((128, 8 * 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8 * 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(
            dst=t.ap(pattern=[[8 * 64, 128], [64, 8], [1, 64]], offset=0),
            src=w.ap(pattern=[[64, 128], [128 * 64, 8], [1, 64]], offset=0),
        )
        nisa.dma_copy(dst=out, src=t)
        return out

    w = np.random.default_rng(2).standard_normal((1024, 64)).astype(ml_dtypes.float8_e4m3)
    ir, _ = load.specialize(w)
    assert "interp.exec_op" not in fast.explain(ir)
    got = fast.simulate(ir, [w])[0]
    want = w.reshape(8, 128, 64).transpose(1, 0, 2).reshape(128, 8 * 64).astype(ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(reference(ir, [w])[0].view(np.uint16), got.view(np.uint16))


def test_every_fp8_tile_is_read_through_a_reshaped_view():
    """A copy out of a (32, 32) tile into a (32, 4, 8) one reads it as a strided view; each
    8-bit float type reads the same values in both simulators."""
    for name in ("float8_e4m3", "float8_e5m2", "float8_e4m3fn"):

        @nki.jit
        def widen(x):
            s = nl.ndarray((32, 32), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=s, src=x)
            d = nl.ndarray((32, 4, 8), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=d, src=s)
            out = nl.ndarray((32, 4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=d)
            return out

        x = np.linspace(-2, 2, 32 * 32, dtype=np.float32).reshape(32, 32)
        x = x.astype(getattr(ml_dtypes, name))
        ir, _ = widen.specialize(x)
        want = x.astype(np.float32).reshape(32, 4, 8)
        assert np.array_equal(fast.simulate(ir, [x])[0], want), name
        assert np.array_equal(reference(ir, [x])[0], want), name
