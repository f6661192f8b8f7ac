"""NKI 0.x ``.ap(scalar_offset=)`` on SBUF/PSUM tensors [reference/nki-0x.md §3.6, §3.7]: one
runtime value (a (1, 1) SBUF int tile or a register) shifts the access along a free dimension
by ``value * prod(base.shape[indirect_dim + 1:])`` elements, for an operand of any engine,
read or written.  The bounds are checked when the kernel runs, with a named error at the
user's line; the partition dimension cannot move."""

import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nkikit
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError
from nkikit.sim import fast, interp
from nkikit.testing.profiles import register_profiles

register_profiles()
W = 8  # columns of the window the offset moves


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


def _off(v: int) -> np.ndarray:
    return np.array([[v]], np.int32)


@nki.jit
def window_sum(x, w, n):
    """``(w.T @ x)[:, n:n+W] + x[:, n:n+W]``: the window read from PSUM by a (1, 1) tile offset
    and from SBUF by a register, each an operand of a Vector-engine tensor_tensor."""
    xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    ws = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ws, src=w)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    acc = nl.ndarray((128, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, 0.0)
    p = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=ws, moving=xs)
    window = p.ap([[64, 128], [1, W]], offset=0, scalar_offset=s, indirect_dim=1)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=window, op=nl.add)  # psum read
    reg = nisa.register_alloc(s)
    window = xs.ap([[64, 128], [1, W]], offset=0, scalar_offset=reg, indirect_dim=1)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=window, op=nl.add)
    out = nl.ndarray((128, W), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def place_blocks(x, n):
    """Copies ``x`` (128, 16) into block ``n`` of a zeroed (128, 4, 16) SBUF tile (the offset
    counts whole blocks of 16: the dims after indirect_dim=1) with a written tensor_copy."""
    xs = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    y = nl.ndarray((128, 4, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=y, value=0.0)
    block = y.ap([[64, 128], [1, 16]], offset=0, scalar_offset=s, indirect_dim=1)
    nisa.tensor_copy(dst=block, src=xs)  # the write
    out = nl.ndarray((128, 4, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


def _inputs():
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (128, 64)).astype(np.float32)
    w = rng.integers(-2, 3, (128, 128)).astype(np.float32)
    return x, w


def _both(kernel, *args):
    """The kernel's outputs from the reference interpreter and from the fast simulator."""
    ir = kernel.ir(*args)
    return interp.simulate(ir, list(args)), fast.simulate(ir, list(args))


@settings(settings.get_profile("ci"), max_examples=10)
@given(st.integers(0, 64 - W))
def test_a_runtime_offset_moves_psum_and_sbuf_reads_along_the_free_dim(v):
    x, w = _inputs()
    ref, quick = _both(window_sum, x, w, _off(v))
    want = (w.T @ x)[:, v : v + W] + x[:, v : v + W]
    np.testing.assert_array_equal(ref[0], want)
    np.testing.assert_array_equal(quick[0], ref[0])  # bit-identical


@pytest.mark.parametrize("v", [0, 1, 3])
def test_a_runtime_offset_on_a_written_operand_counts_whole_inner_blocks(v):
    x = np.arange(128 * 16, dtype=np.float32).reshape(128, 16)
    ref, quick = _both(place_blocks, x, _off(v))
    want = np.zeros((128, 4, 16), np.float32)
    want[:, v] = x
    np.testing.assert_array_equal(ref[0], want)
    np.testing.assert_array_equal(quick[0], ref[0])


@pytest.mark.parametrize("v", [64 - W + 1, -1, 1 << 20])
def test_an_offset_past_the_tile_is_a_runtime_error_at_the_users_line(v):
    x, w = _inputs()
    for run in (interp.simulate, fast.simulate):
        with pytest.raises(NkiError) as e:
            run(window_sum.ir(x, w, _off(v)), [x, w, _off(v)])
        assert e.value.name == "err_tensor_access_out_of_bound"
        assert e.value.loc.line == _line_of(window_sum.func, "# psum read")
        assert f"holds {v}" in str(e.value)


def test_a_written_block_past_the_tile_is_a_runtime_error_at_the_users_line():
    x = np.zeros((128, 16), np.float32)
    with pytest.raises(NkiError) as e:
        place_blocks(x, _off(4))
    assert e.value.name == "err_tensor_access_out_of_bound"
    assert e.value.loc.line == _line_of(place_blocks.func, "# the write")


def test_on_chip_runtime_offsets_compile_and_profile():
    x, w = _inputs()
    prof = nkikit.compile(window_sum, x, w, _off(3), target="trn2").profile()
    assert prof.total_us > 0


@nki.jit
def dynamic_loop_windows(x, n):
    """Sums the windows ``x[:, i:i+W]`` for ``i`` in ``0 .. n - 1``, the loop's induction
    register as the offset (the NKI Library's pattern for a run-time block loop)."""
    xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    acc = nl.ndarray((128, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, 0.0)
    for i in nl.dynamic_range(0, nisa.register_alloc(s)):
        window = xs.ap([[64, 128], [1, W]], offset=0, scalar_offset=i, indirect_dim=1)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=window, op=nl.add)
    out = nl.ndarray((128, W), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("n", [0, 1, 64 - W + 1])
def test_a_loop_register_offsets_an_sbuf_operand_each_iteration(n):
    x, _ = _inputs()
    out = np.asarray(dynamic_loop_windows(x, _off(n)))
    want = sum((x[:, i : i + W] for i in range(n)), np.zeros((128, W), np.float32))
    np.testing.assert_array_equal(out, want)


def test_an_on_chip_offset_along_the_partition_dim_is_rejected_at_the_users_line():
    @nki.jit
    def k(x, n):
        xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=n)
        o = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        rows = xs.ap([[64, 64], [1, 64]], offset=0, scalar_offset=s, indirect_dim=0)  # bad
        nisa.tensor_copy(dst=o, src=rows)
        out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=o)
        return out

    x, _ = _inputs()
    with pytest.raises(NkiError) as e:
        k(x, _off(0))
    assert e.value.name == "err_invalid_argument"
    assert "free dimension" in str(e.value)
    assert e.value.loc.line == _line_of(k.func, "# bad")
