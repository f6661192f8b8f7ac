"""A kernel that returns nothing is an error at its `def` line; an output left partly unwritten
is a warning that names the launch grid that would cover it. Both dialects."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
import nkikit.nki as nki0
import nkikit.nki.isa as nisa0
import nkikit.nki.language as nl0
from nkikit.errors import ErrKernelHasNoOutput, NkiWarning


@nki.jit
def forgets_return(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))


@nki.jit
def returns_a_number(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return None, None


@nki.jit
def rows_by_program(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    nl.store(out[i * 128 : (i + 1) * 128, :], value=nl.load(x[i * 128 : (i + 1) * 128, :]))
    return out


@nki0.jit
def forgets_return_0x(x):
    out = nl0.ndarray(x.shape, dtype=x.dtype, buffer=nl0.shared_hbm)
    nisa0.dma_copy(dst=out, src=x)


@nki0.jit
def rows_by_program_0x(x):
    out = nl0.ndarray(x.shape, dtype=x.dtype, buffer=nl0.shared_hbm)
    rows = slice(nl0.program_id(0) * 128, (nl0.program_id(0) + 1) * 128)
    t = nl0.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl0.sbuf)
    nisa0.dma_copy(dst=t, src=x[rows, :])
    nisa0.dma_copy(dst=out[rows, :], src=t)
    return out


def _def_line(kernel) -> int:
    return inspect.getsourcelines(kernel.func)[1] + 1  # the line after the decorator


@pytest.mark.parametrize(
    "kernel, returned",
    [
        (forgets_return, "nothing"),
        (returns_a_number, "no tensor"),
        (forgets_return_0x, "nothing"),
    ],
)
def test_a_kernel_that_returns_nothing_is_an_error_at_its_def_line(kernel, returned):
    x = np.ones((128, 64), np.float32)
    with pytest.raises(ErrKernelHasNoOutput) as info:
        kernel(x)
    assert info.value.loc.line == _def_line(kernel)
    assert f"returns {returned} and writes none of its arguments" in str(info.value)


def test_a_kernel_that_writes_its_argument_in_place_may_return_nothing():
    @nki0.jit
    def in_place(x):
        t = nl0.ndarray(x.shape, dtype=x.dtype, buffer=nl0.sbuf)
        nisa0.dma_copy(dst=t, src=x)
        nisa0.activation(dst=t, op=nl0.exp, data=t)
        nisa0.dma_copy(dst=x, src=t)

    x = np.zeros((128, 8), np.float32)
    assert in_place(x) is None
    np.testing.assert_array_equal(x, np.ones_like(x))


def test_beta1_spmd_kernel_called_without_its_grid_warns_with_the_grid_it_needs():
    x = np.ones((256, 64), np.float32)
    with pytest.warns(NkiWarning) as record:
        y = rows_by_program(x)
    assert np.isnan(y).mean() == 0.5  # what the warning is about
    message = str(record[0].message)
    assert (
        "writes output 'out' (shape [256, 64]) only at indices [0, 127] of dimension 0" in message
    )
    assert "launched with grid (1,)" in message and "did you mean rows_by_program[2]?" in message
    assert record[0].filename == __file__ and record[0].lineno == _def_line(rows_by_program)


def test_beta1_spmd_kernel_launched_on_too_small_a_grid_names_the_program_id_it_needs():
    x = np.ones((512, 64), np.float32)
    with pytest.warns(NkiWarning, match=r"grid \(2,\); the kernel indexes program_id\(0\) up to 3"):
        rows_by_program[2](x)
    with pytest.warns(NkiWarning, match=r"did you mean rows_by_program\[4\]\?"):
        rows_by_program[2](np.ones((512, 32), np.float32))


def test_nki0x_kernel_called_without_its_launch_warns_with_the_grid_it_needs():
    x = np.ones((256, 8), np.float32)
    with pytest.warns(NkiWarning, match=r"did you mean rows_by_program_0x\[2\]\?"):
        rows_by_program_0x(x)


def test_fully_written_outputs_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiWarning)
        rows_by_program[2](np.ones((256, 64), np.float32))
        nki0.cpu_simulate(rows_by_program_0x)[2](x=np.ones((256, 8), np.float32))
