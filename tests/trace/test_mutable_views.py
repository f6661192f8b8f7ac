"""A kernel's writes to an ``nt.mutable_tensor`` reach the caller's array whatever its layout:
a non-contiguous numpy view is written back as a torch view is; a read-only array is refused."""

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
import nkikit.typing as nt
from nkikit.errors import ErrInvalidArgument


@nki.jit
def fill(x, dst: nt.mutable_tensor):
    nl.store(dst, value=nl.multiply(nl.load(x), 2.0))


@pytest.mark.parametrize(
    "view",
    [
        lambda base: base[:4, ::2],  # strided columns
        lambda base: base.T[:4, :8],  # transposed (Fortran order)
        lambda base: base[1:5, 3:11],  # offset window of a wider array
    ],
    ids=["strided", "transposed", "window"],
)
def test_a_non_contiguous_numpy_view_is_written_back(view):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    base = np.full((16, 16), -1.0, np.float32)
    dst = view(base)
    assert not dst.flags.c_contiguous
    untouched = base.copy()
    fill(x, dst)
    np.testing.assert_array_equal(dst, x * 2)
    # only the view's elements changed in the array it views
    mask = np.zeros(base.shape, bool)
    view(mask)[...] = True
    np.testing.assert_array_equal(base[~mask], untouched[~mask])


def test_a_read_only_mutable_argument_is_refused_by_name():
    x = np.ones((4, 8), np.float32)
    dst = np.zeros((4, 8), np.float32)
    dst.flags.writeable = False
    with pytest.raises(ErrInvalidArgument, match=r"argument 'dst'.*read-only"):
        fill(x, dst)
