"""Every argument of every Beta-1 ``nkikit.isa`` instruction and ``nkikit.language`` function,
given each value of the wrong kind in ``BAD`` (an array, a string, a tuple, a nan, an integer
past 32 bits, None, an arbitrary object), is refused with an NkiError -- or, for a call Python
itself rejects, its own TypeError -- never an internal exception from inside nkikit.
Exhaustive (5,280 calls, a few seconds); the NKI 0.x twin is
tests/nki0x/test_misuse_every_argument.py."""

import inspect

import numpy as np
import pytest

import nkikit
import nkikit.isa as nisa
import nkikit.language as nl

BAD = [np.zeros(2), np.zeros((2, 2)), "x", (1, 2, 3), (), float("nan"), float("inf"), 2**40,
       -1, None, object()]  # fmt: skip


def _functions(module, package: str) -> list[str]:
    return sorted(
        n
        for n in dir(module)
        if not n.startswith("_")
        and inspect.isfunction(getattr(module, n))
        and getattr(module, n).__module__.startswith(package)
    )


CALLS = [(nisa, n) for n in _functions(nisa, "nkikit.isa")] + [
    (nl, n) for n in _functions(nl, "nkikit.language")
]


@pytest.mark.parametrize(("module", "name"), CALLS, ids=[f"{m.__name__}.{n}" for m, n in CALLS])
def test_a_bad_value_for_any_argument_is_refused_cleanly(module, name, unclean_refusal):
    fn = getattr(module, name)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "name"
    ]
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    fill = {"shape": (128, 8), "dtype": nl.float32}
    inputs = np.ones((128, 8), np.float32), np.zeros((128, 8), np.float32)

    def kernel(param: str, value):
        @nkikit.jit
        def k(a, out):
            t = nl.load(a)
            args = {p: fill.get(p, t) for p in required}
            args[param] = value
            fn(**args)
            nl.store(out, t)

        return lambda: k(*inputs)

    problems = [
        unclean_refusal(f"{module.__name__}.{name}({p.name}={v!r})", kernel(p.name, v))
        for p in params
        for v in BAD
    ]
    assert [p for p in problems if p] == []


def test_the_calls_cover_both_modules():
    assert (nisa, "tensor_scalar") in CALLS and (nl, "load") in CALLS
