"""The verifier: architecture rules the Neuron compiler and hardware enforce.

``verify(kernel)`` walks a traced kernel once and raises ``NkiError`` for the first rule it
breaks, with the NKI error name and the kernel's own source line.  Rules are data:

- ``OP_RULES``: functions ``rule(site)`` run on every op, in order, where a ``Site`` is the op
  with its enclosing loops and the value range of every symbol its indices may use (among
  them ``rule_indirect``: where an index tile may index, and what it must be);
- ``PRIM_RULES``: per-primitive constraints (matmul limits, activation bias/scale, ...), run
  for an op before the generic shape rules so the most specific message wins;
- ``rule_spec``: every output access holds what its primitive produces (partitions and
  elements per partition, dtype) by the primitive's record (``nkikit/ir/prims.py``), which
  also gives each operand's role name, the engine (hence the memories it may touch, by
  ``_ENGINE_MEMORIES``) and the flags the other rules ask about;
- ``TENSOR_RULES``: per on-chip tensor (partition limit, PSUM bank size), run when the walk
  first meets the tensor, after the rules of that op (so ``nc_matmul`` with 256 stationary
  columns reports the matmul limit, not the 256-partition result);
- ``OP_SHAPE_RULES``: generic tile rules (partitions, access pattern, bounds, writes);
- ``KERNEL_RULES``: whole-kernel rules run after the walk (outputs written, SBUF/PSUM
  capacity).

Every check is symbolic: index ranges are bounded like ``Affine.bounds`` does, over loop trip
counts, SPMD grid sizes and tile axis sizes, never by enumerating elements, so verifying a
kernel costs time proportional to its IR, not to its data (well under a millisecond per op).
The one index no rule can bound is a runtime index (indirect DMA): the simulator checks it
when it runs, as the hardware does.

An unrolled kernel (NKI 0.x traces every loop) repeats a few kinds of op thousands of times,
differing only in the constants of their indices.  The walk remembers the *signature* of
every op that passed (its primitive, attributes, mask, enclosing loops, and per operand the
tensor facts, tile shape and index terms the rules read): an op with a signature seen before
is checked for bounds only, the one rule that reads index constants.  Signatures are tuples
of small ints (per tensor, per access class: ``_Walk``), and the same walk records the flat
scan the capacity rules read (``ir/residency.Scan``), so a kernel is walked once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import count
from math import prod
from operator import attrgetter

import numpy as np

from .. import dtypes
from ..collector import gc_paused
from ..errors import UNKNOWN_LOC, NkiError, SourceLoc
from ..targets import TARGETS, Target, get_target
from .affine import Affine, Axis, LoopVar, Predicate, ProgramId, Sym
from .core import ON_CHIP, Access, Alloc, Kernel, Loop, Op, Tensor, declared_inputs, is_accumulator
from .prims import (
    PRIMS,
    PrimError,
    accumulates,
    engine_of,
    engines_of,
    mask_ref,
    mx_scale_rows,
)
from .residency import (
    Recorder,
    Scan,
    psum_blocks_in_use,
    psum_user_top,
    resident_overflow,
    timeline,
)

# ---------------------------------------------------------------------------------------------
# the op in context


@dataclass(slots=True)
class Site:
    """One op as the rules see it: the op, its enclosing loops (outermost first), the value
    range ``[0, n)`` of every loop variable and program id in scope, and the target."""

    op: Op
    loops: tuple[Loop, ...]
    ranges: dict[Sym, int]
    target: Target
    kernel: Kernel
    operands: list[tuple[str, Access, bool]] = field(init=False)

    def __post_init__(self) -> None:
        # (role, access, is_write) of every tile operand, computed once for all rules
        self.operands = list(_operands(self.op))

    @property
    def loc(self) -> SourceLoc:
        return self.op.loc

    def fail(self, name: str, **fields: object) -> NkiError:
        return NkiError(name, self.op.loc, **fields)


Rule = Callable[[Site], None]


def _in_name(op: Op, i: int) -> str:
    return PRIMS[op.prim].in_role(i)


_INDEX_TILE = "index tile"  # the role of the runtime index tiles an op's inputs end with


def _operands(op: Op) -> Iterable[tuple[str, Access, bool]]:
    """``(role, access, is_write)`` for every tile operand of ``op``."""
    p = PRIMS[op.prim]
    for i, a in enumerate(op.outs):
        yield p.out_role(i), a, True
    n = declared_inputs(op)
    for i, a in enumerate(op.ins):
        if isinstance(a, Access):
            yield p.in_role(i) if i < n else _INDEX_TILE, a, False


_MEM = {"sbuf": "SBUF", "psum": "PSUM", "hbm": "HBM", "shared_hbm": "HBM", "private_hbm": "HBM"}


def _mem(t: Tensor) -> str:
    return _MEM.get(t.buffer, t.buffer)


def _fsize(a: Access) -> int:
    """Elements per partition of tile ``a`` (Access.free_size without numpy's overhead)."""
    n = 1
    for x in a.shape[1:]:
        n *= x
    return n


def _bytes(t: Tensor) -> int:
    """Bytes per partition of ``t`` (Tensor.bytes_per_partition without numpy's overhead)."""
    n = t.dtype.itemsize
    for i, x in enumerate(t.shape):
        if i != t.par_axis:
            n *= x
    return n


def _tile(a: Access) -> str:
    return f"{a.tensor.name}{list(a.shape)}"


# ---------------------------------------------------------------------------------------------
# engines and legal memories (rule 3)


def _require(site: Site, role: str, a: Access, allowed: tuple[str, ...]) -> None:
    if a.tensor.buffer not in allowed:
        names = " or ".join(dict.fromkeys(_MEM[b] for b in allowed))
        raise site.fail(
            "err_unsupported_memory",
            op=site.op.prim,
            what=f"{role} {a.tensor.name!r}",
            allowed=names,
            got=_mem(a.tensor),
        )


_HBM_SBUF = ("hbm", "shared_hbm", "private_hbm", "sbuf")

# The memories each engine is wired to: (reads, writes) [ISA §4.0, nki.md §2.1].
_ENGINE_MEMORIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # DMA moves HBM<->SBUF, SBUF<->SBUF and HBM<->HBM; it cannot touch PSUM (NKI >= 0.3)
    "dma": (_HBM_SBUF, _HBM_SBUF),
    "tensor": (("sbuf",), ("psum",)),  # TensorE reads SBUF, writes PSUM
    "gpsimd": (("sbuf",), ("sbuf",)),  # GpSimd has no path to PSUM
    "vector": (ON_CHIP, ON_CHIP),
    "scalar": (ON_CHIP, ON_CHIP),
}
# roles whose memories an idiom's record overrides (partition_broadcast's PSUM evacuation)
_MEMORY_OVERRIDES = {n: dict(p.memories) for n, p in PRIMS.items() if p.memories}


def rule_memory(site: Site) -> None:
    """Each engine reads and writes only the memories wired to it.  An op the compiler may
    place on any of several engines (an unassigned copy) must be legal on every one."""
    override = _MEMORY_OVERRIDES.get(site.op.prim, {})
    for eng in engines_of(site.op):  # none for an op no engine runs (device_print)
        reads, writes = _ENGINE_MEMORIES[eng]
        for role, a, write in site.operands:
            _require(site, role, a, override.get(role) or (writes if write else reads))


# ---------------------------------------------------------------------------------------------
# indirect DMA (runtime index tiles)


def rule_indirect(site: Site) -> None:
    """An index tile (``t[idx_tile, i_f]``) may only index the HBM side of a DMA (nl.load,
    nl.store, nl.atomic_rmw, nisa.dma_copy); it is an SBUF tile of integers with one index
    per partition of the access ((P, 1)), on the dimension the partition axis walks.  An NKI
    0.x scalar offset (``.ap(scalar_offset=)``: one runtime value for the whole access) may
    shift an operand of any instruction, in HBM or along a free dimension of an SBUF/PSUM
    tensor [nki-0x.md §3.7]."""
    op = site.op
    for role, a, _ in site.operands:
        ind = a.indirect
        if ind is None or a.indirect_extent is not None:  # tensor indirection: its own rule
            continue
        scalar = site.kernel.dialect == "nki-0.x" and all(n == 1 for n in ind.shape)
        if scalar and not a.tensor.is_hbm and a.indirect_dim == 0:
            raise site.fail(
                "err_unsupported_memory",
                op=op.prim,
                what=f"a runtime offset along the partition dimension of {role} {a.tensor.name!r}",
                allowed="HBM (on SBUF/PSUM a scalar_offset moves along a free dimension)",
                got=_mem(a.tensor),
            )
        if scalar and not a.tensor.is_hbm:
            pass  # an on-chip operand of any engine, shifted along a free dimension
        elif engine_of(op) != "dma" or op.attrs.get("transpose"):
            raise site.fail(
                "err_indirect_indices_are_not_supported_with_nki_api",
                api="load_transpose2d" if op.attrs.get("transpose") else op.prim,
                operand=f"{role} {a!r}",
            )
        elif not a.tensor.is_hbm:
            raise site.fail(
                "err_unsupported_memory",
                op=op.prim,
                what=f"indirectly indexed {role} {a.tensor.name!r}",
                allowed="HBM (an indirect DMA gathers from or scatters to HBM)",
                got=_mem(a.tensor),
            )
        if ind.tensor.buffer != "sbuf":
            raise site.fail(
                "err_unsupported_memory",
                op=op.prim,
                what=f"index tile {ind.tensor.name!r} of {role} {a.tensor.name!r}",
                allowed="SBUF (load the indices with nl.load first)",
                got=_mem(ind.tensor),
            )
        if not dtypes.is_int(ind.dtype) or ind.dtype.kind == "b":
            raise site.fail(
                "err_unsupported_dtype",
                op=op.prim,
                dtype=dtypes.name(ind.dtype),
                why=f"index tile {ind.tensor.name!r} must hold integers (int32 or uint32; "
                "e.g. nl.load of an int32 tensor, or nisa.iota(..., dtype=nl.int32))",
            )
        if scalar:
            # one runtime value for the whole access (NKI 0.x .ap(scalar_offset=)): it shifts
            # the access along its dimension; no per-partition pairing to check.  (Beta 1 has
            # no such form: there an index tile gives each partition its own index.)
            continue
        # the tile axis the index tile varies along: axis 0 (its partitions), or in an NKI 0.x
        # gather-transpose the dst axis that src's gathered axis 0 became [nki-0x.md §4.3]
        row = 0
        if site.kernel.dialect == "nki-0.x" and op.prim == "dma_copy":
            row = next((k for k, n in enumerate(ind.shape) if n > 1), 0)
        free = [k for k, n in enumerate(ind.shape) if k != row and n > 1]
        if free:
            raise site.fail(
                "err_indirect_indices_free_dim",
                tensor=a.tensor.name,
                why=f"index tile {ind.tensor.name!r} varies along free tile axis {free[0]} "
                f"(extent {ind.shape[free[0]]})",
            )
        rows = a.shape[row] if len(a.shape) > row else 1
        if ind.shape[row] != rows:
            raise site.fail(
                "err_num_partition_mismatch",
                op=f"{op.prim} (index tile {ind.tensor.name!r} of {role} {a.tensor.name!r})",
                a=ind.shape[row],
                b=rows,
            )
        if rows > 1:
            walked = [
                d for d, x in enumerate(a.index) if d != a.indirect_dim and x.coef(Axis(row)) != 0
            ]
            if walked:
                raise site.fail(
                    "err_indirect_indices_free_dim",
                    tensor=a.tensor.name,
                    why=f"dimension {walked[0]} already takes the partition axis, so the "
                    f"index tile on dimension {a.indirect_dim} indexes a free dimension",
                )


# ---------------------------------------------------------------------------------------------
# tensor indirection (NKI 0.x NkiTensor.indirect, NC-v4)

_QUADRANT = 32


def _start(x: Affine) -> Affine:
    """The partition (or column) an index starts at: ``x`` at tile position 0."""
    return Affine(tuple((s, c) for s, c in x.terms if type(s) is not Axis), x.const)


def rule_tensor_indirection(site: Site) -> None:
    """NeuronCore-v4 tensor indirection [nki-0x.md §3.8]: an NC-v4 target; only the operands
    the primitive's record lists (``Prim.indirection``: roles, engines, dtypes, pairs sharing
    one index); no ScalarE scatter into PSUM; and the base-partition rules, read on the
    operands' views (nkikit places every tensor at partition 0, so a view's first partition is
    its physical one): each index starts on a quadrant boundary (a multiple of 32), an
    indirect input starts on its index's partition, and an indirect ``dst``'s index on the
    partition of the instruction's input (its index's, when that input is indirect).  (These
    read index constants, which no op signature holds: an op with a runtime index is checked
    in full every time, ``_Walk.body``.)"""
    op = site.op
    found = [(r, a, w) for r, a, w in site.operands if a.indirect_extent is not None]
    if not found:
        return
    for _, a, _ in found:
        if type(a.indirect) is not Access:
            raise PrimError(
                f"{op.prim}: an indirect view reached the IR unresolved ({a.indirect!r}); the "
                "emit layer resolves it (nkikit/trace/indirection.py)"
            )
    p = PRIMS[op.prim]
    have = site.target.nc_version
    if have < 4:
        want = next(t.name for t in TARGETS.values() if t.nc_version >= 4)
        raise site.fail(
            "err_unsupported_instruction_on_target",
            op=f"{op.prim} with an indirect view (NkiTensor.indirect)",
            versions="4",
            target=site.target.name,
            have=have,
            want=want,
        )
    spec = p.indirection
    # an input that is the destination itself (its old value, e.g. tensor_copy_predicated's
    # kept elements) is that output
    roles = {}
    for role, a, write in found:
        if not write:
            role = next((p.out_role(i) for i, o in enumerate(op.outs) if o == a), role)
        roles[role] = a
        if spec is None or role not in spec.roles:
            allowed = ", ".join(sorted(spec.roles)) if spec is not None else "none"
            raise site.fail(
                "err_indirect_operand_not_supported",
                op=op.prim,
                operand=f"{role} {a.tensor.root.name!r}",
                why=f"{op.prim} takes indirect views as {allowed}",
            )
    assert spec is not None
    engines = engines_of(op)
    for eng in engines:
        if spec.engines and eng not in spec.engines:
            raise site.fail(
                "err_indirect_operand_not_supported",
                op=f"{op.prim} on the {eng} engine",
                operand=f"{found[0][0]} {found[0][1].tensor.root.name!r}",
                why=f"{op.prim} takes indirect views on the {' and '.join(spec.engines)} "
                "engines only (pass engine=)",
            )
    for role, a in roles.items():
        name = dtypes.name(a.dtype)
        if (spec.dtypes is not None and name not in spec.dtypes) or name in spec.not_dtypes:
            allowed = (
                ", ".join(sorted(spec.dtypes))
                if spec.dtypes is not None
                else f"not {', '.join(sorted(spec.not_dtypes))}"
            )
            raise site.fail(
                "err_unsupported_dtype",
                op=op.prim,
                dtype=name,
                why=f"indirect {role} {a.tensor.root.name!r} must be {allowed}",
            )
        if "scalar" in engines and a in op.outs and a.tensor.buffer == "psum":
            raise site.fail(
                "err_unsupported_memory",
                op=f"{op.prim} on the scalar engine",
                what=f"indirect {role} {a.tensor.root.name!r} (a scatter)",
                allowed="SBUF (the ScalarE cannot scatter into PSUM"
                + ("; pass engine=nisa.engine.vector" if len(engines) > 1 else "")
                + ")",
                got="PSUM",
            )
    for x, y in spec.pairs:
        ax, ay = roles.get(x), roles.get(y)
        if (ax is None) != (ay is None) or (ax is not None and ax.indirect != ay.indirect):
            raise site.fail(
                "err_indirect_operand_not_supported",
                op=op.prim,
                operand=f"{x if ax is not None else y}",
                why=f"{x} and {y} are indirect together, through the same index and num_elem",
            )
    _quadrants(site, roles)


def _quadrants(site: Site, roles: dict[str, Access]) -> None:
    """The base-partition rules of :func:`rule_tensor_indirection`."""
    op = site.op
    p = PRIMS[op.prim]

    def bad(why: str) -> NkiError:
        return site.fail("err_invalid_argument", op=op.prim, why=why)

    for role, a in roles.items():
        ind = a.indirect
        assert ind is not None
        start = _start(ind.index[0])
        if start.const % _QUADRANT or any(c % _QUADRANT for _, c in start.terms):
            raise bad(
                f"the index of indirect {role} {a.tensor.root.name!r} starts at partition "
                f"{start!r} of {ind.tensor.root.name!r}; an index starts on a quadrant "
                "boundary (a multiple of 32)"
            )
        if a not in op.outs and _start(a.index[0]) != start:
            raise bad(
                f"indirect {role} {a.tensor.root.name!r} starts at partition "
                f"{_start(a.index[0])!r}, its index at {start!r}; they must start on the "
                "same partition"
            )
    if p.partition_free:  # a matmul's dst partitions are not its inputs'
        return
    first = next((x for x in op.ins if isinstance(x, Access)), None)
    for i, o in enumerate(op.outs):
        if o.indirect_extent is None or first is None:
            continue
        at = _start((first.indirect if first.indirect is not None else first).index[0])
        mine = _start(o.indirect.index[0])  # type: ignore[union-attr]
        if mine != at:
            raise bad(
                f"the index of indirect {p.out_role(i)} {o.tensor.root.name!r} starts at "
                f"partition {mine!r}, the input {first.tensor.root.name!r} at {at!r}; they "
                "must start on the same partition"
            )


# ---------------------------------------------------------------------------------------------
# scoping and masks (rules 4, 6)


def _affines(op: Op) -> Iterable[Affine]:
    for a in op.outs:
        yield from a.index
    for a in op.ins:
        if isinstance(a, Access):
            yield from a.index
    if op.mask is not None:
        yield from (c for c, _ in op.mask.clauses)
    for v in op.attrs.values():
        if isinstance(v, Affine):
            yield v
        elif isinstance(v, Predicate):
            yield from (c for c, _ in v.clauses)


def rule_loop_scope(site: Site) -> None:
    """An index may only use the variables of loops that enclose the op."""
    for aff in _affines(site.op):
        for s, _ in aff.terms:
            if isinstance(s, LoopVar) and s not in site.ranges:
                loop = next(
                    (x for x, _ in site.kernel.walk() if isinstance(x, Loop) and x.var is s), None
                )
                raise site.fail(
                    "err_loop_variable_used_out_of_scope",
                    op=site.op.prim,
                    var=s.name,
                    line=loop.loc.line if loop is not None else "?",
                )


def _check_predicate(site: Site, pred: Predicate, shape: tuple[int, ...], what: str) -> None:
    for aff, cmp in pred.clauses:
        if cmp == "!=" and what == "the mask":
            # a mask shrinks the instruction to a box; "not equal" is a hole, not a box
            raise site.fail(
                "err_unsupported_expression_in_mask",
                got=f"{pred!r} (a mask cannot use '!='; describe the kept region with "
                "<, <=, >, >= and &)",
            )
        for s in aff.syms:
            if isinstance(s, Axis) and s.k >= len(shape):
                raise site.fail(
                    "err_unsupported_expression_in_mask",
                    got=f"{pred!r}: {what} uses tile axis {s.k}, but the tile "
                    f"{list(shape)} has {len(shape)} axes",
                )


def rule_mask(site: Site) -> None:
    """A mask compares affine expressions of the op's own tile axes."""
    op = site.op
    if op.mask is not None:
        ref = mask_ref(op)
        _check_predicate(site, op.mask, ref.shape if ref is not None else (), "the mask")
    pred = op.attrs.get("pred")
    if isinstance(pred, Predicate) and op.outs:
        _check_predicate(site, pred, op.outs[0].shape, "the predicate")


# ---------------------------------------------------------------------------------------------
# per-primitive rules (rules 2, 9, 13, 14)


def _size_error(site: Site, what: str, size: int, limit: int) -> NkiError:
    return site.fail("err_size_of_dimension_exceed_arch_limit", what=what, size=size, limit=limit)


def prim_nc_matmul(site: Site) -> None:
    """stationary [K, M] and moving [K, N]: K equal and <= pmax, M <= 128, N <= 512;
    fp32/tf32 only with each other."""
    op, t = site.op, site.target
    st, mv = op.ins[0], op.ins[1]
    assert isinstance(st, Access) and isinstance(mv, Access)
    if st.partitions != mv.partitions:
        raise site.fail(
            "err_num_partition_mismatch",
            op="nc_matmul (contraction dimension)",
            a=st.partitions,
            b=mv.partitions,
        )
    if _fsize(st) > t.gemm_stationary_fmax:
        raise _size_error(
            site, f"nc_matmul stationary {_tile(st)}", _fsize(st), t.gemm_stationary_fmax
        )
    if _fsize(mv) > t.gemm_moving_fmax:
        raise _size_error(site, f"nc_matmul moving {_tile(mv)}", _fsize(mv), t.gemm_moving_fmax)
    wide = {"float32", "tfloat32"}
    a, b = dtypes.name(st.dtype), dtypes.name(mv.dtype)
    if (a in wide) != (b in wide):
        raise site.fail("err_matmul_dtype_mismatch", a=a, b=b)


def prim_nc_transpose(site: Site) -> None:
    """TensorE transposes up to 128x128, VectorE up to 32x32."""
    a = site.op.ins[0]
    assert isinstance(a, Access)
    limit = 32 if engine_of(site.op) == "vector" else site.target.pmax
    eng = "VectorE" if limit == 32 else "TensorE"
    if _fsize(a) > limit:
        raise _size_error(site, f"nc_transpose ({eng}) input {_tile(a)}", _fsize(a), limit)
    if a.partitions > limit:
        raise site.fail("err_num_partition_exceed_arch_limit", size=a.partitions, limit=limit)


_BIAS_DTYPES = frozenset({"float32", "float16", "bfloat16"})


def prim_activation(site: Site) -> None:
    """bias: a (P, 1) fp32/fp16/bf16 tile (or an immediate); scale: a float or (P, 1) fp32;
    on NeuronCore-v2 the free-axis reduction adds only (``activation_reduce``: "NC-v2 requires
    reduce_op=nl.add" [nki-0x.md §4.10; nki.md §3])."""
    op = site.op
    red = op.attrs.get("reduce_op")
    if red is not None and red != "add" and site.target.nc_version == 2:
        raise site.fail(
            "err_invalid_argument",
            op=op.prim,
            why=f"reduce_op={red}: on NeuronCore-v2 ({site.target.name}) the ScalarE "
            "reduction adds only (reduce_op=nl.add); other reductions need trn2 or later",
        )
    bias = op.ins[1] if len(op.ins) > 1 else None
    scale = op.ins[2] if len(op.ins) > 2 else None
    if isinstance(bias, Access) and (
        _fsize(bias) != 1 or dtypes.name(bias.dtype) not in _BIAS_DTYPES
    ):
        raise site.fail(
            "err_activation_bias_invalid_type",
            got=f"{_tile(bias)} of {dtypes.name(bias.dtype)}",
        )
    if isinstance(scale, Access):
        if _fsize(scale) != 1:
            raise site.fail("err_activation_scale_scalar_or_vector", got=list(scale.shape))
        if dtypes.name(scale.dtype) != "float32":
            raise site.fail("err_activation_scale_invalid_type", got=dtypes.name(scale.dtype))


def prim_bn_stats(site: Site) -> None:
    """bn_stats takes at most bn_stats_fmax elements per partition per instruction."""
    a = site.op.ins[0]
    assert isinstance(a, Access)
    limit = site.target.bn_stats_fmax
    if _fsize(a) > limit:
        raise _size_error(site, f"bn_stats input {_tile(a)}", _fsize(a), limit)


def prim_bn_aggr(site: Site) -> None:
    """bn_aggr reads groups of three statistics (count, mean, count * variance) -- what
    bn_stats writes, six per instruction: its input's free size is a multiple of 3 [nki.md
    §3, bn_aggr]."""
    a = site.op.ins[0]
    assert isinstance(a, Access)
    if _fsize(a) % 3:
        raise site.fail(
            "err_invalid_argument",
            op="bn_aggr",
            why=f"its input {_tile(a)} has {_fsize(a)} elements per partition, not a multiple "
            "of 3; bn_aggr aggregates the (count, mean, variance) groups bn_stats writes",
        )


def _scalar_operands(*positions: int) -> Rule:
    """Operands at ``positions`` are immediates or (P, 1) tiles (one value per partition)."""

    def rule(site: Site) -> None:
        op = site.op
        n = declared_inputs(op)
        for i in positions:
            x = op.ins[i] if i < n else None
            if isinstance(x, Access) and _fsize(x) != 1:
                raise site.fail(
                    "err_invalid_argument",
                    op=op.prim,
                    why=f"{_in_name(op, i)} must be a scalar or a (P, 1) tile, got "
                    f"{_tile(x)}; use tensor_tensor for elementwise operands",
                )

    rule.__doc__ = f"operands {positions} are scalars or (P, 1) tiles"
    return rule


def _one_psum_input(i: int, j: int) -> Rule:
    """Inputs ``i`` and ``j`` stream through one engine: at most one of them in PSUM."""

    def rule(site: Site) -> None:
        op = site.op
        if max(i, j) >= len(op.ins):
            return
        x, y = op.ins[i], op.ins[j]
        if (
            isinstance(x, Access)
            and isinstance(y, Access)
            and x.tensor.buffer == y.tensor.buffer == "psum"
        ):
            raise site.fail(
                "err_unsupported_memory",
                op=op.prim,
                what=f"{_in_name(op, i)} and {_in_name(op, j)}",
                allowed="SBUF for at least one of them (copy one input to SBUF first)",
                got="both in PSUM",
            )

    rule.__doc__ = f"inputs {i} and {j} are not both in PSUM"
    return rule


def prim_affine_select(site: Site) -> None:
    """affine_select evaluates one comparison."""
    pred = site.op.attrs["pred"]
    if len(pred.clauses) > 1:
        raise site.fail(
            "err_unsupported_expression_in_mask",
            got=f"{pred!r} (affine_select evaluates one comparison; chain two "
            "affine_select calls or use nl.where for a combined predicate)",
        )


# -- MX (NC-v4) ---------------------------------------------------------------------------------


def rule_target(site: Site) -> None:
    """The instruction exists on the target's NeuronCore generation (the MX instructions:
    NC-v4 only [nki-0x.md §4.2])."""
    p = PRIMS[site.op.prim]
    have = site.target.nc_version
    if have not in p.nc_versions:
        want = next(t.name for t in TARGETS.values() if t.nc_version in p.nc_versions)
        raise site.fail(
            "err_unsupported_instruction_on_target",
            op=site.op.prim,
            versions="/".join(map(str, p.nc_versions)),
            target=site.target.name,
            have=have,
            want=want,
        )


def rule_mx_containers(site: Site) -> None:
    """MX containers (x4 dtypes) are computed on by the MX instructions only; any other
    instruction may only move their bits between tensors of the same dtype (DMA never
    converts MX types), and memset writes them only with 0 [nki-0x.md §3.11, §4.4]."""
    op = site.op
    p = PRIMS[op.prim]
    if p.mx:
        return
    x4 = [(role, a) for role, a, _ in site.operands if dtypes.is_x4(a.dtype)]
    if not x4:
        return
    role, a = x4[0]
    if op.prim == "memset":
        if op.attrs.get("value") == 0:
            return
        why = f"memset fills {role} {a.tensor.name!r} of an MX type only with 0, got {op.attrs.get('value')}"
    elif p.raw and len({dtypes.name(b.dtype) for _, b, _ in site.operands}) == 1:
        return  # bits moved between tensors of the same MX type
    elif p.raw:
        names = sorted({dtypes.name(b.dtype) for _, b, _ in site.operands})
        why = (
            f"{role} {a.tensor.name!r}: MX types are never converted; both sides must have the "
            f"same dtype (got {' and '.join(names)}); reinterpret bits with .view(dtype) or "
            ".ap(..., dtype=)"
        )
    else:
        why = (
            f"{role} {a.tensor.name!r}: only quantize_mx and nc_matmul_mx compute on MX "
            "containers (copies move them)"
        )
    raise site.fail("err_unsupported_dtype", op=op.prim, dtype=dtypes.name(a.dtype), why=why)


def _mx_scale(site: Site, role: str, scale: Access, data_partitions: int, free: int) -> None:
    """An MX scale tile holds one scale per 8 data partitions at ``mx_scale_rows`` layout
    (4 of every 32 partitions) and one per container of the data [nki-0x.md §4.5]."""
    need = mx_scale_rows(data_partitions)
    if scale.partitions < need:
        raise site.fail(
            "err_invalid_argument",
            op=site.op.prim,
            why=f"{role} {_tile(scale)} has {scale.partitions} partitions; the scales of "
            f"{data_partitions} data partitions sit at partitions (i // 4) * 32 + i % 4 "
            f"for i < {data_partitions // 8}, so it needs at least {need}",
        )
    if _fsize(scale) != free:
        raise site.fail(
            "err_invalid_argument",
            op=site.op.prim,
            why=f"{role} {_tile(scale)} has {_fsize(scale)} elements per partition; the "
            f"data has {free} containers per partition, one scale each",
        )


def _mx_partitions(site: Site, role: str, a: Access) -> None:
    if a.partitions % 32:
        raise site.fail(
            "err_invalid_argument",
            op=site.op.prim,
            why=f"{role} {_tile(a)} spans {a.partitions} partitions; MX data spans a "
            "multiple of 32 partitions (pad it)",
        )


def prim_nc_matmul_mx(site: Site) -> None:
    """stationary [K, M] and moving [K, N] containers: K equal, a multiple of 32, at most
    pmax; M even and at most 128; N at most one PSUM's worth of dst (NC-v4: 4096 fp32 /
    8192 bf16); scale tiles in the MX layout [nki-0x.md §4.5]."""
    op, t = site.op, site.target
    st, mv, st_scale, mv_scale = op.ins[:4]
    assert isinstance(st, Access) and isinstance(mv, Access)
    if st.partitions != mv.partitions:
        raise site.fail(
            "err_num_partition_mismatch",
            op="nc_matmul_mx (contraction dimension)",
            a=st.partitions,
            b=mv.partitions,
        )
    _mx_partitions(site, "stationary", st)
    m, n = _fsize(st), _fsize(mv)
    if m > t.gemm_stationary_fmax:
        raise _size_error(site, f"nc_matmul_mx stationary {_tile(st)}", m, t.gemm_stationary_fmax)
    if m % 2:
        raise site.fail(
            "err_invalid_argument",
            op=op.prim,
            why=f"stationary {_tile(st)} has {m} containers per partition; it must be even",
        )
    dst = op.outs[0]
    limit = t.psum_tile_bytes // max(dst.dtype.itemsize, 1)
    if n > limit:
        raise _size_error(site, f"nc_matmul_mx moving {_tile(mv)}", n, limit)
    _mx_scale(site, "stationary_scale", st_scale, st.partitions, m)
    _mx_scale(site, "moving_scale", mv_scale, mv.partitions, n)


def prim_quantize_mx(site: Site) -> None:
    """src [P, F]: P a multiple of 32 (at most pmax), F a multiple of 4; dst [P, F / 4]
    containers; dst_scale in the MX layout [nki-0x.md §4.11]."""
    op = site.op
    src = op.ins[0]
    assert isinstance(src, Access)
    _mx_partitions(site, "src", src)
    f = _fsize(src)
    if f % 4:
        raise site.fail(
            "err_invalid_argument",
            op=op.prim,
            why=f"src {_tile(src)} has {f} elements per partition; quantize_mx packs 4 "
            "consecutive values per container, so it must be a multiple of 4",
        )
    if len(op.outs) > 1:
        _mx_scale(site, "dst_scale", op.outs[1], src.partitions, f // 4)


def prim_sequence_bounds(site: Site) -> None:
    """segment_ids is one partition: (1, n) [nki-0x.md §4.7 sequence_bounds]."""
    ids = site.op.ins[0]
    assert isinstance(ids, Access)
    if ids.partitions != 1:
        raise site.fail(
            "err_invalid_argument",
            op=site.op.prim,
            why=f"segment_ids {_tile(ids)} must have one partition (shape (1, n))",
        )


def prim_topk(site: Site) -> None:
    """P a multiple of 16 (one GpSimd core per 16 partitions), 8 <= n < 65536,
    1 <= K < 32768, K <= n, and src holding ceil(n / 16) elements per partition
    [nki-0x.md §4.8 topk]."""
    op = site.op
    src = op.ins[0]
    assert isinstance(src, Access)
    n, k = op.attrs["n"], op.attrs["k"]
    why = None
    if src.partitions % 16:
        why = f"src {_tile(src)} spans {src.partitions} partitions; it must be a multiple of 16"
    elif not 8 <= n < 65536:
        why = f"n={n} must be at least 8 and below 65536"
    elif not 1 <= k < 32768:
        why = f"K={k} (val_dst's elements per partition) must be at least 1 and below 32768"
    elif k > n:
        why = f"K={k} (val_dst's elements per partition) must not exceed n={n}"
    elif _fsize(src) < -(-n // 16):
        why = (
            f"src {_tile(src)} holds {_fsize(src)} elements per partition; n={n} needs "
            f"ceil(n / 16) = {-(-n // 16)}"
        )
    if why is not None:
        raise site.fail("err_invalid_argument", op=op.prim, why=why)


def _engine_generations(**since: int) -> Rule:
    """The op's engine exists for it from NeuronCore generation ``since[engine]`` on (the
    GpSimd ``rng`` from NC-v3, the VectorE PRNG state moves from NC-v4 [nki-0x.md §4.12])."""

    def rule(site: Site) -> None:
        eng = site.op.attrs.get("engine")
        first = since.get(eng)
        have = site.target.nc_version
        if first is not None and have < first:
            want = next(t.name for t in TARGETS.values() if t.nc_version >= first)
            raise site.fail(
                "err_unsupported_instruction_on_target",
                op=f"{site.op.prim} on the {eng} engine",
                versions="/".join(str(v) for v in range(first, 5)),
                target=site.target.name,
                have=have,
                want=want,
            )

    return rule


PRIM_RULES: dict[str, list[Rule]] = {
    "nc_matmul_mx": [prim_nc_matmul_mx],
    "quantize_mx": [prim_quantize_mx],
    "nc_matmul": [prim_nc_matmul],
    "nc_transpose": [prim_nc_transpose],
    "activation": [prim_activation],
    "bn_stats": [prim_bn_stats],
    "bn_aggr": [prim_bn_aggr],
    "affine_select": [prim_affine_select],
    "tensor_tensor": [_one_psum_input(0, 1)],
    "tensor_scalar": [_scalar_operands(1, 2)],
    "scalar_tensor_tensor": [_one_psum_input(0, 2), _scalar_operands(1)],
    "tensor_tensor_scan": [_scalar_operands(2)],
    "range_select": [_scalar_operands(1, 2)],
    "dropout": [_scalar_operands(1)],
    "activate2": [_scalar_operands(1, 2, 3)],
    "exponential": [_scalar_operands(1)],
    "tensor_scalar_cumulative": [_scalar_operands(1, 2)],
    "sequence_bounds": [prim_sequence_bounds],
    "topk": [prim_topk],
    "rng": [_engine_generations(gpsimd=3)],
    "rand2": [_scalar_operands(1, 2)],
    "rand_set_state": [_engine_generations(vector=4)],
    "rand_get_state": [_engine_generations(vector=4)],
}


def rule_prim(site: Site) -> None:
    """Dispatch to the op's entries of ``PRIM_RULES``."""
    for rule in PRIM_RULES.get(site.op.prim, ()):
        rule(site)


def rule_spec(site: Site) -> None:
    """Every output access holds what its primitive produces (the record's output spec):
    the same partitions and elements per partition -- operands match by partitions x
    elements per partition, free shapes may differ ([128, 4, 64] holds what [128, 256]
    does) -- or, for a DMA, as many elements as its source; and every operand has a
    dtype the primitive accepts."""
    op = site.op
    p = PRIMS[op.prim]
    for i, x in enumerate(op.ins[: declared_inputs(op)]):
        if not isinstance(x, Access):
            continue
        allowed = p.in_dtypes and dict(p.in_dtypes).get(p.in_role(i))
        if allowed and dtypes.name(x.dtype) not in allowed:
            raise _dtype_error(site, p.in_role(i), x, allowed)
    for i, (out, spec) in enumerate(zip(op.outs, p.out_spec(op.ins, op.attrs))):
        role = p.out_role(i)
        if spec.elements is not None:
            n = 1
            for s in out.shape:
                n *= s
            if n != spec.elements:
                src = op.ins[0]
                raise site.fail(
                    "err_store_dst_shape_smaller_than_other_shape",
                    op=f"{op.prim} ({n} elements into {role} {out.tensor.name}, "
                    f"{spec.elements} from the source)",
                    dst=list(out.shape),
                    src=list(src.shape) if isinstance(src, Access) else spec.elements,
                )
        parts = out.partitions
        if spec.partitions is not None and parts != spec.partitions:
            raise site.fail(
                "err_num_partition_mismatch",
                op=f"{op.prim} ({role} {_tile(out)} and the {spec.partitions}-partition "
                "result it receives)",
                a=parts,
                b=spec.partitions,
            )
        if spec.free is not None and _fsize(out) != spec.free:
            raise site.fail(
                "err_store_dst_shape_smaller_than_other_shape",
                op=f"{op.prim} ({role} {out.tensor.name} has {_fsize(out)} elements per "
                f"partition, the instruction produces {spec.free})",
                dst=list(out.shape),
                src=[spec.partitions if spec.partitions is not None else parts, spec.free],
            )
        if spec.dtypes is not None and dtypes.name(out.dtype) not in spec.dtypes:
            raise _dtype_error(site, role, out, spec.dtypes)


def _dtype_error(site: Site, role: str, a: Access, allowed) -> NkiError:
    return site.fail(
        "err_unsupported_dtype",
        op=site.op.prim,
        dtype=dtypes.name(a.dtype),
        why=f"{role} {a.tensor.name!r} must be {' or '.join(sorted(allowed))}",
    )


# ---------------------------------------------------------------------------------------------
# tile shape rules (rules 1, 8, 13, 15)


def _on_chip(a: Access) -> bool:
    return a.tensor.buffer in ON_CHIP


def _lead(op: Op, a: Access) -> int:
    """How many leading tile axes of ``a`` iterate over block dimensions (dimensions before the
    partition dimension) of a blocked tensor; the tile proper starts after them."""
    par = a.tensor.par_axis
    # instructions the compiler splits per block when they cover a blocked tensor whole, e.g.
    # the memset of nl.zeros((nblocks, nl.par_dim(128), 512)) or a DMA of all its blocks
    if par == 0 or not PRIMS[op.prim].block_split or not _on_chip(a):
        return 0
    lead = 0
    while lead < min(par, len(a.shape) - 1):
        ax = Axis(lead)
        if any(x.coef(ax) != 0 for d, x in enumerate(a.index) if d >= par):
            break
        lead += 1
    return lead


def _parts(op: Op, a: Access) -> int:
    """Partitions of the tile ``a`` (after leading block axes)."""
    k = _lead(op, a)
    return a.shape[k] if len(a.shape) > k else 1


def _free(op: Op, a: Access) -> int:
    """Elements per partition of the tile ``a`` (after leading block axes)."""
    n = 1
    for s in a.shape[_lead(op, a) + 1 :]:
        n *= s
    return n


def rule_partitions(site: Site) -> None:
    """An on-chip tile spans at most pmax partitions."""
    limit = site.target.pmax
    for _, a, _ in site.operands:
        if _on_chip(a) and _parts(site.op, a) > limit:
            raise site.fail(
                "err_num_partition_exceed_arch_limit", size=_parts(site.op, a), limit=limit
            )


def rule_tile_dims(site: Site) -> None:
    """An on-chip access is a partition dimension plus at most a 4-D free pattern."""
    limit = site.target.max_tile_dims
    for role, a, _ in site.operands:
        ndim = len(a.shape) - _lead(site.op, a)
        if _on_chip(a) and ndim > limit:
            raise site.fail(
                "err_exceed_max_supported_dimension",
                what=f"{site.op.prim} {role} {_tile(a)}",
                ndim=ndim,
                limit=limit,
            )


def _partition_axis_problem(a: Access, lead: int) -> str | None:
    """Why the partition axis (tile axis ``lead``) of on-chip access ``a`` does not walk its
    tensor's partitions, if it does not."""
    if len(a.shape) <= lead or a.shape[lead] <= 1:
        return None  # one partition: nothing to walk
    par = a.tensor.par_axis
    if par >= len(a.index):
        return "the tensor has no partition index"
    p_axis = Axis(lead)
    p_index = a.index[par]
    stride = p_index.coef(p_axis)
    if stride == 0:
        return (
            f"the partition index does not use tile axis {lead}; broadcasting along "
            "partitions needs broadcast_to"
        )
    if stride != 1:
        return f"partition stride {stride}; partitions cannot be strided"
    for s in p_index.syms:
        if isinstance(s, Axis) and s.k != lead and a.shape[s.k] > 1:
            return f"the partition index also depends on tile axis {s.k}"
    for d, x in enumerate(a.index):
        if d != par and x.coef(p_axis) != 0:
            return f"tile axis {lead} also indexes dimension {d}"
    return None


def _dma_partition_axis(a: Access, lead: int) -> int:
    """The tile axis that walks the partitions of a DMA's on-chip access ``a``: the one
    axis (of extent > 1) its partition index uses, else ``lead``."""
    par = a.tensor.par_axis
    if par >= len(a.index):
        return lead
    used = [
        s.k
        for s in a.index[par].syms
        if isinstance(s, Axis) and s.k < len(a.shape) and a.shape[s.k] > 1
    ]
    return used[0] if len(used) == 1 else lead


def rule_partition_axis(site: Site) -> None:
    """Tile axis 0 of every on-chip access is the tensor's partition dimension, stride 1.

    For a DMA only the on-chip side is constrained: HBM has no partitions, so a DMA may
    read HBM in any order (that is how load_transpose2d works).  A DMA sees SBUF as memory
    too, so any one tile axis may walk its partitions (an SBUF-to-SBUF ``dma_transpose``
    reads partitions along its last axis [nki-0x.md §4.3]); they still may not be strided."""
    dma = engine_of(site.op) == "dma"
    for role, a, _ in site.operands:
        if not _on_chip(a):
            continue
        lead = _lead(site.op, a)
        if dma:
            lead = _dma_partition_axis(a, lead)
        why = _partition_axis_problem(a, lead)
        if why is not None:
            raise site.fail(
                "err_leading_dimension_of_tensor_must_be_partition",
                op=site.op.prim,
                operand=role,
                access=repr(a),
                par=a.tensor.par_axis,
                tensor=a.tensor.name,
                why=why,
            )


def rule_partition_match(site: Site) -> None:
    """All tile operands of an engine instruction span the same partitions (scalar operands
    are (P, 1) tiles with the same P)."""
    op = site.op
    if PRIMS[op.prim].partition_free:  # e.g. nc_matmul: its result has M partitions
        return
    ops = site.operands
    if not ops:
        return
    p0 = _parts(op, ops[0][1])
    for role, a, _ in ops[1:]:
        if role == _INDEX_TILE:  # one runtime offset for the whole access (scalar_offset)
            continue
        if _parts(op, a) != p0:
            raise site.fail("err_num_partition_mismatch", op=op.prim, a=p0, b=_parts(op, a))


def rule_free_size(site: Site) -> None:
    """Vector/Scalar/GpSimd instructions address at most 64K elements per partition of SBUF
    (4K of PSUM).  A broadcast axis (stride 0) reads the same elements again, so it does not
    count: the NKI Library's ``layernorm_tkg`` subtracts a [128, 320] fp32 PSUM mean broadcast
    to [128, 320, 24] (7,680 reads of 320 elements)."""
    if engine_of(site.op) not in ("vector", "scalar", "gpsimd"):
        return
    t = site.target
    for role, a, _ in site.operands:
        limit = t.psum_fmax if a.tensor.buffer == "psum" else t.sbuf_fmax
        if _on_chip(a) and _free(site.op, a) > limit:
            touched = _free_touched(site.op, a)
            if touched > limit:
                raise _size_error(site, f"{site.op.prim} {role} {_tile(a)}", touched, limit)


def _free_touched(op: Op, a: Access) -> int:
    """Elements per partition the tile ``a`` addresses: :func:`_free` without its broadcast
    axes (tile axes no index expression uses)."""
    used = {s.k for s in a.syms if type(s) is Axis}
    n = 1
    for k in range(_lead(op, a) + 1, len(a.shape)):
        if k in used:
            n *= a.shape[k]
    return n


# ---------------------------------------------------------------------------------------------
# writes (rules 5, 11)


def rule_immutable(site: Site) -> None:
    """Kernel parameters are read-only unless annotated ``nt.mutable_tensor``."""
    for a in site.op.outs:
        root = a.tensor.root
        if root.kind == "input" and not root.mutable:
            raise site.fail("err_cannot_update_immutable_parameter", tensor=root.name)
        if root.kind == "const":
            raise site.fail(
                "err_invalid_argument",
                op=site.op.prim,
                why=f"{root.name} is a constant (nl.shared_constant) and cannot be written",
            )


def _varies_with(op: Op, a: Access, sym: Sym) -> bool:
    """Whether the elements ``op`` writes through ``a`` change with ``sym``: through the index,
    or through a mask that selects on it (e.g. only iteration 0 writes)."""
    if any(x.coef(sym) != 0 for x in a.index):
        return True
    if a.indirect is not None and any(x.coef(sym) != 0 for x in a.indirect.index):
        return True
    return op.mask is not None and any(c.coef(sym) != 0 for c, _ in op.mask.clauses)


def _writes_in(body: list, t: Tensor) -> bool:
    """Whether some op in ``body`` (or a loop nested in it) writes tensor ``t``."""
    for s in body:
        if isinstance(s, Op) and any(o.tensor.root is t for o in s.outs):
            return True
        if isinstance(s, Loop) and _writes_in(s.body, t):
            return True
    return False


def rule_distinct_writes(site: Site) -> None:
    """Each iteration of an affine_range loop writes its own locations: a write to a tensor
    that outlives the loop must be indexed by the loop variable (accumulations excepted)."""
    op = site.op
    if accumulates(op):
        return
    state = PRIMS[op.prim].state_outs
    for i, a in enumerate(op.outs):
        if state and PRIMS[op.prim].out_role(i) in state:
            continue  # engine state (the PRNG's): carried from iteration to iteration
        root = a.tensor.root
        if is_accumulator(root):  # engine state, updated in program order
            continue
        scope = set(root.scope)
        for loop in site.loops:
            var = loop.var
            if var.kind != "affine" or var.trip <= 1 or var in scope:
                continue
            # a scatter whose index tile is (re)written in the loop writes where the data
            # says: distinctness is then the author's contract, as for atomic_rmw
            if a.indirect is not None and _writes_in(loop.body, a.indirect.tensor.root):
                continue
            if not _varies_with(op, a, var):
                raise site.fail(
                    "err_unexpected_output_dependencies",
                    op=op.prim,
                    tensor=root.name,
                    loop=var.name,
                )


def rule_spmd_writes(site: Site) -> None:
    """SPMD instances run in parallel: a write to shared HBM is indexed by every program id
    of a grid axis with more than one instance."""
    op, grid = site.op, site.kernel.grid
    if not grid or accumulates(op):
        return
    for a in op.outs:
        root = a.tensor.root
        # a scatter writes where its index tile says (per instance): not provable here
        if root.buffer != "shared_hbm" or a.indirect is not None:
            continue
        for axis, size in enumerate(grid):
            pid = ProgramId(axis)
            if size > 1 and not _varies_with(op, a, pid):
                raise site.fail(
                    "err_spmd_output_dependencies",
                    op=op.prim,
                    tensor=root.name,
                    axis=axis,
                    size=size,
                )


# ---------------------------------------------------------------------------------------------
# bounds (rule 10)


def rule_bounds(site: Site) -> None:
    """Every element an unmasked op touches lies inside its tensor.  (Masked ops are left to
    the simulator, which checks the elements the mask keeps.)"""
    if site.op.mask is not None:
        return
    for _, a, _ in site.operands:
        bad = _out_of_bounds(a, site.ranges)
        if bad is not None:
            d, lo, hi = bad
            raise site.fail(
                "err_tensor_access_out_of_bound",
                tensor=a.tensor.name,
                dim=d,
                index=f"{lo if lo < 0 else hi} (index range [{lo}, {hi}])",
                size=a.tensor.shape[d],
            )


def _out_of_bounds(a: Access, ranges: dict[Sym, int]) -> tuple[int, int, int] | None:
    """``(dimension, lo, hi)`` of the first dimension whose index range ``[lo, hi]`` leaves
    ``a``'s tensor, or None."""
    tshape = a.tensor.shape
    shape = a.shape
    if 0 in shape:
        return None
    indirect = a.indirect is not None
    for d, x in enumerate(a.index[: len(tshape)]):
        if indirect and d == a.indirect_dim:
            continue  # a runtime index: checked when it runs (simulator / hardware)
        # Affine.bounds, inlined: each term sweeps [0, n) of its symbol
        lo = hi = x.const
        for sym, c in x.terms:
            n = shape[sym.k] if type(sym) is Axis else ranges.get(sym, 1)
            top = c * (n - 1)
            if top < 0:
                lo += top
            else:
                hi += top
        if lo < 0 or hi >= tshape[d]:
            return d, lo, hi
    return None


# A rule here or in OP_SHAPE_RULES / PRIM_RULES may read only what an op signature holds
# (``_Walk.body``; rule_bounds aside): a rule that reads more (index constants, tensor
# identity, another op) must add it to the signature, or an op like one that passed would
# skip it.
OP_RULES: list[Rule] = [
    rule_target,
    rule_tensor_indirection,
    rule_mx_containers,
    rule_loop_scope,
    rule_mask,
    rule_indirect,
    rule_memory,
    rule_prim,
    rule_spec,
]
# run after the tensor rules of the tensors the op touches
OP_SHAPE_RULES: list[Rule] = [
    rule_partitions,
    rule_tile_dims,
    rule_partition_axis,
    rule_partition_match,
    rule_free_size,
    rule_immutable,
    rule_distinct_writes,
    rule_spmd_writes,
    rule_bounds,
]


# ---------------------------------------------------------------------------------------------
# tensor rules (rules 1, 2)


def _tensor_loc(t: Tensor) -> SourceLoc:
    return t.loc or UNKNOWN_LOC


def tensor_partitions(t: Tensor, target: Target, kernel: Kernel) -> None:
    """An SBUF/PSUM tensor spans at most pmax partitions."""
    if t.partitions > target.pmax:
        raise NkiError(
            "err_num_partition_exceed_arch_limit",
            _tensor_loc(t),
            size=t.partitions,
            limit=target.pmax,
        )


def tensor_psum_tile(t: Tensor, target: Target, kernel: Kernel) -> None:
    """One PSUM tile (the dims after the partition dim) fits a 2 KiB bank per partition.  An
    NKI 0.x PSUM tensor is an explicit allocation that may span banks (it starts on a bank
    boundary; each matmul still writes within one bank): it fits the whole PSUM."""
    if t.buffer != "psum":
        return
    n = 1
    for s in t.shape[t.par_axis + 1 :]:
        n *= s
    used = n * t.dtype.itemsize
    limit = target.psum_bytes if kernel.dialect == "nki-0.x" else target.psum_tile_bytes
    if used > limit:
        raise NkiError(
            "err_psum_capacity_exceeded",
            _tensor_loc(t),
            tensor=t.name,
            used=used,
            limit=limit,
        )


TENSOR_RULES: list[Callable[[Tensor, Target, Kernel], None]] = [tensor_partitions, tensor_psum_tile]


# ---------------------------------------------------------------------------------------------
# kernel rules (rules 7, 12)


def kernel_outputs_written(kernel: Kernel, target: Target, sc: Scan) -> None:
    """Every returned tensor is written by some instruction."""
    want = {t.root.uid for t in kernel.outputs}
    written: set[int] = set()
    for op, _ in kernel.ops():
        for a in op.outs:
            written.add(a.tensor.root.uid)
        if want <= written:
            break  # every output is written: the rest of the walk cannot change that
    for t in kernel.outputs:
        if t.root.uid not in written:  # a returned reshape is written through its base
            raise NkiError(
                "err_tensor_output_not_written_to",
                t.loc or kernel.loc or UNKNOWN_LOC,
                tensor=t.name,
            )


def _psum_liveness(kernel: Kernel, target: Target, sc: Scan) -> None:
    """Peak PSUM bytes per partition under a simple, conservative liveness.

    Within a body, a tensor is live from its Alloc to the last statement that uses it (a use
    inside a nested loop counts for the whole loop).  A tensor allocated in a loop body counts
    once, not per iteration: rolled loops reuse one buffer.  Walking in program order, the
    first allocation that pushes PSUM past its capacity is reported.  (SBUF is checked by
    what stays resident once idle tiles are spilled: see ``kernel_capacity``.)  Tensors a user
    allocation placed hold their banks for the whole kernel (checked where they are created);
    the others share the banks above the highest of those (``ir/residency.psum_user_top``).
    A tensor whose blocks live one loop iteration at a time counts the blocks of an iteration
    (``ir/residency.psum_blocks_in_use``).  A tensor NKI 0.x placed by hand
    (``nl.ndarray(address=)``: ``Tensor.address``) lives as the others do, but the placed
    tensors live at a statement take the bytes of the union of their byte ranges, so tiles
    placed on the same bank share it (the NKI Library's attention and MoE kernels place a tile
    per loop step on one of a few banks).  A placement past the end of PSUM is reported as the
    walk enters its body (before any capacity error at a later statement).

    In program points (``ir/residency.Scan``) a tensor allocated in body B is live from its
    Alloc to the end of the span of its last statement in B, and the tensors live at a
    statement of B are those of B and of the bodies enclosing it whose interval holds it: the
    unplaced bytes live at every Alloc are one prefix sum over the intervals, the placed bytes
    one interval count per elementary byte segment (``_placed_bytes``)."""
    mask = (sc.psum & ~sc.user)[sc.alloc_owner]
    if not mask.any():
        return
    limit = target.psum_bytes - psum_user_top(kernel, sc)
    blocks = psum_blocks_in_use(kernel, sc)
    owner, at, body = sc.alloc_owner[mask], sc.alloc_point[mask], sc.alloc_ctx[mask]
    tensors = [sc.tensors[k] for k in owner.tolist()]
    sizes = _psum_sizes(tensors, blocks)
    placed = np.fromiter((t.address is not None for t in tensors), dtype=bool, count=len(tensors))
    addr = np.zeros(len(tensors), dtype=np.int64)
    addr[placed] = [tensors[j].address for j in np.flatnonzero(placed).tolist()]
    # placements past the end of PSUM, each reported when the walk enters its body
    oob = np.flatnonzero(placed & (addr + sizes > target.psum_bytes))
    depth = np.array([len(ch) - 1 for ch in sc.chain], dtype=np.int64)[body]
    # each tensor's last statement in the body it is allocated in: the last use there, else
    # its (last) Alloc there -- per (tensor, body), as a tensor allocated twice shares one
    n_ctx = len(sc.chain)
    groups, group = np.unique(owner * n_ctx + body, return_inverse=True)
    group = group.reshape(-1)
    last_use = np.full(len(groups), -1, dtype=np.int64)
    for d in np.unique(depth).tolist():
        own, _, hi = sc.statement_at(np.full(len(sc.touch_owner), d, dtype=np.int64))
        key = sc.touch_owner * n_ctx + own
        pos = np.searchsorted(groups, key).clip(0, len(groups) - 1)
        mine = (own >= 0) & (groups[pos] == key)
        np.maximum.at(last_use, pos[mine], hi[mine])
    last_alloc = np.full(len(groups), -1, dtype=np.int64)
    np.maximum.at(last_alloc, group, at)
    last = np.where(last_use >= 0, last_use, last_alloc)[group]
    unplaced = np.where(placed, 0, sizes)
    delta = np.zeros(len(sc.stmts) + 1, dtype=np.int64)
    np.add.at(delta, at, unplaced)
    np.add.at(delta, last + 1, -unplaced)
    live = np.cumsum(delta)[at]
    if placed.any():
        live += _placed_bytes(at, last, addr, addr + sizes, placed)
    over = np.flatnonzero(live > limit)
    if len(oob):
        j = int(oob[np.argmin(np.asarray(sc.start, dtype=np.int64)[body[oob]])])
        if not len(over) or sc.start[int(body[j])] < at[over[0]]:
            lo, hi = int(addr[j]), int(addr[j] + sizes[j])
            raise NkiError(
                "err_allocation_out_of_bounds",
                _tensor_loc(tensors[j]),
                what=f"{tensors[j].name} at bytes [{lo}, {hi}) of each PSUM partition, "
                f"which has {target.psum_bytes}",
            )
    if not len(over):
        return
    i = int(over[0])
    p = int(at[i])
    chain = set(sc.chain[int(body[i])])
    # the tensors of the enclosing bodies live here: outer bodies first, then biggest first
    here = [
        j
        for j in np.lexsort((at, depth)).tolist()
        if int(body[j]) in chain and at[j] <= p <= last[j]
    ]
    here.sort(key=lambda j: -int(sizes[j]))
    shown = ", ".join(
        f"{t.name} ({int(sizes[j])} B{_at(t)}, line {t.loc.line if t.loc else '?'})"
        for j, t in ((j, tensors[j]) for j in here[:5])
    )
    if len(here) > 5:
        shown += f", and {len(here) - 5} more"
    raise NkiError(
        "err_psum_total_capacity_exceeded",
        _tensor_loc(tensors[i]),
        used=int(live[i]),
        limit=limit,
        banks=limit // 2048,
        tensors=shown,
    )


def _placed_bytes(
    at: np.ndarray, last: np.ndarray, lo: np.ndarray, hi: np.ndarray, placed: np.ndarray
) -> np.ndarray:
    """At every point ``at``, the bytes covered by the union of the byte ranges ``[lo, hi)``
    of the ``placed`` entries live there (entry ``j`` live at points ``at[j]..last[j]``).

    The distinct range ends cut PSUM into elementary segments, each inside or outside every
    range; a segment is covered at a point when some entry whose range holds it is live there,
    counted as (entries allocated at or before it) - (entries dead before it) by binary search.
    A kernel places a few distinct ranges (a bank or two each), so there are few segments."""
    j = np.flatnonzero(placed)
    plo, phi, pat, plast = lo[j], hi[j], at[j], last[j]
    ends = np.unique(np.concatenate([plo, phi]))
    covered = np.zeros(len(at), dtype=np.int64)
    for a, b in zip(ends[:-1].tolist(), ends[1:].tolist()):
        holds = (plo <= a) & (phi >= b)
        if not holds.any():
            continue
        born = np.sort(pat[holds])
        dead = np.sort(plast[holds])
        n = np.searchsorted(born, at, side="right") - np.searchsorted(dead, at, side="left")
        covered += (b - a) * (n > 0)
    return covered


def _psum_sizes(tensors: list[Tensor], blocks: dict[int, int]) -> np.ndarray:
    """Bytes per partition each PSUM tensor holds while live (the blocks an iteration holds,
    for a tensor in ``blocks``); computed once per distinct (shape, itemsize, axis)."""
    facts = list(zip(map(_SHAPE, tensors), map(_ITEMSIZE, tensors), map(_PAR_AXIS, tensors)))
    # each tensor's first tensor of the same facts (one hashing pass, at C level)
    rep = np.fromiter(map({}.setdefault, facts, count()), dtype=np.int64, count=len(facts))
    sizes = np.zeros(len(tensors), dtype=np.int64)
    for k in np.unique(rep).tolist():
        sizes[k] = _bytes(tensors[k])
    sizes = sizes[rep]
    if blocks:
        for j, t in enumerate(tensors):
            n = blocks.get(t.uid)
            if n is not None:
                sizes[j] = n * _bytes(t) // prod(t.shape[: t.par_axis])
    return sizes


_SHAPE = attrgetter("shape")
_ITEMSIZE = attrgetter("dtype.itemsize")
_PAR_AXIS = attrgetter("par_axis")


def _at(t: Tensor) -> str:
    return "" if t.address is None else f" at byte {t.address}"


def kernel_capacity(kernel: Kernel, target: Target, sc: Scan) -> None:
    """Live PSUM tensors fit the target's PSUM (PSUM is never spilled), and at every
    statement the SBUF tensors that cannot be spilled there fit the target's SBUF per
    partition (``ir/residency.py``: the same computation the allocator spills by, so a kernel
    over SBUF capacity that spilling makes fit is accepted, as the Neuron compiler spills).
    One scan of the kernel (``ir/residency.Scan``, recorded by the verifier's walk) serves
    both."""
    _psum_liveness(kernel, target, sc)
    over = resident_overflow(timeline(kernel, sc), target)
    if over is not None:
        raise over.error()


KERNEL_RULES: list[Callable[[Kernel, Target, Scan], None]] = [
    kernel_outputs_written,
    kernel_capacity,
]


# ---------------------------------------------------------------------------------------------
# the driver


@dataclass(slots=True)
class _Walk:
    """One walk over the kernel, checking every op.

    An unrolled kernel repeats a few kinds of op thousands of times, so what the rules found is
    remembered at three levels, each keyed by small ints or by the identity of IR objects the
    kernel holds (alive, hence with ids of their own, for the whole walk):

    - per tensor (by uid): a small int for the facts the rules read (``_tensor_sig``), and
      which of those passed ``TENSOR_RULES`` (they read nothing else);
    - per access, by (tensor facts, tile shape, identity of its index tuple, loop context):
      a small int for its class (tensor facts, tile shape, index terms: everything the op
      rules read of it but its index constants) and whether it is in bounds in that context;
    - per op: the signature (``body``) of every op that passed every rule.
    """

    kernel: Kernel
    target: Target
    # signatures of ops that passed every rule (see ``body``)
    passed: set[tuple] = field(default_factory=set)
    # tensor uid -> its facts' int (``_tensor_sig``, interned in ``tensor_ids``)
    tensor_sigs: dict[int, int] = field(default_factory=dict)
    tensor_ids: dict[tuple, int] = field(default_factory=dict)
    tensors_ok: set[int] = field(default_factory=set)  # tensor facts that passed TENSOR_RULES
    # per loop context: (tensor facts, tile shape, id(index tuple)) -> the access's class if
    # it is in bounds there, else ~class
    accesses: list[dict[tuple, int]] = field(default_factory=lambda: [{}])
    class_ids: dict[tuple, int] = field(default_factory=dict)
    index_sigs: dict[int, tuple] = field(default_factory=dict)  # id(index tuple) -> term ids
    term_ids: dict[int, int] = field(default_factory=dict)  # id(terms tuple) -> interned int
    terms: dict[tuple, int] = field(default_factory=dict)
    # what the walk records for the capacity rule (``ir/residency.Scan``); its contexts (0:
    # the kernel body, then one per loop body) are the walk's loop contexts
    rec: Recorder = field(default_factory=Recorder)

    def tensor_sig(self, t: Tensor) -> int:
        """The int standing for ``t``'s facts (``_tensor_sig``), remembered by uid (and ``t``
        by the recorder: the walk asks once per tensor)."""
        self.rec.tensor_of[t.uid] = t
        ts = self.tensor_sigs[t.uid] = self.tensor_ids.setdefault(
            _tensor_sig(t), len(self.tensor_ids)
        )
        return ts

    def tensor(self, t: Tensor) -> None:
        """Run ``TENSOR_RULES`` on ``t`` unless a tensor of the same facts passed them."""
        ts = self.tensor_sigs.get(t.uid)
        if ts is None:
            ts = self.tensor_sig(t)
        if ts in self.tensors_ok:
            return
        if t.buffer in ON_CHIP:
            for rule in TENSOR_RULES:
                rule(t, self.target, self.kernel)
        self.tensors_ok.add(ts)

    def run(self) -> None:
        k = self.kernel
        base: dict[Sym, int] = {ProgramId(i): g for i, g in enumerate(k.grid)}
        self.body(k.body, (), base, 0)
        for t in k.tensors:
            self.tensor(t)
        sc = self.rec.finish()
        for rule in KERNEL_RULES:
            rule(k, self.target, sc)

    def body(
        self, stmts_in: list, loops: tuple[Loop, ...], ranges: dict[Sym, int], ctx: int
    ) -> None:
        """Check ``stmts_in`` (in loop context ``ctx``: ``loops`` with symbol ``ranges``),
        recording them in ``rec`` as ``ir/residency.Recorder.walk`` does (the capacity rule
        reads the scan: the kernel is walked once).

        An op's signature is everything the rules but ``rule_bounds`` read, its index
        constants left out: its primitive, context, mask, attributes, immediates and the class
        of every access.  Two ops of one signature pass or fail the same rules, so an op whose
        signature passed before is checked for bounds only.  An op with a runtime index tile
        (indirect DMA) is always checked in full."""
        passed = self.passed
        accesses = self.accesses[ctx]
        tsigs = self.tensor_sigs
        rec = self.rec
        stmts, touched, points = rec.stmts, rec.uids, rec.points
        for s in stmts_in:
            point = len(stmts)
            stmts.append(s)
            tp = type(s)
            if tp is Op:
                parts = [s.prim, ctx, s.mask]
                ok = direct = True
                for a in s.outs:
                    t = a.tensor
                    uid = t.uid
                    touched.append(uid)
                    points.append(point)
                    if a.indirect is not None:
                        direct = False
                        rec.tensor_of[uid] = t
                        continue
                    ts = tsigs.get(uid)
                    if ts is None:
                        ts = self.tensor_sig(t)
                    c = accesses.get((ts, a.shape, id(a.index)))
                    if c is None:
                        c = self.access_class(a, ts, accesses, ranges)
                    if c < 0:
                        ok = False
                        c = ~c
                    parts.append(c)
                parts.append(-1)
                for a in s.ins:
                    if type(a) is not Access:
                        parts.append((type(a), a))
                        continue
                    t = a.tensor
                    uid = t.uid
                    touched.append(uid)
                    points.append(point)
                    if a.indirect is not None:
                        direct = False
                        rec.tensor_of[uid] = t
                        continue
                    ts = tsigs.get(uid)
                    if ts is None:
                        ts = self.tensor_sig(t)
                    c = accesses.get((ts, a.shape, id(a.index)))
                    if c is None:
                        c = self.access_class(a, ts, accesses, ranges)
                    if c < 0:
                        ok = False
                        c = ~c
                    parts.append(c)
                sig = None
                if direct:
                    parts.extend(s.attrs.items())
                    sig = tuple(parts)
                    try:
                        hit = sig in passed
                    except TypeError:  # an unhashable attribute: check in full
                        hit, sig = False, None
                    if hit:
                        # only the bounds depend on the constants; a masked op's bounds are
                        # the simulator's (rule_bounds)
                        if not ok and s.mask is None:
                            rule_bounds(Site(s, loops, ranges, self.target, self.kernel))
                        continue
                site = Site(s, loops, ranges, self.target, self.kernel)
                for rule in OP_RULES:
                    rule(site)
                for _, a, _ in site.operands:
                    self.tensor(a.tensor)
                for rule in OP_SHAPE_RULES:
                    rule(site)
                if sig is not None:
                    passed.add(sig)
            elif tp is Alloc:
                rec.allocs.append((s, point, ctx))
            elif tp is Loop:
                inner = dict(ranges)
                inner[s.var] = s.trip
                body = rec.enter(s, point, ctx)
                self.accesses.append({})
                self.body(s.body, loops + (s,), inner, body)
                rec.leave(body, ctx)

    def access_class(
        self, a: Access, ts: int, accesses: dict[tuple, int], ranges: dict[Sym, int]
    ) -> int:
        """The class of direct access ``a`` of a tensor of facts ``ts`` (see ``body``),
        ``~class`` if it leaves its tensor with ``ranges``; remembered in ``accesses`` (those
        of its loop context)."""
        isig = self.index_sigs.get(id(a.index))
        if isig is None:
            ids = self.term_ids
            out = []
            for x in a.index:
                # index terms are often shared tuples (a front end's cached decompositions):
                # look them up by identity before hashing their symbols
                tid = ids.get(id(x.terms))
                if tid is None:
                    tid = ids[id(x.terms)] = self.terms.setdefault(x.terms, len(self.terms))
                out.append(tid)
            isig = self.index_sigs[id(a.index)] = tuple(out)
        c = self.class_ids.setdefault((ts, a.shape, isig), len(self.class_ids))
        if _out_of_bounds(a, ranges) is not None:
            c = ~c
        accesses[ts, a.shape, id(a.index)] = c
        return c


def _tensor_sig(t: Tensor) -> tuple:
    """The facts about tensor ``t`` the rules read (``TENSOR_RULES`` and, through the access
    classes, the op rules).  The dtype by identity (dtypes are shared objects, and hashing one
    is slow): finer than its name, so facts never merge two dtypes a rule could tell apart;
    the tensor holds it, so its id stays its own."""
    root = t if t.base is None else t.root
    return (
        t.buffer,
        t.shape,
        t.par_axis,
        id(t.dtype),
        root.kind,
        root.mutable,
        root.buffer,
        root.scope,
    )


def verify(kernel: Kernel, target: str | Target | None = None) -> None:
    """Raise ``NkiError`` for the first architecture rule ``kernel`` breaks, in program order.

    ``target`` (a name or alias in ``nkikit.targets.TARGETS``, or a ``Target``; default: the
    ``NEURON_PLATFORM_TARGET_OVERRIDE`` target, else trn2) sets the capacity and tile limits.  Returns None when the kernel is legal."""
    with gc_paused():  # see nkikit/collector.py
        _Walk(kernel, get_target(target)).run()
