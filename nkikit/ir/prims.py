"""The primitive records: what each IR instruction *is*, declared once.

An IR op names a primitive (``Op.prim``).  :data:`PRIMS` holds one frozen :class:`Prim`
per primitive with every fact the layers need about it:

- its operand **roles** (input and output names, which inputs may be immediates, how many
  are optional), used by the tracer's checks and every error message;
- its **engine**: fixed, or a choice picked by an attribute (default first), plus rules
  that override the choice (``tensor_tensor(op=power)`` runs on the GpSimd);
- its **attribute schema**: names, types and defaults (``Builder.emit`` checks every op
  against it and fills the defaults, so every later layer may index ``op.attrs``);
- its **flags**: whether it reads its destination, accumulates into it, leaves part of it,
  evaluates its mask over its input, moves raw bits, may mix partition counts, is split per
  block;
- its **output spec**: the partitions, elements per partition and dtype each output gets
  from the inputs and attributes (the verifier holds every output access to it).

Facts come from the ISA documentation as summarized in the design references
(``reference/nki.md`` §2-3, ``reference/nki-0x.md`` §4; tagged [ISA] below).  What a primitive *does* stays in each layer's own table, keyed
by the primitive's name as JAX keys its rules by primitive: the simulation rule
(``nkikit/sim/rules.py`` ``RULES``), the lowering and cost (``nkikit/compiler/lower.py``
``PRIMS``), the per-primitive checks (``nkikit/ir/verify.py`` ``PRIM_RULES``).
``tests/ir/test_prims.py`` fails when a primitive lacks an entry in any of them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import dtypes
from ..errors import NkiInternalError
from .affine import Affine, Predicate
from .core import Access, Op, Operand

# Engines that run instructions ("dma" is the DMA queues).
ENGINES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "dma")
# The ``engine`` value of an op whose engine the kernel left to the compiler (see Prim.balance).
ANY_ENGINE = "any"


class PrimError(NkiInternalError, AssertionError):
    """An op that contradicts its primitive record: a bug in the nkikit code that emitted it
    (a front end or a tracer helper) or in a layer that handled it, never a problem with the
    user's kernel."""


class _Required:
    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of an attribute every op must set."""

# concrete types, not the numbers ABCs: emit checks every op, and an ABC check is slow
_INT = (int, np.integer)
_REAL = (int, float, np.integer, np.floating)
_STR = (str,)
_OPT_STR = (str, type(None))
_BOOL = (bool, np.bool_)


@dataclass(frozen=True, slots=True)
class Attr:
    """One attribute: its name, the types its value may have, its default (``REQUIRED``
    when the op must set it) and, for a name from a closed list, the values it may take
    (empty: any value of its types).  The front ends refuse other values at the user's line;
    ``check_op`` treats one that reaches it as a bug (``PrimError``)."""

    name: str
    types: tuple[type, ...]
    default: Any = REQUIRED
    choices: tuple[Any, ...] = ()

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


class OutSpec(NamedTuple):
    """What one output of a primitive is: its partition count and elements per partition
    (None: whatever the destination has, e.g. a memset), or only its total element count
    (a DMA: shapes may differ [ISA]), the dtype the instruction produces when the front end
    does not choose one, and the dtypes it may be (None: any)."""

    partitions: int | None = None
    free: int | None = None
    elements: int | None = None
    dtype: np.dtype | None = None
    dtypes: frozenset[str] | None = None


OutRule = Callable[[Sequence[Operand], Mapping[str, Any]], tuple[OutSpec, ...]]


@dataclass(frozen=True, slots=True)
class Indirection:
    """Which operands of a primitive may be NeuronCore-v4 tensor-indirection views (NKI 0.x
    ``NkiTensor.indirect``: one column per offset read at run time) [nki-0x.md §3.8, §4].

    ``roles``: the output and input roles that may be one.  ``engines``: the engines that take
    one (empty: every engine of the primitive).  ``dtypes``: the dtypes an indirect operand may
    have (None: any); ``not_dtypes``: dtypes it may not have.  ``pairs``: roles that are
    indirect together or not at all, through one index (an MX data tensor and its scales)."""

    roles: frozenset[str]
    engines: tuple[str, ...] = ()
    dtypes: frozenset[str] | None = None
    not_dtypes: frozenset[str] = frozenset()
    pairs: tuple[tuple[str, str], ...] = ()


# The snake group of tensor indirection per engine: offset ``i`` of an indirect view is the
# index tile's element ``[i % G, i // G]``, G = 16 on the Vector, Scalar and GpSimd engines and
# 32 on the Tensor engine [nki-0x.md §3.8].  An engine not listed takes no indirect view.
SNAKE_GROUP: Mapping[str, int] = {"tensor": 32, "vector": 16, "scalar": 16, "gpsimd": 16}


@dataclass(frozen=True, slots=True)
class Prim:
    """The record of one primitive (see the module docstring for what each part is for).

    ``engines``: the engines it may run on, the default first; empty for a primitive that
    runs on none (simulation only, e.g. ``device_print``).  With more than one, the
    ``engine`` attribute picks.  ``balance``: the engines the compiler chooses among when the
    kernel leaves the engine unassigned (the ``engine`` attribute is :data:`ANY_ENGINE`, its
    default then): the Neuron compiler places such instructions to balance the engines'
    load, so the verifier checks the op on every one of them and the lowering picks one
    (:func:`engines_of`).  ``engine_rules``: ``(attr, value, engine)`` -- an op whose
    ``attrs[attr] == value`` runs on ``engine`` whatever its ``engine`` attribute says.
    ``reads_dst``: True, or the name of the attribute that makes the op read its
    destination's old value (an input that is not among ``ins``).  ``accumulate_attr``: the
    attribute that marks an accumulation into the destination (``+=``, PSUM accumulation,
    atomic RMW), whose writes need not be distinct per loop iteration.
    """

    name: str
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    out_spec: OutRule
    engines: tuple[str, ...]
    attrs: tuple[Attr, ...] = ()
    min_ins: int | None = None  # None: every input role is required
    min_outs: int | None = None  # None: every output role is required
    immediates: frozenset[str] = frozenset()  # input roles that may be Python numbers
    in_dtypes: tuple[tuple[str, frozenset[str]], ...] = ()  # legal dtypes per input role
    memories: tuple[tuple[str, tuple[str, ...]], ...] = ()  # roles not wired like the engine
    engine_rules: tuple[tuple[str, Any, str], ...] = ()
    reads_dst: bool | str = False
    accumulate_attr: str | None = None
    mask_on_input: bool = False  # the mask (and iteration space) is the first input's tile
    balance: tuple[str, ...] = ()  # engines an unassigned op may be placed on (see above)
    raw: bool = False  # moves bits: inputs reach the rule in their storage dtype
    # leaves some destination elements as they were: always, or when the named attribute is set
    partial_write: bool | str = False
    partition_free: bool = False  # operands may differ in partition count
    block_split: bool = False  # split per block when it covers a blocked tensor whole
    # NeuronCore generations that have the instruction (the MX ones: NC-v4 only [nki-0x.md
    # §4.2]); the verifier rejects it on other targets
    nc_versions: tuple[int, ...] = (2, 3, 4)
    # computes on MX containers (x4 dtypes); other primitives may only move their bits
    mx: bool = False
    # output roles that carry an engine's state from one instruction to the next (the PRNG
    # state): written in program order, so an affine_range loop need not index them
    state_outs: frozenset[str] = frozenset()
    # NC-v4 tensor indirection: which operands may be indirect views (None: none may)
    indirection: Indirection | None = None
    attr_index: Mapping[str, Attr] = field(init=False, repr=False, compare=False)
    # the attribute that picks the engine, when there is a choice (else None)
    engine_attr: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.engines) > 1 and all(a.name != "engine" for a in self.attrs):
            # the engine choice is an attribute whose default is the default engine, or
            # "unassigned" when the compiler balances the op
            default = ANY_ENGINE if self.balance else self.engines[0]
            object.__setattr__(self, "attrs", (*self.attrs, Attr("engine", _STR, default)))
        object.__setattr__(self, "attr_index", {a.name: a for a in self.attrs})
        object.__setattr__(self, "engine_attr", "engine" if len(self.engines) > 1 else None)

    @property
    def default_engine(self) -> str | None:
        return self.engines[0] if self.engines else None

    def in_role(self, i: int) -> str:
        """The role of input ``i``; inputs past the declared roles are the runtime index
        tiles ``Builder.emit`` appends for indirect accesses."""
        return self.ins[i] if i < len(self.ins) else "index tile"

    def out_role(self, i: int) -> str:
        return self.outs[i] if i < len(self.outs) else f"output {i}"


# ---------------------------------------------------------------------------------------------
# output specs


def _tile(x: Operand) -> Access:
    if not isinstance(x, Access):
        raise PrimError(f"expected a tile operand, got {x!r}")
    return x


def _pf(a: Access) -> tuple[int, int]:
    """(partitions, elements per partition) of a tile access."""
    n = 1
    for s in a.shape[1:]:
        n *= s
    return (a.shape[0] if a.shape else 1), n


def _like(i: int, dtype: np.dtype | None = None) -> Callable[[Sequence[Operand]], OutSpec]:
    """An output shaped like input ``i`` (same partitions and elements per partition)."""

    def spec(ins: Sequence[Operand]) -> OutSpec:
        a = _tile(ins[i])
        p, f = _pf(a)
        return OutSpec(p, f, dtype=dtype or a.dtype)

    return spec


def _column(i: int) -> Callable[[Sequence[Operand]], OutSpec]:
    """A (P, 1) per-partition result of input ``i`` (reduce_res), fp32 by default."""

    def spec(ins: Sequence[Operand]) -> OutSpec:
        return OutSpec(_pf(_tile(ins[i]))[0], 1, dtype=dtypes.float32)

    return spec


def _fixed(
    i: int, free: int, dtype: np.dtype | None = None, allowed: frozenset[str] | None = None
) -> Callable[[Sequence[Operand]], OutSpec]:
    """A (P, ``free``) result of input ``i``'s partitions."""

    def spec(ins: Sequence[Operand]) -> OutSpec:
        a = _tile(ins[i])
        return OutSpec(_pf(a)[0], free, dtype=dtype or a.dtype, dtypes=allowed)

    return spec


def _outs(*parts: Callable[[Sequence[Operand]], OutSpec]) -> OutRule:
    """An output rule from one spec function per output role."""

    def rule(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
        return tuple(p(ins) for p in parts)

    return rule


def _any_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    return (OutSpec(),)


def _no_outs(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    return ()


def _dma_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # element counts of src and dst must match; shapes may differ [ISA dma_copy]
    a = _tile(ins[0])
    return (OutSpec(elements=math.prod(a.shape), dtype=a.dtype),)


def _matmul_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # dst partitions = stationary free size, dst free size = moving free size; fp32 (or
    # bf16 on NC-v4) in PSUM [ISA nc_matmul]
    st, mv = _tile(ins[0]), _tile(ins[1])
    return (OutSpec(_pf(st)[1], _pf(mv)[1], dtype=dtypes.float32, dtypes=_MATMUL_OUT),)


def _transpose_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    p, f = _pf(_tile(ins[0]))  # free dims are flattened first [ISA nc_transpose]
    return (OutSpec(f, p, dtype=_tile(ins[0]).dtype),)


def _broadcast_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    a = _tile(ins[0])
    return (OutSpec(None, _pf(a)[1], dtype=a.dtype),)


def _reduce_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    a = _tile(ins[0])
    p, f = _pf(a)
    kept = f
    for k in attrs["axes"]:
        kept //= a.shape[k]
    return (OutSpec(p, kept, dtype=a.dtype),)


def _partition_reduce_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    a = _tile(ins[0])
    return (OutSpec(1, _pf(a)[1], dtype=a.dtype),)


def _shuffle_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # same dtype and elements per partition; partition counts may differ [ISA, NKL]
    a = _tile(ins[0])
    return (OutSpec(None, _pf(a)[1], dtype=a.dtype, dtypes=frozenset({dtypes.name(a.dtype)})),)


def local_gather_indices(index_shape: Sequence[int], num_valid_indices: int | None) -> int:
    """How many indices each GpSimd core of ``local_gather`` uses: ``num_valid_indices``, by
    default all of its 16 partitions' indices [ISA local_gather]."""
    p = index_shape[0] if index_shape else 1
    k = int(np.prod(index_shape[1:])) if len(index_shape) > 1 else 1
    return int(num_valid_indices) if num_valid_indices is not None else min(16, p) * k


def _gather_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # every partition gets one chunk of num_elem_per_idx elements per index of its core; no
    # dtype conversion [ISA local_gather]
    src, index = _tile(ins[0]), _tile(ins[1])
    used = local_gather_indices(index.shape, attrs.get("num_valid_indices"))
    n = used * int(attrs["num_elem_per_idx"])
    name = dtypes.name(src.dtype)
    return (OutSpec(_pf(src)[0], n, dtype=src.dtype, dtypes=frozenset({name})),)


def _n_gather_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # one element of data per index, in data's dtype (no conversion) [ISA nc_n_gather]
    data, indices = _tile(ins[0]), _tile(ins[1])
    name = dtypes.name(data.dtype)
    return (OutSpec(_pf(indices)[0], _pf(indices)[1], dtype=data.dtype, dtypes=frozenset({name})),)


def mx_scale_rows(data_partitions: int) -> int:
    """Partitions an MX scale tile spans for ``data_partitions`` of data: scale row ``i``
    (data partitions ``8i .. 8i + 7``) lives at partition ``(i // 4) * 32 + i % 4``, 4 of every
    32 partitions, so the scales stay in the quadrant of their data [nki-0x.md §4.5]."""
    last = max(data_partitions // 8 - 1, 0)
    return (last // 4) * 32 + last % 4 + 1


def _matmul_mx_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # like nc_matmul: dst partitions = stationary (packed) free size, free = moving's; fp32
    # or bf16 in PSUM [nki-0x.md §4.5 nc_matmul_mx]
    st, mv = _tile(ins[0]), _tile(ins[1])
    return (OutSpec(_pf(st)[1], _pf(mv)[1], dtype=dtypes.float32, dtypes=_MATMUL_OUT),)


def _quantize_mx_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # four values per container: F / 4 containers per partition, and one scale per 8 x 4
    # group in a tile of its own partition count [nki-0x.md §4.11]
    p, f = _pf(_tile(ins[0]))
    return (
        OutSpec(p, f // 4, dtype=dtypes.float8_e4m3fn_x4, dtypes=_MX_QUANTIZED),
        OutSpec(None, f // 4, dtype=dtypes.uint8, dtypes=_MX_SCALE),
    )


def _nonzero_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # int32 indices, one more element per partition than src: the count goes last
    # [nki-0x.md §4.8 nonzero_with_count]
    p, f = _pf(_tile(ins[0]))
    return (OutSpec(p, f + 1, dtype=np.dtype(np.int32), dtypes=frozenset({"int32"})),)


def _exponential_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    p, f = _pf(_tile(ins[0]))
    return (
        OutSpec(p, f, dtype=_tile(ins[0]).dtype, dtypes=_EXP_DST),
        OutSpec(p, 1, dtype=dtypes.float32),
    )


def _cumulative_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # dst: the running values; acc: the register after the last element (fp32)
    p, f = _pf(_tile(ins[0]))
    return (
        OutSpec(p, f, dtype=_tile(ins[0]).dtype, dtypes=_CUMULATIVE),
        OutSpec(p, 1, dtype=dtypes.float32),
    )


def _sequence_bounds_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # (1, n) segment ids -> (1, 2, n): starts then ends [nki-0x.md §4.7]
    a = _tile(ins[0])
    p, f = _pf(a)
    return (OutSpec(p, 2 * f, dtype=a.dtype, dtypes=_BOUNDS),)


def _topk_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    # K bf16 values and K uint32 indices per partition [nki-0x.md §4.8 topk]
    p = _pf(_tile(ins[0]))[0]
    k = int(attrs["k"])
    return (
        OutSpec(p, k, dtype=dtypes.bfloat16, dtypes=frozenset({"bfloat16"})),
        OutSpec(p, k, dtype=dtypes.uint32, dtypes=frozenset({"uint32"})),
    )


# ---------------------------------------------------------------------------------------------
# dtype sets [ISA]

_MX_DATA = frozenset({"float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4"})
_MX_QUANTIZED = frozenset({"float8_e5m2_x4", "float8_e4m3fn_x4"})  # fp4 is not producible
_MX_SCALE = frozenset({"float8_e8m0fnu", "uint8"})

_MATMUL_IN = frozenset(
    {"float8_e4m3", "float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "tfloat32", "float32"}
)
_MATMUL_OUT = frozenset({"float32", "bfloat16"})
_INDEX8_OUT = frozenset({"uint16", "uint32"})
_FP32_MIN = -3.4028234663852886e38
# exponential's destination and source dtypes [nki-0x.md §4.6 exponential]
_EXP_DST = frozenset(
    """float8_e4m3 float8_e4m3fn float8_e5m2 float16 bfloat16 float32 tfloat32 int8 int16 int32
    uint8 uint16""".split()
)
_EXP_SRC = (_EXP_DST - {"tfloat32"}) | {"uint32"}
# tensor_scalar_cumulative: no 32-bit integers [nki-0x.md §4.6 tensor_scalar_cumulative]
_CUMULATIVE = frozenset(
    "bfloat16 float16 float32 float8_e4m3 float8_e4m3fn float8_e5m2 uint8 uint16 int8 int16".split()
)
_BOUNDS = frozenset({"float32", "int32"})  # sequence_bounds [nki-0x.md §4.7]
# the dtypes of an indirect TensorE operand [nki-0x.md §3.8]; a matmul's PSUM dst too (the
# reference says "operands": fp32 dst, the usual one, is refused rather than guessed)
_TENSOR_E_INDIRECT = frozenset(
    {"float16", "bfloat16", "float8_e4m3", "float8_e5m2", "float8_e4m3fn"}
)
_INT32S = frozenset({"int32", "uint32"})

_ON_CHIP = ("sbuf", "psum")


# ---------------------------------------------------------------------------------------------
# the table

_HBM_SBUF = ("hbm", "shared_hbm", "private_hbm", "sbuf")
_GROUPS = Attr("groups", (tuple,))


def group_size(attrs: Mapping[str, Any]) -> int:
    """Ranks per replica group of a collective op (every group has as many)."""
    groups = attrs.get("groups")
    return len(groups[0]) if groups else 1


def _one_element(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    return (OutSpec(elements=1),)


_U32 = frozenset({"uint32"})
_F32 = frozenset({"float32"})
_INT_DTYPES = frozenset({"int8", "int16", "int32", "uint8", "uint16", "uint32"})
# rand2's destinations [nki-0x.md §4.12]
_RAND2_DTYPES = _INT_DTYPES | frozenset(
    {"float8_e4m3", "float8_e5m2", "float16", "bfloat16", "float32", "tfloat32"}
)
# uint32 words of one lane's PRNG state: one XORWOW state (x, y, z, w, v, d) on the GpSimd,
# four on the VectorE, which draws 4 x 32 bits per lane per cycle [nki-0x.md §4.12]
RNG_STATE_WORDS: Mapping[str, int] = {"gpsimd": 6, "vector": 24}
SCALAR_OPS = frozenset(
    {
        "add",
        "subtract",
        "multiply",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
    }
)


def _rng_state_out(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    """The state words of the op's engine per partition (set_rng_seed writes every lane)."""
    return (OutSpec(None, RNG_STATE_WORDS[attrs["engine"]], dtype=dtypes.uint32, dtypes=_U32),)


def _rng_dst(allowed: frozenset[str]) -> Callable[[Sequence[Operand]], OutSpec]:
    """A random destination: any partitions and size, one of the ``allowed`` dtypes."""

    def spec(ins: Sequence[Operand]) -> OutSpec:
        return OutSpec(dtypes=allowed)

    return spec


def _rng_out(dst: Callable[[Sequence[Operand]], OutSpec], state: int) -> OutRule:
    """``dst``'s spec, then the advanced state: the partitions of input ``state`` and the
    state words of the op's engine."""

    def rule(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
        p = _pf(_tile(ins[state]))[0]
        words = RNG_STATE_WORDS[attrs.get("engine", "vector")]
        return dst(ins), OutSpec(p, words, dtype=dtypes.uint32, dtypes=_U32)

    return rule


def _collective_out(mul: int, div: int) -> OutRule:
    """A collective's destination: as many elements as its source, times the group size
    ``mul == 0`` (all_gather) or divided by it ``div == 0`` (reduce_scatter); any shape."""

    def rule(ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
        a = _tile(ins[0])
        n, g = math.prod(a.shape), group_size(attrs)
        n = n * (g if mul == 0 else 1) // (g if div == 0 else 1)
        return (OutSpec(elements=n, dtype=a.dtype),)

    return rule


_RECORDS = (
    # -- DMA ---------------------------------------------------------------------------------
    Prim(
        "dma_copy",
        ins=("src",),
        outs=("dst",),
        out_spec=_dma_out,
        engines=("dma",),
        # oob_skip (oob_mode.skip): elements whose runtime index is outside the tensor are not
        # transferred, instead of a runtime error [ISA dma_copy]
        attrs=(
            Attr("rmw_op", _OPT_STR, None),
            Attr("transpose", _BOOL, False),
            Attr("oob_skip", _BOOL, False),
        ),
        reads_dst="rmw_op",
        accumulate_attr="rmw_op",
        partial_write="oob_skip",
        raw=True,
        partition_free=True,
        block_split=True,
    ),
    # -- TensorE -----------------------------------------------------------------------------
    Prim(
        "nc_matmul",
        ins=("stationary", "moving"),
        outs=("dst",),
        out_spec=_matmul_out,
        engines=("tensor",),
        attrs=(Attr("accumulate", _BOOL, False), Attr("perf_mode", _OPT_STR, None)),
        in_dtypes=(("stationary", _MATMUL_IN), ("moving", _MATMUL_IN)),
        reads_dst="accumulate",
        accumulate_attr="accumulate",
        partition_free=True,
        indirection=Indirection(
            frozenset({"dst", "stationary", "moving"}), dtypes=_TENSOR_E_INDIRECT
        ),
    ),
    Prim(
        # MXFP8/MXFP4 matmul: packed containers dequantized by their 8-partition x 4-value
        # groups' scales on the fly, contraction over partitions and the 4 packed values
        # [nki-0x.md §4.5]
        "nc_matmul_mx",
        ins=("stationary", "moving", "stationary_scale", "moving_scale"),
        outs=("dst",),
        out_spec=_matmul_mx_out,
        engines=("tensor",),
        attrs=(Attr("accumulate", _BOOL, False),),
        in_dtypes=(
            ("stationary", _MX_DATA),
            ("moving", _MX_DATA),
            ("stationary_scale", _MX_SCALE),
            ("moving_scale", _MX_SCALE),
        ),
        reads_dst="accumulate",
        accumulate_attr="accumulate",
        raw=True,  # containers and scales reach the rule as their bits
        partition_free=True,
        nc_versions=(4,),
        mx=True,
        # dst on its own; each data tensor together with its scales, through one index
        indirection=Indirection(
            frozenset({"dst", "stationary", "moving", "stationary_scale", "moving_scale"}),
            dtypes=_TENSOR_E_INDIRECT | _MX_DATA | _MX_SCALE,
            pairs=(("stationary", "stationary_scale"), ("moving", "moving_scale")),
        ),
    ),
    Prim(
        "nc_transpose",
        ins=("data",),
        outs=("dst",),
        out_spec=_transpose_out,
        engines=("tensor", "vector"),  # TensorE <= 128x128, VectorE <= 32x32 [ISA]
        partition_free=True,
    ),
    Prim(
        # nl.broadcast_to along partitions: a ones-row matmul on the TensorE [nki.md §3.2],
        # whose PSUM result lands in the destination's memory
        "partition_broadcast",
        ins=("src",),
        outs=("dst",),
        out_spec=_broadcast_out,
        engines=("tensor",),
        memories=(("src", ("sbuf",)), ("dst", _ON_CHIP)),
        raw=True,
        partition_free=True,
    ),
    # -- ScalarE -----------------------------------------------------------------------------
    Prim(
        "activation",
        ins=("data", "bias", "scale"),
        outs=("dst", "reduce_res"),
        out_spec=_outs(_like(0), _column(0)),
        engines=("scalar",),
        attrs=(Attr("op", _STR), Attr("reduce_op", _OPT_STR, None)),
        min_outs=1,
        immediates=frozenset({"bias", "scale"}),
        indirection=Indirection(frozenset({"dst", "data"})),
    ),
    Prim(
        # NC-v4 Activation2: v = (data op0 imm0) op1 imm1 (a "bypass" stage is skipped,
        # reverseN swaps its operands), dst = op(v, relu_param), optional reduction of dst
        # [nki-0x.md §4.10 activate2]
        "activate2",
        ins=("data", "imm0", "imm1", "relu_param"),
        outs=("dst", "reduce_res"),
        out_spec=_outs(_like(0), _column(0)),
        engines=("scalar",),
        attrs=(
            Attr("op", _STR),
            Attr("op0", _STR, "bypass"),
            Attr("op1", _STR, "bypass"),
            Attr("reverse0", _BOOL, False),
            Attr("reverse1", _BOOL, False),
            Attr("reduce_op", _OPT_STR, None),
        ),
        min_outs=1,
        immediates=frozenset({"imm0", "imm1", "relu_param"}),
        nc_versions=(4,),
        indirection=Indirection(frozenset({"dst", "data"})),
    ),
    # -- VectorE / ScalarE / GpSimd ----------------------------------------------------------
    Prim(
        "tensor_copy",
        ins=("src",),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("vector", "scalar", "gpsimd"),
        raw=True,
        # [A2, PM]: a copy the kernel does not assign (nl.copy, the PSUM evacuation of a
        # store or an assignment) is placed by the compiler on VectorE or ScalarE, both of
        # which read PSUM; GpSimd does not, so it is not a candidate
        balance=("vector", "scalar"),
        # Vector and Scalar only [nki-0x.md §4.4]
        indirection=Indirection(frozenset({"dst", "src"}), engines=("vector", "scalar")),
    ),
    Prim(
        "memset",
        ins=(),
        outs=("dst",),
        out_spec=_any_out,
        engines=("vector", "gpsimd"),  # [ISA memset]
        attrs=(Attr("value", _REAL),),
        block_split=True,
    ),
    Prim(
        "tensor_tensor",
        ins=("data1", "data2"),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("vector", "gpsimd"),
        attrs=(Attr("op", _STR), Attr("accumulate", _BOOL, False)),
        engine_rules=(("op", "power", "gpsimd"),),  # power runs on the GpSimd [ISA]
        accumulate_attr="accumulate",
        indirection=Indirection(frozenset({"dst", "data1"})),
    ),
    Prim(
        "tensor_scalar",
        ins=("data", "operand0", "operand1"),
        outs=("dst", "reduce_res"),
        out_spec=_outs(_like(0), _column(0)),
        engines=("vector", "scalar", "gpsimd"),
        attrs=(
            Attr("op0", _STR),
            Attr("reverse0", _BOOL, False),
            Attr("op1", _OPT_STR, None),
            Attr("reverse1", _BOOL, False),
            Attr("reduce_op", _OPT_STR, None),
            Attr("accumulate", _BOOL, False),
        ),
        min_ins=2,
        min_outs=1,
        immediates=frozenset({"operand0", "operand1"}),
        accumulate_attr="accumulate",
        # not the int32/uint32 "tensor_scalar_addr" form [nki-0x.md §4.6]: read here as no
        # 32-bit integer indirect operand
        indirection=Indirection(frozenset({"dst", "data"}), not_dtypes=_INT32S),
    ),
    Prim(
        "scalar_tensor_tensor",
        ins=("data", "operand0", "operand1"),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("vector",),
        attrs=(
            Attr("op0", _STR),
            Attr("op1", _STR),
            Attr("reverse0", _BOOL, False),
            Attr("reverse1", _BOOL, False),
        ),
        immediates=frozenset({"operand0"}),
    ),
    Prim(
        # bf16/fp16 -> MXFP8 containers + one scale per 8 x 4 group [nki-0x.md §4.11]
        "quantize_mx",
        ins=("src",),
        outs=("dst", "dst_scale"),
        out_spec=_quantize_mx_out,
        engines=("vector",),
        in_dtypes=(("src", frozenset({"bfloat16", "float16"})),),
        memories=(("src", ("sbuf",)), ("dst", ("sbuf",)), ("dst_scale", ("sbuf",))),
        reads_dst=True,  # the scale partitions it does not write keep their value
        partial_write=True,
        raw=True,  # the source's own bits; the outputs are container and scale bits
        partition_free=True,  # the scale tile has its own partition count
        nc_versions=(4,),
        mx=True,
    ),
    Prim(
        "tensor_reduce",
        ins=("data",),
        outs=("dst",),
        out_spec=_reduce_out,
        engines=("vector",),
        attrs=(
            Attr("op", _STR),
            Attr("axes", (tuple,)),
            Attr("negate", _BOOL, False),
            Attr("keepdims", _BOOL, False),
        ),
        mask_on_input=True,
        indirection=Indirection(frozenset({"dst", "data"})),
    ),
    Prim(
        # the GpSimd's cross-partition reductions [ISA tensor_partition_reduce; nki-0x.md
        # §4.9]; ``average`` is the fp32 add reduction divided by the partitions it reads
        "tensor_partition_reduce",
        ins=("data",),
        outs=("dst",),
        out_spec=_partition_reduce_out,
        engines=("gpsimd",),
        attrs=(Attr("op", _STR, choices=("add", "max", "bitwise_or", "bitwise_and", "average")),),
        mask_on_input=True,
        partition_free=True,
    ),
    Prim(
        "tensor_tensor_scan",
        ins=("data0", "data1", "initial"),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("vector",),
        attrs=(Attr("op0", _STR), Attr("op1", _STR)),
        immediates=frozenset({"initial"}),
    ),
    Prim(
        # NC-v4 VectorE exp: dst = exp(src - max_value), optionally summed into reduce_res
        # [nki-0x.md §4.6 exponential]
        "exponential",
        ins=("src", "max_value"),
        outs=("dst", "reduce_res"),
        out_spec=_exponential_out,
        engines=("vector",),
        min_outs=1,
        immediates=frozenset({"max_value"}),
        in_dtypes=(("src", _EXP_SRC),),
        nc_versions=(4,),
        indirection=Indirection(frozenset({"dst", "src"})),
    ),
    Prim(
        # per-partition running scan reg = op1(op0(src[i], imm0), reg), dst[i] = reg, starting
        # from ``init``; ``acc`` receives the last reg (the VectorE accumulator)
        # [nki-0x.md §4.6 tensor_scalar_cumulative]
        "tensor_scalar_cumulative",
        ins=("src", "imm0", "init"),
        outs=("dst", "acc"),
        out_spec=_cumulative_out,
        engines=("vector",),
        attrs=(Attr("op0", _STR), Attr("op1", _STR)),
        min_outs=1,
        immediates=frozenset({"imm0", "init"}),
        in_dtypes=(("src", _CUMULATIVE),),
        indirection=Indirection(frozenset({"dst", "src"})),
    ),
    Prim(
        "reciprocal",
        ins=("data",),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("vector",),
    ),
    Prim(
        "select",  # nl.where
        ins=("condition", "x", "y"),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("vector",),
        immediates=frozenset({"x", "y"}),
        # nisa.tensor_copy_predicated: dst and predicate [nki-0x.md §4.4]
        indirection=Indirection(frozenset({"dst", "condition"})),
    ),
    Prim(
        "range_select",
        ins=("on_true_tile", "bound0", "bound1"),
        outs=("dst", "reduce_res"),
        out_spec=_outs(_like(0), _column(0)),
        engines=("vector",),
        attrs=(
            Attr("comp_op0", _STR),
            Attr("comp_op1", _STR),
            Attr("on_false", _REAL, _FP32_MIN),
            Attr("range_start", _INT, 0),
            Attr("reduce_op", _STR, "max"),
        ),
        min_outs=1,
        immediates=frozenset({"bound0", "bound1"}),
    ),
    Prim(
        "select_reduce",
        ins=("predicate", "on_true", "on_false"),
        outs=("dst", "reduce_res"),
        out_spec=_outs(_like(0), _column(0)),
        engines=("vector",),
        attrs=(Attr("reverse", _BOOL, False), Attr("reduce_op", _STR, "max")),
        min_outs=1,
        immediates=frozenset({"on_false"}),
    ),
    Prim(
        "bn_stats",
        ins=("data",),
        outs=("dst",),
        out_spec=_outs(_fixed(0, 6, dtypes.float32)),
        engines=("vector",),
        mask_on_input=True,
    ),
    Prim(
        "bn_aggr",
        ins=("data",),
        outs=("dst",),
        out_spec=_outs(_fixed(0, 2, dtypes.float32)),
        engines=("vector",),
    ),
    Prim(
        # dst = data, each element zeroed when the Vector PRNG's next uniform draw is below
        # ``prob`` [nki-0x.md §4.12]; reads and advances the PRNG state (see rng below)
        "dropout",
        ins=("data", "prob", "state"),
        outs=("dst", "state"),
        out_spec=_rng_out(_like(0), 2),
        engines=("vector",),
        immediates=frozenset({"prob"}),
        in_dtypes=(("state", _U32),),
        raw=True,  # the state's uint32 bits reach the rule as they are
        state_outs=frozenset({"state"}),
    ),
    Prim(
        "max8",
        ins=("src",),
        outs=("dst",),
        out_spec=_outs(_fixed(0, 8)),
        engines=("vector",),
        mask_on_input=True,
    ),
    Prim(
        "nc_find_index8",
        ins=("data", "vals"),
        outs=("dst",),
        out_spec=_outs(_fixed(0, 8, dtypes.uint32, _INDEX8_OUT)),
        engines=("vector",),
    ),
    Prim(
        "nc_match_replace8",
        ins=("data", "vals"),
        outs=("dst", "dst_idx"),
        out_spec=_outs(_like(0), _fixed(0, 8, dtypes.uint32)),
        engines=("vector",),
        attrs=(Attr("imm", _REAL),),
        min_outs=1,
    ),
    Prim(
        "nc_stream_shuffle",
        ins=("src",),
        outs=("dst",),
        out_spec=_shuffle_out,
        engines=("vector",),
        attrs=(Attr("shuffle_mask", (tuple,)),),
        reads_dst=True,  # mask entry 255 keeps the destination's partition [ISA]
        partial_write=True,
        raw=True,
        partition_free=True,
    ),
    # -- GpSimd ------------------------------------------------------------------------------
    Prim(
        "iota",
        ins=(),
        outs=("dst",),
        out_spec=_any_out,
        engines=("gpsimd",),
        attrs=(Attr("expr", (Affine,)),),
    ),
    Prim(
        "affine_select",
        ins=("on_true_tile",),
        outs=("dst",),
        out_spec=_outs(_like(0)),
        engines=("gpsimd",),
        attrs=(Attr("pred", (Predicate,)), Attr("on_false", _REAL)),
    ),
    Prim(
        "local_gather",
        ins=("src_buffer", "index"),
        outs=("dst",),
        out_spec=_gather_out,
        engines=("gpsimd",),
        attrs=(
            Attr("num_elem_per_idx", _INT, 1),
            Attr("num_valid_indices", (*_INT, type(None)), None),
        ),
        raw=True,
    ),
    Prim(
        "nc_n_gather",
        ins=("data", "indices"),
        outs=("dst",),
        out_spec=_n_gather_out,
        engines=("gpsimd",),
        raw=True,
    ),
    Prim(
        # per element: start and end (exclusive) of its segment; id 0 (padding) -> (n, -1)
        # [nki-0x.md §4.7 sequence_bounds]
        "sequence_bounds",
        ins=("segment_ids",),
        outs=("dst",),
        out_spec=_sequence_bounds_out,
        engines=("gpsimd",),
        in_dtypes=(("segment_ids", _BOUNDS),),
    ),
    Prim(
        # the K largest of the n elements each 16-partition group holds "snake"-wise
        # (element e at partition e % 16, column e // 16), ascending, with their indices
        # [nki-0x.md §4.8 topk]
        "topk",
        ins=("src",),
        outs=("val_dst", "idx_dst"),
        out_spec=_topk_out,
        engines=("gpsimd",),
        attrs=(Attr("n", _INT), Attr("k", _INT)),
        in_dtypes=(("src", frozenset({"bfloat16"})),),
        memories=(("src", ("sbuf",)), ("val_dst", ("sbuf",)), ("idx_dst", ("sbuf",))),
    ),
    # -- registers (NKI 0.x) -----------------------------------------------------------------
    # A register is modeled as a one-element int32 SBUF tile (``nkikit/nki/isa/registers.py``);
    # these run on an engine's instruction sequencer, charged as one small GpSimd instruction.
    Prim(
        # register_alloc(x) / register_move / register_load / register_store [nki-0x.md §4.14]:
        # one 32-bit value from an immediate, a register or a one-element HBM/SBUF tile into a
        # register or a one-element tile, converted to the destination's dtype
        "register_move",
        ins=("src",),
        outs=("dst",),
        out_spec=_one_element,
        engines=("gpsimd",),
        immediates=frozenset({"src"}),
        memories=(("src", _HBM_SBUF), ("dst", _HBM_SBUF)),
        raw=True,
        partition_free=True,
    ),
    Prim(
        # ncc.rank_id(): this rank's id within the collective world [nki-0x.md §5.8]
        "rank_id",
        ins=(),
        outs=("dst",),
        out_spec=_any_out,
        engines=("gpsimd",),
    ),
    # -- random numbers [nki-0x.md §4.12] ----------------------------------------------------
    # Each engine's PRNG state is an IR tensor (``trace/rng.py``: RNG_STATE_WORDS uint32 words
    # per partition, seeded at the kernel's start from the simulation call's seed), which the
    # instructions below read and write like any operand, so both simulators and the
    # scheduler see the state carried from one instruction to the next.  The generator is
    # XORWOW per lane (``sim/prng.py``); hardware streams are not reproduced bit for bit.
    Prim(
        # rng(dst, engine): 32 random bits per element, truncated to dst's integer dtype
        "rng",
        ins=("state",),
        outs=("dst", "state"),
        out_spec=_rng_out(_rng_dst(_INT_DTYPES), 0),
        engines=("vector", "gpsimd"),
        in_dtypes=(("state", _U32),),
        raw=True,
        state_outs=frozenset({"state"}),
    ),
    Prim(
        # rand2(dst, min, max): uniform in [min, max] (fp32 immediates or (P, 1) tiles)
        "rand2",
        ins=("state", "min", "max"),
        outs=("dst", "state"),
        out_spec=_rng_out(_rng_dst(_RAND2_DTYPES), 0),
        engines=("vector",),
        immediates=frozenset({"min", "max"}),
        in_dtypes=(("state", _U32), ("min", _F32), ("max", _F32)),
        raw=True,
        state_outs=frozenset({"state"}),
        nc_versions=(4,),
    ),
    Prim(
        # set_rng_seed(src_seeds): every lane's state from one 32-bit seed (a [1, 1] tile, or
        # the immediate of the kernel-start seeding, which ``call_seed`` mixes with the
        # simulation call's seed); Vector only for the user, GpSimd for its kernel-start seeding
        "set_rng_seed",
        ins=("src_seeds",),
        outs=("state",),
        out_spec=_rng_state_out,
        engines=("vector", "gpsimd"),
        attrs=(Attr("call_seed", _BOOL, False),),
        immediates=frozenset({"src_seeds"}),
        in_dtypes=(("src_seeds", frozenset({"int32", "uint32", "float32"})),),
        raw=True,
        partition_free=True,
        state_outs=frozenset({"state"}),
    ),
    Prim(
        # rand_set_state(src_seeds, engine): the per-lane state words from an SBUF uint32 tile
        "rand_set_state",
        ins=("src_seeds",),
        outs=("state",),
        out_spec=_rng_state_out,
        engines=("gpsimd", "vector"),
        in_dtypes=(("src_seeds", _U32),),
        raw=True,
        state_outs=frozenset({"state"}),
        nc_versions=(3, 4),
    ),
    Prim(
        # rand_get_state(dst, engine): the per-lane state words into a uint32 tile
        "rand_get_state",
        ins=("state",),
        outs=("dst",),
        out_spec=_rng_state_out,
        engines=("gpsimd", "vector"),
        in_dtypes=(("state", _U32),),
        raw=True,
        nc_versions=(3, 4),
    ),
    # -- NkiScalar arithmetic (NKI 0.7) [nki-0x.md §4.14] -------------------------------------
    Prim(
        # dst = x op y on one on-device integer (``nkikit/nki/isa/scalars.py``): + - * wrap
        # around at the dtype's width; comparisons give 0 / 1.  Run by the sequencer like
        # the register moves.
        "scalar_arith",
        ins=("x", "y"),
        outs=("dst",),
        out_spec=_one_element,
        engines=("gpsimd",),
        attrs=(Attr("op", _STR),),
        immediates=frozenset({"x", "y"}),
        in_dtypes=(("x", frozenset({"int32"})), ("y", frozenset({"int32"}))),
        raw=True,
        partition_free=True,
    ),
    # -- collectives across ranks (NKI 0.x nki.collectives) [nki-0x.md §5.8] -----------------
    # One op per (src, dst) pair; ``groups``: the replica groups (each a tuple of ranks).  The
    # collective engines' rings move the data; the cost model charges the op as a DMA of its
    # bytes.  What each rank receives is the simulation rule's (``sim/rules.py``).
    *(
        Prim(
            name,
            ins=("src",),
            outs=("dst",),
            out_spec=spec,
            engines=("dma",),
            attrs=attrs,
            raw=raw,
            partition_free=True,
            # a rank no pair sends to keeps its destination
            reads_dst=name == "collective_permute",
            partial_write=name == "collective_permute",
        )
        for name, spec, attrs, raw in (
            ("all_reduce", _collective_out(1, 1), (_GROUPS, Attr("op", _STR)), False),
            ("all_gather", _collective_out(0, 1), (_GROUPS, Attr("dim", _INT)), True),
            (
                "reduce_scatter",
                _collective_out(1, 0),
                (_GROUPS, Attr("dim", _INT), Attr("op", _STR)),
                False,
            ),
            ("all_to_all", _collective_out(1, 1), (_GROUPS, Attr("dim", _INT)), True),
            ("collective_permute", _collective_out(1, 1), (Attr("pairs", (tuple,)),), True),
        )
    ),
    # variable-length collectives (NKI 0.3 / 0.6): tensors are flat element buffers; the
    # counts and displacements are a uint32 metadata tile read when the op runs (rows: send
    # counts, send displacements, recv counts, recv displacements; one column per rank of the
    # group) [nki.collectives.all_gather_v / all_to_all_v docs]; a destination element no
    # chunk lands on keeps its value
    *(
        Prim(
            name,
            ins=("src", "metadata"),
            outs=("dst",),
            out_spec=_any_out,
            engines=("dma",),
            attrs=(
                _GROUPS,
                Attr("recv_counts_known", _BOOL, False),
                Attr("has_rdispls", _BOOL, False),
            ),
            in_dtypes=(("metadata", _U32),),
            raw=True,
            partition_free=True,
            reads_dst=True,
            partial_write=True,
        )
        for name in ("all_gather_v", "all_to_all_v")
    ),
    Prim(
        # ncc.collective_permute_implicit_current_processing_rank_id: the rank whose data a
        # ring step ``iteration`` holds: this rank's own at 0, then its predecessors' in the
        # ring of its replica group (the group's rank order)
        "ring_rank_id",
        ins=(),
        outs=("dst",),
        out_spec=_any_out,
        engines=("gpsimd",),
        attrs=(_GROUPS, Attr("iteration", _INT)),
    ),
    Prim(
        "nonzero_with_count",
        ins=("src",),
        outs=("dst",),
        out_spec=_nonzero_out,
        engines=("gpsimd",),
        attrs=(Attr("index_offset", _INT, 0), Attr("padding_val", _INT, -1)),
        in_dtypes=(("src", frozenset({"float32", "int32"})),),
        # only the first partition of each GpSimd core (0, 16, ..., 112) is written [ISA]
        reads_dst=True,
        partial_write=True,
        raw=True,
    ),
    # -- simulation only ---------------------------------------------------------------------
    Prim(
        "device_print",
        ins=("x",),
        outs=(),
        out_spec=_no_outs,
        engines=(),
        attrs=(Attr("prefix", _STR),),
        partition_free=True,
    ),
)

PRIMS: dict[str, Prim] = {p.name: p for p in _RECORDS}
"""Every primitive, by name."""


def names_where(pred: Callable[[Prim], bool]) -> frozenset[str]:
    """The primitives whose record satisfies ``pred`` (for layers that keep a set)."""
    return frozenset(n for n, p in PRIMS.items() if pred(p))


MASK_ON_INPUT = names_where(lambda p: p.mask_on_input)
# the primitives that exchange data between ranks (``sim/ranks.py`` runs every rank)
COLLECTIVES = names_where(lambda p: any(a.name in ("groups", "pairs") for a in p.attrs))
RAW = names_where(lambda p: p.raw)


# ---------------------------------------------------------------------------------------------
# accessors


def prim(name: str) -> Prim:
    """The record of primitive ``name`` (``PrimError`` for an unknown name)."""
    p = PRIMS.get(name)
    if p is None:
        raise PrimError(f"unknown primitive {name!r}; the primitives are in nkikit/ir/prims.py")
    return p


def engine_choices(name: str) -> tuple[str, ...]:
    """The values the ``engine`` of primitive ``name`` may take, the default first: its
    engines, preceded by :data:`ANY_ENGINE` when the compiler balances it."""
    got = _CHOICES.get(name)
    if got is None:  # asked per traced instruction: made once per primitive
        p = prim(name)
        got = _CHOICES[name] = (ANY_ENGINE, *p.engines) if p.balance else p.engines
    return got


_CHOICES: dict[str, tuple[str, ...]] = {}


def _ruled(p: Prim, attrs: Mapping[str, Any]) -> str | None:
    for attr, value, eng in p.engine_rules:
        if attrs.get(attr) == value:
            return eng
    return None


def resolve_engine(name: str, attrs: Mapping[str, Any]) -> str | None:
    """The engine an op of primitive ``name`` with ``attrs`` runs on: an engine rule that
    matches, else the ``engine`` attribute (when there is a choice), else the default.
    An unassigned engine (:data:`ANY_ENGINE`) resolves to the first engine of ``balance``,
    the nominal engine of layers that need one; the lowering picks among all of them.
    None for a primitive no engine runs (simulation only)."""
    p = prim(name)
    ruled = _ruled(p, attrs)
    if ruled is not None:
        return ruled
    if p.engine_attr is not None:
        eng = attrs.get(p.engine_attr)
        if eng == ANY_ENGINE:
            return p.balance[0]
        return eng or p.default_engine
    return p.default_engine


def engines_of(op: Op) -> tuple[str, ...]:
    """Every engine ``op`` may run on: the compiler's candidates (``balance``) for an op
    whose engine the kernel left unassigned, else the one engine of :func:`engine_of` (empty
    for an op no engine runs).  The verifier checks the op on each of them."""
    p = PRIMS[op.prim]
    if p.balance and op.attrs.get("engine") == ANY_ENGINE and _ruled(p, op.attrs) is None:
        return p.balance
    eng = engine_of(op)
    return () if eng is None else (eng,)


def engine_of(op: Op) -> str | None:
    """The engine that executes ``op`` ("dma", "tensor", "vector", "scalar", "gpsimd"), or
    None when no engine does (``device_print``)."""
    return resolve_engine(op.prim, op.attrs)


def reads_dst(op: Op) -> bool:
    """Whether ``op`` reads its destination's old value (an input not listed in ``ins``):
    PSUM accumulation, atomic read-modify-write, a shuffle that keeps some partitions."""
    r = PRIMS[op.prim].reads_dst
    return bool(op.attrs.get(r)) if isinstance(r, str) else r


def writes_partially(op: Op) -> bool:
    """Whether ``op`` may leave some elements of its destination as they were (a skipped
    out-of-bounds transfer, a shuffle that keeps some partitions)."""
    w = PRIMS[op.prim].partial_write
    return bool(op.attrs.get(w)) if isinstance(w, str) else w


def accumulates(op: Op) -> bool:
    """Whether ``op`` accumulates into its destination (``+=``, PSUM accumulation, atomic
    RMW): an associative update, so its writes need not be distinct per iteration."""
    a = PRIMS[op.prim].accumulate_attr
    return a is not None and bool(op.attrs.get(a))


def mask_ref(op: Op) -> Access | None:
    """The access whose tile axes ``op``'s mask is over: the first input for primitives
    that mask their input (reductions), else the first output (else the first tile input)."""
    if PRIMS[op.prim].mask_on_input and op.ins and isinstance(op.ins[0], Access):
        return op.ins[0]
    if op.outs:
        return op.outs[0]
    return next((a for a in op.ins if isinstance(a, Access)), None)


def out_specs(name: str, ins: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[OutSpec, ...]:
    """What each output role of primitive ``name`` gets from ``ins`` and (complete)
    ``attrs``: one :class:`OutSpec` per output role."""
    return prim(name).out_spec(ins, attrs)


def in_dtypes(name: str) -> Mapping[str, frozenset[str]]:
    """The legal dtypes of those input roles of ``name`` whose dtypes the ISA restricts."""
    return dict(prim(name).in_dtypes)


def memories(name: str) -> Mapping[str, tuple[str, ...]]:
    """Per-role memories of ``name`` that differ from its engine's wiring (an idiom)."""
    return dict(prim(name).memories)


class EngineChoiceError(ValueError):
    """An ``engine`` attribute naming an engine the primitive cannot run on: the user's
    choice, not a bug, so ``Builder.emit`` reports it as the NKI error it is."""

    def __init__(self, name: str, engine: object, choices: tuple[str, ...]) -> None:
        super().__init__(f"{name}: engine={engine} is not one of {choices}")
        self.prim = name
        self.engine = engine
        self.choices = choices


def check_op(
    name: str, outs: Sequence[Any], ins: Sequence[Any], attrs: Mapping[str, Any]
) -> dict[str, Any]:
    """Check an op about to be emitted against its record and return its complete
    attributes: the given ones (in their order), then every missing default; the engine
    attribute holds the engine that runs the op (engine rules applied).

    Raises ``PrimError`` for an unknown primitive, a wrong number of inputs or outputs, an
    input that is not a tile where the role needs one, an unknown attribute, a missing
    required one or a value of the wrong type, and ``EngineChoiceError`` for an engine the
    primitive does not run on."""
    p = PRIMS.get(name) or prim(name)
    # an unrolled kernel emits the same few kinds of op again and again: the checks read only
    # the operand types and the attribute names and types, and the complete attributes
    # depend on the given values only.  Both are remembered under one key when every value
    # is a plain scalar, keyed with its type (1, 1.0 and True stay apart; floats by repr, so
    # 0.0 and -0.0 do too); other values (dtypes, whose equality ignores metadata; tuples;
    # arrays) are completed each time.
    vkey: tuple | None = (name, *map(type, outs), None, *map(type, ins))
    for k, v in attrs.items():
        t = type(v)
        if t is float:
            vkey += ((k, t, repr(v)),)
        elif t in _PLAIN_ATTR or isinstance(v, enum.Enum):
            vkey += ((k, t, v),)
        else:
            vkey = None
            break
    if vkey is not None:
        done = _FULL.get(vkey)
        if done is not None:
            return dict(done)
    key = (
        name,
        *[type(o) for o in outs],
        None,
        *[type(x) for x in ins],
        *[(k, type(v)) for k, v in attrs.items()],
    )
    if key not in _CHECKED:
        _check_record(p, outs, ins, attrs)
        _CHECKED.add(key)
    full = _complete(name, p, attrs)
    if vkey is not None and len(_FULL) < _FULL_MAX:
        _FULL[vkey] = dict(full)
    return full


def _complete(name: str, p: Prim, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``check_op``'s complete attributes for ``attrs`` (engine rules applied)."""
    full: dict[str, Any] = {}
    for k, value in attrs.items():
        a = p.attr_index[k]
        full[k] = (
            a.default if value is None and (a.default is None or k == p.engine_attr) else value
        )
        if a.choices and full[k] not in a.choices:
            raise PrimError(f"{name}: attribute {k}={value!r} is not one of {a.choices}")
    for a in p.attrs:
        if a.name not in full:
            full[a.name] = a.default
    if p.engine_attr is not None:
        eng = full[p.engine_attr]
        if eng not in p.engines and not (p.balance and eng == ANY_ENGINE):
            raise EngineChoiceError(name, eng, p.engines)
        if eng != ANY_ENGINE or _ruled(p, full) is not None:
            full[p.engine_attr] = resolve_engine(name, full)  # an unassigned engine stays so
    return full


# (primitive, output types, None, input types, (attribute, type) ...) that passed _check_record
_CHECKED: set[tuple] = set()
# (name, output types, None, input types, (attribute, type, value)...) -> complete
# attributes of an op that passed _check_record, for check_op
_FULL: dict[tuple, dict[str, Any]] = {}
_FULL_MAX = 1 << 16
_PLAIN_ATTR = frozenset({str, int, bool, type(None)})


def _check_record(
    p: Prim, outs: Sequence[Any], ins: Sequence[Any], attrs: Mapping[str, Any]
) -> None:
    """``check_op``'s checks of the operands and attribute types (``PrimError``)."""
    name = p.name
    lo_in = len(p.ins) if p.min_ins is None else p.min_ins
    lo_out = len(p.outs) if p.min_outs is None else p.min_outs
    if not lo_in <= len(ins) <= len(p.ins):
        raise PrimError(f"{name}: {len(ins)} inputs, the record has roles {p.ins}")
    if not lo_out <= len(outs) <= len(p.outs):
        raise PrimError(f"{name}: {len(outs)} outputs, the record has roles {p.outs}")
    for role, x in zip(p.ins, ins):
        if not isinstance(x, Access) and not (role in p.immediates and isinstance(x, _REAL)):
            raise PrimError(f"{name}: input {role} must be a tile, got {x!r}")
    for i, o in enumerate(outs):
        if not isinstance(o, Access):
            raise PrimError(f"{name}: output {p.out_role(i)} must be a tile, got {o!r}")
    for key, value in attrs.items():
        a = p.attr_index.get(key)
        if a is None:
            raise PrimError(f"{name}: unknown attribute {key!r} (schema: {list(p.attr_index)})")
        if value is None and (a.default is None or key == p.engine_attr):
            continue  # None: the default
        if not isinstance(value, a.types):
            raise PrimError(f"{name}: attribute {key}={value!r} is not of type {a.types}")
    for a in p.attrs:
        if a.name not in attrs and a.required:
            raise PrimError(f"{name}: missing attribute {a.name!r}")
