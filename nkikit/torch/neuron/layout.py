"""How a region's tensors are laid out in SBUF tiles: the iteration space of a generated kernel.

Every value of a region is aligned to one *domain* (the broadcast of its inputs, right-aligned
as torch broadcasts): its aligned shape has the domain's size or 1 in each dimension.  The
dimensions a region reduces (all its reductions and row-wise ops must reduce the same ones) go
on the tile's free axis, whole, so a reduction is one VectorE/ScalarE instruction per tile
(reference/nki-0x.md §4.6 ``tensor_reduce``: free axes only).  Without reductions the free
axis is the innermost dimension, cut into chunks.  One other dimension is the partition axis,
cut into tiles of at most 128 rows (§3.9); the rest are loops.

Adjacent dimensions that every tensor walks contiguously are merged first, so a contiguous
elementwise region is one ``(rows, cols)`` loop whatever its rank, and a broadcast operand is
read through stride-0 access patterns (``.ap``, §3.6): a row vector is DMA'd to every
partition, a column vector becomes a ``(P, 1)`` tile used as a ``tensor_scalar`` operand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .region import Region

PMAX = 128
"""Partitions per tile (``nl.tile_size.pmax``, reference/nki-0x.md §3.10)."""
FREE_CHUNK = 2048
"""Free elements per tile of an elementwise region: 8 KiB per partition in fp32, so a chain
of a dozen live tiles stays well inside a partition's SBUF."""
MAX_REDUCED = 8192
"""Largest reduced extent held in one tile row (32 KiB per partition in fp32)."""
MAX_TILES = 8192
"""Most tiles one kernel unrolls into (NKI 0.7 kernels unroll their Python loops)."""


class Unsupported(Exception):
    """The region (or one of its nodes) cannot be generated; ``str()`` is the reason."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The tiling of a region.

    ``dims`` are the merged domain sizes; ``part`` indexes the partition dimension (None: one
    partition), ``free`` the free dimensions (in order), ``outer`` the loop dimensions.
    ``chunk`` is the free extent per tile when the free axis is one cut dimension, else the
    whole free extent.  ``strides[name]`` are the element strides of each input and output
    over ``dims`` (0 where it is broadcast); ``wide[name]`` says whether a value spans the free
    axis (a ``(P, F)`` tile) or not (a ``(P, 1)`` tile); ``reduced`` the region's reduced
    domain dimensions (original numbering) and ``aligned`` every value's aligned shape."""

    domain: tuple[int, ...]
    dims: tuple[int, ...]
    part: int | None
    free: tuple[int, ...]
    outer: tuple[int, ...]
    chunk: int
    strides: dict[str, tuple[int, ...]]
    wide: dict[str, bool]
    aligned: dict[str, tuple[int, ...]]
    reduced: frozenset[int]
    fold: bool = False
    """The reduced elements are spread over the partitions too (a region reducing everything):
    each reduction ends with a cross-partition reduce, and its results are ``(1, 1)`` tiles."""

    @property
    def free_size(self) -> int:
        return math.prod(self.dims[d] for d in self.free)

    @property
    def part_size(self) -> int:
        return 1 if self.part is None else self.dims[self.part]

    @property
    def tiles(self) -> int:
        outer = math.prod(self.dims[d] for d in self.outer)
        return outer * -(-self.part_size // PMAX) * -(-self.free_size // self.chunk)


def pad(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """torch's broadcast of equal-rank shapes; Unsupported if they do not broadcast."""
    out = list(shapes[0])
    for s in shapes[1:]:
        for i, n in enumerate(s):
            if out[i] == 1:
                out[i] = n
            elif n not in (1, out[i]):
                raise Unsupported(f"shapes {shapes} do not broadcast")
    return tuple(out)


def plan(region: Region, kinds: dict[str, tuple[str, tuple[int, ...], bool]]) -> Plan:
    """The tiling of ``region``.  ``kinds[node.out.name]`` is ``(kind, dims, folds)`` for each
    node (``folds``: a reduction that can finish across partitions):
    kind ``"map"`` (elementwise over its broadcast tensor operands), ``"reduce"`` (``dims`` of
    its first operand, in that operand's torch numbering, become 1), ``"rows"`` (same shape out
    as in, reducing ``dims`` internally: softmax, norms), ``"alias"`` (result ``dims[0]`` of a
    multi-result node), ``"fill"`` (shape of its operand, nothing read) or ``"view"`` (a
    reshape or expand that moves no element)."""
    names = {v.name for v in region.inputs} | {n.out.name for n in region.nodes}
    rank = max(
        [len(v.shape) for v in region.inputs] + [len(n.out.shape) for n in region.nodes] + [1]
    )
    aligned: dict[str, tuple[int, ...]] = {v.name: pad(v.shape, rank) for v in region.inputs}
    reduced: set[int] | None = None

    def operand_shape(name: str, node_op: str) -> tuple[int, ...]:
        a = aligned[name]
        if pad(region.value(name).shape, rank) != a:
            raise Unsupported(
                f"{node_op}: {name} (shape {region.value(name).shape}) is a reduction result "
                "without keepdim broadcast along another axis"
            )
        return a

    for node in region.nodes:
        kind, dims, _ = kinds[node.out.name]
        tensors = [a for a in _flat(node.args) + _flat(node.kwargs) if a in names]
        if kind == "alias":
            # a multi-result node's extra results share its first result's layout, reduced
            # where the node reduces
            src = tensors[0]
            out = aligned[src]
            if region.value(node.out.name).shape != region.value(src).shape:
                out = tuple(1 if i in (reduced or ()) else n for i, n in enumerate(out))
            aligned[node.out.name] = out
            continue
        if kind == "view":
            # a reshape that only adds or drops size-1 dimensions (or an expand) keeps every
            # element where the domain has it: no data moves
            src = aligned[tensors[0]]
            out = pad(node.out.shape, rank)
            if len(node.out.shape) > rank or any(a not in (o, 1) for a, o in zip(src, out)):
                raise Unsupported(
                    f"{node.op}: {tensors[0]} {region.value(tensors[0]).shape} -> "
                    f"{node.out.shape} moves elements across dimensions"
                )
            aligned[node.out.name] = out
            continue
        ins = [operand_shape(t, node.op) for t in tensors]
        if kind in ("reduce", "rows"):
            x = region.value(tensors[0])
            r = len(x.shape)
            here = {(d % max(r, 1)) + rank - r for d in dims} if r else set()
            if reduced is None:
                reduced = here
            elif here and here != reduced:
                raise Unsupported(
                    f"{node.op} reduces dims {sorted(here)} but the region reduces "
                    f"{sorted(reduced)}: one region reduces one set of dimensions"
                )
            out = (
                ins[0]
                if kind == "rows"
                else tuple(1 if i in here else n for i, n in enumerate(ins[0]))
            )
            if kind == "rows" and len(ins) > 1:
                out = broadcast(*ins)
        elif kind == "fill":
            out = ins[0] if ins else pad(node.out.shape, rank)
        else:
            out = broadcast(*ins) if ins else pad(node.out.shape, rank)
        if kind != "reduce" and pad(node.out.shape, rank) != out:
            raise Unsupported(f"{node.op}: result shape {node.out.shape} is not its operands'")
        aligned[node.out.name] = out
    red = frozenset(reduced or ())
    domain = broadcast(*aligned.values())
    for o in region.outputs:
        a = aligned[o]
        for i, (n, d) in enumerate(zip(a, domain)):
            if n != d and not (i in red and n == 1):
                raise Unsupported(
                    f"output {o} (shape {region.value(o).shape}) does not cover the region's "
                    f"domain {domain}"
                )

    def strides_of(a: tuple[int, ...]) -> list[int]:
        out, acc = [0] * rank, 1
        for i in range(rank - 1, -1, -1):
            out[i] = acc if a[i] > 1 or domain[i] == 1 else 0
            acc *= a[i]
        return out

    io = [v.name for v in region.inputs] + [o for o in region.outputs]
    st = {n: strides_of(aligned[n]) for n in io}
    # drop size-1 dims, then merge neighbours every tensor walks contiguously
    keep = [i for i in range(rank) if domain[i] > 1]
    dims = [domain[i] for i in keep]
    isred = [i in red for i in keep]
    st = {n: [s[i] for i in keep] for n, s in st.items()}
    k = len(dims) - 1
    while k > 0:
        if isred[k - 1] == isred[k] and all(s[k - 1] == s[k] * dims[k] for s in st.values()):
            dims[k - 1 : k + 1] = [dims[k - 1] * dims[k]]
            isred[k - 1 : k + 1] = [isred[k]]
            for s in st.values():
                s[k - 1 : k + 1] = [s[k]]
        k -= 1
    if not dims:
        dims, isred, st = [1], [False], {n: [0] for n in st}
    if red:
        free = [i for i, r in enumerate(isred) if r]
        rows = [i for i, r in enumerate(isred) if not r]
    else:
        free, rows = [len(dims) - 1], list(range(len(dims) - 1))
        inner = dims[-1]
        if math.prod(dims[i] for i in rows) < PMAX and inner % PMAX == 0 and inner > PMAX:
            # too few rows for the partitions: fold the inner dimension onto them
            dims[-1:] = [PMAX, inner // PMAX]
            for s in st.values():
                s[-1:] = [s[-1] * (inner // PMAX), s[-1]]
            rows, free = rows + [len(dims) - 2], [len(dims) - 1]
    if red:
        wide = {n: any(a[i] > 1 for i in red) for n, a in aligned.items()}
    else:
        wide = {n: _wide_unreduced(a, domain) for n, a in aligned.items()}
    fold = False
    if red and not rows and math.prod(dims) >= 2 * PMAX and _foldable(region, kinds, wide):
        # nothing left for the partitions: put part of the reduced extent on them
        split = _fold_split(dims[free[0]], math.prod(dims[i] for i in free[1:]))
        if split > 1:
            n0 = dims[free[0]]
            dims[free[0] : free[0] + 1] = [split, n0 // split]
            for s in st.values():
                s[free[0] : free[0] + 1] = [s[free[0]] * (n0 // split), s[free[0]]]
            rows, free = [free[0]], [f + 1 for f in free]
            fold = True
    part = rows[-1] if rows else None
    outer = tuple(rows[:-1])
    fsize = math.prod(dims[i] for i in free)
    if red and fsize > MAX_REDUCED:
        raise Unsupported(
            f"the reduced extent {fsize} exceeds one SBUF tile row ({MAX_REDUCED} elements per "
            "partition)"
        )
    if red and len(free) > 3:
        raise Unsupported("the reduced dimensions need more than 3 free access-pattern levels")
    chunk = fsize if red else min(fsize, FREE_CHUNK)
    p = Plan(
        domain,
        tuple(dims),
        part,
        tuple(free),
        outer,
        chunk,
        {n: tuple(s) for n, s in st.items()},
        wide,
        aligned,
        red,
        fold,
    )
    if p.tiles > MAX_TILES:
        raise Unsupported(f"the region needs {p.tiles} tiles (at most {MAX_TILES} unrolled)")
    return p


def _foldable(region: Region, kinds: dict, wide: dict[str, bool]) -> bool:
    """Whether every reduction of ``region`` can finish across partitions: its inputs all span
    the reduced axis, its reductions fold, and nothing computed from a reduction is broadcast
    back over the reduced axis (that would need the result on every partition)."""
    if not all(wide[v.name] for v in region.inputs):
        return False
    after: set[str] = set()
    for node in region.nodes:
        kind, _, folds = kinds[node.out.name]
        uses = set(_flat(node.args) + _flat(node.kwargs))
        if kind in ("reduce", "rows") and not folds:
            return False
        if kind == "reduce" or uses & after:
            if wide[node.out.name] or (kind == "reduce" and uses & after):
                return False
            after.add(node.out.name)
    return True


def _fold_split(n0: int, rest: int) -> int:
    """Partitions for a reduced extent ``n0 * rest`` folded over its outer dimension ``n0``:
    the largest divisor of ``n0`` up to 128 that leaves each partition at most
    ``MAX_REDUCED`` elements (1: none)."""
    for p in range(min(PMAX, n0), 1, -1):
        if n0 % p == 0 and (n0 // p) * rest <= MAX_REDUCED:
            return p
    return 1


def _wide_unreduced(a: tuple[int, ...], domain: tuple[int, ...]) -> bool:
    """Whether a value spans the free axis of a region without reductions: the innermost
    dimension of the domain larger than 1 (the free axis is made from it)."""
    for i in range(len(domain) - 1, -1, -1):
        if domain[i] > 1:
            return a[i] > 1
    return False


def _flat(x) -> list:
    if isinstance(x, tuple | list):
        out = []
        for e in x:
            out.extend(_flat(e))
        return out
    return [x]
