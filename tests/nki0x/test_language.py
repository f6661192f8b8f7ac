"""nkikit.nki.language: tile_size follows the target a kernel is traced for; loops are Python
ranges; launch queries are ints; NKIObject classes are dataclass-like."""

import inspect

import numpy as np
import pytest

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError


# gemm_moving_fmax is 512 on every target, trn3 included (the NKI samples' trn3 MX kernels
# size their moving tiles by it) [reference/nki-0x.md §3.10]
@pytest.mark.parametrize(
    "target, moving, sbuf",
    [("trn1", 512, 192 * 1024), ("trn2", 512, 224 * 1024), ("trn3", 512, 256 * 1024)],
)
def test_tile_size_follows_the_target(monkeypatch, target, moving, sbuf):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    seen = {}

    @nki.jit
    def k(x):
        seen.update(
            pmax=nl.tile_size.pmax,
            moving=nl.tile_size.gemm_moving_fmax,
            sbuf=nl.tile_size.total_available_sbuf_size,
            bank=nl.tile_size.psum_fmax,
            version=nisa.get_nc_version(),
            aligns=(nl.tile_size.sbuf_min_align, nl.tile_size.psum_min_align),
        )
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    k(np.zeros((1, 1), np.float32))
    assert seen["pmax"] == 128 and seen["bank"] == 512
    assert seen["moving"] == moving and seen["sbuf"] == sbuf
    assert seen["version"].name == {"trn1": "gen2", "trn2": "gen3", "trn3": "gen4"}[target]
    assert seen["aligns"] == (64, 4)  # where nkikit's allocator places tiles


def test_loops_are_python_ranges_and_launch_queries_are_ints():
    assert list(nl.affine_range(3)) == [0, 1, 2]
    assert list(nl.sequential_range(1, 7, 3)) == [1, 4]
    seen = []

    @nki.jit
    def k(x):
        seen.append((nl.program_ndim(), nl.num_programs(), nl.program_id(0)))
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    x = np.ones((1, 1), np.float32)
    k(x)
    nki.cpu_simulate(k)[2](x=x)
    assert seen == [(0, 1, 0), (1, 2, 0), (1, 2, 1)]


def test_launch_queries_outside_a_kernel_are_unknown():
    # host code that builds a kernel's configuration before the launch cannot know the grid:
    # the queries answer None, so `nl.num_programs() or n` falls back on the host's own n,
    # and the launched kernel sees its real grid
    assert (nl.program_ndim(), nl.num_programs(), nl.program_id(0)) == (None, None, None)
    n_host = nl.num_programs() or 2
    seen = []

    @nki.jit
    def k(x):
        seen.append(nl.num_programs())
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    nki.cpu_simulate(k)[n_host](x=np.ones((1, 1), np.float32))
    assert seen == [2, 2]
    assert nl.program_ndim() is None  # the launch is over


def test_nkiobject_subclasses_are_dataclass_like():
    class Config(nl.NKIObject):
        tile: int
        dtype: object = nl.bfloat16

        def __post_init__(self):
            self.double = None if self.tile is None else 2 * self.tile

    c = Config(64)
    assert (c.tile, c.dtype, c.double) == (64, nl.bfloat16, 128)
    with pytest.raises(TypeError, match="unexpected keyword argument 'size'"):
        Config(size=3)
    assert Config().tile is None  # a field left out is None, as NKI's constructor gives


def test_wrappers_lower_to_instructions():
    x = np.random.default_rng(1).standard_normal((128, 32)).astype(np.float32)

    @nki.jit
    def k(x):
        t = nl.load(x)
        y = nl.add(nl.exp(t), 1.0)
        s = nl.sum(y, axis=1)
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, s)
        return out

    np.testing.assert_allclose(k(x)[:, 0], (np.exp(x) + 1.0).sum(axis=1), rtol=1e-5)


def test_wrappers_take_numpy_scalars_and_refuse_other_operands():
    x = np.random.default_rng(2).standard_normal((128, 32)).astype(np.float32)

    @nki.jit
    def k(x):
        t = nl.load(x)
        y = nl.multiply(nl.add(t, np.float32(1.5)), np.int64(2))
        z = nl.subtract(np.float32(3.0), y)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, z)
        return out

    np.testing.assert_allclose(k(x), 3.0 - (x + 1.5) * 2, rtol=1e-6)

    @nki.jit
    def bad(x):
        t = nl.load(x)
        nl.add(t, "2")
        return x

    with pytest.raises(NkiError, match=r"nl.add: y must be a tensor .*got str") as e:
        bad(x)
    assert e.value.loc.file == __file__


def test_execute_runs_and_removed_entry_points_say_so():
    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
    np.testing.assert_array_equal(nki.execute(double, x), 2 * x)
    for name in ("baremetal", "benchmark", "profile", "simulate_kernel"):
        with pytest.raises(NotImplementedError, match=f"nki.{name} is not part of NKI 0.x"):
            getattr(nki, name)(double)


def test_nkiobject_fields_without_annotations_under_dataclass():
    """NKI synthesises the constructor from plain class attributes too, also when the class
    is decorated with the stdlib ``@dataclass`` (the NKI Library writes such classes)."""
    from dataclasses import dataclass

    @dataclass
    class Section(nl.NKIObject):
        index = None
        offset = 0
        size: int = 4

        def end(self):
            return self.offset + self.size

    s = Section(index=2, offset=8)
    assert (s.index, s.offset, s.size, s.end()) == (2, 8, 4, 12)
    assert Section().index is None
    with pytest.raises(TypeError, match="unexpected keyword"):
        Section(length=1)


def _shard_rows(buffer):
    @nki.jit
    def k(x):
        # each program writes its half of the rows into one output tensor
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=buffer)
        half = x.shape[0] // nl.num_programs()
        rows = slice(nl.program_id() * half, (nl.program_id() + 1) * half)
        t = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[rows, :])
        nisa.activation(dst=t, op=nl.exp, data=t)
        nisa.dma_copy(dst=out[rows, :], src=t)
        return out

    return k


def test_lnc2_output_in_hbm_is_one_tensor_and_private_hbm_is_refused():
    """`nl.hbm` of an LNC=2 kernel is one tensor both programs write (as NKI 0.2 compiled the
    NKI Library's depthwise conv); returning `private_hbm` from two programs is an error, not
    program 0's half."""
    x = np.linspace(-1, 1, 256 * 8, dtype=np.float32).reshape(256, 8)
    np.testing.assert_allclose(nki.cpu_simulate(_shard_rows(nl.hbm))[2](x=x), np.exp(x), rtol=1e-6)
    with pytest.raises(NkiError, match="private to each of its 2 programs"):
        nki.cpu_simulate(_shard_rows(nl.private_hbm))[2](x=x)
    y = x[:128]  # one program: its private tensor is the whole result
    np.testing.assert_allclose(
        nki.cpu_simulate(_shard_rows(nl.private_hbm))[1](x=y), np.exp(y), rtol=1e-6
    )


def test_nl_bool_is_the_boolean_dtype():
    assert nl.bool == nl.bool_ == np.dtype(bool)


def test_kernel_arguments_read_as_hbm_alone_and_shared_hbm_on_an_lnc_grid():
    seen = []

    @nki.jit
    def k(x):
        seen.append((x.buffer == nl.hbm, x.buffer == nl.shared_hbm, nl.is_hbm(x.buffer)))
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(k(x), x)
    nki.cpu_simulate(k)[2](x=x)
    assert seen == [(True, False, True), (False, True, True), (False, True, True)]


@pytest.mark.parametrize("module", [nl, nisa], ids=["language", "isa"])
def test_star_import_gives_the_dialect_not_nkikit_helpers(module):
    # every function `from nki.language import *` (or isa) gives is the dialect's own, defined
    # in it; classes are the dialect's types and the enums shared with Beta 1
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            assert obj.__module__.startswith(module.__name__), (name, obj.__module__)
        elif inspect.ismodule(obj):
            assert obj.__name__.startswith(module.__name__ + "."), name
        elif inspect.isclass(obj) and obj is not np.dtype:  # nl.DType: a dtype's type
            assert obj.__module__.startswith(("nkikit.nki", "nkikit.isa", "nkikit.language")), name
