"""Names of ALU operators, activation functions and reductions, and how user code names them
(strings, numpy functions such as ``np.add``, or ``nl.*`` functions)."""

from __future__ import annotations

from collections.abc import Collection

from ..errors import NkiError, caller_loc

ALU_OPS = frozenset(
    """add subtract multiply divide maximum minimum power mod fmod equal not_equal greater
    greater_equal less less_equal logical_and logical_or logical_xor logical_not bitwise_and
    bitwise_or bitwise_xor left_shift right_shift invert abs rsqrt reciprocal bypass
    arith_shift_right abs_max abs_min square relu""".split()
)
# the ALU operators that read only their first operand (the docs' "arithmetic unary" row:
# abs, square, relu, rsqrt, reciprocal; plus the bitvec/logical nots and bypass)
ALU_UNARY = frozenset("bypass abs square relu rsqrt reciprocal invert logical_not".split())
ACTIVATIONS = frozenset(
    """copy identity exp log tanh sigmoid relu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid
    silu silu_dx erf erf_dx softplus mish sqrt rsqrt reciprocal square sin cos tan arctan abs
    sign negative trunc floor ceil invert logical_not gelu_apprx_sigmoid_dx prelu""".split()
)
REDUCE_OPS = frozenset(
    "add subtract multiply max min maximum minimum bitwise_and bitwise_or "
    "bitwise_xor logical_and logical_or logical_xor".split()
)

_ALIASES = {
    "sum": "add",
    "amax": "max",
    "amin": "min",
    "true_divide": "divide",
    "negate": "negative",
    "prod": "multiply",
    "product": "multiply",
    "absolute": "abs",
    "fabs": "abs",
    "power": "power",
    "all": "logical_and",
    "any": "logical_or",
}


def op_name(op: object, kind: str = "alu", valid: Collection[str] | None = None) -> str:
    """Normalize ``op`` to a canonical name; ``kind`` is 'alu', 'activation' or 'reduce'.
    ``valid``: the names the caller takes, instead of every name of the kind (an
    instruction with operators of its own: ``tensor_partition_reduce``'s ``average``)."""
    if op is None:
        # no operator: the ALU passes its input on, the activation copies; a reduction has none
        name = {"alu": "bypass", "activation": "copy"}.get(kind, "")
        if name and (valid is None or name in valid):
            return name
    elif isinstance(op, str):
        name = op
    else:
        name = getattr(op, "__nki_op__", None) or getattr(op, "__name__", None) or ""
    name = _ALIASES.get(name, name)
    if kind == "reduce":
        name = {"maximum": "max", "minimum": "min"}.get(name, name)
        names = REDUCE_OPS
    elif kind == "activation":
        names = ACTIVATIONS
    else:
        name = {"max": "maximum", "min": "minimum"}.get(name, name)
        names = ALU_OPS
    if name not in (names if valid is None else valid):
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=f"{kind} op",
            why=f"{op!r} is not a supported {kind} operator",
        )
    return name
