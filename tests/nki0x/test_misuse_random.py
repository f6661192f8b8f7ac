"""Random misuse: any argument of any NKI 0.x instruction, ``nl`` function or tensor method
given a value of the wrong kind (an array, a string, a tuple, a nan, an integer too large,
None, an arbitrary object) is refused with an NkiError -- or, for a call Python itself
rejects, its own TypeError -- never an internal exception from inside nkikit.
Deterministic (derandomized hypothesis)."""

import inspect
import os
import traceback

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nkikit
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

PACKAGE = os.path.dirname(nkikit.__file__)
# instructions whose every call needs a launch or registers set up first
SKIP = {
    "sendrecv",
    "core_barrier",
    "register_alloc",
    "register_load",
    "register_move",
    "register_store",
    "scalar_load",
    "scalar_store",
}


def _instructions() -> list[str]:
    names = []
    for name in nisa.__all__:
        fn = getattr(nisa, name)
        module = getattr(fn, "__module__", "") or ""
        if inspect.isfunction(fn) and module.startswith("nkikit.nki.isa") and name not in SKIP:
            params = inspect.signature(fn).parameters
            if "dst" in params or "src" in params:  # an instruction, not a helper
                names.append(name)
    return sorted(names)


INSTRUCTIONS = _instructions()
BAD = [
    np.zeros(2),
    np.zeros((2, 2)),
    "x",
    (1, 2, 3),
    (),
    float("nan"),
    float("inf"),
    2**40,
    -1,
    None,
    object(),
]


def _tile():
    t = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    return t


@pytest.mark.parametrize("name", ["dma_copy", "nc_matmul", "tensor_scalar", "activation"])
def test_the_instructions_are_found(name):
    assert name in INSTRUCTIONS


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_a_bad_value_for_any_argument_is_refused_cleanly(data):
    name = data.draw(st.sampled_from(INSTRUCTIONS))
    fn = getattr(nisa, name)
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "name"]
    param = data.draw(st.sampled_from([p.name for p in params]))
    value = data.draw(st.sampled_from(BAD))
    required = [p.name for p in params if p.default is inspect.Parameter.empty]

    @nki.jit
    def k(x):
        operands = {p: _tile() for p in required}
        operands[param] = value
        fn(**operands)
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=_tile())
        return out

    try:
        k(np.zeros((1, 1), np.float32))
    except NkiError:
        pass
    except Exception as e:  # noqa: BLE001 - only Python's own refusal of the call is fine
        inner = traceback.extract_tb(e.__traceback__)[-1]
        assert not inner.filename.startswith(PACKAGE), (
            f"nisa.{name}({param}={value!r}): {type(e).__name__} from "
            f"{inner.filename}:{inner.lineno}: {e}"
        )


def _language_functions() -> list[str]:
    return sorted(
        n for n in nl.__all__ if inspect.isfunction(getattr(nl, n)) and n not in ("device_print",)
    )


TENSOR_METHODS = ["reshape", "ap", "view", "broadcast_to", "expand_dims", "permute",
                  "transpose", "select", "flatten_dims", "split_dims", "squeeze", "bitcast",
                  "astype", "__getitem__", "indirect", "swapaxes"]  # fmt: skip


def _refused_cleanly(what: str, body) -> None:
    @nki.jit
    def k(x):
        body()
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=_tile())
        return out

    try:
        k(np.zeros((1, 1), np.float32))
    except NkiError:
        pass
    except Exception as e:  # noqa: BLE001 - only Python's own refusal of the call is fine
        inner = traceback.extract_tb(e.__traceback__)[-1]
        assert not inner.filename.startswith(PACKAGE), (
            f"{what}: {type(e).__name__} from {inner.filename}:{inner.lineno}: {e}"
        )


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_a_bad_value_for_a_language_function_is_refused_cleanly(data):
    name = data.draw(st.sampled_from(_language_functions()))
    fn = getattr(nl, name)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if not params:
        return
    param = data.draw(st.sampled_from([p.name for p in params]))
    value = data.draw(st.sampled_from(BAD))
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    fill = {"shape": (16, 8), "dtype": nl.float32}

    def body():
        args = {p: fill[p] if p in fill else _tile() for p in required}
        args[param] = value
        fn(**args)

    _refused_cleanly(f"nl.{name}({param}={value!r})", body)


@settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    method=st.sampled_from(TENSOR_METHODS),
    on_chip=st.booleans(),
    value=st.sampled_from(BAD),
    arity=st.sampled_from([1, 2]),
)
def test_a_bad_value_for_a_tensor_method_is_refused_cleanly(method, on_chip, value, arity):
    def body():
        if on_chip:
            t = _tile()
        else:
            t = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        getattr(t, method)(*[value] * arity)

    _refused_cleanly(f"tensor.{method}({value!r} x {arity})", body)
