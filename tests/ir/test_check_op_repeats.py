"""``prims.check_op`` remembers which kinds of op (operand types, attribute names and types)
passed its record checks: a repeat of a kind skips them, anything else is still checked, and
every op gets its own attribute values."""

from __future__ import annotations

import numpy as np
import pytest

from nkikit.ir import prims
from nkikit.ir.core import Access, Tensor
from nkikit.ir.prims import EngineChoiceError, PrimError


def tile(*shape: int) -> Access:
    return Access.whole(Tensor("t", shape, np.dtype(np.float32), "sbuf"))


def test_a_repeated_kind_keeps_its_own_attribute_values():
    first = prims.check_op("memset", [tile(128, 8)], [], {"value": 0.0})
    again = prims.check_op("memset", [tile(128, 8)], [], {"value": -0.0})
    assert first["value"] == 0.0 and np.signbit(again["value"])
    assert again["engine"] == "vector"
    assert prims.check_op("memset", [tile(128, 8)], [], {"value": 1.0, "engine": None}) == {
        "value": 1.0,
        "engine": "vector",
    }


def test_another_kind_after_a_passing_one_is_checked():
    prims.check_op("memset", [tile(128, 8)], [], {"value": 1.0})
    with pytest.raises(PrimError, match="not of type"):
        prims.check_op("memset", [tile(128, 8)], [], {"value": "one"})
    with pytest.raises(PrimError, match="must be a tile"):
        prims.check_op("memset", [1.0], [], {"value": 1.0})
    with pytest.raises(PrimError, match="unknown attribute"):
        prims.check_op("memset", [tile(128, 8)], [], {"value": 1.0, "colour": "red"})


def test_an_engine_is_checked_on_every_op_of_a_kind():
    prims.check_op("memset", [tile(128, 8)], [], {"value": 1.0, "engine": "gpsimd"})
    with pytest.raises(EngineChoiceError):
        prims.check_op("memset", [tile(128, 8)], [], {"value": 1.0, "engine": "tensor"})


def test_a_repeated_op_gets_a_dict_of_its_own():
    first = prims.check_op("memset", [tile(128, 8)], [], {"value": 2.0})
    first["value"] = 99.0  # a later pass may rewrite an op's attributes
    again = prims.check_op("memset", [tile(128, 8)], [], {"value": 2.0})
    assert again == {"value": 2.0, "engine": "vector"}


def test_values_that_compare_equal_keep_their_types():
    for value in (1.0, 1, True, 1.0, 1):
        got = prims.check_op("memset", [tile(128, 8)], [], {"value": value})
        assert type(got["value"]) is type(value)
