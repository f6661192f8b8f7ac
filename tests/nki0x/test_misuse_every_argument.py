"""Every argument of every NKI 0.x instruction, ``nl`` function and tensor method, given each
value of the wrong kind in ``BAD`` (an array, a string, a tuple, a nan, an integer past 32
bits, None, an arbitrary object), is refused with an NkiError -- or, for a call Python itself
rejects, its own TypeError -- never an internal exception from inside nkikit.  Exhaustive:
6,193 calls, a few seconds.  The Beta-1 twin is tests/isa/test_beta1_misuse_every_argument.py."""

import inspect

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl

# instructions whose calls need a launch or registers set up first
SKIP = {"sendrecv", "core_barrier", "register_alloc", "register_load", "register_move",
        "register_store", "scalar_load", "scalar_store"}  # fmt: skip
BAD = [np.zeros(2), np.zeros((2, 2)), "x", (1, 2, 3), (), float("nan"), float("inf"), 2**40,
       -1, None, object()]  # fmt: skip
TENSOR_METHODS = ["reshape", "ap", "view", "broadcast_to", "expand_dims", "permute",
                  "transpose", "select", "flatten_dims", "split_dims", "squeeze", "bitcast",
                  "astype", "__getitem__", "indirect", "swapaxes"]  # fmt: skip


def _functions(module, skip=()) -> list[str]:
    """The functions ``module`` defines among its public names."""
    return sorted(
        n
        for n in module.__all__
        if inspect.isfunction(getattr(module, n))
        and getattr(module, n).__module__.startswith(module.__name__)
        and n not in skip
    )


def _params(fn) -> list[inspect.Parameter]:
    return [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "name"
    ]


def _tile():
    t = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.0)
    return t


def _in_a_kernel(body):
    """A call of a kernel that runs ``body`` before storing a tile."""

    @nki.jit
    def k(x):
        body()
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=_tile())
        return out

    return lambda: k(np.zeros((1, 1), np.float32))


def _each_bad_argument(module, name: str, unclean_refusal) -> list[str]:
    """The calls of ``module.name`` with one argument bad that leak an internal exception;
    the other required arguments are an SBUF tile (a shape (16, 8), a dtype float32)."""
    fn = getattr(module, name)
    params = _params(fn)
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    fill = {"shape": (16, 8), "dtype": nl.float32}
    problems = []
    for param in params:
        for value in BAD:

            def body(param=param.name, value=value):
                args = {p: fill[p] if p in fill else _tile() for p in required}
                args[param] = value
                fn(**args)

            what = f"{module.__name__}.{name}({param.name}={value!r})"
            problems.append(unclean_refusal(what, _in_a_kernel(body)))
    return [p for p in problems if p]


@pytest.mark.parametrize("name", _functions(nisa, SKIP))
def test_a_bad_value_for_any_instruction_argument_is_refused_cleanly(name, unclean_refusal):
    assert _each_bad_argument(nisa, name, unclean_refusal) == []


@pytest.mark.parametrize("name", _functions(nl, ("device_print",)))
def test_a_bad_value_for_any_language_argument_is_refused_cleanly(name, unclean_refusal):
    assert _each_bad_argument(nl, name, unclean_refusal) == []


@pytest.mark.parametrize("method", TENSOR_METHODS)
def test_a_bad_value_for_a_tensor_method_is_refused_cleanly(method, unclean_refusal):
    problems = []
    for buffer in (nl.sbuf, nl.shared_hbm):
        for value in BAD:
            for arity in (1, 2):

                def body(buffer=buffer, value=value, arity=arity):
                    t = nl.ndarray((16, 8), dtype=nl.float32, buffer=buffer)
                    getattr(t, method)(*[value] * arity)

                what = f"{buffer.name} tensor.{method}({value!r} x {arity})"
                problems.append(unclean_refusal(what, _in_a_kernel(body)))
    assert [p for p in problems if p] == []


def test_the_functions_are_found():
    assert {"dma_copy", "nc_matmul", "tensor_scalar"} <= set(_functions(nisa, SKIP))
    assert {"ndarray", "load", "fori_loop"} <= set(_functions(nl))
