"""random_inputs and round_to: reproducible, in the requested NKI dtype, rounded once."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nkikit import dtypes
from nkikit.testing import random_inputs, round_to


def test_same_seed_same_arrays():
    a = random_inputs([(3, 4), (4,)], "bfloat16", seed=1)
    b = random_inputs([(3, 4), (4,)], "bfloat16", seed=1)
    c = random_inputs([(3, 4), (4,)], "bfloat16", seed=2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


def test_shape_forms():
    one = random_inputs((2, 3), "float32", 0)
    assert isinstance(one, np.ndarray) and one.shape == (2, 3)
    many = random_inputs([(2, 3), [5]], "float32", 0)
    assert [m.shape for m in many] == [(2, 3), (5,)]
    named = random_inputs({"x": (2, 3), "w": (3,)}, "float16", 0)
    assert list(named) == ["x", "w"] and named["w"].dtype == np.float16
    assert random_inputs((), "float32", 0).shape == ()


@pytest.mark.parametrize(
    "name",
    [
        "float32",
        "bfloat16",
        "float16",
        "float8_e4m3",
        "float8_e4m3fn",
        "float8_e5m2",
        "int8",
        "uint16",
        "int32",
        "bool",
    ],
)
def test_dtype(name):
    x = random_inputs((64, 8), name, 3)
    assert x.dtype == dtypes.as_dtype(name)


def test_integers_are_small():
    x = random_inputs((1000,), "int8", 0)
    assert x.min() >= -8 and x.max() <= 8
    u = random_inputs((1000,), "uint8", 0)
    assert u.min() >= 0 and u.max() <= 16


def test_scale_and_distribution():
    x = random_inputs((10000,), "float32", 0, scale=10.0)
    assert 8.0 < x.std() < 12.0
    u = random_inputs((10000,), "float32", 0, scale=2.0, distribution="uniform")
    assert u.min() >= -2.0 and u.max() < 2.0
    with pytest.raises(ValueError, match="distribution"):
        random_inputs((2,), "float32", 0, distribution="cauchy")
    with pytest.raises(TypeError, match="float64"):
        random_inputs((2,), np.float64, 0)


def test_round_to_rounds_once_to_nearest_even():
    x = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], dtype=np.float32)  # bf16 ties
    np.testing.assert_array_equal(round_to(x, "bfloat16").astype(np.float32), [1.0, 1.0 + 2.0**-6])


def test_round_to_fp8_saturates():
    y = round_to(np.array([1e6, -1e6]), "float8_e4m3")
    assert y.dtype == ml_dtypes.float8_e4m3
    np.testing.assert_array_equal(y.astype(np.float32), [240.0, -240.0])


def test_round_to_tf32_keeps_ten_mantissa_bits():
    x = np.array([1.0 + 2.0**-11, 1.0 + 2.0**-10], dtype=np.float32)
    y = round_to(x, "tfloat32")
    assert dtypes.is_tf32(y.dtype)
    np.testing.assert_array_equal(y, [1.0, 1.0 + 2.0**-10])


def test_dtype_per_array_and_unchanged_draws_for_one_dtype():
    a = random_inputs([(4, 3), (5,)], ["bfloat16", "int32"], seed=5)
    assert a[0].dtype == dtypes.bfloat16 and a[1].dtype == np.int32
    named = random_inputs({"x": (4, 3), "t": (5,)}, {"x": "float32", "t": "int64"}, seed=5)
    assert named["x"].dtype == np.float32 and named["t"].dtype == np.int64
    # a per-array list of one dtype draws exactly what the single dtype draws
    same = random_inputs([(4, 3), (5,)], ["float32", "float32"], seed=5)
    for x, y in zip(same, random_inputs([(4, 3), (5,)], "float32", seed=5)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="2 entries for 3 shapes"):
        random_inputs([(1,), (1,), (1,)], ["float32", "int32"], 0)
    with pytest.raises(ValueError, match="needs the shapes given by name"):
        random_inputs([(1,)], {"x": "float32"}, 0)


def test_bounds():
    t = random_inputs((5000,), "int32", 0, bounds=(0, 32000))
    assert t.min() >= 0 and t.max() < 32000 and t.max() > 30000  # the whole range is drawn
    t64 = random_inputs((100,), "int64", 0, bounds=(3, 4))
    assert t64.dtype == np.int64 and (t64 == 3).all()  # high is excluded
    x, t = random_inputs([(1000,), (1000,)], ["bfloat16", "int32"], 0, bounds=[(1.0, 2.0), None])
    xf = x.astype(np.float32)
    assert xf.min() >= 1.0 and xf.max() < 2.0  # half-open even after rounding to bfloat16
    assert t.min() >= -8 and t.max() <= 8
    with pytest.raises(ValueError, match="hold no integer"):
        random_inputs((2,), "int32", 0, bounds=(0.2, 0.7))
    with pytest.raises(ValueError, match="bool array takes no bounds"):
        random_inputs((2,), "bool", 0, bounds=(0, 1))


def test_example_inputs_follow_the_manifest():
    from nkikit.registry.manifest import Manifest
    from nkikit.testing import example_inputs

    m = Manifest.from_dict(
        {
            "name": "ce",
            "version": 1,
            "license": "MIT",
            "functions": {
                "ce": {
                    "entry": "kernel:ce",
                    "inputs": ["logits", "targets"],
                    "dtypes": ["float32", "bfloat16"],
                    "input_dtypes": {"targets": ["int32", "int64"]},
                    "ranges": {"targets": [0, "logits.shape[1]"]},
                    "example": {"logits": [64, 300], "targets": [64]},
                }
            },
        }
    )
    spec = m.functions["ce"]
    logits, targets = example_inputs(spec, "bfloat16", seed=1)
    assert logits.dtype == dtypes.bfloat16 and logits.shape == (64, 300)
    assert targets.dtype == np.int32 and targets.min() >= 0 and targets.max() < 300
    assert targets.max() > 256  # beyond what bfloat16 holds exactly
    _, t64 = example_inputs(spec, seed=1, input_dtypes={"targets": "int64"})
    assert t64.dtype == np.int64
    # other shapes: the range follows the vocabulary size
    _, small = example_inputs(spec, shapes={"logits": (500, 7), "targets": (500,)})
    assert small.max() == 6 and small.min() == 0
    with pytest.raises(ValueError, match="shapes must be given for exactly the inputs"):
        example_inputs(spec, shapes={"logits": (5, 7)})
