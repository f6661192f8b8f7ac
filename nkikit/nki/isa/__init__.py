"""``nkikit.nki.isa``: NKI 0.x's ``nki.isa`` (``import nkikit.nki.isa as nisa``).

Every instruction writes into a caller-allocated ``dst`` given first and returns nothing;
there is no ``mask=`` and no ``dtype=`` (the destination's dtype is the result's).  Each call
parses its arguments, turns its tensor views into IR accesses and hands them to the emit
function of its primitive (``nkikit/trace/instructions.py``), the same one the Beta-1 front end
(``nkikit.isa``) calls: operator names, engines, the shared checks and the IR attributes are
decided there, so both dialects trace the same IR and share the verifier, both simulators, the
compiler and the profiler.

Operands match by partition count and elements per partition; their free shapes may differ
(``(128, 4, 64)`` against ``(128, 256)``): the accesses are re-expressed in one common shape
before they reach the IR.
"""

from __future__ import annotations

import enum
import math
import os
import types

import numpy as np

from ... import dtypes, errors
from ...errors import NkiError, SourceLoc, caller_loc, warn_at
from ...ir.affine import Affine, Axis, Predicate
from ...ir.core import Access
from ...ir.opnames import ALU_UNARY, op_name
from ...ir.prims import local_gather_indices
from ...isa import engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd
from ...trace import accumulators as ACC
from ...trace import indirection as _indirection
from ...trace import instructions as E
from ...trace.builder import current, maybe_current
from ..indirection import check_tensor_engine
from ..tensor import (
    NkiTensor,
    _index,
    _pattern_pairs,
    access_of,
    empty_operand,
    got_type,
    require_tensor,
)
from ..tensor import as_dtype as _as_dtype
from . import constants  # noqa: F401
from .constants import dge_mode
from .registers import (  # noqa: F401 - NKI's names
    VirtualRegister,
    register_alloc,
    register_load,
    register_move,
    register_store,
)


class dma_engine(enum.IntEnum):  # noqa: N801 - NKI's name
    dma = 1
    gpsimd_dma = 2


# deprecated module constants, still used by the NKI Library
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


class NkiValidationError(AssertionError):
    """Raised by NKI when a call violates a hardware constraint (nkikit raises NkiError)."""


class NkiInstruction:
    """The handle an instruction call returns while tracing (``.depends_on`` adds ordering,
    which the simulator, running in program order, already has)."""

    __slots__ = ("op",)

    def __init__(self, op) -> None:
        self.op = op

    def depends_on(self, *producers) -> NkiInstruction:
        return self


def get_nc_version() -> nc_version:
    """The NeuronCore generation being traced for: ``NKI_NC_VERSION`` (gen2/gen3/gen4, as the
    NKI Library's harness sets it), else the ``NEURON_PLATFORM_TARGET_OVERRIDE`` target."""
    env = os.environ.get("NKI_NC_VERSION")
    if env:
        if env not in nc_version.__members__:
            raise ValueError(f"NKI_NC_VERSION={env!r}: expected one of gen2, gen3, gen4")
        return nc_version[env]
    from ...targets import default_target

    return nc_version(default_target().nc_version)


def get_nc_sub_version() -> int:
    return 0


# -- operands ------------------------------------------------------------------------------------


def _acc(x, loc: SourceLoc, what: str) -> Access:
    return access_of(x, loc, what)


def _chain(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The coarsest shape every one of ``shapes`` (same element count) refines to, or None."""
    bounds: set[int] = set()
    for s in shapes:
        acc = 1
        for n in reversed(s):
            acc *= n
            if acc > 1:
                bounds.add(acc)
    chain = sorted(bounds)
    for a, b in zip(chain, chain[1:]):
        if b % a:
            return None
    if not chain:
        return ()
    dims = [chain[0]] + [b // a for a, b in zip(chain, chain[1:])]
    return tuple(reversed(dims))


def _split_dims(dims, refined: tuple[int, ...]) -> list[tuple[int, int]]:
    """``dims`` (``(count, stride)`` pairs, outermost first) split into the consecutive sizes
    of ``refined`` that make up each count: ``(size, stride)`` per refined dimension, the
    stride of a part being its dimension's stride times the extent of the parts inside it."""
    out: list[tuple[int, int]] = []
    r = list(refined)
    for n, s in dims:
        if n == 1:
            continue
        parts = []
        acc = 1
        while acc < n:
            parts.append(r.pop(0))
            acc *= parts[-1]
        inner = 1
        sub = []
        for p in reversed(parts):
            sub.append((p, s * inner))
            inner *= p
        out.extend(reversed(sub))
    return out


def _refine(view: NkiTensor, refined: tuple[int, ...], start: int) -> NkiTensor:
    """``view`` with dims ``start:`` split into ``refined`` (same elements, same order)."""
    parts = _split_dims(zip(view.shape[start:], view.strides[start:]), refined)
    shape = list(view.shape[:start]) + [p for p, _ in parts]
    strides = list(view.strides[:start]) + [st for _, st in parts]
    if len(shape) == start:
        shape.append(1)
        strides.append(1)
    return view._with(shape, strides)


def _same_free(views: list[NkiTensor], loc: SourceLoc, op: str) -> list[NkiTensor]:
    """Re-express on-chip operands (same partitions, same elements per partition) in one
    common shape."""
    first = views[0].shape
    for v in views:
        if v.shape != first:
            break
    else:
        return views  # one shape: nothing to match or re-express
    _nonempty(views, loc, op)  # no dimensions to match: refused before they are split
    p = views[0].shape[0]
    free = views[0].size // max(p, 1)
    for v in views[1:]:
        if v.shape[0] != p:
            raise NkiError("err_num_partition_mismatch", loc, op=op, a=p, b=v.shape[0])
        if v.size // max(v.shape[0], 1) != free:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=op,
                why=(
                    f"operands have {free} and {v.size // max(v.shape[0], 1)} elements per "
                    f"partition ({views[0].shape} and {v.shape}); they must match"
                ),
            )
    if all(v.shape == views[0].shape for v in views):
        return views
    shapes = [tuple(n for n in v.shape[1:] if n != 1) for v in views]
    refined = _chain(shapes)
    if refined is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=op,
            why=f"operand free shapes {[v.shape[1:] for v in views]} cannot be matched element by element",
        )
    return [_refine(v, refined, 1) for v in views]


def _nonempty(views, loc: SourceLoc, *labels: str) -> None:
    """``access_of``'s refusal of a view with no elements, for the front end's steps that
    reshape operands before their accesses are made (the last label names the rest)."""
    for k, v in enumerate(views):
        if 0 in v.shape:
            raise empty_operand(v, loc, labels[min(k, len(labels) - 1)])


def _tiles(loc: SourceLoc, op: str, *xs: NkiTensor) -> list[Access]:
    for x in xs:
        if type(x) is not NkiTensor:
            require_tensor(x, loc, f"nisa.{op}", "each operand")
    return [_acc(v, loc, op) for v in _same_free(list(xs), loc, f"nisa.{op}")]


def _scalar_or_vector(x, loc: SourceLoc, what: str, like: Access | None = None) -> Access | float:
    """A compile-time scalar or a (P, 1) tensor broadcast along the free axis.  With ``like``
    (the data access it combines with), the tensor's access gets ``like``'s rank, (P, 1, ...,
    1), so that it broadcasts along every free dimension of the data."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, int | float | np.integer | np.floating):
        return float(x)
    if isinstance(x, NkiTensor):
        if x.size // max(x.shape[0], 1) != 1:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=what,
                why=f"expected a scalar or a (P, 1) tensor, got shape {x.shape}",
            )
        a = _acc(x, loc, what)
        rank = 2 if like is None else max(len(like.shape), 2)
        if len(a.shape) != rank:  # (its runtime offset, if any, kept: the verifier judges it)
            shape = (a.shape[0],) + (1,) * (rank - 1)
            a = Access(a.tensor, shape, a.index, a.indirect, a.indirect_dim, a.indirect_extent)
        return a
    raise NkiError(
        "err_invalid_argument",
        loc,
        op=what,
        why=f"expected a scalar or a (P, 1) tensor, got {got_type(x)}",
    )


def _reduce_res(x, data: Access, loc: SourceLoc, op: str) -> Access:
    """The (P, 1) tensor instruction ``op`` reads a reduction out into.  A ``reduce_res`` view
    with more partitions than the data receives the data's partitions (its first P; the engine
    has no accumulator values for lanes the instruction did not use, and the NKI Library passes
    such views), the rest of it is left as it was."""
    if not isinstance(x, NkiTensor):
        require_tensor(x, loc, f"nisa.{op}", "reduce_res")
    return _scalar_or_vector(_lanes(x, data), loc, "reduce_res")


def _lanes(x, data: Access):
    """``x`` cut to the first P partitions of ``data`` when it is a tensor with more: the P
    lanes of a VectorE instruction read (or write) partitions 0..P-1 of a per-partition
    operand, whatever its extent (the NKI Library passes a whole (128, 1) tile as a
    ``range_select`` bound and ``reduce_res`` of a 104-row tile, attention_cte.py)."""
    if isinstance(x, NkiTensor) and x.shape[0] > data.shape[0]:
        return x[0 : data.shape[0]]
    return x


_ENGINE_NAMES = {
    engine.tensor: "tensor",
    engine.vector: "vector",
    engine.scalar: "scalar",
    engine.gpsimd: "gpsimd",
    engine.dma: "dma",
    engine.sync: "sync",
}


def _done(op) -> NkiInstruction:
    """The handle of ``op``, just emitted by the emit layer (``nkikit/trace/instructions.py``),
    after recording which PSUM elements it wrote (a matmul's write makes the next matmul to
    them accumulate; any other write resets them)."""
    for o in op.outs:
        if isinstance(o, Access):
            t = o.tensor
            if (t if t.base is None else t.root).buffer == "psum":
                _psum_written(op.outs, op.prim in _MATMULS)
                break
    b = maybe_current() or current()
    n = b.instructions = b.instructions + 1
    if not n % _GUARD_EVERY:
        _memory_guard(op, n)
    return NkiInstruction(op)


# the instructions whose PSUM writes count as matmul writes for accumulate=None
_MATMULS = frozenset({"nc_matmul", "nc_matmul_mx"})
_GUARD_EVERY = 1 << 14  # instructions between two looks at the process's memory


def _memory_guard(op, n: int) -> None:
    """Unrolled kernels at production shapes trace to millions of instructions; stop with a
    named error at the user's line before the process runs out of memory (an OOM kill loses
    everything, including a test runner's other results).  Asked every ``_GUARD_EVERY``
    instructions (``n`` so far) by :func:`_done`."""
    used = _rss_mb()
    limit = _memory_limit_mb()
    if used > limit:
        raise NkiError(
            "err_kernel_too_large_to_simulate",
            op.loc,
            ops=n,
            used_mb=int(used),
            limit_mb=int(limit),
        )


# -- calls of a kind seen before ---------------------------------------------------------------
# An unrolled kernel makes the same few calls over and over on fresh tiles (per step, a DMA of
# a 128 x 128 fp32 HBM slice into a new SBUF tile).  The checks a call makes before its op is
# appended read the operands' kinds -- memory, tensor kind, dtype, shape, strides -- and the
# options, never which tensors or where in them (an access's bounds are checked when it is
# made).  So a call of a kind accepted earlier in the trace skips them: it makes its accesses
# and appends its op with that call's attributes; the scope checks (``Builder.append``), the
# accumulate rule and the PSUM bookkeeping (``_done``) run for every call.
CHECK_EVERY_CALL = False  # check every call afresh (tests compare the IR both ways)


def _kind(prim: str, options: tuple, defaults: tuple, operands: tuple) -> tuple | None:
    """What the checks of ``prim`` read about a call with ``options`` (the instruction's
    ``defaults`` when not given) on ``operands`` (outputs first: each one's memory, tensor
    kind, whether it is a view of another dtype or shape, dtype, shape and strides; not its
    offset or which tensor it is); None when an operand is not a plain tensor view (a number,
    an indirect view), an option is a tensor or an indirect access awaits its instruction:
    such calls are checked every time, as are calls with an option :func:`_option_key` does
    not key.  Options count by type and value, floats and numpy scalars by their repr (0.0
    and -0.0 are equal numbers, and their calls' attributes differ)."""
    if _indirection.pending or CHECK_EVERY_CALL:
        return None
    for v, d in zip(options, defaults):
        if v is not d:  # given: by value and type (True is not 1, an int not its enum member)
            option_types = tuple(map(type, options))
            if NkiTensor in option_types:
                return None
            if not _BY_VALUE.issuperset(option_types):
                keyed = list(options)
                for i, t in enumerate(option_types):
                    if t not in _BY_VALUE:
                        k = keyed[i] = _option_key(keyed[i])
                        if k is _UNKEYED:
                            return None
                options = tuple(keyed)
            key: list = [prim, options, option_types]
            break
    else:  # every option its default (the common call): no option to hash
        key = [prim]
    for x in operands:
        if type(x) is not NkiTensor or x._indirect is not None:
            return None
        lay = x._layout
        root = lay if lay.base is None else lay.root
        dt = lay.dtype
        key += (root.buffer, root.kind, lay is root, dt, dt.metadata is None, x.shape, x.strides)
    return tuple(key)


# option types whose equality is exact (a float's is not: -0.0 == 0.0, nan != nan); enum
# members and operator functions compare by identity
_BY_VALUE = frozenset(
    {type(None), bool, int, str, types.FunctionType, types.BuiltinFunctionType, np.ufunc}
    | {engine, oob_mode, dge_mode, matmul_perf_mode, reduce_cmd}
)


def _option_key(v):
    """An option as a key: itself when its type compares exactly; a float, a numpy scalar or
    a tuple of plain numbers and strings by its repr (which tells -0.0 from 0.0);
    ``_UNKEYED`` for anything else: a nan (every nan has one repr, not one payload), an
    object whose repr may be its address, which a later object can take."""
    t = type(v)
    if t in _BY_VALUE or isinstance(v, enum.Enum):
        return v
    if t is float or isinstance(v, np.generic):
        return (t, repr(v)) if v == v else _UNKEYED  # a nan's payload is not in its repr
    if t is tuple and all(type(x) in _PLAIN_ITEMS and x == x for x in v):
        return (t, repr(v))
    return _UNKEYED


_PLAIN_ITEMS = frozenset({type(None), bool, int, float, str})
_UNKEYED = object()


def _again(kind: tuple | None, operands: tuple, labels: tuple):
    """For a call of ``kind`` accepted before in this trace: (the builder, a copy of that
    call's attributes, the accesses of ``operands``, the user's line, the op's inputs that are
    constants of the kind or None), for :func:`_append`; None when the kind is new (the caller
    checks the call, then :func:`_remember` s it).  ``labels`` name each operand in an
    access error, as the checking path does."""
    if kind is None:
        return None
    b = maybe_current()
    seen = None if b is None else b.accepted.get(kind)
    if seen is None:
        return None
    loc = caller_loc()
    accesses = [x._access or access_of(x, loc, what) for x, what in zip(operands, labels)]
    return b, dict(seen[0]), accesses, loc, seen[1]


def _append(prim: str, again: tuple) -> NkiInstruction:
    """The op :func:`_again` prepared, appended; its handle."""
    b, attrs, accesses, loc, consts = again
    if consts is None:  # the op's tiles are the operands, the output first
        ins = accesses[1:]
    else:  # the recorded inputs that were no operand (a scalar from an option) in place
        rest = iter(accesses[1:])
        ins = [next(rest) if c is _OPERAND else c for c in consts]
    return _done(b.append(prim, accesses[:1], ins, attrs, None, loc))


_OPERAND = object()  # in a remembered op's inputs: the next operand's access


def _call(prim: str, kind, operands: tuple, labels: tuple, checked, *args) -> NkiInstruction:
    """A call of ``prim`` on ``operands`` (its output, then its inputs): appended as the
    remembered call of its ``kind`` was, or ``checked(*args)`` and remembered."""
    again = _again(kind, operands, labels)
    if again is not None:
        return _append(prim, again)
    state = _before()
    return _remember(kind, checked(*args), operands, state)


def _remember(kind: tuple | None, handle: NkiInstruction, operands: tuple, state):
    """Remember that a call of ``kind`` on ``operands`` (its output first) passed its checks,
    when it emitted one op (``state``: the trace's instruction count and the process's
    warning count before the call), warned of nothing, and the op's tiles are its operands'
    own accesses in order (no view re-expressed); ``handle``."""
    if kind is None:
        return handle
    b = current()  # the call was traced: a builder is there
    op = handle.op
    if (
        b.instructions != state[0] + 1
        or errors.warnings_issued != state[1]
        or op.mask is not None
        or len(op.outs) != 1
        or op.outs[0] is not operands[0]._access
    ):
        return handle
    # the op's inputs: the other operands' accesses in order, and constants of the kind (the
    # scalars an option gave); ``consts`` None when they are just the operands
    consts: list | None = []
    n = 1
    for a in op.ins:
        if type(a) is Access:
            if n == len(operands) or a is not operands[n]._access:
                return handle
            consts.append(_OPERAND)
            n += 1
        else:
            consts.append(a)
    if n != len(operands):
        return handle
    if len(consts) == n - 1:
        consts = None
    b.accepted[kind] = (dict(op.attrs), consts)
    return handle


def _before() -> tuple[int, int]:
    """The state :func:`_remember` compares with: instructions traced, warnings issued."""
    b = maybe_current()
    return (0 if b is None else b.instructions), errors.warnings_issued


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def _memory_limit_mb() -> float:
    env = os.environ.get("NKIKIT_MEMORY_LIMIT_MB")
    if env:
        return float(env)
    try:
        return 0.4 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (OSError, ValueError):
        return float("inf")


_ENGINE_UNKNOWN = engine.unknown


def _engine_arg(e, op: str, loc: SourceLoc) -> str | None:
    """The engine name an ``engine=`` argument (an ``nisa.engine`` member) asks for; None for
    ``engine.unknown`` (the instruction's default).  The emit layer checks that the
    instruction runs there."""
    if e is _ENGINE_UNKNOWN or e is None:
        return None
    if not isinstance(e, engine):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"engine must be an nisa.engine member, got {e!r}",
        )
    if e == engine.unknown:
        return None
    return _ENGINE_NAMES[e]


def _unsupported(api: str, why: str, loc: SourceLoc):
    return NkiError("err_unsupported_api", loc, api=api, why=why)


def _dst_chip(dst: NkiTensor, loc: SourceLoc, op: str, allowed=("sbuf", "psum")) -> None:
    if type(dst) is NkiTensor and dst._layout.root.buffer in allowed:
        return
    require_tensor(dst, loc, f"nisa.{op}", "dst")
    if dst.tensor.buffer not in allowed:
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=f"nisa.{op}",
            what="dst",
            allowed=" or ".join(a.upper() for a in allowed),
            got=dst.tensor.buffer,
        )


# -- PSUM accumulation state ---------------------------------------------------------------------
# nc_matmul(accumulate=None): the first matmul write to a PSUM element since it was allocated
# overwrites, later ones add [NKI 0.x ISA, nc_matmul].  Loops unroll at trace time, so which
# elements a matmul wrote is known exactly: one boolean per PSUM element.


def _elements(x: Access) -> np.ndarray:
    """Flat storage element numbers of a (direct) access."""
    shape = x.shape
    grids = np.indices(shape, sparse=True)
    env = {Axis(k): g for k, g in enumerate(grids)}
    t = x.tensor
    flat = 0
    for a, stride in zip(x.index, _row_major(t.shape)):
        flat = flat + np.asarray(a.evaluate(env)) * stride
    return np.broadcast_to(np.asarray(flat), shape).ravel()


def _row_major(shape):
    out = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        out[k] = out[k + 1] * shape[k + 1]
    return out


def _region(x: Access) -> tuple:
    """(layout uid, index, shape, per-dimension bounding box, access) of a PSUM access."""
    last = _LAST_REGION
    if last[0] is x:  # a matmul asks for its destination's region twice (written before? write)
        return last[1]
    r = _region_of(x)
    globals()["_LAST_REGION"] = (x, r)  # one tuple: replaced at once, never half-updated
    return r


_LAST_REGION: tuple = (None, None)  # (access, its region) of the last _region call


def _region_of(x: Access) -> tuple:
    shape = x.shape
    box = []
    for a in x.index:
        # Affine.bounds over the tile axes, inlined (an unrolled kernel asks per instruction)
        lo = hi = a.const
        for s, c in a.terms:
            top = c * (shape[s.k] - 1) if type(s) is Axis else None
            if top is None:
                ranges = {Axis(k): n for k, n in enumerate(shape)}
                return (x.tensor.uid, x.index, shape, tuple(a.bounds(ranges) for a in x.index), x)
            if top < 0:
                lo += top
            else:
                hi += top
        box.append((lo, hi))
    return (x.tensor.uid, x.index, shape, tuple(box), x)


def _may_overlap(r: tuple, q: tuple) -> bool:
    if r[0] != q[0]:
        return True  # views in different layouts: compare element by element
    return all(lo1 <= hi2 and lo2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(r[3], q[3]))


def _psum_writes(t) -> list:
    """The writes into PSUM tensor ``t`` so far, latest last: (region, by_matmul).  Regions,
    not element masks: an unrolled kernel allocates a PSUM tile per step, and a mask per tile
    would keep every one of them alive."""
    d = current().__dict__
    psum = d.get("_nki_psum")
    if psum is None:
        psum = d["_nki_psum"] = {}
    writes = psum.get(t.uid)
    if writes is None:
        writes = psum[t.uid] = []
    return writes


def _matmul_written(d: Access):
    """Whether each element of ``d`` was last written by a matmul: True or False when all
    elements agree, else the per-element mask; None when a write through a runtime offset
    (tensor indirection) may have touched it since (unknown until run time)."""
    q = _region(d)
    writes = [(r, m) for r, m in _psum_writes(d.tensor.root) if _may_overlap(r, q)]
    if not writes:
        return False
    if any(m is None for _, m in writes):
        return None
    if all(r[:3] == q[:3] for r, _ in writes):
        return writes[-1][1]  # the same region written before: its last writer decides
    mine = _elements(d)
    # each element of ``mine`` by value, at the last position it takes there; found per write
    # by a binary search (element by element in Python, a large tile against many writes
    # made tracing a flash-attention backward kernel take seconds)
    rev = mine[::-1]
    elems, first_rev = np.unique(rev, return_index=True)
    last_pos = len(mine) - 1 - first_rev
    state = np.zeros(mine.shape, dtype=bool)
    for r, m in writes if len(elems) else ():
        e = _elements(r[4])
        k = np.minimum(np.searchsorted(elems, e), len(elems) - 1)
        state[last_pos[k[elems[k] == e]]] = m
    return True if state.all() else False if not state.any() else state


def _psum_written(outs, by_matmul: bool) -> None:
    for o in outs:
        if not isinstance(o, Access) or o.tensor.root.buffer != "psum":
            continue
        if o.indirect is not None:
            # a runtime-offset write (tensor indirection) may land on any element of the
            # tensor: whether a later matmul there overwrites or adds is unknown (None) until
            # a write of known extent covers it again
            root = o.tensor.root
            _psum_writes(root).append((_region_of(Access.whole(root)), None))
        else:
            writes = _psum_writes(o.tensor.root)
            q = _region(o)
            if writes:
                # a write of the same region supersedes the earlier one
                key = q[:3]
                writes[:] = [w for w in writes if w[0][:3] != key]
            writes.append((q, by_matmul))


# -- DMA -----------------------------------------------------------------------------------------


def _dma_pair(dst: NkiTensor, src: NkiTensor, loc: SourceLoc, op: str) -> tuple[Access, Access]:
    if type(dst) is not NkiTensor or type(src) is not NkiTensor:
        require_tensor(dst, loc, f"nisa.{op}", "dst")
        require_tensor(src, loc, f"nisa.{op}", "src")
    _nonempty((dst, src), loc, f"{op} dst", f"{op} src")  # before shapes are matched
    same = dst.shape == src.shape
    if not same and dst.size != src.size:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"src and dst must have the same number of elements, got src={src.size} ({src.shape}), dst={dst.size} ({dst.shape})",
        )
    if src.tensor.buffer == "psum":
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=f"nisa.{op}",
            what="src",
            allowed="HBM or SBUF (copy PSUM with nisa.tensor_copy)",
            got="psum",
        )
    if dst.tensor.buffer == "psum":
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=f"nisa.{op}",
            what="dst",
            allowed="HBM or SBUF",
            got="psum",
        )
    if same:  # the common case: nothing to re-express
        return access_of(dst, loc, f"{op} dst"), access_of(src, loc, f"{op} src")
    views = [dst, src]
    if dst.shape[0] == src.shape[0] and (dst.on_chip or src.on_chip):
        views = _same_free(views, loc, f"nisa.{op}")
    else:
        full = _chain([tuple(n for n in v.shape if n != 1) for v in views])
        if full is None and not (dst.on_chip or src.on_chip):
            if dst.is_contiguous() and src.is_contiguous():
                # two unbroken runs of HBM: element i of one is element i of the other
                flat = [v.reshape((v.size,)) for v in views]
                return _acc(flat[0], loc, f"{op} dst"), _acc(flat[1], loc, f"{op} src")
        if full is None:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=f"nisa.{op}",
                why=f"src {src.shape} and dst {dst.shape} cannot be matched element by element",
            )
        views = [_refine(v, full, 0) for v in views]
        chip = dst if dst.on_chip else src if src.on_chip else None
        if chip is not None and chip.shape[0] == 1:
            # one partition: keep the on-chip side's partition axis (size 1) in front
            views = [v._with((1, *v.shape), (0, *v.strides)) for v in views]
            views[chip is src] = _refine(chip, full, 1)
    return _acc(views[0], loc, f"{op} dst"), _acc(views[1], loc, f"{op} src")


_OOB_ERROR = oob_mode.error


def dma_copy(
    dst,
    src,
    priority=None,
    oob_mode=oob_mode.error,
    dge_mode=dge_mode.unknown,
    engine=engine.unknown,  # noqa: A002 - NKI's name
    name=None,
) -> NkiInstruction:
    """``dst = src`` on the DMA engines (HBM/SBUF both ways; no PSUM source).  The element
    counts must match; differing dtypes convert through fp32.  With ``oob_mode.skip`` a gather
    or scatter (``.ap(vector_offset=...)`` / ``scalar_offset``) leaves out the elements whose
    runtime index is outside the indexed tensor: their destination keeps its old value.
    ``priority``, ``dge_mode`` and ``engine`` are checked (:func:`_dma_options`) and change
    nothing a simulation computes."""
    options = (priority, oob_mode, dge_mode, engine)
    kind = _kind("dma_copy", options, _DMA_DEFAULTS, (dst, src))
    operands = (dst, src)
    return _call("dma_copy", kind, operands, _DMA_LABELS, _dma_copy, *operands, *options)


_DMA_LABELS = ("dma_copy dst", "dma_copy src")
_DMA_DEFAULTS = dma_copy.__defaults__[:4]  # priority, oob_mode, dge_mode, engine


def _dma_copy(dst, src, priority, oob_mode, dge_mode, engine) -> NkiInstruction:  # noqa: A002
    """``dma_copy``, checked."""
    loc = caller_loc()
    mode = _dma_options("dma_copy", loc, priority, dge_mode, engine)
    if (
        mode is _DGE.hwdge
        and isinstance(dst, NkiTensor)
        and isinstance(src, NkiTensor)
        and dtypes.name(dst.dtype) != dtypes.name(src.dtype)
    ):
        # the hardware DGE moves bytes: only the software paths convert through fp32
        # [reference/nki-0x.md §4.1 dma_copy, NKI 0.3 migration]
        raise _invalid(
            "dma_copy",
            f"with dge_mode=nisa.dge_mode.hwdge src and dst must have one dtype, got "
            f"src {dtypes.name(src.dtype)} and dst {dtypes.name(dst.dtype)}: the hardware DGE "
            "does not convert (leave dge_mode to the compiler, or .view() to reinterpret)",
            loc,
        )
    if oob_mode is _OOB_ERROR:
        skip = False
    else:
        indirect = (isinstance(dst, NkiTensor) and dst._indirect is not None) or (
            isinstance(src, NkiTensor) and src._indirect is not None
        )
        # without a runtime index nothing can be out of bounds, so skip changes nothing there
        skip = _oob_skip(oob_mode, loc, "dma_copy") and indirect
    d, s = _dma_pair(dst, src, loc, "dma_copy")
    return _done(E.emit_dma_copy(d, s, oob_skip=skip, loc=loc))


_DGE = dge_mode
_DMA_QUEUES = (engine.sync, engine.scalar)  # the sequencers that trigger a hardware DGE


def _dma_options(op: str, loc: SourceLoc, priority, dge, eng=None) -> dge_mode:
    """The ``dge_mode`` a DMA asks for, its options checked against the ISA's ``dma_copy`` /
    ``dma_transpose`` pages [reference/nki-0x.md §4.1, §4.3] (``err_invalid_argument`` at the
    kernel's line): ``dge_mode`` an ``nisa.dge_mode`` member or its NKI 0.x number (the NKI
    Library passes ``dge_mode=2`` and ``3``), ``hwdge`` on NeuronCore-v3+ only; ``engine``
    (dma_copy) ``unknown``, or ``sync`` / ``scalar`` -- the sequencer that triggers a hardware
    DGE -- with ``dge_mode=hwdge`` only; ``priority`` None or 0-3 (lower is more urgent).
    Whether ``priority`` is refused or ignored before NC-v4, which alone honours it, the
    reference does not say: it is not checked per generation."""
    if isinstance(dge, _DGE):
        mode = dge
    elif type(dge) is int or isinstance(dge, np.integer):
        mode = _DGE(int(dge)) if 0 <= dge <= 3 else None
    else:
        mode = None  # a string, a float, another enum (Beta 1's dge_mode numbers differ)
    if mode is None:
        other = " (another enum's numbers, e.g. Beta 1's)" if isinstance(dge, enum.Enum) else ""
        raise _invalid(
            op,
            "dge_mode must be an nisa.dge_mode member (unknown, swdge, hwdge, none) or its "
            f"number 0-3, got {dge!r}{other}",
            loc,
        )
    if mode is _DGE.hwdge and int(get_nc_version().value) < 3:
        raise _invalid(
            op,
            "dge_mode=nisa.dge_mode.hwdge needs NeuronCore-v3 or later (trn2, trn3), the "
            f"target is {get_nc_version().name}",
            loc,
        )
    if eng is not None and eng is not _ENGINE_UNKNOWN:
        if not isinstance(eng, engine) or eng not in _DMA_QUEUES:
            raise _invalid(
                op,
                "engine must be nisa.engine.unknown, or nisa.engine.sync / "
                f"nisa.engine.scalar with dge_mode=nisa.dge_mode.hwdge, got {_shown(eng)}",
                loc,
            )
        if mode is not _DGE.hwdge:
            raise _invalid(
                op,
                f"engine={_shown(eng)} picks the sequencer of a hardware DGE transfer: it "
                f"needs dge_mode=nisa.dge_mode.hwdge, got {_shown(mode)}",
                loc,
            )
    if priority is not None and not (
        (type(priority) is int or isinstance(priority, np.integer)) and 0 <= priority <= 3
    ):
        raise _invalid(op, f"priority must be None or 0-3, got {priority!r}", loc)
    return mode


def _shown(x) -> str:
    """An argument as the kernel spells it: ``nisa.engine.sync`` for an enum member."""
    if isinstance(x, enum.Enum):
        return f"nisa.{type(x).__name__}.{x.name}"
    return repr(x)


def _oob_skip(mode, loc: SourceLoc, op: str) -> bool:
    """Whether an ``oob_mode=`` argument asks to skip out-of-bounds transfers."""
    try:
        return globals()["oob_mode"](mode) == globals()["oob_mode"].skip
    except ValueError:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"oob_mode must be nisa.oob_mode.error or nisa.oob_mode.skip, got {mode!r}",
        ) from None


def dma_compute(
    dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None
) -> NkiInstruction:
    """``dst = srcs[0] + srcs[1] + ...`` on the DMA compute engine (only ``nl.add``).  The
    NKI 0.2 argument order ``(dst, srcs, scales, reduce_op)`` is recognised too."""
    loc = caller_loc()
    _flags("dma_compute", loc, unique_indices=unique_indices)
    if isinstance(reduce_op, list | tuple) and (scales is None or callable(scales)):
        reduce_op, scales = scales, reduce_op  # 0.2's order: scales before reduce_op
    if op_name(reduce_op) != "add":
        raise NkiError(
            "err_invalid_argument", loc, op="nisa.dma_compute", why="reduce_op must be nl.add"
        )
    if scales is not None and any(
        _number(s, loc, "dma_compute", "scales are numbers") != 1.0 for s in scales
    ):
        raise NkiError(
            "err_invalid_argument", loc, op="nisa.dma_compute", why="every scale must be 1.0"
        )
    if isinstance(srcs, NkiTensor) or not isinstance(srcs, list | tuple) or not srcs:
        raise _invalid(
            "dma_compute", f"srcs must be a non-empty list of tensors, got {srcs!r}", loc
        )
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_compute",
            why=f"srcs holds 1 to 16 tensors, got {len(srcs)}",
        )
    skip = _oob_skip(oob_mode, loc, "dma_compute")

    def indirect(*xs) -> bool:
        return skip and any(isinstance(x, NkiTensor) and x.is_indirect() for x in xs)

    others = [s for s in srcs if not (isinstance(s, NkiTensor) and _same_view(s, dst))]
    if len(others) == len(srcs):
        d, s0 = _dma_pair(dst, others[0], loc, "dma_compute")
        _done(E.emit_dma_copy(d, s0, oob_skip=indirect(dst, others[0]), loc=loc))
        others = others[1:]
    last = None
    for s in others:
        d, sa = _dma_pair(dst, s, loc, "dma_compute")
        last = _done(E.emit_dma_copy(d, sa, rmw_op=reduce_op, oob_skip=indirect(dst, s), loc=loc))
    return last


def _same_view(a: NkiTensor, b: NkiTensor) -> bool:
    return (
        a.tensor is b.tensor
        and a.shape == b.shape
        and a.strides == b.strides
        and a.offset == b.offset
        and a._indirect is None
        and b._indirect is None
    )


def dma_transpose(
    dst,
    src,
    axes=None,
    priority=None,
    dge_mode=dge_mode.unknown,
    oob_mode=oob_mode.error,
    name=None,
) -> NkiInstruction:
    """``dst = src`` with its axes permuted (``axes[i]`` is the source axis that becomes dst
    axis i; default: reversed).  ``dst`` is SBUF and has the permuted shape exactly."""
    loc = caller_loc()
    mode = _dma_options("dma_transpose", loc, priority, dge_mode)
    _dst_chip(dst, loc, "dma_transpose", ("sbuf",))
    require_tensor(src, loc, "nisa.dma_transpose", "src")
    if axes is not None and not isinstance(axes, list | tuple):
        raise _invalid("dma_transpose", f"axes must be a tuple of ints, got {axes!r}", loc)
    axes = (
        _default_transpose_axes(src.ndim)
        if axes is None
        else tuple(_index(a, "nisa.dma_transpose", loc, none=False) for a in axes)
    )
    if sorted(axes) != list(range(src.ndim)) or axes == tuple(range(src.ndim)):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_transpose",
            why=f"axes must permute the {src.ndim} dimensions of src (e.g. {tuple(range(src.ndim - 1, -1, -1))}), got {axes}",
        )
    if src.dtype != dst.dtype:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_transpose",
            why=f"src and dst dtypes must match, got {dtypes.name(src.dtype)} and {dtypes.name(dst.dtype)}",
        )
    shape = tuple(src.shape[a] for a in axes)
    if shape != dst.shape:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_transpose",
            why=f"dst shape {dst.shape} must be the permuted src shape {shape} (axes {axes})",
        )
    skip = oob_mode is not _OOB_ERROR and _oob_skip(oob_mode, loc, "dma_transpose")
    if skip and not src.is_indirect():
        # "Only valid when src uses indirect indexing" [ISA dma_transpose oob_mode]
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_transpose",
            why="oob_mode=nisa.oob_mode.skip is only valid when src uses indirect indexing "
            "(.ap(vector_offset=...) or scalar_offset=...)",
        )
    if not src.is_indirect():
        if mode is _DGE.hwdge:
            _check_hwdge_transpose(src, loc)
        permuted = src._with(shape, [src.strides[a] for a in axes])
        s = _acc(permuted, loc, "dma_transpose src")
        d = _acc(dst, loc, "dma_transpose dst")
        return _done(E.emit_dma_copy(d, s, oob_skip=skip, loc=loc))
    # a gather-transpose (``.ap(vector_offset=)`` on HBM): the rows are gathered along src's
    # axis 0 and land on dst axis ``axes.index(0)`` [nki-0x.md §4.3 dma_transpose, "Indirect
    # transpose"]; the gathered access with its tile axes renamed.  A (128, N) index gathers
    # row ``idx[i % 128, i // 128]`` for element i (column-major): one DMA per column.
    if src._indirect[2] == "vector":
        _check_gather_transpose(src, mode, loc)
    op = None
    for sub_src, sub_dst in _gather_columns(src, dst, axes.index(0), loc):
        s = _acc(sub_src, loc, "dma_transpose src")
        s = s.remap(sub_dst.shape, {Axis(a): Affine.of(Axis(i)) for i, a in enumerate(axes)})
        d = _acc(sub_dst, loc, "dma_transpose dst")
        op = E.emit_dma_copy(d, s, oob_skip=skip, loc=loc)
    return _done(op)


def _check_hwdge_transpose(src: NkiTensor, loc: SourceLoc) -> None:
    """A direct ``dma_transpose`` with ``dge_mode=hwdge`` (a Hardware DGE transpose)
    [ISA dma_transpose, "DMA Direct Transpose Constraints"; nki-0x.md §4.3]: 2-D
    ``src.shape[0] == 16``; 3-D/4-D ``src.shape[0]`` in {1, 2, 4, 8, 16} and
    ``src.shape[0] * src.shape[-2]`` a multiple of 16; ``src.shape[-1] <= 128``; a 2-byte
    dtype."""
    sh = tuple(src.shape)
    why = None
    if src.ndim == 2 and sh[0] != 16:
        why = f"a 2-D source needs src.shape[0] == 16, got {sh}"
    elif src.ndim > 2 and (sh[0] not in (1, 2, 4, 8, 16) or (sh[0] * sh[-2]) % 16):
        why = (
            "a 3-D/4-D source needs src.shape[0] in {1, 2, 4, 8, 16} and "
            f"src.shape[0] * src.shape[-2] a multiple of 16, got {sh}"
        )
    elif sh[-1] > 128:
        why = f"src.shape[-1] must be at most 128, got {sh}"
    elif src.dtype.itemsize != 2:
        why = f"the dtype must be 2 bytes, got {dtypes.name(src.dtype)}"
    if why is not None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_transpose",
            why=f"dge_mode=nisa.dge_mode.hwdge (a Hardware DGE transpose): {why}",
        )


def _check_gather_transpose(src: NkiTensor, dge: dge_mode, loc: SourceLoc) -> None:
    """The documented limits of an indirect ``dma_transpose`` (a Software DGE
    ``dma_gather_transpose``) [ISA dma_transpose, "DMA Indirect Transpose Constraints";
    nki-0x.md §4.3]: ``dge_mode`` unknown or swdge; a 2-byte dtype; ``src.shape[0]`` a
    multiple of 16; ``src.shape[-1] <= 128``; a 4-D src with ``shape[1]`` or ``shape[2]``
    of 1; a 2-D uint32 index in SBUF with 16 to 128 partitions, a multiple of 16 (that it
    covers src's rows is checked by ``_gather_columns`` and the access).  Runs once per gather-transpose, not per element."""
    index = src._indirect[0]
    why = None
    if dge not in (_DGE.unknown, _DGE.swdge):
        why = f"an indirect (vector_offset) transpose runs on the Software DGE: dge_mode must be nisa.dge_mode.unknown or nisa.dge_mode.swdge, got {dge.name}"
    elif src.dtype.itemsize != 2:
        why = f"an indirect (vector_offset) transpose moves 2-byte elements only, got {dtypes.name(src.dtype)} (bfloat16/float16/int16/uint16)"
    elif src.shape[0] % 16:
        why = f"an indirect (vector_offset) transpose gathers a multiple of 16 rows: src.shape[0] must be divisible by 16, got {tuple(src.shape)}"
    elif src.shape[-1] > 128:
        why = f"an indirect (vector_offset) transpose needs src.shape[-1] <= 128, got {tuple(src.shape)}"
    elif src.ndim == 4 and src.shape[1] != 1 and src.shape[2] != 1:
        why = f"a 4-D indirect (vector_offset) transpose needs src.shape[1] or src.shape[2] to be 1, got {tuple(src.shape)}"
    elif index.ndim != 2 or index.shape[0] % 16 or not 16 <= index.shape[0] <= 128:
        why = f"the vector_offset index of an indirect transpose must be 2-D with 16 to 128 partitions, a multiple of 16, got {tuple(index.shape)}"
    elif dtypes.name(index.dtype) != "uint32":
        why = f"the vector_offset index of an indirect transpose must be uint32, got {dtypes.name(index.dtype)}"
    elif index._layout.root.buffer != "sbuf":
        why = f"the vector_offset index of an indirect transpose must be in SBUF, got {index._layout.root.buffer}"
    if why is not None:
        raise NkiError("err_invalid_argument", loc, op="nisa.dma_transpose", why=why)


def _gather_columns(src: NkiTensor, dst: NkiTensor, axis: int, loc: SourceLoc):
    """``(src, dst)`` of a gather-transpose, one pair per column of a 2-D (128, N) index
    (``flat = idx.T.flatten()[:src.shape[0]]``): column c gathers src rows c*128 ... into
    dst along ``axis``; an index with one column is one pair."""
    index, dim, kind, base = src._indirect
    cols = index.size // max(index.shape[0], 1)
    n = src.shape[0]
    if kind == "vector" and cols == 1 and index.shape[0] > n:
        # a taller one-column index: its first n rows are read (``indices.T.flatten()[:n]``)
        part = NkiTensor._view(
            src._layout, src.shape, src.strides, src.offset, (index[0:n], dim, kind, base)
        )
        yield part, dst
        return
    if kind != "vector" or cols == 1:
        yield src, dst
        return
    if index.ndim != 2 or index.shape[0] != 128 or 128 * cols < n:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.dma_transpose src vector_offset",
            why=f"an index with several columns must be (128, N) with 128 * N >= {n} gathered "
            f"rows, got {tuple(index.shape)}",
        )
    for c in range(-(-n // 128)):
        rows = min(128, n - 128 * c)
        part = NkiTensor._view(
            src._layout,
            (rows, *src.shape[1:]),
            src.strides,
            src.offset,
            (index[0:rows, c : c + 1], dim, kind, base),
        )
        key = tuple(
            slice(128 * c, 128 * c + rows) if k == axis else slice(None) for k in range(dst.ndim)
        )
        yield part, dst[key]


def _default_transpose_axes(ndim: int) -> tuple[int, ...]:
    """``dma_transpose``'s permutation when ``axes`` is not given: 2-D ``(1, 0)``, 3-D
    ``(2, 1, 0)``, 4-D ``(3, 1, 2, 0)`` (the middle axes keep their order) [nki-0x.md §4.3]."""
    if ndim == 4:
        return (3, 1, 2, 0)
    return tuple(range(ndim - 1, -1, -1))


# -- copies and fills ------------------------------------------------------------------------------


def tensor_copy(dst, src, engine=engine.unknown, name=None, dtype=None) -> NkiInstruction:  # noqa: A002
    """Copy (and convert) an on-chip tensor on the Vector, Scalar or GpSimd engine into
    ``dst``'s dtype.  ``dtype`` is a pre-0.2 argument the NKI tutorials still pass (e.g.
    ``dtype=result.dtype`` into an fp32 tile); NKI accepts it and the destination's dtype
    decides the result, so it must name a dtype and changes nothing."""
    kind = (
        None if dtype is not None else _kind("tensor_copy", (engine,), _COPY_DEFAULTS, (dst, src))
    )
    return _call(
        "tensor_copy", kind, (dst, src), _COPY_LABELS, _tensor_copy, dst, src, engine, dtype
    )


_COPY_LABELS = ("tensor_copy", "tensor_copy")
_COPY_DEFAULTS = tensor_copy.__defaults__[:1]  # engine


def _tensor_copy(dst, src, engine, dtype) -> NkiInstruction:  # noqa: A002
    """``tensor_copy``, checked."""
    loc = caller_loc()
    _dst_chip(dst, loc, "tensor_copy")
    if dtype is not None:
        _as_dtype(dtype, loc, "nisa.tensor_copy")  # a dtype, or the usual error
    eng = _engine_arg(engine, "tensor_copy", loc)
    d, s = _tiles(loc, "tensor_copy", dst, src)
    return _done(E.emit_tensor_copy(d, s, engine=eng, loc=loc))


# predicate dtypes [ISA tensor_copy_predicated, select_reduce]; nl.bool_ is a one-byte
# integer tile too (nkikit's torch code generator writes bool predicates)
_PRED_COPY = frozenset({"uint8", "uint16", "uint32", "bool"})
_PRED_SELECT = frozenset({"int8", "uint8", "int16", "uint16", "bool"})


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None) -> NkiInstruction:
    """``dst = src where predicate != 0`` (``reverse_pred``: where it is 0); elsewhere ``dst``
    keeps its value (VectorE).  ``predicate`` uint8/uint16/uint32, ``src`` in ``dst``'s
    dtype, ``src`` and ``predicate`` not both in PSUM [ISA tensor_copy_predicated]."""
    return _copy_predicated(dst, src, predicate, reverse_pred, caller_loc(), strict=True)


def _copy_predicated(dst, src, predicate, reverse_pred, loc: SourceLoc, strict: bool):
    """``tensor_copy_predicated``; ``strict=False`` (``nl.where``, whose condition and
    operands may be of any dtype) skips its dtype and memory rules."""
    _flags("tensor_copy_predicated", loc, reverse_pred=reverse_pred)
    _dst_chip(dst, loc, "tensor_copy_predicated")
    if isinstance(src, NkiTensor):
        d, s, p = _tiles(loc, "tensor_copy_predicated", dst, src, predicate)
        if strict:
            if s.dtype is not d.dtype and dtypes.name(s.dtype) != dtypes.name(d.dtype):
                raise _invalid(
                    "tensor_copy_predicated",
                    f"src and dst must share a dtype, got {dtypes.name(s.dtype)} and "
                    f"{dtypes.name(d.dtype)}",
                    loc,
                )
            _not_both_psum(s, p, "tensor_copy_predicated", "src and predicate", loc)
    else:
        s = _number(
            src, loc, "tensor_copy_predicated", "src is a tensor or a number", or_tensor=True
        )
        d, p = _tiles(loc, "tensor_copy_predicated", dst, predicate)
    if strict:
        _dtype_in(p, _PRED_COPY, "tensor_copy_predicated", "predicate", loc)
    on_true, on_false = (d, s) if reverse_pred else (s, d)
    return _done(E.emit_select(d, p, on_true, on_false, loc=loc))


def memset(dst, value, engine=engine.unknown, name=None) -> NkiInstruction:  # noqa: A002
    """Fill ``dst`` with the compile-time constant ``value`` (which must suit dst's dtype)."""
    kind = _kind("memset", (value, engine), _NO_DEFAULTS, (dst,))
    return _call("memset", kind, (dst,), ("memset",), _memset, dst, value, engine)


def _memset(dst, value, engine) -> NkiInstruction:  # noqa: A002
    """``memset``, checked."""
    loc = caller_loc()
    _dst_chip(dst, loc, "memset")
    v = _number(value, loc, "memset", "value is a number")
    if dtypes.is_int(dst.dtype) and not (v.is_integer() and _int_range(dst.dtype, v)):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.memset",
            why=f"value {value!r} does not fit the integer dtype {dtypes.name(dst.dtype)}",
        )
    eng = _engine_arg(engine, "memset", loc)
    d = _acc(dst, loc, "memset")
    return _done(E.emit_memset(d, value=value, engine=eng, loc=loc))


def _int_range(dt: np.dtype, v: float) -> bool:
    """Whether the integral ``v`` is a value of the integer (or bool) dtype ``dt``."""
    info = np.iinfo(dt) if dt.kind in "iu" else np.iinfo(np.uint8)  # bool: as a byte
    return info.min <= v <= info.max


def _pattern_views(views: list[NkiTensor], pattern, offset, channel_multiplier, loc, op: str):
    """``views`` re-expressed in one shape refining the iota-style access ``pattern``
    (``[[step, num], ...]`` over the free elements), and the affine value
    ``offset + partition * channel_multiplier + sum(step * index)`` in that shape's axes."""
    pairs = _pattern_pairs(pattern, loc, f"nisa.{op}")
    _nonempty(views, loc, f"nisa.{op}")
    counts = tuple(n for _, n in pairs)
    per_partition = views[0].size // views[0].shape[0]
    if math.prod(counts) != per_partition:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"the pattern covers {math.prod(counts)} elements per partition, dst has {per_partition}",
        )
    if isinstance(offset, NkiTensor) or isinstance(channel_multiplier, NkiTensor):
        raise _unsupported(f"nisa.{op} with a runtime offset", "offsets must be ints", loc)
    for v in (offset, channel_multiplier):
        _number(v, loc, op, "offset and channel_multiplier are ints", int)
    free = [tuple(n for n in counts if n != 1)] + [
        tuple(n for n in v.shape[1:] if n != 1) for v in views
    ]
    refined = _chain(free)
    if refined is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=f"nisa.{op}",
            why=f"the pattern counts {counts} cannot be matched to the free shape {views[0].shape[1:]}",
        )
    # coefficient of each refined axis: the step of the pattern dim it belongs to, times the
    # extent of the finer refined axes inside that pattern dim
    coefs = [st for _, st in _split_dims([(n, step) for step, n in pairs], refined)]
    expr = Affine.of(int(offset)) + Affine.of(Axis(0)) * int(channel_multiplier)
    for k, c in enumerate(coefs):
        expr = expr + Affine.of(Axis(k + 1)) * c
    return [_refine(v, refined, 1) for v in views], expr


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None) -> NkiInstruction:
    """``dst[c, w, z, y, x] = offset + c * channel_multiplier + sum(step * index)`` over the
    access ``pattern`` (``[[step, num], ...]``), computed in int32 (GpSimd)."""
    loc = caller_loc()
    _dst_chip(dst, loc, "iota")
    (view,), expr = _pattern_views([dst], pattern, offset, channel_multiplier, loc, "iota")
    return _done(E.emit_iota(_acc(view, loc, "iota"), expr=expr, loc=loc))


_CMP = {
    "equal": "==",
    "not_equal": "!=",
    "greater": ">",
    "greater_equal": ">=",
    "less": "<",
    "less_equal": "<=",
}


def affine_select(
    dst,
    pattern,
    channel_multiplier,
    on_true_tile,
    on_false_value,
    cmp_op=None,
    offset=0,
    name=None,
) -> NkiInstruction:
    """``dst = on_true_tile where cmp_op(v, 0) else on_false_value``, ``v`` the iota-style
    value of ``pattern`` (``offset + partition * channel_multiplier + sum(step * index)``);
    ``cmp_op`` defaults to ``nl.equal`` (GpSimd, SBUF)."""
    loc = caller_loc()
    _dst_chip(dst, loc, "affine_select")
    require_tensor(on_true_tile, loc, "nisa.affine_select", "on_true_tile")
    cmp = _CMP.get(op_name("equal" if cmp_op is None else cmp_op))
    if cmp is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.affine_select",
            why=f"cmp_op must be a comparison (nl.equal, nl.greater_equal, ...), got {cmp_op!r}",
        )
    # on_false_value is an fp32 scalar [ISA affine_select]
    on_false_value = _number(
        on_false_value, loc, "affine_select", "on_false_value is a float32 scalar", or_tensor=True
    )
    _same_free([dst, on_true_tile], loc, "nisa.affine_select")
    (d, t), expr = _pattern_views(
        [dst, on_true_tile], pattern, offset, channel_multiplier, loc, "affine_select"
    )
    return _done(
        E.emit_affine_select(
            _acc(d, loc, "affine_select dst"),
            _acc(t, loc, "on_true_tile"),
            pred=Predicate(((expr, cmp),)),
            on_false=_number(on_false_value, loc, "affine_select", "on_false_value is a number"),
            loc=loc,
        )
    )


# -- TensorE -------------------------------------------------------------------------------------


def _flat2d(x: NkiTensor, loc: SourceLoc, what: str) -> Access:
    """A matmul operand as (partitions, free): its free dims flattened."""
    if type(x) is not NkiTensor:
        require_tensor(x, loc, "nisa.nc_matmul", what)
    ndim = len(x.shape) if type(x) is NkiTensor else x.ndim
    if ndim < 2:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why=f"{what} has shape {tuple(x.shape)}; a matmul operand is (partitions, free ...)",
        )
    if ndim > 2:
        try:
            x = x.flatten_dims(1, x.ndim - 1)
        except NkiError:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nisa.nc_matmul",
                why=f"{what}'s free dimensions {x.get_pattern()[1:]} must be contiguous to flatten",
            ) from None
    return _acc(x, loc, f"nc_matmul {what}")


_PERF_NONE = matmul_perf_mode.none


def nc_matmul(
    dst,
    stationary,
    moving,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    accumulate=None,
    tile_position=(),
    tile_size=(),
    perf_mode=matmul_perf_mode.none,
    name=None,
) -> NkiInstruction:
    """``dst = stationary.T @ moving`` on the TensorE (contraction over partitions) into PSUM,
    accumulating in fp32.  ``accumulate=None``: the first matmul write to a PSUM element
    overwrites, later ones add; ``True`` adds, ``False`` overwrites."""
    options = (
        is_stationary_onezero,
        is_moving_onezero,
        is_transpose,
        accumulate,
        tile_position,
        tile_size,
        perf_mode,
    )
    operands = (dst, stationary, moving)
    kind = _kind("nc_matmul", options, _MATMUL_DEFAULTS, operands)
    # ``_call``, inlined: a remembered matmul's accumulate is the trace's to decide (the
    # first-write-overwrites rule reads which PSUM elements matmuls wrote so far), and the
    # call layer costs a matmul per step a microsecond
    again = _again(kind, operands, _MATMUL_LABELS)
    if again is not None:
        again[1]["accumulate"] = resolve_accumulate(again[2][0], accumulate, again[3], "nc_matmul")
        return _append("nc_matmul", again)
    state = _before()
    return _remember(kind, _nc_matmul(*operands, options), operands, state)


_MATMUL_LABELS = ("nc_matmul dst", "nc_matmul stationary", "nc_matmul moving")
_MATMUL_DEFAULTS = nc_matmul.__defaults__[:7]  # every option but name


def _nc_matmul(dst, stationary, moving, options: tuple) -> NkiInstruction:
    """``nc_matmul``, checked (``options`` in its signature's order; the one-zero hints
    change nothing a simulation computes)."""
    onezero_s, onezero_m, is_transpose, accumulate, tile_position, tile_size, perf_mode = options
    loc = caller_loc()
    for label, v in (("is_stationary_onezero", onezero_s), ("is_moving_onezero", onezero_m)):
        E.flag(v, label, "nc_matmul", loc)
    is_transpose = E.flag(is_transpose, "is_transpose", "nc_matmul", loc)
    accumulate = E.flag(accumulate, "accumulate", "nc_matmul", loc, none=True)
    tile_position = _tile_pair(tile_position, "tile_position", "nc_matmul", loc)
    tile_size = _tile_pair(tile_size, "tile_size", "nc_matmul", loc)
    if not isinstance(perf_mode, matmul_perf_mode | str | int | None):
        raise _invalid(
            "nc_matmul",
            f"perf_mode must be a nisa.matmul_perf_mode, got {got_type(perf_mode)}",
            loc,
        )
    tiled = bool(tile_position or tile_size)
    _dst_chip(dst, loc, "nc_matmul")
    check_tensor_engine(
        "nc_matmul",
        loc,
        dst,
        moving,
        tiled=tiled,
        is_transpose=is_transpose,
        accumulate=accumulate,
        inputs=(stationary,),
    )
    if tiled:
        _check_tiling(tile_position, tile_size, stationary, loc)
    if perf_mode is not _PERF_NONE and perf_mode not in (None, _PERF_NONE, "none"):
        _check_double_row(stationary, moving, perf_mode, loc)
        # the two row halves' matmuls, the second accumulating into the first (fp32 in
        # PSUM), each marked so the cost model charges half a pass
        _matmul_into(dst, stationary[:, 0:1, :], moving[:, 0:1, :], accumulate, loc, "double_row")
        return _matmul_into(dst, stationary[:, 1:2, :], moving[:, 1:2, :], True, loc, "double_row")
    return _matmul_into(dst, stationary, moving, accumulate, loc)


def _matmul_into(dst, stationary, moving, accumulate, loc: SourceLoc, perf_mode=None):
    """One TensorE matmul of (flattened) operands into ``dst``, ``accumulate`` resolved by the
    first-write-overwrites rule when None."""
    s = _flat2d(stationary, loc, "stationary")
    m = _flat2d(moving, loc, "moving")
    want = (s.shape[1], m.shape[1])
    dview = dst
    if dst.shape != want:
        if dst.size != want[0] * want[1] or dst.shape[0] != want[0]:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nisa.nc_matmul",
                why=f"dst has shape {dst.shape}; stationary {stationary.shape} and moving {moving.shape} produce {want}",
            )
        dview = dst.flatten_dims(1, dst.ndim - 1) if dst.ndim > 2 else dst
    d = _acc(dview, loc, "nc_matmul dst")
    acc = resolve_accumulate(d, accumulate, loc, "nc_matmul")
    return _done(E.emit_nc_matmul(d, s, m, accumulate=acc, perf_mode=perf_mode, loc=loc))


def resolve_accumulate(d: Access, accumulate, loc: SourceLoc, op: str) -> bool:
    """Whether matmul ``op`` into PSUM ``d`` adds to it: ``accumulate`` as given (True warns
    where it is undefined: :func:`_warn_accumulating_onto`), or for None the
    first-write-overwrites rule, which needs every element of ``d`` last written by a matmul
    or none of them (else ``err_unsupported_api``: the caller says which)."""
    if accumulate is not None:
        if accumulate:
            _warn_accumulating_onto(d, loc, op)
        return bool(accumulate)
    written = _matmul_written(d)
    if written is True or written is False:
        return written
    raise _unsupported(
        f"{op} into a PSUM region partly written by earlier matmuls"
        if written is not None
        else f"{op} into a PSUM region a runtime-offset (.indirect) write may have touched",
        "pass accumulate=True or False explicitly",
        loc,
    )


def _warn_accumulating_onto(d: Access, loc: SourceLoc, op: str) -> None:
    """``accumulate=True`` needs PSUM a matmul wrote: onto memory nothing wrote since its
    allocation the sum is undefined on the hardware, and on NeuronCore-v2/v3 so is a sum onto
    values another instruction (memset, tensor_copy) wrote [reference/nki-0x.md §4 nc_matmul,
    §6.2].  An ``NkiWarning`` at the user's line, as AWS's simulator warns; the simulators
    add onto whatever is there (the poison, NaN, if nothing wrote it)."""
    q = _region(d)
    written = [r for r, _ in _psum_writes(d.tensor.root) if _may_overlap(r, q)]
    if not written:
        warn_at(
            loc,
            f"{op}(accumulate=True) adds onto PSUM that nothing has written since it was "
            "allocated: undefined on the hardware (the simulators add onto the poison, NaN); "
            "write the first product with accumulate=False",
        )
    elif int(get_nc_version().value) <= 3 and _matmul_written(d) is not True:
        warn_at(
            loc,
            f"{op}(accumulate=True) adds onto PSUM another instruction (memset, tensor_copy, "
            "...) wrote last: undefined on NeuronCore-v2/v3; start the accumulation with a "
            "matmul (accumulate=False)",
        )


_DOUBLE_ROW_DTYPES = {
    3: ("float8_e4m3", "float8_e5m2"),
    4: ("float8_e4m3", "float8_e5m2", "float8_e4m3fn"),
}


def _check_double_row(stationary, moving, perf_mode, loc: SourceLoc) -> None:
    """``perf_mode=double_row`` (NC-v3+): fp8 operands [P, 2, M] and [P, 2, N] whose
    contraction runs over the partitions and the size-2 dimension, ``dst[m, n] = sum over p, r
    of stationary[p, r, m] * moving[p, r, n]``, at twice the rows per pass [NKI 0.x ISA,
    nc_matmul]."""
    mode = getattr(perf_mode, "value", perf_mode)
    if mode != matmul_perf_mode.double_row.value:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why=f"perf_mode={perf_mode!r} is not a nisa.matmul_perf_mode member",
        )
    version = int(get_nc_version().value)
    allowed = _DOUBLE_ROW_DTYPES.get(min(version, 4))
    if allowed is None:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why=f"perf_mode=double_row needs NeuronCore-v3 or newer; tracing for gen{version}",
        )
    for what, x in (("stationary", stationary), ("moving", moving)):
        if not isinstance(x, NkiTensor) or x.ndim != 3 or x.shape[1] != 2:
            shape = getattr(x, "shape", type(x).__name__)
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nisa.nc_matmul",
                why=f"perf_mode=double_row takes {what} as [P, 2, F] (the contraction split over "
                f"the partitions and a dimension of 2), got {shape}",
            )
        if np.dtype(x.dtype).name not in allowed:
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="nisa.nc_matmul",
                why=f"perf_mode=double_row takes fp8 operands ({', '.join(allowed)} on "
                f"gen{version}); {what} is {np.dtype(x.dtype).name}",
            )


def _check_tiling(tile_position, tile_size, stationary: NkiTensor, loc: SourceLoc) -> None:
    """TensorE tiling runs a matmul on a (row_size x column_size) corner of the PE array: it
    changes which PE rows and columns do the work, not the result.  The operands must fit
    the tile [NKI 0.x ISA, nc_matmul]."""
    if not (tile_position and tile_size) or len(tile_position) != 2 or len(tile_size) != 2:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why="tile_position and tile_size are given together, each as (row, column)",
        )
    rows, cols = (_index(v, "nisa.nc_matmul", loc, none=False) for v in tile_size)
    r0, c0 = (_index(v, "nisa.nc_matmul", loc, none=False) for v in tile_position)
    if rows not in (32, 64, 128) or cols not in (32, 64, 128) or r0 % rows or c0 % cols:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why=f"tile_size {tile_size} must be 32, 64 or 128 per side and tile_position {tile_position} a multiple of it",
        )
    if r0 + rows > 128 or c0 + cols > 128:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why=f"the tile at {tile_position} of size {tile_size} leaves the 128 x 128 PE array",
        )
    if not isinstance(stationary, NkiTensor):
        require_tensor(stationary, loc, "nisa.nc_matmul", "stationary")
    p = stationary.shape[0]
    free = stationary.size // max(p, 1)
    if p > rows or free > cols:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_matmul",
            why=f"stationary {stationary.shape} does not fit the {rows} x {cols} PE tile",
        )


def nc_transpose(dst, data, engine=engine.unknown, name=None) -> NkiInstruction:  # noqa: A002
    """Swap partitions and the (flattened) free axis: TensorE (up to 128x128, into PSUM) or
    VectorE (up to 32x32)."""
    kind = _kind("nc_transpose", (engine,), _TRANSPOSE_DEFAULTS, (dst, data))
    return _call(
        "nc_transpose", kind, (dst, data), _TRANSPOSE_LABELS, _nc_transpose, dst, data, engine
    )


_TRANSPOSE_LABELS = ("nc_transpose dst", "nc_matmul data")
_TRANSPOSE_DEFAULTS = nc_transpose.__defaults__[:1]  # engine


def _nc_transpose(dst, data, engine) -> NkiInstruction:  # noqa: A002
    """``nc_transpose``, checked."""
    loc = caller_loc()
    _dst_chip(dst, loc, "nc_transpose")
    eng = _engine_arg(engine, "nc_transpose", loc)
    a = _flat2d(data, loc, "data")
    dv = dst.flatten_dims(1, dst.ndim - 1) if dst.ndim > 2 else dst
    d = _acc(dv, loc, "nc_transpose dst")
    if d.shape != (a.shape[1], a.shape[0]):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.nc_transpose",
            why=f"dst has shape {dst.shape}; the transpose of {data.shape} is {(a.shape[1], a.shape[0])}",
        )
    return _done(E.emit_nc_transpose(d, a, engine=eng, loc=loc))


# -- VectorE / GpSimd ------------------------------------------------------------------------------


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None) -> NkiInstruction:  # noqa: A002
    """Elementwise ``dst = op(data1, data2)`` (no broadcasting)."""
    operands = (dst, data1, data2)
    kind = _kind("tensor_tensor", (op, engine), _NO_DEFAULTS, operands)
    return _call("tensor_tensor", kind, operands, _TT_LABELS, _tensor_tensor, *operands, op, engine)


_NO_DEFAULTS = (object(),)  # options without defaults: always keyed by value
_TT_LABELS = ("tensor_tensor",) * 3


def _tensor_tensor(dst, data1, data2, op, engine) -> NkiInstruction:  # noqa: A002
    """``tensor_tensor``, checked."""
    loc = caller_loc()
    _dst_chip(dst, loc, "tensor_tensor")
    eng = _engine_arg(engine, "tensor_tensor", loc)
    d, a, b = _tiles(loc, "tensor_tensor", dst, data1, data2)
    _bitvec_on_ints(op, "tensor_tensor", loc, data1=a, data2=b, dst=d)
    return _done(E.emit_tensor_tensor(d, a, b, op=op, engine=eng, loc=loc))


def _bitvec_on_ints(op, what: str, loc: SourceLoc, **tiles: Access) -> bool:
    """A bitvec operator reads its inputs as bit patterns, so the input and output tiles must
    have integer dtypes [ISA tensor_tensor, tensor_reduce: "For bitvec operators, the
    input/output data types must be integer types"].  Whether ``op`` is bitvec."""
    if op_name(op) not in E._BITVEC:
        return False
    for role, x in tiles.items():
        if not dtypes.is_int(x.dtype):
            raise NkiError(
                "err_unsupported_dtype",
                loc,
                op=f"nisa.{what}",
                dtype=dtypes.name(x.dtype),
                why=f"{role} of a bitvec operator must be an integer dtype",
            )
    return True


def tensor_scalar(
    dst,
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    engine=engine.unknown,  # noqa: A002
    name=None,
) -> NkiInstruction:
    """``dst = (data op0 operand0) op1 operand1``; operands are scalars or (P, 1) tensors."""
    options = (op0, operand0, reverse0, op1, operand1, reverse1, engine)
    kind = _kind("tensor_scalar", options, _NO_DEFAULTS, (dst, data))
    return _call(
        "tensor_scalar", kind, (dst, data), _TS_LABELS, _tensor_scalar, dst, data, *options
    )


_TS_LABELS = ("tensor_scalar",) * 2


def _tensor_scalar(
    dst,
    data,
    op0,
    operand0,
    reverse0,
    op1,
    operand1,
    reverse1,
    engine,  # noqa: A002
) -> NkiInstruction:
    """``tensor_scalar``, checked."""
    loc = caller_loc()
    _flags("tensor_scalar", loc, reverse0=reverse0, reverse1=reverse1)
    _dst_chip(dst, loc, "tensor_scalar")
    eng = _engine_arg(engine, "tensor_scalar", loc)
    d, a = _tiles(loc, "tensor_scalar", dst, data)
    n0 = op_name(op0)
    if n0 in E._BITVEC or (op1 is not None and op_name(op1) in E._BITVEC) or eng == "scalar":
        _tensor_scalar_rules(d, a, n0, op1, eng, loc)  # rare: not on the common path
    s0 = _operand0(operand0, n0, reverse0, a, loc, "tensor_scalar")
    s1 = None if operand1 is None else _scalar_or_vector(operand1, loc, "operand1", a)
    return _done(
        E.emit_tensor_scalar(
            d,
            a,
            s0,
            s1,
            op0=op0,
            reverse0=reverse0,
            op1=op1,
            reverse1=reverse1,
            engine=eng,
            loc=loc,
        )
    )


def _operand0(operand0, n0: str, reverse0, a: Access, loc: SourceLoc, op: str) -> Access | float:
    """``operand0`` of ``tensor_scalar`` / ``tensor_scalar_reduce``.  A unary ``op0``
    (``nl.abs``, ``nl.square``, ...) reads no operand, so it takes ``None`` or 0 and nothing
    else [ISA tensor_scalar: "Must be None or 0 when op0 is a unary operator"].  Reversed, a
    unary operator reads the operand instead of the data (the tile filled with op(operand0)),
    so there the operand is kept; so is ``nl.bypass``'s, which the ALU table does not list as
    unary.  Any other ``op0`` needs an operand."""
    if n0 in ALU_UNARY:
        if operand0 is None:
            return 0.0
        if not reverse0 and n0 != "bypass":
            if not (_is_number(operand0) and float(operand0) == 0.0):
                got = repr(operand0) if _is_number(operand0) else got_type(operand0)
                why = f"op0=nl.{n0} is unary: operand0 must be None or 0, got {got}"
                raise _invalid(op, why, loc)
    elif operand0 is None:
        raise _invalid(op, f"op0=nl.{n0} needs operand0", loc)
    return _scalar_or_vector(operand0, loc, "operand0", a)


def _is_number(x) -> bool:
    return isinstance(x, int | float | np.integer | np.floating)


def _tensor_scalar_rules(d: Access, a: Access, n0: str, op1, eng, loc: SourceLoc) -> None:
    """``tensor_scalar``'s operator rules [ISA tensor_scalar; nki-0x.md §4.6]: op0 and op1
    both bitvec or both arithmetic; bitvec runs on the VectorE on integer data and dst;
    the ScalarE of NeuronCore-v2/v3 (trn2) takes only (multiply, add), (multiply, None)
    and (add, None)."""
    n1 = None if op1 is None else op_name(op1)
    bit0 = n0 in E._BITVEC
    if n1 is not None and bit0 != (n1 in E._BITVEC):
        raise _invalid(
            "tensor_scalar",
            f"op0 and op1 must both be bitvec or both arithmetic operators, got {n0} and {n1}",
            loc,
        )
    if bit0:
        if eng not in (None, "vector"):
            raise _invalid(
                "tensor_scalar", f"bitvec operators run on the Vector engine, not {eng}", loc
            )
        for role, x in (("data", a), ("dst", d)):
            if not dtypes.is_int(x.dtype):
                raise NkiError(
                    "err_unsupported_dtype",
                    loc,
                    op="nisa.tensor_scalar",
                    dtype=dtypes.name(x.dtype),
                    why=f"{role} of a bitvec operator must be an integer dtype",
                )
    elif eng == "scalar" and int(get_nc_version().value) <= 3:
        if (n0, n1) not in (("multiply", "add"), ("multiply", None), ("add", None)):
            raise _invalid(
                "tensor_scalar",
                "the Scalar engine of NeuronCore-v2/v3 takes op0=nl.multiply with op1=nl.add "
                f"or None, or op0=nl.add with op1=None; got op0={n0}, op1={n1}",
                loc,
            )


def tensor_scalar_reduce(
    dst,
    data,
    op0,
    operand0,
    reduce_op,
    reduce_res=None,
    reverse0=False,
    reduce_cmd=reduce_cmd.reset_reduce,
    reduce_init=None,
    reduce_res_negate=False,
    name=None,
) -> NkiInstruction:
    """``dst = data op0 operand0`` and the free-axis reduction of ``dst`` (add, multiply,
    max, min) into the VectorE accumulators as ``reduce_cmd`` says (``load_reduce`` starts
    from ``reduce_init``), read out into ``reduce_res`` (negated with ``reduce_res_negate``)
    when given [nki-0x.md §4.6, §6.3]."""
    loc = caller_loc()
    _flags("tensor_scalar_reduce", loc, reverse0=reverse0, reduce_res_negate=reduce_res_negate)
    _dst_chip(dst, loc, "tensor_scalar_reduce")
    cmd = ACC.command(reduce_cmd, loc, "tensor_scalar_reduce")
    if reduce_init is not None and cmd != "load_reduce":
        raise _invalid("tensor_scalar_reduce", "reduce_init is only read by load_reduce", loc)
    red = _reduce_name(reduce_op, ("add", "multiply", "max", "min"), "tensor_scalar_reduce", loc)
    # "Bitvec operators are not supported in this API"; reverse0 "(not supported yet)"
    # [ISA tensor_scalar_reduce]
    _arithmetic("tensor_scalar_reduce", loc, op0=op0)
    if reverse0:
        raise _invalid(
            "tensor_scalar_reduce",
            "reverse0=True is documented as not supported yet; compute operand0 op0 data "
            "with nisa.tensor_scalar(reverse0=True) first",
            loc,
        )
    d, a = _tiles(loc, "tensor_scalar_reduce", dst, data)
    r = None if reduce_res is None else _reduce_res(reduce_res, a, loc, "tensor_scalar_reduce")
    init = None if reduce_init is None else _scalar_or_vector(reduce_init, loc, "reduce_init")
    chain = ACC.Chain(
        "vector",
        cmd,
        red,
        a.shape[0],
        r,
        init=init,
        negate=bool(reduce_res_negate),
        loc=loc,
        op="tensor_scalar_reduce",
    )
    s0 = _operand0(operand0, op_name(op0), reverse0, a, loc, "tensor_scalar_reduce")
    op = E.emit_tensor_scalar(
        d,
        a,
        s0,
        op0=op0,
        reverse0=reverse0,
        reduce_res=chain.into,
        reduce_op=None if chain.into is None else red,
        engine="vector",
        loc=loc,
    )
    chain.finish(op)
    return _done(op)


def _invalid(op: str, why: str, loc: SourceLoc) -> NkiError:
    return NkiError("err_invalid_argument", loc, op=f"nisa.{op}", why=why)


def _flags(op: str, loc: SourceLoc, **flags) -> None:
    """:func:`_flag` of each yes/no option of instruction ``op``."""
    for label, value in flags.items():
        E.flag(value, label, op, loc)


def _tile_pair(value, label: str, op: str, loc: SourceLoc) -> tuple:
    """A TensorE tiling option (``tile_position``, ``tile_size``): () when not given (None or
    empty), else a (row, column) pair of integers."""
    if value is None or (isinstance(value, tuple | list) and not value):
        return ()
    if isinstance(value, tuple | list) and len(value) == 2:
        if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value):
            return (int(value[0]), int(value[1]))
    got = repr(value) if isinstance(value, tuple | list) else got_type(value)
    raise _invalid(op, f"{label} must be a (row, column) pair of integers, got {got}", loc)


def _number(x, loc: SourceLoc, op: str, why: str, kind=float, or_tensor: bool = False):
    """``kind(x)`` for a compile-time constant argument; anything else (a tile grid, a list)
    is ``err_invalid_argument`` saying ``why``, not Python's TypeError from inside nkikit.
    ``or_tensor``: the argument may be a tensor too (so a grid's ``.data`` would do)."""
    try:
        return kind(x)
    except (TypeError, ValueError):
        got = got_type(x) if or_tensor else type(x).__name__
        raise _invalid(op, f"{why}, got {got}", loc) from None


def _reduce_name(reduce_op, allowed: tuple[str, ...], op: str, loc: SourceLoc) -> str:
    """The IR name of a ``reduce_op`` argument, one of ``allowed``."""
    name = op_name(reduce_op, "reduce")
    if name not in allowed:
        raise _invalid(op, f"reduce_op must be one of {', '.join(allowed)}, got {reduce_op!r}", loc)
    return name


def _dtype_in(x: Access, allowed: frozenset, op: str, role: str, loc: SourceLoc) -> None:
    """``x``'s dtype is one of ``allowed`` (dtype names) [the instruction's ISA page]."""
    got = dtypes.name(x.dtype)
    if got not in allowed:
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op=f"nisa.{op}",
            dtype=got,
            why=f"{role} must be {' or '.join(sorted(allowed))}",
        )


def _not_both_psum(a, b, op: str, roles: str, loc: SourceLoc) -> None:
    """At most one of two inputs is in PSUM [the instruction's ISA page]."""
    if (
        isinstance(a, Access)
        and isinstance(b, Access)
        and a.tensor.buffer == "psum"
        and b.tensor.buffer == "psum"
    ):
        raise NkiError(
            "err_unsupported_memory",
            loc,
            op=f"nisa.{op}",
            what=roles,
            allowed="SBUF for at least one of them (copy one input to SBUF first)",
            got="both in PSUM",
        )


def _arithmetic(op: str, loc: SourceLoc, **ops) -> None:
    """Every operator of ``ops`` is an arithmetic ALU operator, not a bit-vector one
    [nki-0x.md §4.6, §4.16]."""
    for role, o in ops.items():
        n = op_name(o)
        if n in E._BITVEC:
            raise _invalid(
                op,
                f"{role} must be an arithmetic operator (bitvec operators are not supported), got {n}",
                loc,
            )


def scalar_tensor_tensor(
    dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None
) -> NkiInstruction:
    """``dst = (data op0 operand0) op1 operand1``: operand0 a scalar or (P, 1) tensor, operand1
    a tensor like ``data`` (VectorE)."""
    loc = caller_loc()
    _flags("scalar_tensor_tensor", loc, reverse0=reverse0, reverse1=reverse1)
    _dst_chip(dst, loc, "scalar_tensor_tensor")
    _arithmetic("scalar_tensor_tensor", loc, op0=op0, op1=op1)
    d, a, t1 = _tiles(loc, "scalar_tensor_tensor", dst, data, operand1)
    s0 = _scalar_or_vector(operand0, loc, "operand0", a)
    return _done(
        E.emit_scalar_tensor_tensor(
            d, a, s0, t1, op0=op0, op1=op1, reverse0=reverse0, reverse1=reverse1, loc=loc
        )
    )


def reciprocal(dst, data, name=None) -> NkiInstruction:
    """``dst = 1 / data`` (VectorE, fp32)."""
    kind = _kind("reciprocal", (), (), (dst, data))
    return _call("reciprocal", kind, (dst, data), ("reciprocal",) * 2, _reciprocal, dst, data)


def _reciprocal(dst, data) -> NkiInstruction:
    """``reciprocal``, checked."""
    loc = caller_loc()
    _dst_chip(dst, loc, "reciprocal")
    d, a = _tiles(loc, "reciprocal", dst, data)
    return _done(E.emit_reciprocal(d, a, loc=loc))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None) -> NkiInstruction:
    """Reduce ``data`` over its trailing free axes ``axis`` with ``op`` (VectorE)."""
    loc = caller_loc()
    _flags("tensor_reduce", loc, negate=negate, keepdims=keepdims)
    _dst_chip(dst, loc, "tensor_reduce")
    require_tensor(data, loc, "nisa.tensor_reduce", "data")
    nd = data.ndim
    if isinstance(axis, int | np.integer):
        axes = (axis,)
    elif isinstance(axis, list | tuple) and axis:
        axes = tuple(_index(a, "nisa.tensor_reduce", loc, none=False) for a in axis)
    else:
        raise _invalid(
            "tensor_reduce", f"axis must be an int or a tuple of ints, got {axis!r}", loc
        )
    if len(axes) == 1 and nd >= 3 and 1 <= axes[0] <= 4 and axes[0] != nd - 1:
        # NKI 0.2 read one axis of a 3-D/4-D tensor as "the last dimension" (0.3 made axis
        # numbers literal, and then only trailing dimensions are legal): the NKI Library of
        # early 2026 still writes axis=1, and attention_tkg axis=[4] (the last axis of the
        # 5-D access pattern) of a 3-D view.  Said at the user's line: NKI 0.3+ refuses it
        warn_at(
            loc,
            f"nisa.tensor_reduce(axis={axis}) of {nd}-D data reduces its last dimension, as "
            f"NKI 0.2 read a single axis; NKI 0.3 and later refuse it: write axis={nd - 1}",
        )
        axes = (nd - 1,)
    if not all(-nd <= a < nd for a in axes) or len(set(axes)) != len(axes):
        raise _invalid(
            "tensor_reduce", f"axis {axis} is out of range (or repeated) for {nd}-D data", loc
        )
    axes = tuple(sorted(a + nd if a < 0 else a for a in axes))
    if 0 in axes or axes != tuple(range(nd - len(axes), nd)):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.tensor_reduce",
            why=f"axis {axis} must be the trailing free dimensions of a {nd}-D tensor (e.g. {tuple(range(1, nd))[-1:]})",
        )
    kept = data.shape[: nd - len(axes)]
    nonunit = tuple(n for n in kept[1:] if n != 1)
    rows = math.prod(nonunit)
    if dst.shape[0] != data.shape[0] or dst.size != data.shape[0] * rows:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.tensor_reduce",
            why=f"dst has shape {dst.shape}; reducing {data.shape} over {axes} leaves {kept}",
        )
    if _chain([nonunit, tuple(n for n in dst.shape[1:] if n != 1)]) != nonunit:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.tensor_reduce",
            why=f"dst shape {dst.shape} cannot hold the kept dimensions {kept} element by element",
        )
    # dst seen in the keepdims shape of the reduction: kept dims, then a unit per reduced axis
    refined = _refine(dst, nonunit, 1)
    parts = iter(zip(refined.shape[1:], refined.strides[1:]))
    shape, strides = [dst.shape[0]], [dst.strides[0]]
    for n in kept[1:]:
        m, st = next(parts) if n != 1 else (1, 0)
        shape.append(m)
        strides.append(st)
    shape += [1] * len(axes)
    strides += [0] * len(axes)
    d = _acc(dst._with(shape, strides), loc, "tensor_reduce dst")
    a = _acc(data, loc, "tensor_reduce data")
    if _bitvec_on_ints(op, "tensor_reduce", loc, data=a, dst=d) and negate:
        # the engine negates by multiplying with -1.0, an arithmetic step [ISA tensor_reduce]
        raise _invalid("tensor_reduce", "negate=True needs an arithmetic operator", loc)
    return _done(E.emit_tensor_reduce(d, a, op=op, axes=axes, negate=negate, loc=loc))


def tensor_partition_reduce(dst, op, data, name=None) -> NkiInstruction:
    """Reduce across partitions (GpSimd): (P, F) -> (1, F); ``nl.average`` is the sum
    divided by P, in fp32."""
    loc = caller_loc()
    _dst_chip(dst, loc, "tensor_partition_reduce")
    # the GpSimd's cross-partition reductions: the primitive's record lists them
    try:
        op_name(op, "reduce", valid=E.PARTITION_REDUCE_OPS)
    except NkiError:
        ops = [f"nl.{'maximum' if n == 'max' else n}" for n in E.PARTITION_REDUCE_OPS]
        raise _invalid(
            "tensor_partition_reduce",
            f"op must be {', '.join(ops[:-1])} or {ops[-1]}, got {getattr(op, '__name__', op)!r}",
            loc,
        ) from None
    a = _acc(data, loc, "tensor_partition_reduce data")
    d = _acc(dst, loc, "tensor_partition_reduce dst")
    return _done(E.emit_tensor_partition_reduce(d, a, op=op, loc=loc))


def tensor_tensor_scan(
    dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None
) -> NkiInstruction:
    """Per-partition scan: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])``, ``r[-1] = initial``."""
    loc = caller_loc()
    _flags("tensor_tensor_scan", loc, reverse0=reverse0, reverse1=reverse1)
    _dst_chip(dst, loc, "tensor_tensor_scan")
    _arithmetic("tensor_tensor_scan", loc, op0=op0, op1=op1)
    d, a, b = _tiles(loc, "tensor_tensor_scan", dst, data0, data1)
    _not_both_psum(a, b, "tensor_tensor_scan", "data0 and data1", loc)
    init = _scalar_or_vector(initial, loc, "initial", a)
    return _done(
        E.emit_tensor_tensor_scan(
            d, a, b, init, op0=op0, op1=op1, reverse0=reverse0, reverse1=reverse1, loc=loc
        )
    )


def select_reduce(
    dst,
    predicate,
    on_true,
    on_false,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    reduce_op=None,
    reverse_pred=False,
    name=None,
) -> NkiInstruction:
    """``dst = where(predicate, on_true, on_false)``; its row maximum goes into the VectorE
    accumulators as ``reduce_cmd`` says, read out into ``reduce_res`` when given."""
    loc = caller_loc()
    _flags("select_reduce", loc, reverse_pred=reverse_pred)
    _dst_chip(dst, loc, "select_reduce")
    cmd = ACC.command(reduce_cmd, loc, "select_reduce")
    d, p, t = _tiles(loc, "select_reduce", dst, predicate, on_true)
    _dtype_in(p, _PRED_SELECT, "select_reduce", "predicate", loc)
    if dtypes.name(t.dtype) in ("tfloat32", "int32", "uint32"):
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op="nisa.select_reduce",
            dtype=dtypes.name(t.dtype),
            why="on_true may be any dtype except tfloat32, int32 and uint32",
        )
    _not_both_psum(t, p, "select_reduce", "on_true and predicate", loc)
    f = _scalar_or_vector(on_false, loc, "on_false", t)
    r = None if reduce_res is None else _reduce_res(reduce_res, p, loc, "select_reduce")
    if r is not None and dtypes.is_int(r.dtype):
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op="nisa.select_reduce",
            dtype=dtypes.name(r.dtype),
            why="reduce_res must be of a float dtype",
        )
    red = E.max_reduce_op("select_reduce", reduce_op, loc)
    chain = ACC.Chain("vector", cmd, red, p.shape[0], r, loc=loc, op="select_reduce")
    op = E.emit_select_reduce(
        d, p, t, f, reduce_res=chain.into, reduce_op=reduce_op, reverse=reverse_pred, loc=loc
    )
    chain.finish(op)
    return _done(op)


def range_select(
    dst,
    on_true_tile,
    comp_op0,
    comp_op1,
    bound0,
    bound1,
    reduce_cmd=reduce_cmd.reset_reduce,
    reduce_res=None,
    reduce_op=None,
    range_start=0,
    on_false_value=-3.4028234663852886e38,
    name=None,
) -> NkiInstruction:
    """Keep elements whose free index ``range_start + j`` satisfies both comparisons with the
    (P, 1) bounds, else ``on_false_value``; optionally max-reduce into ``reduce_res``."""
    loc = caller_loc()
    _dst_chip(dst, loc, "range_select")
    cmd = ACC.command(reduce_cmd, loc, "range_select")
    d, a = _tiles(loc, "range_select", dst, on_true_tile)
    # on_true_tile of a floating-point dtype, bounds fp32 [ISA range_select]
    if dtypes.is_int(a.dtype):
        raise NkiError(
            "err_unsupported_dtype",
            loc,
            op="nisa.range_select",
            dtype=dtypes.name(a.dtype),
            why="on_true_tile must be of a floating-point dtype",
        )
    b0 = _scalar_or_vector(_lanes(bound0, a), loc, "bound0", a)
    b1 = _scalar_or_vector(_lanes(bound1, a), loc, "bound1", a)
    for role, b in (("bound0", b0), ("bound1", b1)):
        if isinstance(b, Access):
            _dtype_in(b, _F32, "range_select", role, loc)
    r = None if reduce_res is None else _reduce_res(reduce_res, a, loc, "range_select")
    red = E.max_reduce_op("range_select", reduce_op, loc)
    chain = ACC.Chain("vector", cmd, red, a.shape[0], r, loc=loc, op="range_select")
    op = E.emit_range_select(
        d,
        a,
        b0,
        b1,
        comp_op0=comp_op0,
        comp_op1=comp_op1,
        reduce_res=chain.into,
        reduce_op=reduce_op,
        on_false=on_false_value,
        range_start=range_start,
        loc=loc,
    )
    chain.finish(op)
    return _done(op)


def bn_stats(dst, data, name=None) -> NkiInstruction:
    """Per-partition (count, mean, count * variance) of the even and of the odd elements."""
    loc = caller_loc()
    _dst_chip(dst, loc, "bn_stats")
    d = _acc(dst, loc, "bn_stats dst")
    a = _acc(data, loc, "bn_stats data")
    return _done(E.emit_bn_stats(d, a, loc=loc))


def bn_aggr(dst, data, name=None) -> NkiInstruction:
    """Aggregate bn_stats groups into (mean, variance) per partition."""
    loc = caller_loc()
    _dst_chip(dst, loc, "bn_aggr")
    d, a = _acc(dst, loc, "bn_aggr dst"), _acc(data, loc, "bn_aggr data")
    return _done(E.emit_bn_aggr(d, a, loc=loc))


def max8(dst, src, name=None) -> NkiInstruction:
    """The 8 largest values of each partition, descending."""
    loc = caller_loc()
    _dst_chip(dst, loc, "max8")
    return _done(E.emit_max8(_acc(dst, loc, "max8 dst"), _acc(src, loc, "max8 src"), loc=loc))


def nc_find_index8(dst, data, vals, name=None) -> NkiInstruction:
    """Per partition, the index of the first occurrence of each of 8 values."""
    loc = caller_loc()
    _dst_chip(dst, loc, "nc_find_index8")
    d = _acc(dst, loc, "nc_find_index8 dst")
    a, v = _acc(data, loc, "nc_find_index8 data"), _acc(vals, loc, "nc_find_index8 vals")
    return _done(E.emit_nc_find_index8(d, a, v, loc=loc))


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None) -> NkiInstruction:
    """Replace the first occurrence of each of 8 values by ``imm`` (indices into dst_idx)."""
    loc = caller_loc()
    _dst_chip(dst, loc, "nc_match_replace8")
    d = _acc(dst, loc, "nc_match_replace8 dst")
    idx = None if dst_idx is None else _acc(dst_idx, loc, "nc_match_replace8 dst_idx")
    a, v = _acc(data, loc, "nc_match_replace8 data"), _acc(vals, loc, "nc_match_replace8 vals")
    return _done(E.emit_nc_match_replace8(d, a, v, idx, imm=imm, loc=loc))


def nc_stream_shuffle(dst, src, shuffle_mask, name=None) -> NkiInstruction:
    """Within each 32-partition quadrant, dst partition i takes src partition
    ``shuffle_mask[i]`` (255 keeps dst)."""
    loc = caller_loc()
    _dst_chip(dst, loc, "nc_stream_shuffle")
    d, s = _acc(dst, loc, "nc_stream_shuffle dst"), _acc(src, loc, "nc_stream_shuffle src")
    return _done(E.emit_nc_stream_shuffle(d, s, shuffle_mask=shuffle_mask, loc=loc))


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """GpSimd gather within each 16-partition group (see ``nkikit.isa.local_gather``)."""
    loc = caller_loc()
    num_valid_indices = _index(num_valid_indices, "nisa.local_gather", loc)
    _dst_chip(dst, loc, "local_gather")
    d = _acc(dst, loc, "local_gather dst")
    s, ix = _acc(src_buffer, loc, "local_gather src"), _acc(index, loc, "local_gather index")
    _dtype_in(ix, frozenset({"uint16"}), "local_gather", "index", loc)
    if s.shape[0] % 16:
        raise _invalid(
            "local_gather",
            f"src_buffer spans {s.shape[0]} partitions; it must be a multiple of 16 (one "
            "GpSimd core per 16 partitions)",
            loc,
        )
    if local_gather_indices(ix.shape, num_valid_indices) > 4096:
        raise _invalid(
            "local_gather",
            f"each GpSimd core gathers at most 4096 indices, got "
            f"{local_gather_indices(ix.shape, num_valid_indices)} (index {ix.shape})",
            loc,
        )
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        raise _invalid(
            "local_gather",
            f"num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {num_elem_per_idx!r}",
            loc,
        )
    return _done(
        E.emit_local_gather(
            d,
            s,
            ix,
            num_elem_per_idx=num_elem_per_idx,
            num_valid_indices=num_valid_indices,
            loc=loc,
        )
    )


_U32 = frozenset({"uint32"})
_F32 = frozenset({"float32"})


def nc_n_gather(dst, data, indices, name=None) -> NkiInstruction:
    """GpSimd gather within each partition: ``dst[p, j] = flat(data[p])[indices[p, j]]``,
    ``data``'s free dims flattened, ``dst`` in ``data``'s dtype with one element per index."""
    loc = caller_loc()
    _dst_chip(dst, loc, "nc_n_gather", allowed=("sbuf",))
    d = _acc(dst, loc, "nc_n_gather dst")
    a, ix = _acc(data, loc, "nc_n_gather data"), _acc(indices, loc, "nc_n_gather indices")
    _dtype_in(ix, _U32, "nc_n_gather", "indices", loc)
    return _done(E.emit_nc_n_gather(d, a, ix, loc=loc))


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None) -> NkiInstruction:
    """GpSimd: on partitions 0, 16, ..., 112 of the tile (the first of each core) ``dst`` gets
    the positions (plus ``index_offset``) of the partition's non-zero ``src`` elements, then
    ``padding_val``, and the count as its last element; other partitions are untouched.
    ``src`` fp32/int32 SBUF, ``dst`` int32 SBUF with one more element per partition."""
    loc = caller_loc()
    _dst_chip(dst, loc, "nonzero_with_count", allowed=("sbuf",))
    d, s = _acc(dst, loc, "nonzero_with_count dst"), _acc(src, loc, "nonzero_with_count src")
    return _done(
        E.emit_nonzero_with_count(d, s, index_offset=index_offset, padding_val=padding_val, loc=loc)
    )


def dropout(dst, data, prob, name=None) -> NkiInstruction:
    """Zero each element with probability ``prob`` (a scalar or a (P, 1) tensor), drawing from
    the VectorE's generator (``nisa.rng``'s; reproducible for a given seed); no rescaling.
    ``dst`` has ``data``'s dtype [ISA dropout]."""
    return _dropout(dst, data, prob, caller_loc(), strict=True)


def _dropout(dst, data, prob, loc: SourceLoc, strict: bool):
    """``dropout``; ``strict=False`` (``nl.dropout(x, rate, dtype=)``, which converts into
    its ``dtype``) skips the same-dtype rule."""
    from .random import program

    _dst_chip(dst, loc, "dropout")
    d, a = _tiles(loc, "dropout", dst, data)
    if strict and d.dtype is not a.dtype and dtypes.name(d.dtype) != dtypes.name(a.dtype):
        raise _invalid(
            "dropout",
            f"dst must have data's dtype, got {dtypes.name(d.dtype)} and {dtypes.name(a.dtype)}",
            loc,
        )
    prob = _scalar_or_vector(prob, loc, "prob", a)
    if type(prob) is float and not 0.0 <= prob <= 1.0:
        raise _invalid("dropout", f"prob must be in [0, 1], got {prob!r}", loc)
    return _done(E.emit_dropout(d, a, prob, loc=loc, key=program()))


# -- ScalarE -------------------------------------------------------------------------------------


def activation(
    dst,
    op,
    data,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    name=None,
) -> NkiInstruction:
    """``dst = op(data * scale + bias)`` on the ScalarE; its row sum (``reduce_op``: add)
    goes into the ScalarE accumulators as ``reduce_cmd`` says, read out into ``reduce_res``
    (P, 1) when given [nki-0x.md §4.10, §6.3]."""
    kind = None  # a call that reduces reads and writes the accumulators: checked every time
    if reduce_op is None and reduce_res is None and reduce_cmd is _REDUCE_IDLE:
        kind = _kind("activation", (op, bias, scale), _NO_DEFAULTS, (dst, data))
    args = (dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd)
    return _call("activation", kind, (dst, data), _ACT_LABELS, _activation_checked, *args)


_REDUCE_IDLE = reduce_cmd.idle
_ACT_LABELS = ("activation",) * 2


def _activation_checked(
    dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd
) -> NkiInstruction:
    """``activation``, checked."""
    loc = caller_loc()
    cmd = ACC.command(reduce_cmd, loc, "activation")
    if reduce_op is not None and op_name(reduce_op, "reduce") != "add":
        raise _invalid(
            "activation", f"reduce_op must be nl.add, got {op_name(reduce_op, 'reduce')}", loc
        )
    return _activation(dst, op, data, bias, scale, reduce_op, reduce_res, cmd, loc, "activation")


def activation_reduce(
    dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None
) -> NkiInstruction:
    """``activation(..., reduce_cmd=reset_reduce)``: the free-axis reduction of the result
    starts the ScalarE accumulators afresh and is read out into ``reduce_res`` when given."""
    loc = caller_loc()
    return _activation(
        dst, op, data, bias, scale, reduce_op, reduce_res, "reset_reduce", loc, "activation_reduce"
    )


def _activation(dst, op, data, bias, scale, reduce_op, reduce_res, cmd, loc, what):
    _dst_chip(dst, loc, what)
    d, a = _tiles(loc, what, dst, data)
    b = 0.0 if bias is None else _scalar_or_vector(bias, loc, "activation bias", a)
    s = _scalar_or_vector(scale, loc, "activation scale", a)
    red = None
    if reduce_op is not None:
        red = op_name(reduce_op, "reduce")
    elif reduce_res is not None or cmd != "idle":
        red = "add"  # the ScalarE accumulators add [nki-0x.md §4.10]
    r = None if reduce_res is None else _reduce_res(reduce_res, a, loc, what)
    chain = ACC.Chain("scalar", cmd, red, a.shape[0], r, loc=loc, op=what)
    into = chain.into
    op_ = E.emit_activation(
        d, a, b, s, op=op, reduce_res=into, reduce_op=None if into is None else red, loc=loc
    )
    chain.finish(op_)
    return _done(op_)


def activate2(
    dst,
    op,
    data,
    imm0,
    imm1,
    op0,
    op1,
    relu_param=0.0,
    reverse0=False,
    reverse1=False,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    name=None,
) -> NkiInstruction:
    """NC-v4 ScalarE ``dst = op((data op0 imm0) op1 imm1, relu_param)`` (``nl.bypass`` /
    None skips a stage); its row reduction (add, maximum, minimum, abs_max, abs_min) goes
    into the ScalarE accumulators as ``reduce_cmd`` says, read out into ``reduce_res`` when
    given [nki-0x.md §4.10 activate2, §6.3]."""
    loc = caller_loc()
    _flags("activate2", loc, reverse0=reverse0, reverse1=reverse1)
    _dst_chip(dst, loc, "activate2")
    cmd = ACC.command(reduce_cmd, loc, "activate2")
    d, a = _tiles(loc, "activate2", dst, data)
    i0 = _scalar_or_vector(0.0 if imm0 is None else imm0, loc, "imm0", a)
    i1 = _scalar_or_vector(0.0 if imm1 is None else imm1, loc, "imm1", a)
    rp = _scalar_or_vector(relu_param, loc, "relu_param", a)
    red = E.activate2_reduce_op(reduce_op, loc)
    if red is None and reduce_res is not None:
        raise _invalid("activate2", "reduce_res needs reduce_op (e.g. reduce_op=nl.add)", loc)
    r = None if reduce_res is None else _reduce_res(reduce_res, a, loc, "activate2")
    chain = ACC.Chain("scalar", cmd, red, a.shape[0], r, loc=loc, op="activate2")
    op_ = E.emit_activate2(
        d,
        a,
        i0,
        i1,
        rp,
        op=op,
        op0=op0,
        op1=op1,
        reverse0=reverse0,
        reverse1=reverse1,
        reduce_res=chain.into,
        reduce_op=red,
        loc=loc,
    )
    chain.finish(op_)
    return _done(op_)


def exponential(
    dst,
    src,
    max_value=0.0,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    reduce_init=0.0,
    name=None,
) -> NkiInstruction:
    """NC-v4 VectorE ``dst = exp(src - max_value)`` (``max_value`` a scalar or (P, 1));
    its row sum goes into the VectorE accumulators as ``reduce_cmd`` says (``load_reduce``
    starts from ``reduce_init``), read out into ``reduce_res`` when given
    [nki-0x.md §4.6 exponential, §6.3]."""
    loc = caller_loc()
    _dst_chip(dst, loc, "exponential")
    cmd = ACC.command(reduce_cmd, loc, "exponential")
    d, a = _tiles(loc, "exponential", dst, src)
    m = _scalar_or_vector(_lanes(max_value, a), loc, "max_value", a)
    r = None if reduce_res is None else _reduce_res(reduce_res, a, loc, "exponential")
    if cmd != "load_reduce" and not (isinstance(reduce_init, int | float) and reduce_init == 0):
        raise _invalid("exponential", "reduce_init is only read by load_reduce", loc)
    init = _scalar_or_vector(_lanes(reduce_init, a), loc, "reduce_init")
    chain = ACC.Chain("vector", cmd, "add", a.shape[0], r, init=init, loc=loc, op="exponential")
    op = E.emit_exponential(d, a, m, reduce_res=chain.into, loc=loc)
    chain.finish(op)
    return _done(op)


# tensor_scalar_cumulative's op1 as the reduction whose identity starts the register
_SCAN_REDUCE = {
    "add": "add",
    "subtract": "subtract",
    "multiply": "multiply",
    "maximum": "max",
    "minimum": "min",
}


def tensor_scalar_cumulative(
    dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None
) -> NkiInstruction:
    """VectorE running scan per partition: ``reg = op1(op0(src[i], imm0), reg)``,
    ``dst[i] = reg``.  ``reg`` is the VectorE accumulator: ``reset_reduce`` starts it at
    op1's identity, ``reduce`` continues from its value, ``load_reduce`` starts it at
    ``imm1``; it keeps the last value [nki-0x.md §4.6 tensor_scalar_cumulative, §6.3].
    Reading: the pseudo-code's operand order ``op1(x, reg)`` is taken as written."""
    loc = caller_loc()
    _dst_chip(dst, loc, "tensor_scalar_cumulative")
    cmd = ACC.command(reduce_cmd, loc, "tensor_scalar_cumulative")
    if cmd not in ("reset_reduce", "reduce", "load_reduce"):
        raise _invalid(
            "tensor_scalar_cumulative",
            f"reduce_cmd={cmd}: the scan starts from reset_reduce, reduce or load_reduce",
            loc,
        )
    if (imm1 is None) == (cmd == "load_reduce"):
        raise _invalid(
            "tensor_scalar_cumulative",
            "imm1 is the value load_reduce starts from: give it with load_reduce only",
            loc,
        )
    d, a = _tiles(loc, "tensor_scalar_cumulative", dst, src)
    i0 = _scalar_or_vector(_lanes(imm0, a), loc, "imm0", a)
    acc = ACC.register("vector", a.shape[0], loc)
    if cmd == "load_reduce":
        init = _scalar_or_vector(_lanes(imm1, a), loc, "imm1")
    elif cmd == "reduce":
        init = acc
    else:
        name1 = op_name(op1)
        init = ACC.IDENTITY.get(_SCAN_REDUCE.get(name1, ""), 0.0)
    return _done(
        E.emit_tensor_scalar_cumulative(d, a, i0, init, op0=op0, op1=op1, acc=acc, loc=loc)
    )


def sequence_bounds(dst, segment_ids, name=None) -> NkiInstruction:
    """GpSimd: ``dst`` (1, 2, n) = the start and end (exclusive) of each element's segment
    in ``segment_ids`` (1, n); padding (id 0) gets start n and end -1
    [nki-0x.md §4.7 sequence_bounds]."""
    loc = caller_loc()
    _dst_chip(dst, loc, "sequence_bounds", allowed=("sbuf",))
    require_tensor(segment_ids, loc, "nisa.sequence_bounds", "segment_ids")
    d = _acc(dst, loc, "sequence_bounds")
    ids = _acc(segment_ids, loc, "sequence_bounds")
    return _done(E.emit_sequence_bounds(d, ids, loc=loc))


def topk(val_dst, idx_dst, src, n, name=None) -> NkiInstruction:
    """GpSimd top-K (K = ``val_dst``'s elements per partition) of the ``n`` elements each
    16-partition group of ``src`` holds "snake"-wise (element e at partition e % 16, column
    e // 16): every partition of the group gets the K largest values, ascending (bf16), and
    their element numbers (uint32) [nki-0x.md §4.8 topk]."""
    loc = caller_loc()
    for what, t in (("val_dst", val_dst), ("idx_dst", idx_dst), ("src", src)):
        require_tensor(t, loc, "nisa.topk", what)
    _dst_chip(val_dst, loc, "topk", allowed=("sbuf",))
    _dst_chip(idx_dst, loc, "topk", allowed=("sbuf",))
    v = _acc(val_dst, loc, "topk")
    i = _acc(idx_dst, loc, "topk")
    x = _acc(src, loc, "topk")
    return _done(E.emit_topk(v, i, x, n=n, loc=loc))


# -- LNC=2: the two programs of a launch meet ----------------------------------------------------


def sendrecv(
    src,
    dst,
    send_to_rank,
    recv_from_rank,
    pipe_id,
    dma_engine=dma_engine.dma,
    name=None,
    use_gpsimd_dma=None,
) -> None:
    """Send ``src`` to program ``send_to_rank``'s ``dst`` and receive program
    ``recv_from_rank``'s ``src`` into this program's ``dst`` (LNC=2; SBUF tiles of one shape and
    dtype).  Both programs wait for each other; the transfers are DMAs.  ``use_gpsimd_dma``
    is NKI 0.2's spelling of ``dma_engine`` (which queue carries the data, not what arrives)."""
    from ..launch import meet

    loc = caller_loc()
    for what, x in (("src", src), ("dst", dst)):
        if not isinstance(x, NkiTensor) or x.tensor.buffer != "sbuf":
            raise NkiError(
                "err_unsupported_memory",
                loc,
                op="nisa.sendrecv",
                what=what,
                allowed="SBUF",
                got=getattr(getattr(x, "tensor", None), "buffer", type(x).__name__),
            )
    # what one program sends lands in the other's dst, so src and dst of one call may differ
    # in shape (uneven shards: (2, k) out, (3, k) in); the peer's src is checked against this
    # dst when the programs meet
    if src.dtype != dst.dtype:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.sendrecv",
            why=f"src {dtypes.name(src.dtype)} and dst {dtypes.name(dst.dtype)} dtypes must match",
        )

    def complete(payloads: dict) -> None:
        for k, (_src, d_k, _to, frm_k, l_k) in payloads.items():
            peer = payloads.get(frm_k)
            if peer is None or peer[2] != k:
                raise NkiError(
                    "err_invalid_argument",
                    l_k,
                    op="nisa.sendrecv",
                    why=f"program {k} receives from {frm_k}, which does not send to it",
                )
            d, s_ = _dma_pair(d_k, peer[0], l_k, "sendrecv")
            _done(E.emit_dma_copy(d, s_, loc=l_k))

    meet("sendrecv", (src, dst, int(send_to_rank), int(recv_from_rank), loc), complete, loc)


def core_barrier(data, cores, engine=engine.gpsimd, name=None) -> None:  # noqa: A002
    """Wait until both programs of an LNC=2 launch reach this point (``data``: the shared
    HBM tensor being synchronized).  No instruction is emitted: the programs' instructions
    before the barrier come before those after it in the traced order."""
    from ..launch import meet

    loc = caller_loc()
    if tuple(int(c) for c in cores) != (0, 1):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="nisa.core_barrier",
            why=f"cores must be (0, 1), got {cores}",
        )
    meet("core_barrier", None, lambda payloads: None, loc)


from .mx import nc_matmul_mx, quantize_mx  # noqa: E402, F401 - uses the helpers above
from .random import rand2, rand_get_state, rand_set_state, rng, set_rng_seed  # noqa: E402, F401
from .scalars import NkiScalar, scalar_load, scalar_store  # noqa: E402, F401

# -- helpers shared with nkikit.nki.language -------------------------------------------------------


def _copy_into(dst: NkiTensor, value, loc: SourceLoc) -> None:
    """``t[...] = value``: a copy of a tensor (DMA when HBM is involved) or a fill."""
    if isinstance(value, NkiTensor):
        if dst.on_chip and value.on_chip:
            d, s = _tiles(loc, "tensor_copy", dst, value)
            _done(E.emit_tensor_copy(d, s, loc=loc))
        else:
            d, s = _dma_pair(dst, value, loc, "dma_copy")
            _done(E.emit_dma_copy(d, s, loc=loc))
    elif isinstance(value, int | float | np.integer | np.floating | bool):
        _done(E.emit_memset(_acc(dst, loc, "memset"), value=value, loc=loc))
    else:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op="assignment",
            why=f"a tensor is assigned a tensor or a number, got {got_type(value)}",
        )


def _device_print(prefix: str, tensor: NkiTensor, loc: SourceLoc) -> None:
    E.emit_device_print(_acc(tensor, loc, "device_print"), prefix=prefix, loc=loc)


# the dialect's names: not the modules and nkikit helpers this module works with
_INTERNAL = {
    "annotations", "enum", "math", "np", "os", "dtypes", "errors", "types", "mx", "random",
    "registers", "scalars", "ACC", "Access", "Affine", "Axis", "E", "NkiError", "Predicate",
    "SourceLoc", "CHECK_EVERY_CALL", "access_of", "caller_loc", "check_tensor_engine",
    "current", "got_type", "maybe_current", "op_name", "require_tensor", "resolve_accumulate",
    "warn_at", "local_gather_indices", "empty_operand",
}  # fmt: skip
__all__ = [n for n in dir() if not n.startswith("_") and n not in _INTERNAL]
