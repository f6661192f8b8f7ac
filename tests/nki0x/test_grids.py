"""NKI 0.7 tile and block grids (``nl.tiles``, ``nl.blocks``, ``nl.alloc_tiles``,
``nl.alloc_blocks``): geometry, clamped edges, ``.data`` as the same view a slice names (the
same IR), on-chip tile storage and which selections it can give as one operand, and every
misuse as a named error at the kernel's line."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


def _ir_body(kernel, *args) -> str:
    """The kernel's IR without its header (the kernel's name) and source locations."""
    return re.sub(r"\s+# .*", "", str(kernel.ir(*args)).split("\n", 1)[1])


@nki.jit
def scale_by_tiles(src, factor=2.0):
    dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
    src_tiles = nl.tiles(src, tile_shape=(128, 128))
    dst_tiles = nl.tiles(dst, tile_shape=(128, 128))
    for i in range(src_tiles.shape[0]):
        for j in range(src_tiles.shape[1]):
            t = nl.empty_like(src_tiles[i, j], buffer=nl.sbuf)
            nisa.dma_copy(t.data, src_tiles[i, j].data)
            nisa.tensor_scalar(t.data, t.data, nl.multiply, factor)
            nisa.dma_copy(dst_tiles[i, j].data, t.data)
    return dst


@nki.jit
def scale_by_slices(src, factor=2.0):
    dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
    rows, cols = src.shape
    for i in range(-(-rows // 128)):
        for j in range(-(-cols // 128)):
            r0, c0 = i * 128, j * 128
            r1, c1 = min(r0 + 128, rows), min(c0 + 128, cols)
            t = nl.ndarray((r1 - r0, c1 - c0), dtype=src.dtype, buffer=nl.sbuf)
            nisa.dma_copy(t, src[r0:r1, c0:c1])
            nisa.tensor_scalar(t, t, nl.multiply, factor)
            nisa.dma_copy(dst[r0:r1, c0:c1], t)
    return dst


def test_tiles_clamp_the_edges_and_trace_like_slices():
    x = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    np.testing.assert_array_equal(scale_by_tiles(x), x * 2)
    assert _ir_body(scale_by_tiles, x) == _ir_body(scale_by_slices, x)


def _geometry(fn, shape=(1, 1)):
    """Run ``fn(x)`` inside a traced kernel (grids exist only there), ``x`` an HBM tensor of
    ``shape``, and return what it gives."""
    seen = {}

    @nki.jit
    def k(x):
        seen["value"] = fn(x)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(t, 0.0)
        nisa.dma_copy(out, t)
        return out

    k(np.zeros(shape, np.float32))
    return seen["value"]


def test_tile_grid_geometry():
    def fn(x):
        g = nl.tiles(x, tile_shape=(128, 256))
        edge = g[-1, -1]
        row = g[1, :]
        col = g[:, 2]
        return (
            g.shape,
            g.tile_shape,
            g.element_shape,
            g.index_step_elements,
            g.is_remainder,
            edge.shape,
            edge.element_shape,
            edge.is_remainder,
            row.shape,
            row.element_shape,
            col.shape,
            col.element_shape,
            g[1:3, 1:].shape,
            g[1:3, 1:].element_shape,
            g[np.int64(1), np.int32(0)].element_shape,
            g[0, 0].data.shape,
            g[0, 0].dtype == x.dtype,
            len(g),
        )

    got = _geometry(fn, (300, 1000))
    assert got == (
        (3, 4),
        (128, 256),
        (300, 1000),
        (128, 256),
        True,
        (),
        (44, 232),
        True,
        (4,),
        (128, 1000),
        (3,),
        (300, 256),
        (2, 3),
        (172, 744),
        (128, 256),
        (128, 256),
        True,
        3,
    )


def test_leading_hbm_dimensions_are_untiled_slabs():
    @nki.jit
    def per_batch(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        xt = nl.tiles(x, tile_shape=(128, 64))
        ot = nl.tiles(out, tile_shape=(128, 64))
        assert xt.shape == (3, 2, 2) and xt.index_step_elements == (1, 128, 64)
        assert xt[1].shape == (2, 2) and xt[1].element_shape == (256, 128)
        for b in range(xt.shape[0]):
            for i in range(xt.shape[1]):
                row = nl.empty_like(xt[b, i], buffer=nl.sbuf)  # one row of tiles
                assert row.shape == (2,) and row.element_shape == (128, 128)
                nisa.dma_copy(row.data, xt[b, i].data)
                for j in range(row.shape[0]):
                    nisa.tensor_scalar(row[j].data, row[j].data, nl.add, float(b))
                nisa.dma_copy(ot[b, i].data, row.data)
        return out

    x = np.random.default_rng(1).standard_normal((3, 256, 128)).astype(np.float32)
    np.testing.assert_array_equal(per_batch(x), x + np.arange(3, dtype=np.float32)[:, None, None])


def test_blocks_group_tiles_and_tiles_of_a_block_reach_them():
    @nki.jit
    def add_one(src):
        dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        sb = nl.blocks(src, tile_shape=(128, 128), block_shape=(1, 2))
        db = nl.blocks(dst, tile_shape=(128, 128), block_shape=(1, 2))
        assert sb.shape == (3, 2) and sb.block_shape == (1, 2)
        assert sb.index_step_elements == (128, 256)
        for i in range(sb.shape[0]):
            for j in range(sb.shape[1]):
                block = nl.empty_like(sb[i, j], buffer=nl.sbuf)
                assert isinstance(block, nl.NkiBlockGrid) and block.shape == ()
                nisa.dma_copy(block.data, sb[i, j].data)  # one DMA per block
                inner = nl.tiles(block)
                for k in range(inner.shape[1]):
                    nisa.tensor_scalar(inner[0, k].data, inner[0, k].data, nl.add, 1.0)
                nisa.dma_copy(db[i, j].data, block.data)
        return dst

    x = np.random.default_rng(2).standard_normal((300, 400)).astype(np.float32)
    np.testing.assert_array_equal(add_one(x), x + 1)


def test_alloc_tiles_on_sbuf_lays_tiles_along_the_free_axis():
    def fn(_):
        g = nl.alloc_tiles(
            tile_shape=(128, 64), element_shape=(256, 192), buffer=nl.sbuf, dtype=nl.float32
        )
        t11 = g[1, 1].data
        row = g[1].data
        return (
            g.shape,
            g.is_data_representable,
            g[1].is_data_representable,
            g[:, 0].is_data_representable,
            (t11.shape, t11.offset, t11.strides),
            (row.shape, row.offset),
            g.data.tensor is not None if g.is_data_representable else None,
            g[1, 1].data.tensor.shape,
        )

    got = _geometry(fn)
    # tile (i, j) starts at free offset (3 i + j) x 64 of one (128, 6 x 64) backing tensor
    assert got == (
        (2, 3),
        False,
        True,
        False,
        ((128, 64), 4 * 64, (384, 1)),
        ((128, 192), 3 * 64),
        None,
        (128, 384),
    )


def test_alloc_tiles_round_trip_through_sbuf_and_psum():
    @nki.jit
    def through(x):
        g = nl.alloc_tiles(
            tile_shape=(128, 64), element_shape=x.shape, buffer=nl.sbuf, dtype=x.dtype
        )
        xt = nl.tiles(x, tile_shape=(128, 64))
        for i in range(g.shape[0]):
            nisa.dma_copy(g[i].data, xt[i].data)  # a row of tiles is one operand
        acc = nl.zeros_like(g[0], buffer=nl.psum)
        assert acc.buffer == nl.psum and acc.element_shape == (128, x.shape[1])
        for i in range(g.shape[0]):
            nisa.tensor_tensor(acc.data, acc.data, g[i].data, nl.add)
        out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
        res = nl.empty_like(acc, buffer=nl.sbuf)
        nisa.tensor_copy(res.data, acc.data)
        nisa.dma_copy(out, res.data)
        return out

    x = np.random.default_rng(3).standard_normal((384, 160)).astype(np.float32)
    expect = (x[:128] + x[128:256]).astype(np.float32) + x[256:]
    np.testing.assert_allclose(through(x), expect, rtol=1e-6)


def test_alloc_tiles_on_hbm_is_the_logical_tensor_and_blocks_alloc():
    def fn(_):
        h = nl.alloc_tiles(
            tile_shape=(128, 128),
            element_shape=(2, 256, 256),
            buffer=nl.shared_hbm,
            dtype=nl.bfloat16,
        )
        b = nl.alloc_blocks(
            tile_shape=(128, 64),
            block_shape=(1, 2),
            element_shape=(128, 512),
            buffer=nl.sbuf,
            dtype=nl.bfloat16,
        )
        return (
            h.shape,
            h.data.shape,
            h.is_data_representable,
            b.shape,
            b.is_data_representable,
            nl.tiles(b[0, 1]).shape,
            nl.tiles(b[0, 1])[0, 1].data.offset,
        )

    assert _geometry(fn) == ((2, 2, 2), (2, 256, 256), True, (1, 4), True, (1, 2), 3 * 64)


def test_a_tensors_data_is_itself():
    # NKI 0.7 code allocates a tile with nl.ndarray(grid.element_shape, ...) and passes .data
    assert _geometry(lambda x: x.data is x and x[0:1, :].data.shape == (1, 1))


def test_ones_like_of_a_grid_fills_its_storage():
    @nki.jit
    def ones(x):
        g = nl.ones_like(nl.tiles(x, tile_shape=(64, 32)), buffer=nl.sbuf)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, g.data)
        return out

    np.testing.assert_array_equal(ones(np.zeros((64, 96), np.float32)), np.ones((64, 96)))


@pytest.mark.parametrize(
    "body, match",
    [
        (lambda x: nl.tiles(x, tile_shape=(128,)), "tile_shape must have at least 2"),
        (lambda x: nl.tiles(x, tile_shape=(128, 0)), "at least 2 positive"),
        (lambda x: nl.tiles(x, tile_shape=(128.0, 64)), "tuple of ints"),
        (lambda x: nl.tiles(x), "tile_shape is required"),
        (lambda x: nl.tiles(x, tile_shape=(1, 1, 1, 1)), "more dimensions than the source"),
        (lambda x: nl.tiles(3, tile_shape=(1, 1)), "expected a tensor or a grid"),
        (
            lambda x: nl.blocks(x, tile_shape=(128, 64), block_shape=(2,)),
            r"needs the rank of tile_shape",
        ),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[5, 0], "err_tensor_access_out_of_bound"),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[0, 0, 0], "3 indices for a grid of 2"),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[::2], "grid slices take step 1"),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[2:1], "selects no cell"),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[0.5], "ints and a:b slices"),
        (
            lambda x: nisa.dma_copy(
                nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf),
                nl.tiles(x, tile_shape=(128, 64))[0, 0],
            ),
            r"src must be a tensor .*got NkiTileGrid; an instruction takes a grid's \.data",
        ),
        (
            lambda x: nl.tiles(
                nl.ndarray((2, 128, 64), dtype=x.dtype, buffer=nl.sbuf), tile_shape=(128, 64)
            ),
            "on-chip tensor is tiled in every dimension",
        ),
        (
            lambda x: (
                nl.alloc_tiles(
                    tile_shape=(128, 64), element_shape=(256, 64), buffer=nl.sbuf, dtype=x.dtype
                ).data
            ),
            "spans 2 tiles along the partition dimension",
        ),
        (
            lambda x: (
                nl.alloc_tiles(
                    tile_shape=(128, 8, 8),
                    element_shape=(128, 16, 16),
                    buffer=nl.sbuf,
                    dtype=x.dtype,
                )[0, 0, :].data
            ),
            "tiles along dimension 2 are not adjacent",
        ),
        (
            lambda x: nl.alloc_tiles(
                tile_shape=(128, 64, 2), element_shape=(128, 64), buffer=nl.sbuf, dtype=x.dtype
            ),
            "more dimensions than element_shape",
        ),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[0.0:2], "grid slice bounds are ints"),
        (lambda x: nl.tiles(x, tile_shape=(128, 64))[:2.5], "grid slice bounds are ints"),
        (lambda x: nl.tiles(x, tile_shape=(True, 64)), "tuple of ints"),
        (lambda x: nl.blocks(x, tile_shape=(128, 64), block_shape=None), "block_shape is required"),
        (
            lambda x: nl.alloc_blocks(
                tile_shape=(128, 64),
                block_shape=None,
                element_shape=(256, 128),
                buffer=nl.sbuf,
                dtype=x.dtype,
            ),
            "nl.alloc_blocks: block_shape is required",
        ),
        (
            # a scalar argument: no grid hint (a grid's .data is no number either)
            lambda x: nisa.memset(_tile(x), nl.tiles(x, tile_shape=(128, 64))[0, 0]),
            "(?m)nisa.memset: value is a number, got NkiTileGrid$",
        ),
        (
            lambda x: nisa.iota(_tile(x), [[1, 64]], offset=nl.tiles(x, tile_shape=(128, 64))),
            "(?m)nisa.iota: offset and channel_multiplier are ints, got NkiTileGrid$",
        ),
        (
            lambda x: len(nl.tiles(x, tile_shape=(128, 64))[0, 0]),
            None,  # TypeError, below
        ),
        (
            lambda x: iter(nl.tiles(x, tile_shape=(128, 64))[0, 0]),
            None,  # TypeError, below
        ),
        (
            # the storage's partitions are dimension 1; re-tiling its last dimension alone
            # would make dimension 2 the partitions
            lambda x: nl.tiles(
                nl.alloc_tiles(
                    tile_shape=(2, 128, 64),
                    element_shape=(2, 128, 64),
                    buffer=nl.sbuf,
                    dtype=x.dtype,
                ),
                tile_shape=(128, 32),
            ),
            "makes dimension 1 the tiles' partitions, but this storage keeps its partitions "
            "in dimension 0",
        ),
        (
            lambda x: (
                nl.alloc_tiles(
                    tile_shape=(128, 64),
                    element_shape=(2, 128, 64),
                    buffer=nl.sbuf,
                    dtype=x.dtype,
                ).data
            ),
            "keeps the untiled dimension 0 before the partition dimension",
        ),
        (
            lambda x: nl.alloc_tiles(
                tile_shape=(128, 64),
                element_shape=(256, 64),
                buffer=nl.shared_hbm,
                dtype=x.dtype,
                address=(0,),
            ),
            r"err_unsupported_api: nl.ndarray\(address=...\) on shared_hbm",
        ),
    ],
)
def test_grid_misuse_is_a_named_error_at_the_kernel_line(body, match):
    @nki.jit
    def k(x):
        body(x)
        return x

    if match is None:
        with pytest.raises(TypeError, match="NkiTileGrid with no grid dimensions"):
            k(np.zeros((256, 128), np.float32))
        return
    with pytest.raises(NkiError, match=match) as e:
        k(np.zeros((256, 128), np.float32))
    assert e.value.loc.file == __file__


def _grid(x):
    """A 2 x 2 grid of SBUF tiles (a grid where an instruction takes a tensor)."""
    return nl.alloc_tiles(
        tile_shape=(128, 64), element_shape=(256, 128), buffer=nl.sbuf, dtype=x.dtype
    )


def _tile(x):
    return nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)


# every instruction and nl function that reads an operand's shape before its access, and each
# operand helper (tensor, dst, DMA pair, scalar or (P, 1) tensor, tensor or number), with a
# tile grid (whole, one cell, one row) in a tensor's place
_GRID_OPERANDS = {
    "nisa.affine_select": lambda x, g: nisa.affine_select(
        dst=_tile(x),
        pattern=[[-1, 64]],
        channel_multiplier=1,
        on_true_tile=g,
        on_false_value=0.0,
    ),
    "nisa.tensor_reduce data": lambda x, g: nisa.tensor_reduce(
        dst=_tile(x)[:, 0:1], op=nl.add, data=g, axis=1
    ),
    "nisa.tensor_reduce dst": lambda x, g: nisa.tensor_reduce(
        dst=g, op=nl.add, data=_tile(x), axis=1
    ),
    "nisa.dma_transpose": lambda x, g: nisa.dma_transpose(dst=_tile(x), src=g),
    "nisa.iota": lambda x, g: nisa.iota(g, [[1, 64]], 0, 1),
    "nisa.tensor_copy": lambda x, g: nisa.tensor_copy(dst=_tile(x), src=g),
    "nisa.tensor_scalar": lambda x, g: nisa.tensor_scalar(_tile(x), g, nl.multiply, 2.0),
    "nisa.tensor_scalar operand0": lambda x, g: nisa.tensor_scalar(
        _tile(x), _tile(x), nl.multiply, g
    ),
    "nisa.activation bias": lambda x, g: nisa.activation(_tile(x), nl.exp, _tile(x), bias=g),
    "nisa.tensor_copy_predicated src": lambda x, g: nisa.tensor_copy_predicated(
        _tile(x), g, _tile(x)
    ),
    "nisa.sequence_bounds": lambda x, g: nisa.sequence_bounds(
        nl.ndarray((1, 2, 64), dtype=x.dtype, buffer=nl.sbuf), g
    ),
    "nisa.topk": lambda x, g: nisa.topk(_tile(x)[:, 0:8], _tile(x)[:, 0:8], g, 64),
    "nisa.dma_copy": lambda x, g: nisa.dma_copy(_tile(x), g),
    "nisa.register_load": lambda x, g: nisa.register_load(nisa.register_alloc(), g),
    "nl.random_seed": lambda x, g: nl.random_seed(g),
    "t[...] = grid": lambda x, g: _tile(x).__setitem__(..., g),
    "nl.load": lambda x, g: nl.load(g),
    "nl.sum": lambda x, g: nl.sum(g, axis=1),
    "nl.max": lambda x, g: nl.max(g, axis=1),
    "nl.mean": lambda x, g: nl.mean(g, axis=1),
    "nl.transpose": lambda x, g: nl.transpose(g),
    "nl.matmul x": lambda x, g: nl.matmul(g, _tile(x)),
    "nl.matmul y": lambda x, g: nl.matmul(_tile(x), g),
    "nl.copy": lambda x, g: nl.copy(g),
    "nl.add": lambda x, g: nl.add(_tile(x), g),
    "nl.exp": lambda x, g: nl.exp(g),
}


@pytest.mark.parametrize("select", ["grid", "cell", "row"])
@pytest.mark.parametrize("name", sorted(_GRID_OPERANDS))
def test_a_grid_in_a_tensors_place_asks_for_its_data(name, select):
    @nki.jit
    def k(x):
        g = _grid(x)
        g = {"grid": g, "cell": g[0, 0], "row": g[0, :]}[select]
        _GRID_OPERANDS[name](x, g)
        return x

    with pytest.raises(
        NkiError, match=r"(?m)got NkiTileGrid; an instruction takes a grid's \.data$"
    ) as e:
        k(np.zeros((256, 128), np.float32))
    assert e.value.loc.file == __file__
    assert e.value.name == "err_invalid_argument"


def test_a_grid_iterates_over_its_first_dimension():
    def fn(x):
        g = nl.tiles(x, tile_shape=(128, 64))
        return (
            [row.shape for row in g],
            [cell.element_shape for cell in g[1, :]],
            list(g[0, 0 : 0 + 1]),
        )

    rows, cells, one = _geometry(fn, (300, 100))
    assert rows == [(2,), (2,), (2,)]
    assert cells == [(128, 64), (128, 36)]
    assert len(one) == 1


def test_numpy_integers_are_shapes():
    def fn(x):
        g = nl.tiles(x, tile_shape=(np.int64(128), np.int32(64)))
        s = nl.alloc_tiles(
            tile_shape=[np.int64(128), 64],
            element_shape=(np.int64(256), np.int16(128)),
            buffer=nl.sbuf,
            dtype=x.dtype,
        )
        return g.tile_shape, s.shape, type(s.tile_shape[0])

    assert _geometry(fn, (256, 128)) == ((128, 64), (2, 2), int)


@st.composite
def _grid_case(draw):
    """An HBM shape (maybe with a leading untiled dimension), a tile shape, and a selection
    per grid dimension (an int or an a:b slice)."""
    lead = draw(st.lists(st.integers(1, 3), max_size=1))
    rows, cols = draw(st.integers(1, 300)), draw(st.integers(1, 96))
    tile = (draw(st.integers(1, 128)), draw(st.integers(1, 40)))
    counts = [*lead, -(-rows // tile[0]), -(-cols // tile[1])]
    key = []
    for n in counts:
        if draw(st.booleans()):
            key.append(draw(st.integers(-n, n - 1)))
        else:
            a = draw(st.integers(0, n - 1))
            key.append(slice(a, draw(st.integers(a + 1, n))))
    return (*lead, rows, cols), tile, tuple(key)


def _numpy_region(x, tile, key):
    """What grid selection ``key`` names, by numpy slicing (the independent reference)."""
    lead = x.ndim - 2
    index = []
    for d, k in enumerate(key):
        cell = 1 if d < lead else tile[d - lead]
        n = x.shape[d]
        if isinstance(k, int):
            i = k % -(-n // cell)
            index.append(i if d < lead else slice(i * cell, min((i + 1) * cell, n)))
        else:
            index.append(slice(k.start * cell, min(k.stop * cell, n)))
    return x[tuple(index)]


@settings(settings.get_profile("ci"), max_examples=25, deadline=None)
@given(_grid_case())
def test_a_selections_data_is_the_region_slicing_names(case):
    shape, tile, key = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    want = _numpy_region(x, tile, key)

    @nki.jit
    def read(x):
        sel = nl.tiles(x, tile_shape=tile)[key]
        assert sel.element_shape == want.shape
        out = nl.ndarray(sel.element_shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, sel.data)
        return out

    np.testing.assert_array_equal(read(x), want)


@settings(settings.get_profile("ci"), max_examples=15, deadline=None)
@given(
    st.integers(1, 256),
    st.integers(1, 64),
    st.integers(1, 128),
    st.integers(1, 24),
    st.sampled_from([nl.sbuf, nl.psum]),
)
def test_on_chip_tile_storage_rows_and_tiles_agree(rows, cols, tp, tf, buffer):
    """Tiles written one at a time into alloc_tiles storage read back as rows of tiles."""
    x = np.random.default_rng(rows * 1000 + cols).standard_normal((rows, cols)).astype(np.float32)

    @nki.jit
    def through(x):
        g = nl.alloc_tiles(tile_shape=(tp, tf), element_shape=x.shape, buffer=buffer, dtype=x.dtype)
        xt = nl.tiles(x, tile_shape=(tp, tf))
        stage = nl.ndarray((tp, tf), dtype=x.dtype, buffer=nl.sbuf)
        for i in range(g.shape[0]):
            for j in range(g.shape[1]):
                e = xt[i, j].element_shape
                nisa.dma_copy(stage[0 : e[0], 0 : e[1]], xt[i, j].data)
                nisa.tensor_copy(g[i, j].data, stage[0 : e[0], 0 : e[1]])
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ot = nl.tiles(out, tile_shape=(tp, tf))
        for i in range(g.shape[0]):
            assert g[i].is_data_representable
            row = nl.ndarray(g[i].element_shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(row, g[i].data)
            nisa.dma_copy(ot[i].data, row)
        return out

    np.testing.assert_array_equal(through(x), x)
