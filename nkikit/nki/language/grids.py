"""NKI 0.7's tile and block grids: ``nl.tiles``, ``nl.blocks``, ``nl.alloc_tiles``,
``nl.alloc_blocks`` [reference/nki-0x.md §3.12].

A grid is a view of a tensor in tile (or block) coordinates.  It allocates nothing and emits
no instruction; ``grid.data`` is the :class:`NkiTensor` an instruction takes, so a grid kernel
traces into exactly the IR of the same kernel written with slices.

Every grid is a *region* of a *store* plus a geometry:

* the store is either a tensor (``nl.tiles(t)``: the region's data is a slice of ``t``) or the
  backing of ``nl.alloc_tiles`` on SBUF/PSUM, which lays its physical tiles side by side along
  the free axis of one ``(tile partitions, tiles x tile free size)`` tensor, in row-major tile
  order (HBM allocations are plain tensors of the logical shape, as NKI documents);
* the region is an element range per store dimension; a leading *untiled* dimension selected
  by an integer is dropped (one slab at a time), a tiled dimension selected by an integer stays
  in ``element_shape`` and leaves the grid's ``shape``;
* the cell of a tile grid is ``tile_shape`` (1 along untiled dimensions); of a block grid,
  ``tile_shape x block_shape``.  The last cell along a dimension is clamped to the region.

``nl.tiles``/``nl.blocks`` of a grid re-tile its region (a block's tiles, blocks of tiles).
"""

from __future__ import annotations

import builtins
import math
import operator
from typing import Any

import numpy as np

from ...errors import NkiError, SourceLoc, caller_loc
from ...ir.core import HBM_BUFFERS
from ..tensor import NkiTensor


class _TileStorage:
    """The backing of an on-chip ``alloc_tiles``/``alloc_blocks``: logical ``shape``, the
    physical ``tile`` (1 along untiled dimensions; dimension ``first`` is the partition
    dimension) and the ``(tile partitions, tiles x tile free size)`` tensor ``backing``."""

    __slots__ = ("shape", "tile", "first", "backing", "counts", "tile_free")

    def __init__(self, shape: tuple[int, ...], tile: tuple[int, ...], first: int, backing) -> None:
        self.shape, self.tile, self.first, self.backing = shape, tile, first, backing
        self.counts = tuple(-(-n // t) for n, t in zip(shape, tile))
        self.tile_free = math.prod(tile[first + 1 :])

    def view(self, lo, hi, dropped) -> NkiTensor | str:
        """The backing's view of elements ``[lo, hi)`` (dropped dimensions leave the shape),
        or why no single access pattern reaches exactly them."""
        n, first = len(self.shape), self.first
        # element strides inside one tile (row-major over the tile's free dimensions) and
        # the strides between neighbouring tiles (row-major over the tile counts)
        within = [0] * n
        step = 1
        for d in range(n - 1, first, -1):
            within[d] = step
            step *= self.tile[d]
        between = [0] * n
        step = self.tile_free
        for d in range(n - 1, -1, -1):
            between[d] = step
            step *= self.counts[d]
        offset = 0
        shape: list[int] = []
        strides: list[int] = []
        for d in range(n):
            if d < first and not dropped[d]:
                return (
                    f"it keeps the untiled dimension {d} before the partition dimension (an "
                    "on-chip operand's first dimension is its partitions); select one slab of "
                    "it with an integer index"
                )
            t = self.tile[d]
            first_tile, last_tile = lo[d] // t, (hi[d] - 1) // t
            offset += first_tile * between[d] + (lo[d] % t) * within[d]
            if d == first:
                if first_tile != last_tile:
                    return (
                        f"it spans {last_tile - first_tile + 1} tiles along the partition "
                        f"dimension, which live on the same {t} partitions"
                    )
                stride = self.backing.strides[0]
                offset += (lo[d] % t) * (stride - within[d])  # the partition's own stride
            elif first_tile == last_tile or t == 1:
                stride = within[d] if t > 1 else between[d]
            elif within[d] * t == between[d]:
                stride = within[d]  # neighbouring tiles continue each other's rows
            else:
                return f"its tiles along dimension {d} are not adjacent in the storage"
            if not dropped[d]:
                shape.append(hi[d] - lo[d])
                strides.append(stride)
        return self.backing._with(shape, strides, self.backing.offset + offset)


class NkiGrid:
    """A tensor region in tile (``NkiTileGrid``) or block (``NkiBlockGrid``) coordinates.

    ``shape`` counts cells (tiles or blocks) per grid dimension; ``tile_shape`` is the
    nominal tile; ``element_shape`` the selected elements per (kept) source dimension;
    ``index_step_elements`` the elements one grid coordinate steps over; ``data`` the
    selection as one :class:`NkiTensor` (``err_invalid_argument`` when
    ``is_data_representable`` is False); ``is_remainder`` whether a cell is clamped.
    Indexing takes integers (a coordinate, consumed) and ``a:b`` slices."""

    __slots__ = ("_store", "_lo", "_hi", "_dropped", "_grid_dims", "_cell", "tile_shape")

    block_shape: tuple[int, ...] | None = None

    def __init__(self, store, lo, hi, dropped, grid_dims, cell, tile_shape) -> None:
        self._store = store  # NkiTensor | _TileStorage
        self._lo, self._hi, self._dropped = tuple(lo), tuple(hi), tuple(dropped)
        self._grid_dims = tuple(grid_dims)  # store dimensions that are grid coordinates
        self._cell = tuple(cell)  # per store dimension: elements per cell
        self.tile_shape = tuple(tile_shape)

    # -- attributes ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(-(-(self._hi[d] - self._lo[d]) // self._cell[d]) for d in self._grid_dims)

    @property
    def ndim(self) -> int:
        return len(self._grid_dims)

    @property
    def element_shape(self) -> tuple[int, ...]:
        return tuple(h - lo for h, lo, x in zip(self._hi, self._lo, self._dropped) if not x)

    @property
    def index_step_elements(self) -> tuple[int, ...]:
        return tuple(self._cell[d] for d in self._grid_dims)

    @property
    def is_remainder(self) -> bool:
        return any(
            (h - lo) % c
            for h, lo, c, x in zip(self._hi, self._lo, self._cell, self._dropped)
            if not x
        )

    @property
    def dtype(self):
        return self._backing().dtype

    @property
    def buffer(self):
        return self._backing().buffer

    @property
    def is_data_representable(self) -> bool:
        return isinstance(self._data(), NkiTensor)

    @property
    def data(self) -> NkiTensor:
        got = self._data()
        if isinstance(got, NkiTensor):
            return got
        raise NkiError(
            "err_invalid_argument",
            caller_loc(),
            op=f"{type(self).__name__}.data",
            why=f"the selection {self.element_shape} is not one tensor operand: {got}; "
            "select fewer tiles (e.g. one row of tiles) or move them one at a time",
        )

    def _backing(self) -> NkiTensor:
        store = self._store
        return store.backing if isinstance(store, _TileStorage) else store

    def _data(self) -> NkiTensor | str:
        store = self._store
        if isinstance(store, _TileStorage):
            return store.view(self._lo, self._hi, self._dropped)
        key = tuple(
            lo if x else slice(lo, h) for lo, h, x in zip(self._lo, self._hi, self._dropped)
        )
        return store[key]

    def __repr__(self) -> str:
        extra = "" if self.block_shape is None else f", block_shape={self.block_shape}"
        return (
            f"{type(self).__name__}(shape={self.shape}, tile_shape={self.tile_shape}{extra}, "
            f"element_shape={self.element_shape})"
        )

    def __len__(self) -> int:
        if not self._grid_dims:
            raise TypeError(f"len() of a {type(self).__name__} with no grid dimensions")
        return self.shape[0]

    def __iter__(self):
        """The cells (or sub-grids) along the first grid dimension, in order: ``for row in
        grid`` is ``grid[0], grid[1], ...``.  A grid with no grid dimensions is not iterable."""
        n = len(self)  # TypeError now, for a grid with no grid dimensions, not at next()
        return (self[i] for i in range(n))

    # -- indexing ------------------------------------------------------------------------------
    def __getitem__(self, key) -> NkiGrid:
        loc = caller_loc()
        if type(key) is not tuple:
            key = (key,)
        dims = self._grid_dims
        if len(key) > len(dims):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op="grid indexing",
                why=f"{len(key)} indices for a grid of {len(dims)} dimensions {self.shape}",
            )
        lo, hi, dropped = list(self._lo), list(self._hi), list(self._dropped)
        kept = []
        counts = self.shape
        tiled_from = self._tiled_from()
        for g, d in enumerate(dims):
            k = key[g] if g < len(key) else slice(None)
            c, count = self._cell[d], counts[g]
            if isinstance(k, slice):
                if k.step not in (None, 1):
                    raise NkiError(
                        "err_invalid_argument",
                        loc,
                        op="grid indexing",
                        why=f"grid slices take step 1, got {k.step}",
                    )
                for bound in (k.start, k.stop):
                    if bound is not None and not _is_index(bound):
                        raise NkiError(
                            "err_invalid_argument",
                            loc,
                            op="grid indexing",
                            why=f"grid slice bounds are ints, got {bound!r}",
                        )
                a, b, _ = k.indices(count)
                if a >= b:
                    raise NkiError(
                        "err_invalid_argument",
                        loc,
                        op="grid indexing",
                        why=f"the slice {k.start}:{k.stop} selects no cell of dimension {g} "
                        f"({count} cells)",
                    )
                lo[d], hi[d] = self._lo[d] + a * c, min(self._lo[d] + b * c, self._hi[d])
                kept.append(d)
                continue
            try:
                k = operator.index(k)  # ints, numpy integers
            except TypeError:
                raise NkiError(
                    "err_invalid_argument",
                    loc,
                    op="grid indexing",
                    why=f"grid indices are ints and a:b slices, got {type(k).__name__}",
                ) from None
            i = k + count if k < 0 else k
            if not 0 <= i < count:
                raise NkiError(
                    "err_tensor_access_out_of_bound",
                    loc,
                    tensor=self._backing().name,
                    dim=g,
                    index=k,
                    size=count,
                )
            lo[d], hi[d] = self._lo[d] + i * c, min(self._lo[d] + (i + 1) * c, self._hi[d])
            if d < tiled_from:
                dropped[d] = True  # an untiled slab: the dimension leaves element_shape too
        return self._like(lo, hi, dropped, kept)

    def _tiled_from(self) -> int:
        """The first store dimension the tile shape applies to."""
        kept = [d for d in range(len(self._lo)) if not self._dropped[d]]
        return kept[len(kept) - len(self.tile_shape)]

    def _like(self, lo, hi, dropped, grid_dims) -> NkiGrid:
        g = object.__new__(type(self))
        NkiGrid.__init__(g, self._store, lo, hi, dropped, grid_dims, self._cell, self.tile_shape)
        if self.block_shape is not None:
            g.block_shape = self.block_shape
        return g


class NkiTileGrid(NkiGrid):
    """A grid whose cells are tiles (``nl.tiles``, ``nl.alloc_tiles``)."""

    __slots__ = ()


class NkiBlockGrid(NkiGrid):
    """A grid whose cells are blocks of ``block_shape`` tiles (``nl.blocks``,
    ``nl.alloc_blocks``); ``nl.tiles(block)`` reaches a block's tiles."""

    __slots__ = ("block_shape",)


# -- construction ---------------------------------------------------------------------------------


def _is_index(n) -> bool:
    """An integer (Python's or numpy's), not a bool."""
    if isinstance(n, bool | np.bool_):
        return False
    try:
        operator.index(n)
    except TypeError:
        return False
    return True


def _shape_arg(value, what: str, op: str, loc: SourceLoc, min_rank: int = 1) -> tuple[int, ...]:
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple) and all(map(_is_index, value)):
        value = tuple(map(operator.index, value))  # numpy integers as Python ints
    else:
        raise NkiError(
            "err_invalid_argument", loc, op=op, why=f"{what} must be a tuple of ints, got {value!r}"
        )
    if len(value) < min_rank or builtins.min(value, default=1) <= 0:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=op,
            why=f"{what} must have at least {min_rank} positive entries, got {value}",
        )
    return value


def _check_rank(tile_shape, extent, what: str, op: str, loc: SourceLoc) -> None:
    if len(tile_shape) > len(extent):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=op,
            why=f"tile_shape {tile_shape} has more dimensions than {what} {extent}",
        )


def _region(source, op: str, loc: SourceLoc):
    """(store, lo, hi, dropped, the source grid's tile and block shapes) of a grid source."""
    if isinstance(source, NkiGrid):
        return (
            source._store,
            source._lo,
            source._hi,
            source._dropped,
            source.tile_shape,
            source.block_shape,
        )
    if isinstance(source, NkiTensor):
        n = len(source.shape)
        return source, (0,) * n, source.shape, (False,) * n, None, None
    raise NkiError(
        "err_invalid_argument",
        loc,
        op=op,
        why=f"expected a tensor or a grid, got {type(source).__name__}",
    )


def _make(source, tile_shape, block_shape, op: str, loc: SourceLoc) -> NkiTileGrid | NkiBlockGrid:
    store, lo, hi, dropped, src_tile, src_block = _region(source, op, loc)
    if tile_shape is None:
        if src_tile is None:
            raise NkiError(
                "err_invalid_argument", loc, op=op, why="tile_shape is required for a tensor"
            )
        tile_shape = src_tile
    tile_shape = _shape_arg(tile_shape, "tile_shape", op, loc, 2)
    kept = [d for d in range(len(lo)) if not dropped[d]]
    _check_rank(tile_shape, tuple(hi[d] - lo[d] for d in kept), "the source", op, loc)
    untiled = len(kept) - len(tile_shape)
    backing = store.backing if isinstance(store, _TileStorage) else store
    if untiled and backing.on_chip and not isinstance(store, _TileStorage):
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=op,
            why=f"an on-chip tensor is tiled in every dimension: tile_shape {tile_shape} for "
            f"{len(kept)} dimensions",
        )
    if isinstance(store, _TileStorage) and kept[untiled] != store.first:
        raise NkiError(
            "err_invalid_argument",
            loc,
            op=op,
            why=f"tile_shape {tile_shape} makes dimension {kept[untiled]} the tiles' "
            f"partitions, but this storage keeps its partitions in dimension {store.first}",
        )
    if block_shape is not None:
        block_shape = _shape_arg(block_shape, "block_shape", op, loc)
        if len(block_shape) != len(tile_shape):
            raise NkiError(
                "err_invalid_argument",
                loc,
                op=op,
                why=f"block_shape {block_shape} needs the rank of tile_shape {tile_shape}",
            )
    cell = [1] * len(lo)
    for i, d in enumerate(kept[untiled:]):
        cell[d] = tile_shape[i] * (1 if block_shape is None else block_shape[i])
    cls = NkiTileGrid if block_shape is None else NkiBlockGrid
    g = object.__new__(cls)
    NkiGrid.__init__(g, store, lo, hi, dropped, kept, cell, tile_shape)
    if block_shape is not None:
        g.block_shape = block_shape
    return g


def tiles(source, *, tile_shape=None) -> NkiTileGrid:
    """``source`` (a tensor, or a grid's region) as a grid of ``tile_shape`` tiles over its
    trailing dimensions (leading HBM dimensions stay untiled, one slab per coordinate); the
    last tile along a dimension is clamped.  ``tile_shape`` defaults to a grid source's."""
    return _make(source, tile_shape, None, "nl.tiles", caller_loc())


def _needs_block_shape(block_shape, op: str, loc: SourceLoc) -> None:
    """A block grid's ``block_shape`` is required: None would make a tile grid."""
    if block_shape is None:
        raise NkiError("err_invalid_argument", loc, op=op, why="block_shape is required")


def blocks(source, *, tile_shape=None, block_shape) -> NkiBlockGrid:
    """``source`` as a grid of blocks of ``block_shape`` tiles of ``tile_shape``."""
    loc = caller_loc()
    _needs_block_shape(block_shape, "nl.blocks", loc)
    return _make(source, tile_shape, block_shape, "nl.blocks", loc)


def _allocate(tile_shape, block_shape, element_shape, buffer, dtype, address, name, op, fill):
    from . import _buffer_name, full, ndarray

    loc = caller_loc()
    tile_shape = _shape_arg(tile_shape, "tile_shape", op, loc, 2)
    element_shape = _shape_arg(element_shape, "element_shape", op, loc)
    _check_rank(tile_shape, element_shape, "element_shape", op, loc)
    buf = _buffer_name(buffer, loc)
    if buf in HBM_BUFFERS:
        # HBM: the compact logical extent is the storage
        t = (
            ndarray(element_shape, dtype, buffer=buffer, name=name, address=address)
            if fill is None
            else full(element_shape, fill, dtype, buffer=buffer, name=name)
        )
        return _make(t, tile_shape, block_shape, op, loc)
    first = len(element_shape) - len(tile_shape)
    # the physical tile: nominal, but no larger than the extent (a single clamped tile along a
    # dimension takes only its own room); untiled leading dimensions are tiles of extent 1
    tile = (1,) * first + tuple(
        builtins.min(t, n) for t, n in zip(tile_shape, element_shape[first:])
    )
    counts = math.prod(-(-n // t) for n, t in zip(element_shape, tile))
    free = counts * math.prod(tile[first + 1 :])
    kwargs: dict[str, Any] = {"buffer": buffer, "name": name}
    if fill is None:
        backing = ndarray((tile[first], free), dtype, address=address, **kwargs)
    else:
        backing = full((tile[first], free), fill, dtype, **kwargs)
    store = _TileStorage(element_shape, tile, first, backing)
    n = len(element_shape)
    region = NkiGrid(store, (0,) * n, element_shape, (False,) * n, (), (1,) * n, tile_shape)
    return _make(region, tile_shape, block_shape, op, loc)


def alloc_tiles(
    *, tile_shape, element_shape, buffer, dtype, address=None, name: str = ""
) -> NkiTileGrid:
    """New uninitialised storage for ``element_shape`` elements as a grid of ``tile_shape``
    tiles.  HBM stores the logical shape; SBUF/PSUM store the tiles side by side along the
    free axis of one ``(tile partitions, tiles x tile free size)`` tensor, so a row of 2-D
    tiles is one operand and a column is not (``is_data_representable``)."""
    return _allocate(
        tile_shape, None, element_shape, buffer, dtype, address, name, "nl.alloc_tiles", None
    )


def alloc_blocks(
    *, tile_shape, block_shape, element_shape, buffer, dtype, address=None, name: str = ""
) -> NkiBlockGrid:
    """``alloc_tiles`` storage seen as a grid of blocks of ``block_shape`` tiles."""
    _needs_block_shape(block_shape, "nl.alloc_blocks", caller_loc())
    return _allocate(
        tile_shape,
        block_shape,
        element_shape,
        buffer,
        dtype,
        address,
        name,
        "nl.alloc_blocks",
        None,
    )


def grid_like(g: NkiGrid, dtype, buffer, name: str, fill) -> NkiGrid:
    """New storage with ``g``'s geometry and grid shape (``nl.empty_like`` / ``zeros_like`` /
    ``ones_like`` of a grid: ``empty_like(tiles[i, :])[j]`` is tile ``j`` of the row);
    ``fill`` None leaves it uninitialised."""
    op = "nl.alloc_tiles" if g.block_shape is None else "nl.alloc_blocks"
    new = _allocate(
        g.tile_shape,
        g.block_shape,
        g.element_shape,
        buffer if buffer is not None else g.buffer,
        dtype if dtype is not None else g.dtype,
        None,
        name,
        op,
        fill,
    )
    # the coordinates ``g`` consumed (each one cell wide) are consumed in the copy too
    kept = [d for d in range(len(g._lo)) if not g._dropped[d]]
    return new[tuple(slice(None) if d in g._grid_dims else 0 for d in kept)]
