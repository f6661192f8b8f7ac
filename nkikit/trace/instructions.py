"""The emit layer: one ``emit_<prim>`` function per IR primitive, shared by both dialects.

Each dialect front end (NKI Beta 1: ``nkikit.isa``, ``nkikit.language``; NKI 0.x:
``nkikit.nki.isa``) parses its own arguments, turns them into IR accesses of matching shapes
(Beta 1 broadcasts along free dimensions, NKI 0.x re-expresses free shapes) and allocates or
receives the outputs; then it calls the emit function of the primitive, which does what is
the same in both dialects:

- normalizes operator names (``np.add``, ``nl.add``, ``"add"`` -> ``"add"``,
  ``nkikit/ir/opnames.py``) and checks the values the instruction allows;
- picks the engine (``None``: the record's default) and checks it against the primitive's
  record (``nkikit/ir/prims.py``);
- checks what is cheap to check at trace time and the same for every caller: operands span
  the same partitions (unless the record says they may differ), elementwise operands have
  the same elements per partition, and every operand sits in a memory its engine is wired to;
- builds the attribute dict with the IR's names, in the record's order, and appends the op
  (``Builder.emit``, which checks the op against its record).

Conventions shared by every function here:

- outputs come first, then inputs, positionally; attributes are keyword-only;
- a *tile* argument is an ``Access``; a *scalar operand* (the record's immediates, e.g.
  ``tensor_scalar``'s operands) is a Python number or a ``(P, 1)`` access;
- ``mask`` is an IR predicate over the op's tile axes (None: unmasked);
- ``loc`` is the user's source line: every error names it;
- errors the user can cause are ``NkiError`` with the NKI error name (``err_invalid_argument``
  for a value the instruction does not take or an engine it does not run on,
  ``err_num_partition_mismatch``, ``err_unsupported_memory``, ``err_unsupported_api``);
  elementwise inputs of different shapes (with the same counts) are a front end's bug
  (``PrimError``): matching shapes is each dialect's job.

Checks that need the whole kernel or the target (bounds, sizes, output specs, dtypes, scopes)
stay in the verifier (``nkikit/ir/verify.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import NkiError, SourceLoc
from ..ir.affine import Affine, Predicate
from ..ir.core import Access, Op, Operand
from ..ir.opnames import op_name
from ..ir.prims import (
    PRIMS,
    RNG_STATE_WORDS,
    SCALAR_OPS,
    PrimError,
    engine_choices,
    local_gather_indices,
    memories,
    resolve_engine,
)

# the engine wiring and memory names of the verifier's memory rule, so that a trace-time
# check and the verifier can never disagree about where an engine reads and writes
from ..ir.verify import _ENGINE_MEMORIES, _MEM
from . import indirection
from .builder import current, maybe_current
from .rng import rng_state

Scalar = Access | float
"""A scalar operand: an immediate or a (P, 1) tile (one value per partition)."""

FP32_MIN = -3.4028234663852886e38
"""``nl.fp32.min``: the only ``on_false`` value ``range_select`` has [ISA]."""

# Operators whose operand order does not matter: reversing their operands changes nothing.
_COMMUTATIVE = frozenset(
    """add multiply maximum minimum equal not_equal logical_and logical_or logical_xor
    bitwise_and bitwise_or bitwise_xor""".split()
)


# ---------------------------------------------------------------------------------------------
# what every emit function shares


def engine_for(prim: str, engine: str | None, loc: SourceLoc, default: str | None = None) -> str:
    """The engine that ``prim`` runs on when the user asks for ``engine`` (an engine name, or
    None for ``default``, else the record's default).  Raises ``err_invalid_argument`` at
    ``loc`` for an engine the record does not list (e.g. ``tensor_tensor`` on the ScalarE)."""
    choices = engine_choices(prim)
    if engine is None:
        return default or choices[0]
    if engine not in choices:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{prim}",
            why=f"engine={engine} is not one of its engines ({', '.join(choices)})",
        )
    return engine


def _partitions(a: Access) -> int:
    return a.shape[0] if a.shape else 1


def _free(a: Access) -> int:
    n = 1
    for s in a.shape[1:]:
        n *= s
    return n


def _same_partitions(prim: str, loc: SourceLoc, first: Access, *others: Operand | None) -> None:
    """Every tile among ``others`` spans ``first``'s partitions (``err_num_partition_mismatch``
    otherwise); immediates and absent (None) operands are skipped."""
    p = _partitions(first)
    for x in others:
        if isinstance(x, Access) and _partitions(x) != p:
            raise NkiError(
                "err_num_partition_mismatch",
                loc,
                op=f"nisa.{prim} ({_name(first)} and {_name(x)})",
                a=p,
                b=_partitions(x),
            )


def _name(a: Access) -> str:
    """How an error names an operand: its tensor and tile shape."""
    return f"{a.tensor.name}{list(a.shape)}"


def _elementwise(
    prim: str, loc: SourceLoc, outs: Sequence[Access], first: Access, *ins: Operand | None
) -> None:
    """``outs`` and the tile inputs ``ins`` are combined element by element with ``first``:
    the same partitions (``err_num_partition_mismatch``) and elements per partition
    (``err_invalid_argument``) as ``first``; the inputs also in ``first``'s shape (a front
    end's job: ``PrimError``).  Outputs may have another free shape of the same size."""
    shape = first.shape
    for x in outs:
        if not isinstance(x, Access) or x.shape != shape:
            break
    else:
        for x in ins:
            if isinstance(x, Access) and x.shape != shape:
                break
        else:
            return  # every tile in ``first``'s shape: nothing can differ
    tiles = [x for x in ins if isinstance(x, Access)]
    _same_partitions(prim, loc, first, *outs, *tiles)
    f = _free(first)
    for x in (*outs, *tiles):
        if _free(x) != f:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{prim}",
                why=f"operands have {f} and {_free(x)} elements per partition "
                f"({_name(first)} and {_name(x)}); they must match",
            )
    for x in tiles:
        if x.shape != first.shape:
            raise PrimError(
                f"{prim}: elementwise inputs {first!r} and {x!r} have different shapes; the "
                "front end must re-express them in one shape"
            )


def _check_memories(
    prim: str, engine: str | None, outs: Sequence[Access], ins: Sequence[Operand], loc: SourceLoc
) -> None:
    """Every tile operand sits in a memory ``engine`` reads (inputs) or writes (outputs), as
    the verifier's memory rule has it (a record's per-role override first).  Raises
    ``err_unsupported_memory`` naming the operand's role."""
    if engine is None:
        return
    key = (
        prim,
        engine,
        *[a.tensor.buffer for a in outs],
        None,
        *[a.tensor.buffer if isinstance(a, Access) else None for a in ins],
    )
    if key in _MEMORIES_OK:  # the answer depends on nothing else
        return
    p = PRIMS[prim]
    reads, writes = _ENGINE_MEMORIES[engine]
    override = memories(prim)
    roles = [(p.out_role(i), a, writes) for i, a in enumerate(outs)]
    roles += [(p.in_role(i), a, reads) for i, a in enumerate(ins) if isinstance(a, Access)]
    for role, a, wired in roles:
        allowed = override.get(role) or wired
        if a.tensor.buffer not in allowed:
            names = " or ".join(dict.fromkeys(_MEM[b] for b in allowed))
            if engine == "dma" and a.tensor.buffer == "psum":
                names += " (copy PSUM to SBUF with nisa.tensor_copy first)"
            raise NkiError(
                "err_unsupported_memory",
                loc,
                op=f"nisa.{prim}",
                what=f"{role} {a.tensor.name!r}",
                allowed=names,
                got=_MEM.get(a.tensor.buffer, a.tensor.buffer),
            )
    _MEMORIES_OK.add(key)


# (prim, engine, memories of the outputs, None, memories of the inputs) that _check_memories
# found legal
_MEMORIES_OK: set[tuple] = set()


def _emit(
    prim: str,
    outs: list[Access],
    ins: list[Operand],
    attrs: dict,
    mask: Predicate | None,
    loc: SourceLoc,
) -> Op:
    """Check memories for the engine the op will run on, then append it."""
    if indirection.pending:  # an NKI 0.x tensor-indirect view: its engine's snake order
        outs, ins, attrs, mask = indirection.resolve(prim, outs, ins, attrs, mask, loc)
    sig = _signature(prim, outs, ins, attrs)
    if sig is not None:
        full = _SIGNED.get(sig)
        if full is not None:  # checked before: the same record checks, engine and memories
            b = maybe_current() or current(f"nisa.{prim}")
            return b.append(prim, outs, ins, dict(full), mask, loc)
    _check_memories(prim, resolve_engine(prim, attrs), outs, ins, loc)
    b = maybe_current() or current(f"nisa.{prim}")
    op = b.emit(prim, outs, ins, attrs, mask=mask, loc=loc)
    if sig is not None and len(_SIGNED) < _SIGNED_MAX:
        _SIGNED[sig] = dict(op.attrs)
    return op


def _signature(prim: str, outs: list[Access], ins: list[Operand], attrs: dict) -> tuple | None:
    """What the checks of :func:`_emit` read, as a key: the primitive, the attributes (names,
    values and their types), the memory of each output and tile input and the type of each
    other input.  None when an attribute is not a plain str / int / bool / None (a float is
    keyed by its value, so 0.0 and -0.0 would meet; a dtype's equality ignores metadata):
    such ops are checked each time (``check_op`` keeps its own cache)."""
    vals = tuple(attrs.values())
    types = tuple(map(type, vals))
    if not _PLAIN.issuperset(types):
        return None
    key = [prim, tuple(attrs), vals, types]
    for o in outs:
        key.append(o.tensor.buffer if type(o) is Access else type(o))
    key.append(None)
    for x in ins:
        key.append(x.tensor.buffer if type(x) is Access else type(x))
    return tuple(key)


# an unrolled kernel emits the same few kinds of op again and again: the complete attributes
# of each signature (:func:`_signature`) that passed every check
_SIGNED: dict[tuple, dict] = {}
_SIGNED_MAX = 1 << 16
_PLAIN = frozenset({str, int, bool, type(None)})


_COMPARISONS = frozenset(("equal", "not_equal", "greater", "greater_equal", "less", "less_equal"))


def _whole_number(label: str, v, op: str, loc: SourceLoc) -> int:
    """An integer option given at trace time (an integral float reads as its integer)."""
    if isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_):
        return int(v)
    if isinstance(v, float | np.floating) and np.isfinite(v) and float(v).is_integer():
        return int(v)
    raise _invalid(op, loc, f"{label} must be an integer, got {v!r}"[:200])


def _real(label: str, v, op: str, loc: SourceLoc) -> float:
    """A number given at trace time (an immediate, a fill value) as a Python float."""
    if isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool):
        return float(v)
    raise _invalid(op, loc, f"{label} must be a number, got {v!r}"[:200])


def flag(
    value, label: str, prim: str, loc: SourceLoc, *, none: bool = False, api: str | None = None
):
    """A yes/no option by its truth value, as NKI reads it (True, False, 0, 1, numpy bools;
    ``accumulate=(i > 0)``), or None when ``none``; an array, a tensor or a sequence has no
    one truth value: ``err_invalid_argument`` naming ``nisa.<prim>`` (or ``api``: a
    language function's option), not numpy's ValueError from inside nkikit."""
    if type(value) is bool:
        return value
    if value is None and none:
        return None
    if isinstance(value, int | float | np.bool_ | np.number):  # numpy scalars, not arrays
        return bool(value)
    allowed = "True, False or None" if none else "True or False"
    why = f"{label} must be {allowed}, got {type(value).__name__}"
    if api is not None:
        raise NkiError("err_invalid_argument", loc, op=api, why=why)
    raise _invalid(prim, loc, why)


def _invalid(prim: str, loc: SourceLoc, why: str) -> NkiError:
    return NkiError("err_invalid_argument", loc, op=f"nisa.{prim}", why=why)


def max_reduce_op(prim: str, reduce_op: object, loc: SourceLoc) -> str:
    """The reduction of ``range_select`` / ``select_reduce``: the ISA has only max."""
    if reduce_op is None:
        return "max"
    name = op_name(reduce_op, "reduce")
    if name != "max":
        raise _invalid(
            prim, loc, f"reduce_op must be np.max (the only one it has), got {reduce_op!r}"
        )
    return name


def _reduce_into(
    prim: str, reduce_res: Access | None, reduce_op: object, loc: SourceLoc
) -> str | None:
    """The reduction an instruction writes into ``reduce_res``: both given, or neither."""
    if reduce_op is not None and reduce_res is None:
        raise _invalid(prim, loc, "reduce_op needs reduce_res")
    if reduce_res is not None and reduce_op is None:
        raise _invalid(prim, loc, "reduce_res needs reduce_op (e.g. reduce_op=np.add)")
    return None if reduce_op is None else op_name(reduce_op, "reduce")


def _opt(x: Access | None) -> list[Access]:
    return [] if x is None else [x]


# ---------------------------------------------------------------------------------------------
# DMA


def emit_dma_copy(
    dst: Access,
    src: Access,
    *,
    rmw_op: object = None,
    transpose: bool = False,
    oob_skip: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = src`` on the DMA queues (HBM and SBUF both ways; PSUM neither way), converting
    through fp32 when the dtypes differ.  ``dst`` and ``src`` hold the same number of
    elements (their shapes may differ; the verifier checks the count).  ``rmw_op`` (np.add,
    the only one) adds into ``dst``; ``transpose`` marks a DMA transpose (``src`` is already
    the transposed view).  An indirect access on either side is a gather / scatter;
    ``oob_skip`` (``oob_mode.skip``) leaves out the elements whose runtime index falls outside
    the indexed tensor instead of failing, and needs an indirect access."""
    attrs = {
        "rmw_op": None if rmw_op is None else op_name(rmw_op),
        "transpose": flag(transpose, "transpose", "dma_copy", loc),
        "oob_skip": flag(oob_skip, "oob_skip", "dma_copy", loc),
    }
    if oob_skip:
        if dst.indirect is None and src.indirect is None:
            raise _invalid(
                "dma_copy",
                loc,
                "oob_mode.skip needs a runtime (indirect) index on src or dst: "
                "without one nothing can be out of bounds at run time",
            )
    if attrs["rmw_op"] not in (None, "add"):
        raise _invalid(
            "dma_copy",
            loc,
            f"the DMA read-modify-write operation must be np.add (the only one), got {rmw_op!r}",
        )
    return _emit("dma_copy", [dst], [src], attrs, mask, loc)


# ---------------------------------------------------------------------------------------------
# TensorE


def emit_nc_matmul(
    dst: Access,
    stationary: Access,
    moving: Access,
    *,
    accumulate: bool = False,
    perf_mode: str | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst (+)= stationary.T @ moving`` on the TensorE: ``stationary`` [K, M] and
    ``moving`` [K, N] in SBUF (K partitions, ``err_num_partition_mismatch`` otherwise) into
    ``dst`` [M, N] in PSUM, fp32 accumulation.  ``accumulate``: add to ``dst``'s value;
    ``perf_mode``: a ``matmul_perf_mode`` value (``"double_row"``) or None."""
    if _partitions(stationary) != _partitions(moving):
        raise NkiError(
            "err_num_partition_mismatch",
            loc,
            op=f"nisa.nc_matmul (the contraction dimension of stationary {_name(stationary)} "
            f"and moving {_name(moving)})",
            a=_partitions(stationary),
            b=_partitions(moving),
        )
    attrs = {
        "accumulate": flag(accumulate, "accumulate", "nc_matmul", loc),
        "perf_mode": perf_mode,
    }
    return _emit("nc_matmul", [dst], [stationary, moving], attrs, mask, loc)


def emit_nc_matmul_mx(
    dst: Access,
    stationary: Access,
    moving: Access,
    stationary_scale: Access,
    moving_scale: Access,
    *,
    accumulate: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst (+)= S.T @ M`` on the TensorE (NC-v4) with S, M the MX containers
    ``stationary`` [K, M] and ``moving`` [K, N] dequantized by their scale tiles: the
    contraction runs over the K partitions and the 4 values of each container, accumulating
    in fp32 into ``dst`` [M, N] in PSUM (``nkikit/sim/mx.py``).  Sizes, dtypes, the scale
    layout and the target are the verifier's."""
    if _partitions(stationary) != _partitions(moving):
        raise NkiError(
            "err_num_partition_mismatch",
            loc,
            op=f"nisa.nc_matmul_mx (the contraction dimension of stationary "
            f"{_name(stationary)} and moving {_name(moving)})",
            a=_partitions(stationary),
            b=_partitions(moving),
        )
    ins: list[Operand] = [stationary, moving, stationary_scale, moving_scale]
    return _emit(
        "nc_matmul_mx",
        [dst],
        ins,
        {"accumulate": flag(accumulate, "accumulate", "nc_matmul_mx", loc)},
        mask,
        loc,
    )


def emit_quantize_mx(
    dst: Access,
    dst_scale: Access,
    src: Access,
    *,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """Quantize ``src`` [P, F] (bf16/fp16) on the VectorE (NC-v4) into MX containers ``dst``
    [P, F / 4] and one scale per 8-partition x 4-value group into ``dst_scale`` (a tile of its
    own partition count, in the MX scale layout; ``nkikit/sim/mx.py``)."""
    _same_partitions("quantize_mx", loc, src, dst)
    return _emit("quantize_mx", [dst, dst_scale], [src], {}, mask, loc)


def emit_nc_transpose(
    dst: Access,
    data: Access,
    *,
    engine: str | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = data.T`` for a 2-D ``data`` [P, F] into ``dst`` [F, P]: on the TensorE (up to
    128 x 128, into PSUM) or the VectorE (up to 32 x 32).  ``engine=None`` picks by where
    ``dst`` is: the TensorE writes PSUM, so a PSUM ``dst`` means the TensorE."""
    default = "tensor" if dst.tensor.buffer == "psum" else "vector"
    attrs = {"engine": engine_for("nc_transpose", engine, loc, default)}
    return _emit("nc_transpose", [dst], [data], attrs, mask, loc)


def emit_partition_broadcast(
    dst: Access, src: Access, *, mask: Predicate | None = None, loc: SourceLoc
) -> Op:
    """``dst[p, ...] = src[0, ...]`` for every partition ``p`` of ``dst`` (``nl.broadcast_to``
    along partitions: a ones-row matmul on the TensorE).  ``src`` is one SBUF partition with
    ``dst``'s elements per partition."""
    return _emit("partition_broadcast", [dst], [src], {}, mask, loc)


# ---------------------------------------------------------------------------------------------
# ScalarE


def emit_activation(
    dst: Access,
    data: Access,
    bias: Scalar = 0.0,
    scale: Scalar = 1.0,
    *,
    op: object,
    reduce_res: Access | None = None,
    reduce_op: object = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = op(data * scale + bias)`` on the ScalarE; ``op`` an activation function
    (``np.exp``, ``nl.exp``, ``"exp"``), ``bias`` and ``scale`` scalar operands.  With
    ``reduce_op`` (and only then ``reduce_res``, a (P, 1) tile), the free-axis reduction of
    the result is written to ``reduce_res`` too."""
    fn = op_name(op, "activation")
    red = _reduce_into("activation", reduce_res, reduce_op, loc)
    _elementwise("activation", loc, [dst], data)
    _same_partitions("activation", loc, data, bias, scale, reduce_res)
    attrs = {"op": fn, "reduce_op": red}
    return _emit("activation", [dst, *_opt(reduce_res)], [data, bias, scale], attrs, mask, loc)


# the (op0, op1) stages activate2 has [nki-0x.md §4.10 activate2]
_ACTIVATE2_STAGES = frozenset(
    {
        ("multiply", "add"),
        ("multiply", "subtract"),
        ("multiply", "bypass"),
        ("add", "bypass"),
        ("subtract", "bypass"),
        ("bypass", "bypass"),
    }
)
# activate2's reductions, by the IR's reduction names [nki-0x.md §4.10 activate2]
_ACTIVATE2_REDUCE = {
    "add": "add",
    "maximum": "max",
    "minimum": "min",
    "abs_max": "abs_max",
    "abs_min": "abs_min",
}


def activate2_reduce_op(reduce_op: object, loc: SourceLoc) -> str | None:
    """The IR name of activate2's ``reduce_op`` (None: no reduction): add, maximum,
    minimum, abs_max or abs_min [nki-0x.md §4.10]."""
    if reduce_op is None:
        return None
    name = op_name(reduce_op)
    if name not in _ACTIVATE2_REDUCE:
        raise _invalid(
            "activate2",
            loc,
            f"reduce_op must be nl.add, nl.maximum, nl.minimum, nl.abs_max or nl.abs_min, "
            f"got {reduce_op!r}",
        )
    return _ACTIVATE2_REDUCE[name]


def emit_activate2(
    dst: Access,
    data: Access,
    imm0: Scalar = 0.0,
    imm1: Scalar = 0.0,
    relu_param: Scalar = 0.0,
    *,
    op: object,
    op0: object = None,
    op1: object = None,
    reverse0: bool = False,
    reverse1: bool = False,
    reduce_res: Access | None = None,
    reduce_op: str | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """NC-v4 ScalarE ``dst = op((data op0 imm0) op1 imm1, relu_param)``: a ``None`` /
    ``bypass`` stage is skipped, ``reverseN`` swaps stage N's operands; ``(op0, op1)`` one of
    the six pairs the ISA has; ``relu_param`` is prelu's slope.  With ``reduce_res`` (P, 1),
    the row reduction ``reduce_op`` (an IR name from :func:`activate2_reduce_op`) of ``dst``
    (before rounding) goes there."""
    fn = op_name(op, "activation")
    s0, s1 = op_name(op0), op_name(op1)
    if (s0, s1) not in _ACTIVATE2_STAGES:
        raise _invalid(
            "activate2",
            loc,
            f"(op0, op1) = ({s0}, {s1}) is not one of the pairs the ScalarE has: "
            + ", ".join(f"({a}, {b})" for a, b in sorted(_ACTIVATE2_STAGES)),
        )
    reverse0 = flag(reverse0, "reverse0", "activate2", loc)
    reverse1 = flag(reverse1, "reverse1", "activate2", loc)
    for reverse, stage, n in ((reverse0, s0, 0), (reverse1, s1, 1)):
        if reverse and stage == "bypass":
            raise _invalid("activate2", loc, f"reverse{n}=True needs op{n}")
    if isinstance(imm0, Access) and isinstance(imm1, Access) and imm0.dtype != imm1.dtype:
        raise _invalid(
            "activate2",
            loc,
            f"imm0 and imm1 tensors must have one dtype, got {imm0.dtype} and {imm1.dtype}",
        )
    if reduce_res is not None and reduce_op is None:
        raise _invalid("activate2", loc, "reduce_res needs reduce_op (e.g. reduce_op=nl.add)")
    attrs = {
        "op": fn,
        "op0": s0,
        "op1": s1,
        "reverse0": reverse0,
        "reverse1": reverse1,
        "reduce_op": reduce_op if reduce_res is not None else None,
    }
    _elementwise("activate2", loc, [dst], data)
    _same_partitions("activate2", loc, data, imm0, imm1, relu_param, reduce_res)
    ins = [data, imm0, imm1, relu_param]
    return _emit("activate2", [dst, *_opt(reduce_res)], ins, attrs, mask, loc)


# ---------------------------------------------------------------------------------------------
# VectorE / ScalarE / GpSimd


def emit_tensor_copy(
    dst: Access,
    src: Access,
    *,
    engine: str | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = src`` (converting dtypes) on the VectorE (default), ScalarE or GpSimd; the
    same partitions and elements per partition."""
    attrs = {"engine": engine_for("tensor_copy", engine, loc)}
    _elementwise("tensor_copy", loc, [dst], src)
    return _emit("tensor_copy", [dst], [src], attrs, mask, loc)


def emit_memset(
    dst: Access,
    *,
    value: float,
    engine: str | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """Fill ``dst`` with ``value`` on the VectorE (default) or GpSimd."""
    attrs = {"value": float(value), "engine": engine_for("memset", engine, loc)}
    return _emit("memset", [dst], [], attrs, mask, loc)


def emit_tensor_tensor(
    dst: Access,
    data1: Access,
    data2: Access,
    *,
    op: object,
    engine: str | None = None,
    accumulate: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = op(data1, data2)`` element by element (``accumulate``: ``dst = op(dst, data2)``
    with ``data1`` the destination itself, for ``+=``); ``data1`` and ``data2`` of one shape,
    ``dst`` of their partitions and elements per partition.  VectorE by default, or GpSimd;
    ``op=power`` runs on the GpSimd whatever ``engine`` says (the record's engine rule)."""
    attrs = {
        "op": op_name(op),
        "accumulate": flag(accumulate, "accumulate", "tensor_tensor", loc),
        "engine": engine_for("tensor_tensor", engine, loc),
    }
    _elementwise("tensor_tensor", loc, [dst], data1, data2)
    return _emit("tensor_tensor", [dst], [data1, data2], attrs, mask, loc)


def emit_tensor_scalar(
    dst: Access,
    data: Access,
    operand0: Scalar,
    operand1: Scalar | None = None,
    *,
    op0: object,
    reverse0: bool = False,
    op1: object = None,
    reverse1: bool = False,
    reduce_res: Access | None = None,
    reduce_op: object = None,
    engine: str | None = None,
    accumulate: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = (data op0 operand0) op1 operand1`` (``reverseN``: ``operandN opN x``); the
    operands are scalar operands; without ``op1`` only the first operation runs (``operand1``
    and ``reverse1`` need ``op1``).  With ``reduce_op`` (``nisa.tensor_scalar_reduce``) the
    free-axis reduction of the result also goes to ``reduce_res`` (P, 1), on the VectorE.
    ``accumulate``: ``data`` is ``dst`` itself (``+=``).  Engine: VectorE by default, ScalarE
    or GpSimd."""
    if op1 is None and (operand1 is not None or flag(reverse1, "reverse1", "tensor_scalar", loc)):
        raise _invalid("tensor_scalar", loc, "operand1 and reverse1 need op1")
    if op1 is not None and operand1 is None:
        raise _invalid("tensor_scalar", loc, "op1 needs operand1")
    attrs = {
        "op0": op_name(op0),
        "reverse0": flag(reverse0, "reverse0", "tensor_scalar", loc),
        "op1": None if op1 is None else op_name(op1),
        "reverse1": flag(reverse1, "reverse1", "tensor_scalar", loc),
        "reduce_op": _reduce_into("tensor_scalar", reduce_res, reduce_op, loc),
        "accumulate": flag(accumulate, "accumulate", "tensor_scalar", loc),
        "engine": engine_for("tensor_scalar", engine, loc),
    }
    _elementwise("tensor_scalar", loc, [dst], data)
    _same_partitions("tensor_scalar", loc, data, operand0, operand1, reduce_res)
    ins = [data, operand0] if operand1 is None else [data, operand0, operand1]
    return _emit("tensor_scalar", [dst, *_opt(reduce_res)], ins, attrs, mask, loc)


def emit_scalar_tensor_tensor(
    dst: Access,
    data: Access,
    operand0: Scalar,
    operand1: Access,
    *,
    op0: object,
    op1: object,
    reverse0: bool = False,
    reverse1: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = (data op0 operand0) op1 operand1`` on the VectorE: ``operand0`` a scalar
    operand, ``operand1`` a tile of ``data``'s shape."""
    attrs = {
        "op0": op_name(op0),
        "op1": op_name(op1),
        "reverse0": flag(reverse0, "reverse0", "scalar_tensor_tensor", loc),
        "reverse1": flag(reverse1, "reverse1", "scalar_tensor_tensor", loc),
    }
    _elementwise("scalar_tensor_tensor", loc, [dst], data, operand1)
    _same_partitions("scalar_tensor_tensor", loc, data, operand0)
    ins = [data, operand0, operand1]
    return _emit("scalar_tensor_tensor", [dst], ins, attrs, mask, loc)


def emit_tensor_reduce(
    dst: Access,
    data: Access,
    *,
    op: object,
    axes: tuple[int, ...],
    negate: bool = False,
    keepdims: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = op-reduce(data)`` over the free tile axes ``axes`` of ``data`` (never 0) on
    the VectorE (``negate``: the negated result); ``dst`` has ``data``'s partitions and the
    kept elements (``keepdims`` only records the front end's shape choice)."""
    attrs = {
        "op": op_name(op, "reduce"),
        "axes": tuple(int(a) for a in axes),
        "negate": flag(negate, "negate", "tensor_reduce", loc),
        "keepdims": flag(keepdims, "keepdims", "tensor_reduce", loc),
    }
    _same_partitions("tensor_reduce", loc, data, dst)
    return _emit("tensor_reduce", [dst], [data], attrs, mask, loc)


PARTITION_REDUCE_OPS = PRIMS["tensor_partition_reduce"].attr_index["op"].choices


def emit_tensor_partition_reduce(
    dst: Access, data: Access, *, op: object, mask: Predicate | None = None, loc: SourceLoc
) -> Op:
    """``dst = op-reduce(data)`` across partitions on the GpSimd: (P, F) -> (1, F); ``op``
    one of the record's (add, max, bitwise_or, bitwise_and, average)."""
    attrs = {"op": op_name(op, "reduce", valid=PARTITION_REDUCE_OPS)}
    return _emit("tensor_partition_reduce", [dst], [data], attrs, mask, loc)


def emit_tensor_tensor_scan(
    dst: Access,
    data0: Access,
    data1: Access,
    initial: Scalar,
    *,
    op0: object,
    op1: object,
    reverse0: bool = False,
    reverse1: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """Per-partition scan along the free axis on the VectorE:
    ``dst[i] = op1(op0(data0[i], dst[i-1]), data1[i])``, ``dst[-1] = initial`` (a scalar
    operand).  ``reverse0`` / ``reverse1`` swap the operands of ``op0`` / ``op1``: modeled
    for commutative operators (where they change nothing), ``err_unsupported_api`` else."""
    ops = {"op0": op_name(op0), "op1": op_name(op1)}
    reverses = (
        flag(reverse0, "reverse0", "tensor_tensor_scan", loc),
        flag(reverse1, "reverse1", "tensor_tensor_scan", loc),
    )
    for reverse, (which, name) in zip(reverses, ops.items()):
        if reverse and name not in _COMMUTATIVE:
            raise NkiError(
                "err_unsupported_api",
                loc,
                api=f"nisa.tensor_tensor_scan(reverse{which[-1]}=True)",
                why=f"swapping the operands of {which}={name} is not modeled (only of "
                "commutative operators, where it changes nothing)",
            )
    _elementwise("tensor_tensor_scan", loc, [dst], data0, data1)
    _same_partitions("tensor_tensor_scan", loc, data0, initial)
    return _emit("tensor_tensor_scan", [dst], [data0, data1, initial], ops, mask, loc)


def emit_reciprocal(
    dst: Access, data: Access, *, mask: Predicate | None = None, loc: SourceLoc
) -> Op:
    """``dst = 1 / data`` on the VectorE."""
    _elementwise("reciprocal", loc, [dst], data)
    return _emit("reciprocal", [dst], [data], {}, mask, loc)


def emit_select(
    dst: Access,
    condition: Access,
    x: Access | float,
    y: Access | float,
    *,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = x where condition != 0 else y`` on the VectorE; ``x`` and ``y`` are tiles of
    ``condition``'s shape or immediates."""
    _elementwise("select", loc, [dst], condition, x, y)
    return _emit("select", [dst], [condition, x, y], {}, mask, loc)


def emit_range_select(
    dst: Access,
    on_true_tile: Access,
    bound0: Scalar,
    bound1: Scalar,
    *,
    comp_op0: object,
    comp_op1: object,
    reduce_res: Access | None = None,
    reduce_op: object = None,
    on_false: float = FP32_MIN,
    range_start: int = 0,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = on_true_tile`` where the free index ``i`` (from ``range_start``) satisfies
    ``(i comp_op0 bound0) and (i comp_op1 bound1)``, else ``on_false`` (the ISA's only value:
    ``nl.fp32.min``); bounds are scalar operands.  With ``reduce_res``, also the row maximum
    (``reduce_op``: np.max, the only one) into it (VectorE)."""
    # compared in fp32, where the ISA holds it: -3.4028235e38 written in a kernel is the same
    on_false = _real("on_false_value", on_false, "range_select", loc)
    if np.float32(on_false) != np.float32(FP32_MIN):
        raise _invalid(
            "range_select",
            loc,
            f"on_false_value must be nl.fp32.min (a hardware constraint), got {on_false!r}",
        )
    cmps = (op_name(comp_op0), op_name(comp_op1))
    if not all(c in _COMPARISONS for c in cmps):
        raise _invalid(
            "range_select",
            loc,
            f"comp_op0 and comp_op1 must be comparisons (nl.greater_equal, nl.less, ...), "
            f"got {comp_op0!r}, {comp_op1!r}",
        )
    attrs = {
        "comp_op0": cmps[0],
        "comp_op1": cmps[1],
        "on_false": float(on_false),
        "range_start": _whole_number("range_start", range_start, "range_select", loc),
        "reduce_op": max_reduce_op("range_select", reduce_op, loc),
    }
    _elementwise("range_select", loc, [dst], on_true_tile)
    _same_partitions("range_select", loc, on_true_tile, bound0, bound1, reduce_res)
    ins = [on_true_tile, bound0, bound1]
    return _emit("range_select", [dst, *_opt(reduce_res)], ins, attrs, mask, loc)


def emit_select_reduce(
    dst: Access,
    predicate: Access,
    on_true: Access,
    on_false: Access | float,
    *,
    reduce_res: Access | None = None,
    reduce_op: object = None,
    reverse: bool = False,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = on_true where predicate != 0 else on_false`` (``reverse``: where it is 0) on
    the VectorE; ``on_true`` of ``predicate``'s shape, ``on_false`` an immediate or a tile of
    its partitions ((P, 1), or broadcast to its shape).  With ``reduce_res``, also the row
    maximum (``reduce_op``: np.max, the only one)."""
    attrs = {
        "reverse": flag(reverse, "reverse", "select_reduce", loc),
        "reduce_op": max_reduce_op("select_reduce", reduce_op, loc),
    }
    _elementwise("select_reduce", loc, [dst], predicate, on_true)
    _same_partitions("select_reduce", loc, predicate, on_false, reduce_res)
    ins = [predicate, on_true, on_false]
    return _emit("select_reduce", [dst, *_opt(reduce_res)], ins, attrs, mask, loc)


def emit_exponential(
    dst: Access,
    src: Access,
    max_value: Scalar = 0.0,
    *,
    reduce_res: Access | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """NC-v4 VectorE ``dst = exp(src - max_value)`` (``max_value`` a scalar operand); with
    ``reduce_res`` (P, 1), the row sum of the result (before rounding) goes there."""
    _elementwise("exponential", loc, [dst], src)
    _same_partitions("exponential", loc, src, max_value, reduce_res)
    return _emit("exponential", [dst, *_opt(reduce_res)], [src, max_value], {}, mask, loc)


# tensor_scalar_cumulative's running operators [nki-0x.md §4.6]
_CUMULATIVE_OP1 = frozenset({"add", "subtract", "multiply", "maximum", "minimum"})
# bit-vector operators: not arithmetic, so not an op0 of tensor_scalar_cumulative
_BITVEC = frozenset(
    "bitwise_and bitwise_or bitwise_xor left_shift right_shift arith_shift_right invert".split()
)


def emit_tensor_scalar_cumulative(
    dst: Access,
    src: Access,
    imm0: Scalar,
    init: Scalar,
    *,
    op0: object,
    op1: object,
    acc: Access | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """VectorE running scan per partition: ``reg = op1(op0(src[i], imm0), reg)``,
    ``dst[i] = reg``, ``reg`` starting at ``init`` (a scalar operand); ``acc`` (P, 1) fp32
    receives the last ``reg``.  ``op0`` arithmetic, ``op1`` one of add, subtract, multiply,
    maximum, minimum."""
    a0, a1 = op_name(op0), op_name(op1)
    if a0 in _BITVEC or a0 == "bypass":
        raise _invalid(
            "tensor_scalar_cumulative", loc, f"op0 must be an arithmetic operator, got {a0}"
        )
    if a1 not in _CUMULATIVE_OP1:
        raise _invalid(
            "tensor_scalar_cumulative",
            loc,
            f"op1 must be nl.add, nl.subtract, nl.multiply, nl.maximum or nl.minimum, got {a1}",
        )
    _elementwise("tensor_scalar_cumulative", loc, [dst], src)
    _same_partitions("tensor_scalar_cumulative", loc, src, imm0, init, acc)
    attrs = {"op0": a0, "op1": a1}
    outs = [dst, *_opt(acc)]
    return _emit("tensor_scalar_cumulative", outs, [src, imm0, init], attrs, mask, loc)


def emit_sequence_bounds(dst: Access, segment_ids: Access, *, loc: SourceLoc) -> Op:
    """GpSimd: for each element of ``segment_ids`` (1, n), the start and the end (exclusive)
    of its segment into ``dst`` (1, 2, n): starts first; padding (id 0) gets (n, -1)."""
    _same_partitions("sequence_bounds", loc, segment_ids, dst)
    return _emit("sequence_bounds", [dst], [segment_ids], {}, None, loc)


def emit_topk(val_dst: Access, idx_dst: Access, src: Access, *, n: int, loc: SourceLoc) -> Op:
    """GpSimd top-K: K = ``val_dst``'s elements per partition; each 16-partition group of
    ``src`` holds ``n`` elements "snake"-wise (element e at partition e % 16, column
    e // 16); every partition of the group gets the group's K largest values in ascending
    order (``val_dst``, bf16) and their element numbers (``idx_dst``, uint32)."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise _invalid("topk", loc, f"n must be an int, got {n!r}")
    k = _free(val_dst)
    if _free(idx_dst) != k:
        raise _invalid(
            "topk",
            loc,
            f"idx_dst {_name(idx_dst)} must hold as many elements per partition as val_dst "
            f"{_name(val_dst)} ({k})",
        )
    _same_partitions("topk", loc, src, val_dst, idx_dst)
    return _emit("topk", [val_dst, idx_dst], [src], {"n": int(n), "k": k}, None, loc)


# max8 and nc_find_index8 read 8 to 16,384 elements per partition [ISA max8, nc_find_index8]
MAX8_FREE = (8, 16384)


def _per_partition(prim: str, free: tuple[int, int] | None = None) -> Callable[..., Op]:
    def emit(dst: Access, data: Access, *, mask: Predicate | None = None, loc: SourceLoc) -> Op:
        _same_partitions(prim, loc, data, dst)
        if free is not None and not free[0] <= _free(data) <= free[1]:
            raise _invalid(
                prim,
                loc,
                f"data has {_free(data)} elements per partition, {free[0]} to {free[1]} allowed",
            )
        return _emit(prim, [dst], [data], {}, mask, loc)

    emit.__name__ = emit.__qualname__ = f"emit_{prim}"
    return emit


emit_bn_stats = _per_partition("bn_stats")
emit_bn_stats.__doc__ = """``dst`` (P, 6) fp32 = per-partition statistics of ``data`` (count,
mean, count * variance of the even elements, then of the odd ones) on the VectorE."""
emit_bn_aggr = _per_partition("bn_aggr")
emit_bn_aggr.__doc__ = """``dst`` (P, 2) = (mean, variance) per partition, aggregated from the
``bn_stats`` groups in ``data``, on the VectorE."""
emit_max8 = _per_partition("max8", MAX8_FREE)
emit_max8.__doc__ = """``dst`` (P, 8) = the 8 largest values of each partition of ``data``,
descending, on the VectorE."""


def emit_dropout(
    dst: Access,
    data: Access,
    prob: Scalar,
    *,
    mask: Predicate | None = None,
    loc: SourceLoc,
    key: tuple = (),
) -> Op:
    """``dst = data`` with each element zeroed with probability ``prob`` (a scalar operand),
    on the VectorE: an element is dropped when the Vector PRNG's next uniform draw is below
    ``prob`` (the state ``rng`` and ``rand2`` use; ``key``: see :func:`rng_state`)."""
    _elementwise("dropout", loc, [dst], data)
    _same_partitions("dropout", loc, data, prob)
    state = rng_state("vector", _partitions(data), loc, key)
    return _emit("dropout", [dst, state], [data, prob, state], {}, mask, loc)


# -- random numbers [nki-0x.md §4.12]: every instruction reads and writes its engine's PRNG
# state tensor (``trace/rng.py``); ``key`` names the program of an LNC launch traced in lockstep


def emit_rng(dst: Access, *, engine: str | None = None, loc: SourceLoc, key: tuple = ()) -> Op:
    """``dst`` = 32 random bits per element, truncated to its integer dtype, from the
    ``engine``'s generator (VectorE by default, or GpSimd)."""
    eng = engine_for("rng", engine, loc)
    state = rng_state(eng, _partitions(dst), loc, key)
    return _emit("rng", [dst, state], [state], {"engine": eng}, None, loc)


def emit_rand2(dst: Access, lo: Scalar, hi: Scalar, *, loc: SourceLoc, key: tuple = ()) -> Op:
    """``dst`` uniform in ``[lo, hi]`` (fp32 immediates, or (P, 1) fp32 tiles), from the
    VectorE's generator.  Immediates must satisfy ``lo < hi`` (``err_invalid_argument``)."""
    for label, v in (("min", lo), ("max", hi)):
        if not isinstance(v, Access):
            _real(label, v, "rand2", loc)
    if not isinstance(lo, Access) and not isinstance(hi, Access) and not float(lo) < float(hi):
        raise _invalid("rand2", loc, f"min must be less than max, got min={lo} max={hi}")
    _same_partitions("rand2", loc, dst, lo, hi)
    state = rng_state("vector", _partitions(dst), loc, key)
    return _emit("rand2", [dst, state], [state, lo, hi], {}, None, loc)


def emit_set_rng_seed(src: Access, *, loc: SourceLoc, key: tuple = ()) -> Op:
    """Seed every lane of the VectorE's generator from the 32-bit value of the one-element
    SBUF/PSUM tile ``src``."""
    if _partitions(src) * _free(src) != 1 or src.dtype.itemsize != 4:
        raise _invalid(
            "set_rng_seed",
            loc,
            f"src_seeds {_name(src)} must be one 32-bit element ([1, 1]), got {src.dtype}",
        )
    state = rng_state("vector", 128, loc, key)  # every lane
    return _emit(
        "set_rng_seed", [state], [src], {"call_seed": False, "engine": "vector"}, None, loc
    )


def emit_rand_set_state(
    src: Access, *, engine: str | None = None, loc: SourceLoc, key: tuple = ()
) -> Op:
    """The first P lanes of the ``engine``'s generator (GpSimd by default) take the state
    words in ``src`` (P, RNG_STATE_WORDS[engine]) uint32."""
    eng = engine_for("rand_set_state", engine, loc)
    _state_words("rand_set_state", "src_seeds", src, eng, loc)
    state = rng_state(eng, _partitions(src), loc, key)
    return _emit("rand_set_state", [state], [src], {"engine": eng}, None, loc)


def emit_rand_get_state(
    dst: Access, *, engine: str | None = None, loc: SourceLoc, key: tuple = ()
) -> Op:
    """``dst`` (P, RNG_STATE_WORDS[engine]) uint32 = the state of the first P lanes of the
    ``engine``'s generator (GpSimd by default)."""
    eng = engine_for("rand_get_state", engine, loc)
    _state_words("rand_get_state", "dst", dst, eng, loc)
    state = rng_state(eng, _partitions(dst), loc, key)
    return _emit("rand_get_state", [dst], [state], {"engine": eng}, None, loc)


def _state_words(prim: str, role: str, a: Access, engine: str, loc: SourceLoc) -> None:
    """A state tile holds the engine's words per lane, for at most 128 lanes."""
    words = RNG_STATE_WORDS[engine]
    if _free(a) != words or _partitions(a) > 128:
        raise _invalid(
            prim,
            loc,
            f"{role} {_name(a)} must hold {words} uint32 words per partition (the {engine} "
            f"PRNG state: {words // 6} XORWOW state(s) of 6 words) on at most 128 partitions",
        )


def emit_scalar_arith(
    dst: Access, x: Access | int, y: Access | int, *, op: str, loc: SourceLoc
) -> Op:
    """``dst = x op y`` on one-element int32 tiles or ints: ``add`` / ``subtract`` /
    ``multiply`` wrap around at 32 bits, comparisons give 0 or 1 (NKI 0.7 ``NkiScalar``)."""
    if op not in SCALAR_OPS:
        raise _invalid("scalar_arith", loc, f"op={op} is not one of {sorted(SCALAR_OPS)}")
    return _emit("scalar_arith", [dst], [x, y], {"op": op}, None, loc)


def emit_nc_find_index8(
    dst: Access, data: Access, vals: Access, *, mask: Predicate | None = None, loc: SourceLoc
) -> Op:
    """``dst`` (P, 8) uint16/uint32 = per partition, the index in ``data`` of the first
    occurrence of each of the 8 values of ``vals`` (P, 8) (a repeated value: the next
    occurrence), on the VectorE."""
    _same_partitions("nc_find_index8", loc, data, vals, dst)
    lo, hi = MAX8_FREE
    if _free(vals) != 8 or not lo <= _free(data) <= hi:
        raise _invalid(
            "nc_find_index8",
            loc,
            f"vals must hold 8 values per partition (got {_free(vals)}) and data {lo} to {hi} "
            f"(got {_free(data)})",
        )
    return _emit("nc_find_index8", [dst], [data, vals], {}, mask, loc)


def emit_nc_match_replace8(
    dst: Access,
    data: Access,
    vals: Access,
    dst_idx: Access | None = None,
    *,
    imm: float,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = data`` with the first occurrence of each of the 8 values of ``vals`` in every
    partition replaced by ``imm``; their indices into ``dst_idx`` (P, 8) when given (VectorE)."""
    _elementwise("nc_match_replace8", loc, [dst], data)
    _same_partitions("nc_match_replace8", loc, data, vals, dst_idx)
    if _free(vals) != 8:
        raise _invalid(
            "nc_match_replace8", loc, f"vals must hold 8 values per partition, got {_free(vals)}"
        )
    outs = [dst, *_opt(dst_idx)]
    try:
        imm = float(imm)
    except (TypeError, ValueError):
        raise _invalid("nc_match_replace8", loc, f"imm must be a number, got {imm!r}") from None
    return _emit("nc_match_replace8", outs, [data, vals], {"imm": imm}, mask, loc)


def emit_nc_stream_shuffle(
    dst: Access,
    src: Access,
    *,
    shuffle_mask: Sequence[int],
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """Within each 32-partition quadrant, ``dst`` partition ``i`` takes ``src`` partition
    ``shuffle_mask[i]`` (255 keeps ``dst``'s), on the VectorE; the same elements per
    partition (partition counts may differ)."""
    try:
        sm = tuple(int(x) for x in shuffle_mask)
    except (TypeError, ValueError):
        raise _invalid(
            "nc_stream_shuffle", loc, f"shuffle_mask must be a list of ints, got {shuffle_mask!r}"
        ) from None
    src_p, dst_p = src.shape[0], dst.shape[0]
    # entry i is read by dst partitions i, i + 32, ...: the last of them reads the highest
    # src partition, base + m, base the start of its quadrant
    bad = [
        m
        for i, m in enumerate(sm)
        if m != 255
        and not (0 <= m < 32 and (i >= dst_p or ((dst_p - 1 - i) // 32) * 32 + m < src_p))
    ]
    if len(sm) > 32 or bad:
        raise _invalid(
            "nc_stream_shuffle",
            loc,
            f"shuffle_mask has at most 32 entries, each a partition of src's quadrant "
            f"(0..{min(src_p, 32) - 1}) or 255; got {shuffle_mask!r}",
        )
    return _emit("nc_stream_shuffle", [dst], [src], {"shuffle_mask": sm}, mask, loc)


# ---------------------------------------------------------------------------------------------
# GpSimd


def emit_iota(dst: Access, *, expr: Affine, mask: Predicate | None = None, loc: SourceLoc) -> Op:
    """``dst[i] = expr(i)``: the value of an affine expression of ``dst``'s tile axes (and
    loop variables), on the GpSimd (SBUF)."""
    return _emit("iota", [dst], [], {"expr": expr}, mask, loc)


def emit_affine_select(
    dst: Access,
    on_true_tile: Access,
    *,
    pred: Predicate,
    on_false: float,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """``dst = on_true_tile`` where the affine predicate ``pred`` of the tile axes holds, else
    ``on_false``, on the GpSimd (SBUF only)."""
    _elementwise("affine_select", loc, [dst], on_true_tile)
    attrs = {"pred": pred, "on_false": _real("on_false_value", on_false, "affine_select", loc)}
    return _emit("affine_select", [dst], [on_true_tile], attrs, mask, loc)


def emit_local_gather(
    dst: Access,
    src_buffer: Access,
    index: Access,
    *,
    num_elem_per_idx: int = 1,
    num_valid_indices: int | None = None,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """GpSimd gather: each core (16 partitions) uses the first ``num_valid_indices`` of its
    partitions' uint16 ``index`` values, read column by column (default: all of them), and
    every partition of the core takes ``num_elem_per_idx`` elements of its own ``src_buffer``
    row at each of those element offsets: ``dst`` is (P, num_valid_indices *
    num_elem_per_idx)."""
    try:
        attrs = {
            "num_elem_per_idx": int(num_elem_per_idx),
            "num_valid_indices": None if num_valid_indices is None else int(num_valid_indices),
        }
    except (TypeError, ValueError):
        raise _invalid(
            "local_gather",
            loc,
            f"num_elem_per_idx and num_valid_indices are ints, got {num_elem_per_idx!r}, "
            f"{num_valid_indices!r}",
        ) from None
    if attrs["num_elem_per_idx"] < 1:
        raise _invalid(
            "local_gather", loc, f"num_elem_per_idx must be >= 1, got {num_elem_per_idx}"
        )
    _same_partitions("local_gather", loc, src_buffer, index, dst)
    most = local_gather_indices(index.shape, None)
    if num_valid_indices is not None and not 0 < int(num_valid_indices) <= most:
        raise _invalid(
            "local_gather",
            loc,
            f"num_valid_indices must be between 1 and the {most} indices a core holds "
            f"(index {index.shape}), got {num_valid_indices}",
        )
    return _emit("local_gather", [dst], [src_buffer, index], attrs, mask, loc)


def emit_nc_n_gather(
    dst: Access,
    data: Access,
    indices: Access,
    *,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """GpSimd gather within each partition: ``dst[p, j] = flat(data[p])[indices[p, j]]``
    (``data``'s free dims flattened; integer ``indices``, checked against the partition's
    element count when the kernel runs); ``dst`` has ``data``'s dtype."""
    if not np.issubdtype(indices.tensor.dtype, np.integer):
        raise _invalid(
            "nc_n_gather", loc, f"indices must be integers (uint32), got {indices.tensor.dtype}"
        )
    _same_partitions("nc_n_gather", loc, data, indices, dst)
    return _emit("nc_n_gather", [dst], [data, indices], {}, mask, loc)


def emit_nonzero_with_count(
    dst: Access,
    src: Access,
    *,
    index_offset: int = 0,
    padding_val: int = -1,
    mask: Predicate | None = None,
    loc: SourceLoc,
) -> Op:
    """GpSimd: on the first partition of each core (tile partitions 0, 16, ..., 112) ``dst``
    gets the positions (plus ``index_offset``) of ``src``'s non-zero elements in that
    partition's free elements, in order, then ``padding_val``, and as its last element the
    count; the other partitions of ``dst`` keep their values.  ``dst`` is int32 with one more
    element per partition than ``src`` [nki-0x.md §4.8]."""
    for name, v in (("index_offset", index_offset), ("padding_val", padding_val)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise _invalid("nonzero_with_count", loc, f"{name} must be an int, got {v!r}")
    _same_partitions("nonzero_with_count", loc, src, dst)
    attrs = {"index_offset": int(index_offset), "padding_val": int(padding_val)}
    return _emit("nonzero_with_count", [dst], [src], attrs, mask, loc)


# ---------------------------------------------------------------------------------------------
# simulation only


def emit_register_move(dst: Access, src: Access | int, *, loc: SourceLoc) -> Op:
    """``dst = src`` for one 32-bit value: ``src`` an immediate int, a register or a
    one-element HBM/SBUF tile, ``dst`` a register or a one-element tile (a register is a
    one-element int32 SBUF tile in the IR); converted to ``dst``'s dtype."""
    for role, a in (("dst", dst), ("src", src)):
        if isinstance(a, Access) and (_partitions(a) * _free(a) != 1 or a.dtype.itemsize > 4):
            raise _invalid(
                "register_move",
                loc,
                f"{role} {_name(a)} must be one element of at most 32 bits, got "
                f"{list(a.shape)} {a.dtype}",
            )
    return _emit("register_move", [dst], [src], {}, None, loc)


def emit_rank_id(dst: Access, *, loc: SourceLoc) -> Op:
    """``dst`` (a register) = the id of the rank that runs the kernel."""
    return _emit("rank_id", [dst], [], {}, None, loc)


def _collective(
    prim: str, dst: Access, src: Access, attrs: dict, loc: SourceLoc, *, dim: int | None = None
) -> Op:
    """A collective between the ranks of each group: the tiles are both in HBM or both in
    SBUF, of one dtype; along ``dim`` (a tile dimension) the destination is the source's
    extent times (all_gather) or divided by (reduce_scatter) the group size."""
    on_chip = {a.tensor.buffer in ("sbuf", "psum") for a in (dst, src)}
    if len(on_chip) != 1 or "psum" in (dst.tensor.buffer, src.tensor.buffer):
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=f"ncc.{prim}",
            what=f"src {_name(src)} and dst {_name(dst)}",
            allowed="both HBM or both SBUF",
            got=f"{_MEM.get(src.tensor.buffer)} and {_MEM.get(dst.tensor.buffer)}",
        )
    if dst.dtype != src.dtype:
        raise _invalid(
            prim, loc, f"src and dst must have one dtype, got {src.dtype} and {dst.dtype}"
        )
    if dim is not None and not 0 <= dim < len(src.shape):
        raise _invalid(prim, loc, f"collective_dim={dim} is not a dimension of {list(src.shape)}")
    return _emit(prim, [dst], [src], attrs, None, loc)


def emit_all_reduce(dst: Access, src: Access, *, groups: tuple, op: object, loc: SourceLoc) -> Op:
    """``dst`` = ``op`` (add, maximum or minimum) over the ``src`` of every rank of the
    group, computed in fp32."""
    name = op_name(op)
    if name not in ("add", "maximum", "minimum"):
        raise _invalid(
            "all_reduce", loc, f"op must be nl.add, nl.maximum or nl.minimum, got {op!r}"
        )
    return _collective("all_reduce", dst, src, {"groups": groups, "op": name}, loc)


def emit_all_gather(dst: Access, src: Access, *, groups: tuple, dim: int, loc: SourceLoc) -> Op:
    """``dst`` = the ``src`` of every rank of the group, concatenated in group order along
    tile dimension ``dim``."""
    return _collective("all_gather", dst, src, {"groups": groups, "dim": dim}, loc, dim=dim)


def emit_reduce_scatter(
    dst: Access, src: Access, *, groups: tuple, dim: int, op: object, loc: SourceLoc
) -> Op:
    """The group's ``op``-reduction of ``src`` (fp32), split along tile dimension ``dim`` into
    one chunk per rank: the ``k``-th rank of the group receives chunk ``k``."""
    name = op_name(op)
    if name not in ("add", "maximum", "minimum"):
        raise _invalid(
            "reduce_scatter", loc, f"op must be nl.add, nl.maximum or nl.minimum, got {op!r}"
        )
    attrs = {"groups": groups, "dim": dim, "op": name}
    return _collective("reduce_scatter", dst, src, attrs, loc, dim=dim)


def emit_all_to_all(dst: Access, src: Access, *, groups: tuple, dim: int, loc: SourceLoc) -> Op:
    """``src`` split along tile dimension ``dim`` into one chunk per rank of the group: chunk
    ``j`` goes to rank ``j``, whose ``dst`` holds the chunks it receives in group order."""
    return _collective("all_to_all", dst, src, {"groups": groups, "dim": dim}, loc, dim=dim)


def emit_collective_permute(dst: Access, src: Access, *, pairs: tuple, loc: SourceLoc) -> Op:
    """For each ``(source, target)`` rank pair, the target's ``dst`` = the source's ``src``;
    a rank no pair targets keeps its ``dst``."""
    return _collective("collective_permute", dst, src, {"pairs": pairs}, loc)


def _collective_v_emitter(prim: str, doc: str) -> Callable[..., Op]:
    def emit(
        dst: Access,
        src: Access,
        metadata: Access,
        *,
        groups: tuple,
        recv_counts_known: bool = False,
        has_rdispls: bool = False,
        loc: SourceLoc,
    ) -> Op:
        return _collective_v(prim, dst, src, metadata, groups, recv_counts_known, has_rdispls, loc)

    emit.__name__ = emit.__qualname__ = f"emit_{prim}"
    emit.__doc__ = doc
    return emit


emit_all_gather_v = _collective_v_emitter(
    "all_gather_v",
    """Variable-length all-gather of flat HBM buffers: every rank sends the chunk of ``src``
    that column 0 of ``metadata`` rows 0 / 1 (count, displacement) names; the chunk of the
    group's j-th rank lands in slot j of ``dst`` (or at its receive displacement, row 3).""",
)
emit_all_to_all_v = _collective_v_emitter(
    "all_to_all_v",
    """Variable-length all-to-all of flat HBM buffers: the group's j-th rank receives from
    every rank the chunk its ``metadata`` rows 0 / 1 column j (count, displacement) name,
    placed at this rank's receive displacements (row 3).""",
)


def _collective_v(
    prim: str,
    dst: Access,
    src: Access,
    metadata: Access,
    groups: tuple,
    recv_counts_known: bool,
    has_rdispls: bool,
    loc: SourceLoc,
) -> Op:
    for role, a in (("src", src), ("dst", dst)):
        if not a.tensor.is_hbm:
            raise NkiError(
                "err_unsupported_memory",
                loc,
                op=f"ncc.{prim}",
                what=f"{role} {_name(a)}",
                allowed="HBM",
                got=_MEM.get(a.tensor.buffer),
            )
    if dst.dtype != src.dtype:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{prim}",
            why=f"src and dst must have one dtype, got {src.dtype} and {dst.dtype}",
        )
    rows = 4 if has_rdispls else 3 if recv_counts_known else 2
    m = metadata
    if len(m.shape) != 2 or m.shape[0] < rows or m.shape[1] < len(groups[0]):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"ncc.{prim}",
            why=f"metadata {_name(m)} must be ({rows}.., >= {len(groups[0])}): rows send counts, "
            "send displacements[, recv counts[, recv displacements]], a column per rank of "
            "the group",
        )
    attrs = {
        "groups": groups,
        "recv_counts_known": bool(recv_counts_known),
        "has_rdispls": bool(has_rdispls),
    }
    return _emit(prim, [dst], [src, metadata], attrs, None, loc)


def emit_ring_rank_id(dst: Access, *, groups: tuple, iteration: int, loc: SourceLoc) -> Op:
    """``dst`` = the rank whose data ring step ``iteration`` holds: this rank at 0, then the
    predecessors in its replica group's ring (the group's rank order)."""
    return _emit(
        "ring_rank_id", [dst], [], {"groups": groups, "iteration": int(iteration)}, None, loc
    )


def emit_device_print(x: Access, *, prefix: str, loc: SourceLoc) -> Op:
    """Print ``x`` (after ``prefix``) when the kernel is simulated; no engine runs it."""
    return _emit("device_print", [], [x], {"prefix": str(prefix)}, None, loc)


EMITTERS: dict[str, Callable[..., Op]] = {
    name.removeprefix("emit_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("emit_")
}
"""The emit function of every primitive, by primitive name."""
