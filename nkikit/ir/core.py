"""The IR data model: tensors, accesses, ops, loops and the kernel that holds them.

A kernel body is a list of statements: ``Alloc`` (a buffer comes to life, poisoned),
``Op`` (one instruction: primitive name, output and input accesses, attributes, mask,
source location) and ``Loop`` (a rolled affine_range / sequential_range with a body).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import SourceLoc
from .affine import Affine, Axis, LoopVar, Predicate, Sym

HBM_BUFFERS = ("hbm", "shared_hbm", "private_hbm")
ON_CHIP = ("sbuf", "psum")

_tensor_ids = itertools.count()


@dataclass(eq=False, slots=True)
class Tensor:
    """A named buffer: kernel parameter, output, constant or on-chip tile."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    buffer: str  # one of HBM_BUFFERS + ON_CHIP
    kind: str = "temp"  # "input" | "output" | "temp" | "const"
    par_axis: int = 0
    loc: SourceLoc | None = None
    scope: tuple[LoopVar, ...] = ()  # loops enclosing its creation
    base: Tensor | None = None  # a reshape of another HBM tensor
    mutable: bool = False
    const_value: np.ndarray | None = None
    # bytes [start, end) of each partition of its memory that the user's allocation fixed
    # (blocks beyond the allocated tiles alias modulo them); None: the allocator chooses
    user_span: tuple[int, int] | None = None
    # byte offset in each partition that NKI 0.x ``nl.ndarray(address=(p, offset))`` placed an
    # on-chip tensor at; None: unplaced.  Unlike ``user_span`` it does not hold its bytes for
    # the whole kernel: the tensor lives as any other, and placed tensors alive at once that
    # share bytes share them (``ir/verify.py``: ``_psum_liveness``)
    address: int | None = None
    # the counter's own __next__: no Python frame per tensor (an unrolled kernel makes many)
    uid: int = field(default_factory=_tensor_ids.__next__)

    def __hash__(self) -> int:
        return self.uid

    @property
    def is_hbm(self) -> bool:
        return self.buffer in HBM_BUFFERS

    @property
    def root(self) -> Tensor:
        t = self
        while t.base is not None:
            t = t.base
        return t

    @property
    def partitions(self) -> int:
        return self.shape[self.par_axis] if self.shape else 1

    @property
    def bytes_per_partition(self) -> int:
        # math.prod, not np.prod: asked per tile by the verifier and the allocator
        n = math.prod([s for i, s in enumerate(self.shape) if i != self.par_axis])
        return n * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"%{self.name}"


ACCUMULATOR_LANES = 128
ACCUMULATORS = frozenset({"acc_vector", "acc_scalar"})
"""The names of the tensors that hold the VectorE and ScalarE accumulator registers
(``nkikit/trace/accumulators.py``): engine state the engine updates in program order, so
the verifier lets every iteration of a loop write them and the cost model charges a
reduction's read-out to the copy out of them."""


def is_accumulator(t: Tensor) -> bool:
    """Whether ``t`` holds an engine's accumulator registers (see :data:`ACCUMULATORS`)."""
    return t.name in ACCUMULATORS and t.shape == (ACCUMULATOR_LANES, 1) and t.buffer == "sbuf"


# not frozen (a frozen dataclass's __init__ sets each field through object.__setattr__, and
# the tracer builds an Access per operand of every instruction): treated as immutable all the
# same -- ops share their accesses, and hashing takes every field
@dataclass(unsafe_hash=True, slots=True)
class Access:
    """A tile-shaped window of a tensor: tile element ``(a0, a1, ...)`` is tensor element
    ``(index[0], index[1], ...)`` evaluated with ``Axis(k) = ak``.

    An *indirect* access (indirect DMA, ``t[idx_tile, i_f]``) also has a runtime index:
    along tensor dimension ``indirect_dim`` the coordinate is ``index[indirect_dim]`` (a static
    offset, usually 0) **plus** the integer the SBUF index tile holds for the element.
    ``indirect`` is that index tile's access, written in the same tile axes as this access
    (so ``%idx[a0, 0]`` gives partition ``a0`` its own index); ``indirect.shape`` is its extent
    along each of this access's tile axes ((P, 1) for a legal gather/scatter).  The op that
    uses an indirect access also lists ``indirect`` among its inputs (the builder adds it), so
    every pass that follows reads sees the index tile as one.

    *Tensor indirection* (NKI 0.x ``NkiTensor.indirect``, NeuronCore-v4) is an indirect access
    of an on-chip tensor whose runtime index is a free-dimension offset per element, read from
    the index tile in snake order (``nkikit/trace/indirection.py`` builds it); its
    ``indirect_extent`` is the size of the view the offsets select in: each runtime offset must
    lie in ``[0, indirect_extent)``, not only inside the tensor.  None for the other runtime
    indices (indirect DMA rows, scalar offsets), which the tensor's shape bounds.
    """

    tensor: Tensor
    shape: tuple[int, ...]
    index: tuple[Affine, ...]
    indirect: Access | None = None
    indirect_dim: int = 0
    indirect_extent: int | None = None

    @staticmethod
    def whole(tensor: Tensor) -> Access:
        return Access(
            tensor, tensor.shape, tuple(Affine.of(Axis(k)) for k in range(len(tensor.shape)))
        )

    @property
    def dtype(self) -> np.dtype:
        return self.tensor.dtype

    @property
    def is_whole(self) -> bool:
        return (
            self.indirect is None
            and self.shape == self.tensor.shape
            and all(a == Affine.of(Axis(k)) for k, a in enumerate(self.index))
        )

    @property
    def syms(self) -> tuple[Sym, ...]:
        own = (s for a in self.index for s in a.syms)
        ind = self.indirect.syms if self.indirect is not None else ()
        return tuple(dict.fromkeys((*own, *ind)))

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def free_size(self) -> int:
        return math.prod(self.shape[1:])

    def substitute(self, mapping: dict[Sym, Affine]) -> Access:
        return self.remap(self.shape, mapping)

    def remap(self, shape: tuple[int, ...], mapping: dict[Sym, Affine]) -> Access:
        """This access seen with tile ``shape``, its indices (and its runtime index tile's)
        rewritten by ``mapping`` (typically tile axes of the old shape -> those of the new)."""
        index = tuple(a.substitute(mapping) for a in self.index)
        ind = self.indirect
        if ind is not None:
            ind_index = tuple(a.substitute(mapping) for a in ind.index)
            ind_shape = tuple(
                n if any(a.coef(Axis(k)) != 0 for a in ind_index) else 1
                for k, n in enumerate(shape)
            )
            ind = Access(ind.tensor, ind_shape, ind_index)
        return Access(
            self.tensor, tuple(shape), index, ind, self.indirect_dim, self.indirect_extent
        )

    def __repr__(self) -> str:
        if self.is_whole:
            return repr(self.tensor)
        parts = [repr(a) for a in self.index]
        if self.indirect is not None:
            ind = self.indirect
            where = f"{ind.tensor!r}[{', '.join(repr(a) for a in ind.index)}]"
            off = self.index[self.indirect_dim]
            parts[self.indirect_dim] = where if off == Affine() else f"{where} + {off!r}"
        shape = "x".join(map(str, self.shape))
        return f"{self.tensor!r}[{', '.join(parts)}]<{shape}>"


def indirect_index_tiles(accesses) -> list[Access]:
    """The runtime index tiles of the indirect accesses among ``accesses`` (in order)."""
    return [a.indirect for a in accesses if isinstance(a, Access) and a.indirect is not None]


def declared_inputs(op: Op) -> int:
    """How many of ``op.ins`` are the operands its primitive declares: the rest, at the end,
    are the runtime index tiles of its indirect accesses, which ``Builder.append`` lists after
    them (each once, and none that is an operand already).  An optional operand left out (a
    ``tensor_scalar`` without ``operand1``) leaves its role to no index tile."""
    ins = op.ins
    tiles = indirect_index_tiles((*op.outs, *ins))
    if not tiles:
        return len(ins)
    for n in range(max(0, len(ins) - len(tiles)), len(ins) + 1):
        head = ins[:n]
        listed: list[Access] = []
        for t in tiles:
            if t not in head and t not in listed:
                listed.append(t)
        if list(ins[n:]) == listed:
            return n
    return len(ins)


Operand = Access | float | int


@dataclass(eq=False, slots=True)
class Op:
    """One instruction.  ``prim`` names a primitive record (``ir/prims.py``: operand roles,
    engine, attribute schema, flags, output spec); ``attrs`` holds every attribute of its
    schema (``Builder.emit`` fills the defaults and writes the engine that runs the op)."""

    prim: str
    outs: list[Access]
    ins: list[Operand]
    attrs: dict[str, Any]
    loc: SourceLoc
    mask: Predicate | None = None


@dataclass(eq=False, slots=True)
class Alloc:
    """A tensor comes to life here (re-poisoned at every iteration of enclosing loops)."""

    tensor: Tensor


@dataclass(frozen=True, slots=True)
class DeviceLoop:
    """The run-time trip count of a hardware loop (NKI 0.x ``nl.fori_loop`` /
    ``nl.dynamic_range`` with a register bound, ``nl.while_loop``) [reference/nki-0x.md §5.2].

    A counting loop runs ``for i in range(start, stop, step)``, each bound an int or a
    register (a one-element int32 SBUF tile, read when the loop starts), and writes ``i`` into
    the register ``counter`` before each iteration.  A while loop (``stop`` None) runs while
    the register ``cond`` holds a value other than 0, tested before each iteration.  The
    loop's variable counts iterations; its ``trip`` is what layers that need a static count
    (verifier, cost model) assume: the exact count for int bounds, else 1.

    ``peers``: the (start, stop) of the same counting loop in the other programs of an LNC
    launch, when the programs' loops are one IR loop (``nki/language/device_loops.py``);
    they must give the same iterations (cores run identical control flow).  ``peer_conds``:
    likewise for a while loop, the other programs' condition registers, which must agree
    with ``cond`` on being 0 before every iteration."""

    start: Access | int = 0
    stop: Access | int | None = None
    step: int = 1
    counter: Access | None = None
    cond: Access | None = None
    peers: tuple[tuple[Access | int, Access | int], ...] = ()
    peer_conds: tuple[Access, ...] = ()


@dataclass(eq=False, slots=True)
class Loop:
    var: LoopVar
    body: list[Stmt]
    loc: SourceLoc
    device: DeviceLoop | None = None  # a trip count known at run time (None: ``var.trip``)

    @property
    def kind(self) -> str:
        return self.var.kind

    @property
    def trip(self) -> int:
        return self.var.trip


Stmt = Op | Alloc | Loop


@dataclass(eq=False, slots=True)
class Kernel:
    """A specialized, traced kernel."""

    name: str
    params: list[Tensor]
    outputs: list[Tensor]
    body: list[Stmt]
    grid: tuple[int, ...] = ()
    loc: SourceLoc | None = None
    tensors: list[Tensor] = field(default_factory=list)
    # how to rebuild the kernel's Python return value from the outputs
    return_structure: Any = None
    # the front end that traced it ("nki-beta1" or "nki-0.x"): a few tile-model rules differ
    dialect: str = "nki-beta1"
    # nl.program_id axes the kernel read while launched without a grid (so each read 0)
    unlaunched_program_ids: tuple[int, ...] = ()
    # facts computed from the finished kernel, kept with it (not in a global cache keyed by
    # kernels, which would keep every kernel it saw alive): see ``derived``
    facts: dict[str, Any] = field(default_factory=dict, repr=False)

    def derived(self, name: str, compute: Callable[[Kernel], Any]) -> Any:
        """``compute(self)``, computed once per kernel and kept with it under ``name`` (the
        kernel is not changed after it is traced)."""
        facts = self.facts
        if name not in facts:
            facts[name] = compute(self)
        return facts[name]

    def walk(self):
        """Yield ``(stmt, enclosing_loops)`` for every statement, depth first."""

        def go(body: list[Stmt], loops: tuple[Loop, ...]):
            for s in body:
                yield s, loops
                if isinstance(s, Loop):
                    yield from go(s.body, loops + (s,))

        yield from go(self.body, ())

    def ops(self):
        for s, loops in self.walk():
            if isinstance(s, Op):
                yield s, loops

    def census(self) -> Census:
        """How many ops the kernel has, which primitives and whether a loop has a run-time
        trip count: one walk, kept with the kernel (caches weigh kernels by their ops, the
        simulators ask for the rest; an unrolled kernel has 10^5 statements)."""
        return self.derived("census", _census)

    def __str__(self) -> str:
        from .printer import print_kernel

        return print_kernel(self)


def dtype_str(dt: np.dtype) -> str:
    return dtypes.name(dt)


@dataclass(frozen=True, slots=True)
class Census:
    """What :meth:`Kernel.census` counts."""

    ops: int  # loop bodies counted once
    prims: frozenset[str]
    device_loops: bool  # a loop with a run-time trip count


def _census(kernel: Kernel) -> Census:
    n = 0
    prims: set[str] = set()
    device = False
    stack = [kernel.body]
    while stack:
        for s in stack.pop():
            ts = type(s)
            if ts is Op:
                n += 1
                prims.add(s.prim)
            elif ts is Loop:
                device = device or s.device is not None
                stack.append(s.body)
    return Census(n, frozenset(prims), device)
