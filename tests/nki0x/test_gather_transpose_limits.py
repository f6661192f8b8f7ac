"""The documented limits of an indirect ``dma_transpose`` (``.ap(vector_offset=)`` on HBM, a
Software DGE gather-transpose) [ISA dma_transpose "DMA Indirect Transpose Constraints",
nki-0x.md §4.3]: dge_mode unknown/swdge, a 2-byte dtype, src.shape[0] % 16 == 0,
src.shape[-1] <= 128, a 4-D src with shape[1] or shape[2] == 1, and a 2-D uint32 SBUF index
with 16..128 partitions (a multiple of 16), whose first src.shape[0] entries are read."""

import ml_dtypes
import numpy as np
import pytest
from gather_transpose_kernels import gather_t, gather_t4

import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit.errors import NkiError

BF16 = ml_dtypes.bfloat16


def _table(w=32, dt=BF16):
    return np.random.default_rng(3).random((400, w)).astype(dt)


def _idx(p=128, dt=np.uint32):
    return np.random.default_rng(4).integers(0, 400, (p, 1)).astype(dt)


def _rejects(fn, *args, words, **kw):
    with pytest.raises(NkiError) as e:
        fn(*args, **kw)
    assert e.value.name == "err_invalid_argument", e.value
    assert words in str(e.value), e.value
    assert "nisa.dma_transpose(dst=got" in str(e.value)  # the kernel's own line


def test_legal_gather_transposes_run():
    t, idx = _table(), _idx()
    np.testing.assert_array_equal(gather_t(t, idx, 128), t[idx[:, 0]].T)
    got = gather_t(t, idx, 128, dge=nisa.dge_mode.swdge)
    np.testing.assert_array_equal(got, t[idx[:, 0]].T)
    t16 = _table(dt=np.float16)
    np.testing.assert_array_equal(gather_t(t16, idx, 128), t16[idx[:, 0]].T)


def test_a_taller_index_gathers_its_first_rows():
    # indices.shape[0] * indices.shape[1] >= src.shape[0]: the first src.shape[0] are read
    t, idx = _table(), _idx()
    np.testing.assert_array_equal(gather_t(t, idx, 112), t[idx[:112, 0]].T)


def test_the_dtype_must_be_two_bytes():
    _rejects(gather_t, _table(dt=np.float32), _idx(), 128, words="2-byte")


def test_the_index_must_be_uint32():
    _rejects(gather_t, _table(), _idx(dt=np.int32), 128, words="must be uint32")


def test_the_gathered_rows_are_a_multiple_of_16():
    _rejects(gather_t, _table(), _idx(), 120, words="divisible by 16")


def test_the_index_partitions_are_16_to_128_by_16():
    _rejects(gather_t, _table(), _idx(p=24), 16, words="16 to 128 partitions")


def test_the_last_axis_is_at_most_128():
    _rejects(gather_t, _table(w=160), _idx(), 128, words="src.shape[-1] <= 128")


def test_only_the_software_dge_gathers():
    kw = {"dge": nisa.dge_mode.hwdge}
    _rejects(gather_t, _table(), _idx(), 128, words="dge_mode must be", **kw)


def test_a_4d_source_has_a_unit_middle_axis():
    t, idx = _table(w=48), _idx()
    want = np.transpose(t.reshape(400, 1, 3, 16)[idx[:, 0]], (3, 1, 2, 0))
    np.testing.assert_array_equal(gather_t4(t.reshape(400, 1, 3, 16), idx, 128), want)
    _rejects(gather_t4, t.reshape(400, 3, 2, 8), idx, 128, words="shape[1] or src.shape[2]")


@nki.jit
def plain_t(x, oob=nisa.oob_mode.error, dge=nisa.dge_mode.unknown):
    t = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x, oob_mode=oob, dge_mode=dge)
    out = nl.ndarray(t.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_oob_skip_needs_an_indirect_source():
    # "oob_mode.skip: ... Only valid when src uses indirect indexing" [ISA dma_transpose]
    x = np.arange(16 * 8).reshape(16, 8).astype(BF16)
    np.testing.assert_array_equal(plain_t(x), x.T)
    with pytest.raises(NkiError) as e:
        plain_t(x, oob=nisa.oob_mode.skip)
    assert e.value.name == "err_invalid_argument" and "indirect" in str(e.value)
    assert "nisa.dma_transpose(dst=t" in str(e.value)
    t, idx = _table(), _idx(p=16)
    idx[3, 0] = 1000  # out of bounds: skipped, its column stays 0
    want = t[np.minimum(idx[:, 0], 399)].T.copy()
    want[:, 3] = 0
    np.testing.assert_array_equal(gather_t(t, idx, 16, oob=nisa.oob_mode.skip), want)


def test_a_hardware_dge_transpose_has_its_own_limits():
    # [ISA dma_transpose "DMA Direct Transpose Constraints"]: 2-D src.shape[0] == 16,
    # src.shape[-1] <= 128, a 2-byte dtype; dge_mode unknown leaves the choice open
    x = np.arange(16 * 8).reshape(16, 8).astype(BF16)
    np.testing.assert_array_equal(plain_t(x, dge=nisa.dge_mode.hwdge), x.T)
    y = np.arange(32 * 8).reshape(32, 8).astype(BF16)
    np.testing.assert_array_equal(plain_t(y), y.T)
    for bad, words in ((y, "src.shape[0] == 16"), (x.astype(np.float32), "2 bytes")):
        with pytest.raises(NkiError) as e:
            plain_t(bad, dge=nisa.dge_mode.hwdge)
        assert e.value.name == "err_invalid_argument" and words in str(e.value)
        assert "nisa.dma_transpose(dst=t" in str(e.value)


def test_dge_mode_has_the_nki_0x_numbers():
    # NKI 0.x numbers dge_mode unknown=0 ... none=3 (Beta 1: none=0, unknown=3); a raw integer
    # (the NKI Library passes dge_mode=3) means what NKI 0.x means by it
    assert [m.value for m in nisa.dge_mode] == [0, 1, 2, 3]
    assert nisa.dge_mode.none == 3 and nisa.dge_mode.unknown == 0
    t, idx = _table(), _idx()
    np.testing.assert_array_equal(gather_t(t, idx, 128, dge=0), t[idx[:, 0]].T)
    _rejects(gather_t, t, idx, 128, words="dge_mode must be", dge=3)
