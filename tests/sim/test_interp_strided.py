"""The reference interpreter's strided views: accesses no basic slice expresses (several tile
axes in one tensor dimension, reversed axes) read and write the same elements as index
arrays would, and are bounds-checked the same way."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nkikit.errors import NkiError
from nkikit.ir.affine import Affine, Axis, LoopVar
from nkikit.ir.core import Access, Op, Tensor
from nkikit.sim.interp import Interpreter, injective

_OP = Op("tensor_copy", [], [], {}, None)


def _interp(store: np.ndarray, t: Tensor) -> Interpreter:
    it = Interpreter.__new__(Interpreter)
    Interpreter.__init__(it, None)  # type: ignore[arg-type]
    it.mem[t.uid] = store
    return it


def _elements(access: Access, env: dict) -> list[tuple[int, ...]]:
    """The tensor element of every tile position, in tile (C) order, computed by hand."""
    out = []
    for pos in itertools.product(*(range(n) for n in access.shape)):
        full = {**env, **{Axis(k): v for k, v in enumerate(pos)}}
        out.append(tuple(int(a.evaluate(full)) for a in access.index))
    return out


@st.composite
def _accesses(draw):
    """A 2-d tensor and a 3-axis tile whose axes mix into its dimensions with any steps."""
    tshape = (draw(st.integers(8, 24)), draw(st.integers(8, 24)))
    shape = tuple(draw(st.integers(1, 3)) for _ in range(3))
    dims = [[], []]
    for k in range(3):
        step = draw(st.sampled_from([-3, -2, -1, 1, 2, 4]))
        dims[draw(st.integers(0, 1))].append((Axis(k), step))
    loop = LoopVar("i", 4, "affine")
    index = []
    for d, terms in enumerate(dims):
        lo = sum(min(0, c * (shape[a.k] - 1)) for a, c in terms)
        hi = sum(max(0, c * (shape[a.k] - 1)) for a, c in terms)
        const = draw(st.integers(-lo, max(-lo, tshape[d] - 1 - hi - 3)))
        index.append(Affine(tuple(terms) + ((loop, 1),), const))
    t = Tensor("t", tshape, np.dtype(np.float32), "sbuf")
    return t, Access(t, shape, tuple(index)), loop, draw(st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(_accesses())
def test_strided_reads_and_writes_the_elements_index_arrays_name(case):
    t, acc, loop, i = case
    env = {loop: i}
    elems = _elements(acc, env)
    if any(not 0 <= e[d] < t.shape[d] for e in elems for d in range(2)):
        return  # drawn past the edge: the bounds test below covers errors
    store = np.arange(np.prod(t.shape), dtype=np.float32).reshape(t.shape)
    it = _interp(store, t)
    got = it.read(acc, env, _OP)
    want = np.array([store[e] for e in elems], np.float32).reshape(acc.shape)
    assert got.flags.c_contiguous and np.array_equal(got, want)
    value = -1.0 - np.arange(np.prod(acc.shape), dtype=np.float32).reshape(acc.shape)
    expect = store.copy()
    for e, v in zip(elems, value.reshape(-1)):
        expect[e] = v  # the last write of an element wins, as numpy's index assignment
    it.write(acc, value, env, _OP)
    distinct = len(set(elems)) == len(elems)
    assert injective(it._plan(acc).strided, acc.shape) <= distinct
    assert np.array_equal(store, expect)


def test_a_strided_access_past_the_tensor_names_the_dimension_and_index():
    t = Tensor("t", (4, 16), np.dtype(np.float32), "sbuf")
    # dimension 1 holds 8*a1 + a2: a (2, 4, 4) tile reaches column 8 + 3 + 8 = 19 from base 8
    acc = Access(
        t,
        (4, 2, 4),
        (Affine(((Axis(0), 1),)), Affine(((Axis(1), 8), (Axis(2), 1)), 8)),
    )
    it = _interp(np.zeros(t.shape, np.float32), t)
    with pytest.raises(NkiError) as e:
        it.read(acc, {}, _OP)
    assert e.value.name == "err_tensor_access_out_of_bound" and "19" in str(e.value)
