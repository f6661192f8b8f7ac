"""``nisa.tensor_partition_reduce``: every operator the primitive's record lists
(``nkikit/ir/prims.py``: add, max, bitwise_or, bitwise_and, average [nki-0x.md §4.9]) against
numpy, on the reference interpreter and on the fast path.  ``nl.average`` is the fp32 add
reduction divided by the partition count."""

import ml_dtypes
import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError
from nkikit.ir.prims import PRIMS

OPS = PRIMS["tensor_partition_reduce"].attr_index["op"].choices
NL_OPS = {
    "add": nl.add,
    "max": nl.maximum,
    "bitwise_or": nl.bitwise_or,
    "bitwise_and": nl.bitwise_and,
    "average": nl.average,
}
NUMPY = {
    "add": lambda x: np.sum(x, axis=0, keepdims=True),
    "max": lambda x: np.max(x, axis=0, keepdims=True),
    "bitwise_or": lambda x: np.bitwise_or.reduce(x, axis=0, keepdims=True),
    "bitwise_and": lambda x: np.bitwise_and.reduce(x, axis=0, keepdims=True),
    "average": lambda x: np.mean(x, axis=0, keepdims=True, dtype=np.float64),
}


@nki.jit
def across_partitions(x, op, dtype=nl.float32):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray((1, *x.shape[1:]), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=r, op=op, data=t)
    out = nl.ndarray(r.shape, dtype=dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.fixture(params=["reference", "fast"])
def simulator(request, monkeypatch):
    monkeypatch.setenv("NKIKIT_SIM", request.param)
    return request.param


def test_every_operator_of_the_record_has_a_test():
    assert set(OPS) == set(NL_OPS) == set(NUMPY)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(128, 64), (96, 5), (7, 4, 8)])
def test_each_operator_matches_numpy(op, shape, simulator):
    rng = np.random.default_rng(len(shape) * 1000 + shape[0])
    if op.startswith("bitwise"):
        x = rng.integers(0, 1 << 20, shape).astype(np.int32)
        got = across_partitions(x, NL_OPS[op], nl.int32)
        np.testing.assert_array_equal(got, NUMPY[op](x))
    else:
        x = rng.standard_normal(shape).astype(np.float32)
        got = across_partitions(x, NL_OPS[op])
        assert got.shape == (1, *shape[1:]) and got.dtype == np.float32
        np.testing.assert_allclose(got, NUMPY[op](x), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("p", [128, 96, 3])
def test_average_is_the_sum_divided_in_fp32(p, simulator):
    # the same bits as the add reduction divided by P in fp32, rounded once into dst's dtype
    x = (np.random.default_rng(p).standard_normal((p, 48)) * 1000).astype(np.float32)
    total = across_partitions(x, nl.add)
    want = total / np.float32(p)
    np.testing.assert_array_equal(across_partitions(x, nl.average), want)
    xb = x.astype(ml_dtypes.bfloat16)
    total_b = across_partitions(xb, nl.add)
    got_b = across_partitions(xb, nl.average, nl.bfloat16)
    np.testing.assert_array_equal(got_b, (total_b / np.float32(p)).astype(ml_dtypes.bfloat16))


def test_an_operator_outside_the_record_is_refused():
    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=r, op=nl.minimum, data=t)  # <-
        out = nl.ndarray(r.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out

    with pytest.raises(NkiError) as e:
        k(np.zeros((8, 4), np.float32))
    assert e.value.name == "err_invalid_argument"
    assert "nl.average" in str(e.value) and "'minimum'" in str(e.value)
    assert e.value.loc.file == __file__ and e.value.loc.text.endswith("# <-")
