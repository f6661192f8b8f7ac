"""NKI 0.7 ``NkiScalar`` with ``nisa.scalar_load`` / ``scalar_store`` [nki-0x.md §4.14]:
traced int32 arithmetic with wrap-around, a scalar as ``.ap(scalar_offset=)`` and as a
``nl.fori_loop`` bound, and every constraint a named error at the kernel's line.  Both
simulators run every kernel here and must agree bit for bit (``conftest.py``)."""

import inspect

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

ROWS, W = 8, 4
X = np.arange(ROWS * W, dtype=np.float32).reshape(ROWS, W)


def _n(v: int) -> np.ndarray:
    return np.array([[v]], np.int32)


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


def _load(n):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=n)
    return nisa.scalar_load(s)


def _store(value):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.scalar_store(s, value)
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    return out


@nki.jit
def arithmetic(a, b):
    x, y = _load(a), _load(b)
    return (
        _store(x * y),
        _store(x + y),
        _store(x - y),
        _store(3 - x),
        _store(-x),
        _store(x * 2 + y * 5 - 7),
    )


def _wrap(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize(
    "a,b", [(100000, 100000), (2**31 - 1, 1), (-(2**31), 1), (-(2**31), -1), (12, -5)]
)
def test_arithmetic_is_traced_and_wraps_around_at_32_bits(a, b):
    got = [int(o[0, 0]) for o in arithmetic(_n(a), _n(b))]
    want = [a * b, a + b, a - b, 3 - a, -a, a * 2 + b * 5 - 7]
    assert got == [_wrap(v) for v in want]


def test_the_reference_example():
    # int32: 100000 * 100000 -> 1410065408 [nki-0x.md §4.14]
    assert int(arithmetic(_n(100000), _n(100000))[0][0, 0]) == 1410065408


def test_one_trace_serves_every_value():
    a = arithmetic.ir(_n(1), _n(2))
    assert a is arithmetic.ir(_n(5), _n(9))  # the values exist only when the kernel runs
    assert sum(op.prim == "scalar_arith" for op, _ in a.ops()) == 9


def _row(x, i):
    return x.ap([[x.shape[1], 1], [1, x.shape[1]]], offset=0, scalar_offset=i, indirect_dim=0)


@nki.jit
def row_after(x, n):
    """Row ``2 * n + 1`` of x, its index computed on the device."""
    i = _load(n) * 2 + 1
    row = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=_row(x, i))
    out = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=row)
    return out


@pytest.mark.parametrize("n", [0, 1, 3])
def test_a_scalar_is_a_dma_scalar_offset(n):
    np.testing.assert_array_equal(row_after(X, _n(n))[0], X[2 * n + 1])


@nki.jit
def sum_first(x, n):
    """x[: n - 1].sum(0): the loop bound is a scalar computed on the device."""
    acc = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(acc, 0.0)
    row = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)

    def body(i):
        nisa.dma_copy(dst=row, src=_row(x, i))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)

    nl.fori_loop(0, _load(n) - 1, body)
    out = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("n", [1, 2, ROWS + 1])
def test_a_scalar_is_a_fori_loop_bound(n):
    np.testing.assert_array_equal(sum_first(X, _n(n))[0], X[: n - 1].sum(axis=0))


# ---------------------------------------------------------------------------------------------
# constraints: named errors at the user's line


@nki.jit
def store_an_int(n):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.scalar_store(s, 5)  # bad
    return n


@nki.jit
def load_unsigned(n):
    s = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.memset(s, 1)
    nisa.scalar_load(s)  # bad
    return n


@nki.jit
def load_two(n):
    s = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(s, 1)
    nisa.scalar_load(s)  # bad
    return n


@nki.jit
def load_from_psum(n):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.psum)
    nisa.memset(s, 1)
    nisa.scalar_load(s)  # bad
    return n


@nki.jit
def store_narrower(n):
    s = nl.ndarray((1, 1), dtype=nl.int16, buffer=nl.sbuf)
    nisa.scalar_store(s, _load(n))  # bad
    return n


@nki.jit
def add_a_float(n):
    x = _load(n)
    x + 1.5  # bad
    return n


@nki.jit
def add_a_wide_int(n):
    x = _load(n)
    x + 2**40  # bad
    return n


@nki.jit
def branch_on_a_scalar(n):
    x = _load(n)
    if x:  # bad
        pass
    return n


@nki.jit
def comparison_as_offset(x, n):
    i = _load(n) < 3
    x.ap([[x.shape[1], 1], [1, x.shape[1]]], offset=0, scalar_offset=i)  # bad
    return n


@nki.jit
def comparison_as_bound(x, n):
    nl.fori_loop(0, _load(n) == 3, lambda i: None)  # bad
    return n


@nki.jit
def store_a_comparison(n):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.scalar_store(s, _load(n) >= 1)  # bad
    return n


@pytest.mark.parametrize(
    "kernel,args,name",
    [
        (store_an_int, (_n(0),), "err_invalid_argument"),
        (load_unsigned, (_n(0),), "err_unsupported_dtype"),
        (load_two, (_n(0),), "err_invalid_argument"),
        (load_from_psum, (_n(0),), "err_unsupported_memory"),
        (store_narrower, (_n(0),), "err_unsupported_dtype"),
        (add_a_float, (_n(0),), "err_invalid_argument"),
        (add_a_wide_int, (_n(0),), "err_invalid_argument"),
        (branch_on_a_scalar, (_n(0),), "err_unsupported_api"),
        (comparison_as_offset, (X, _n(0)), "err_invalid_argument"),
        (comparison_as_bound, (X, _n(0)), "err_invalid_argument"),
        (store_a_comparison, (_n(0),), "err_invalid_argument"),
    ],
)
def test_bad_scalar_uses_are_named_errors_at_the_users_line(kernel, args, name):
    with pytest.raises(NkiError) as e:
        kernel(*args)
    assert e.value.name == name, str(e.value)
    assert e.value.loc.line == _line_of(kernel.func, "# bad")
