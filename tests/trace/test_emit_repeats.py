"""The emit layer remembers the signature of each op that passed its checks (primitive,
attribute names, values and types, operand memories): a repeat skips the checks, anything
else is still checked, and every op gets its own attribute dict."""

from __future__ import annotations

import numpy as np
import pytest

from nkikit import dtypes
from nkikit.errors import NkiError, caller_loc
from nkikit.ir.core import Access
from nkikit.ir.prims import PrimError
from nkikit.language.operands import new_tile
from nkikit.trace import instructions as E
from nkikit.trace.builder import Builder, tracing


def tile(buffer: str = "sbuf", shape=(128, 64)) -> Access:
    return new_tile(shape, dtypes.as_dtype(np.float32), caller_loc(), buffer=buffer)[1]


def test_a_repeated_op_gets_the_same_complete_attributes_in_its_own_dict():
    with tracing(Builder("k", ())):
        loc = caller_loc()
        a, c = tile(), tile()
        first = E.emit_tensor_copy(a, c, loc=loc)
        again = E.emit_tensor_copy(c, a, loc=loc)
    assert first.attrs == again.attrs == {"engine": "any"}  # the compiler balances it
    assert first.attrs is not again.attrs
    again.attrs["engine"] = "gpsimd"
    assert first.attrs["engine"] == "any"


def test_another_memory_after_a_passing_op_is_checked():
    with tracing(Builder("k", ())):
        loc = caller_loc()
        a, c = tile(), tile()
        E.emit_tensor_copy(a, c, loc=loc)
        with pytest.raises(NkiError, match="err_unsupported_memory"):
            E.emit_tensor_copy(tile("hbm"), c, loc=loc)


def test_the_type_of_an_attribute_value_is_part_of_the_signature():
    with tracing(Builder("k", ())):
        loc = caller_loc()
        out, s, m = tile("psum", (64, 64)), tile(), tile()
        attrs = {"accumulate": True, "perf_mode": None}
        op = E._emit("nc_matmul", [out], [s, m], dict(attrs), None, loc)
        assert op.attrs["accumulate"] is True
        with pytest.raises(PrimError, match="not of type"):  # 1 == True, but not a bool
            E._emit("nc_matmul", [out], [s, m], {"accumulate": 1, "perf_mode": None}, None, loc)
