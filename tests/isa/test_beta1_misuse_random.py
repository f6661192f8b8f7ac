"""Random misuse of the Beta-1 front end: any argument of any ``nkikit.isa`` instruction or
``nkikit.language`` function given a value of the wrong kind (an array, a string, a tuple, a
nan, an integer too large, None, an arbitrary object) is refused with an NkiError -- or, for a
call Python itself rejects, its own TypeError -- never an internal exception from inside
nkikit.  Deterministic (derandomized hypothesis); the NKI 0.x twin is
tests/nki0x/test_misuse_random.py."""

import inspect
import os
import traceback

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nkikit
import nkikit.isa as nisa
import nkikit.language as nl
from nkikit.errors import NkiError

PACKAGE = os.path.dirname(nkikit.__file__)
BAD = [np.zeros(2), np.zeros((2, 2)), "x", (1, 2, 3), (), float("nan"), float("inf"), 2**40, -1,
       None, object()]  # fmt: skip


def _functions(module, package: str) -> list[tuple[str, str]]:
    found = []
    for name in getattr(module, "__all__", None) or dir(module):
        fn = getattr(module, name)
        if (
            not name.startswith("_")
            and inspect.isfunction(fn)
            and fn.__module__.startswith(package)
        ):
            params = inspect.signature(fn).parameters.values()
            found += [
                (name, p.name)
                for p in params
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "name"
            ]
    return found


CALLS = [("isa", *c) for c in _functions(nisa, "nkikit.isa")] + [
    ("language", *c) for c in _functions(nl, "nkikit.language")
]


def test_the_calls_cover_both_modules():
    assert {m for m, _, _ in CALLS} == {"isa", "language"}
    assert ("isa", "tensor_scalar", "reverse0") in CALLS


@settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(call=st.sampled_from(CALLS), value=st.sampled_from(BAD))
def test_a_bad_value_for_any_argument_is_refused_cleanly(call, value):
    module, name, param = call
    fn = getattr(nisa if module == "isa" else nl, name)
    params = inspect.signature(fn).parameters.values()
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]

    @nkikit.jit
    def k(a, out):
        t = nl.load(a)
        fill = {"shape": (128, 8), "dtype": nl.float32}
        args = {p: fill.get(p, t) for p in required}
        args[param] = value
        fn(**args)
        nl.store(out, t)

    try:
        k(np.ones((128, 8), np.float32), np.zeros((128, 8), np.float32))
    except NkiError:
        pass
    except Exception as e:  # noqa: BLE001 - only Python's own refusal of the call is fine
        inner = traceback.extract_tb(e.__traceback__)[-1]
        assert not inner.filename.startswith(PACKAGE), (
            f"{module}.{name}({param}={value!r}): {type(e).__name__} from "
            f"{inner.filename}:{inner.lineno}: {e}"
        )
