"""Calling kernels: argument binding, specialization cache, grids, torch tensors, errors."""

import numpy as np
import pytest

import nkikit as nki
import nkikit.language as nl
import nkikit.typing as nt


@nki.jit
def scale(x, factor=2.0):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(x), factor))
    return out


def test_wrong_arguments_name_the_parameter():
    with pytest.raises(TypeError, match="scale\\(\\).*'x'"):
        scale()
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        scale(np.ones((2, 2), np.float32), y=1)


@nki.jit
def total(first, /, *rest, scale=1.0, **named):
    acc = nl.load(first)
    for x in (*rest, *named.values()):
        acc = nl.add(acc, nl.load(x))
    out = nl.ndarray(first.shape, dtype=first.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(acc, scale))
    return out


def test_star_args_and_keyword_arguments_are_inputs_of_their_own():
    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(total(x), x)
    np.testing.assert_array_equal(total(x, 2 * x, 3 * x, scale=2.0), 12 * x)
    np.testing.assert_array_equal(total(x, bias=5 * x), 6 * x)
    # each item is an HBM input named after its place in the call
    assert [t.name for t in total.ir(x, x, x, bias=x).params] == [
        "first",
        "rest[0]",
        "rest[1]",
        "bias",
    ]
    # three inputs and two inputs are two specializations
    assert total.ir(x, x, x) is not total.ir(x, x)
    with pytest.raises(TypeError, match="total\\(\\).*first"):
        total(first=x)


def test_specialization_is_cached_per_shape_dtype_and_constant():
    x = np.ones((4, 8), np.float32)
    k1 = scale.ir(x)
    assert scale.ir(np.zeros((4, 8), np.float32)) is k1
    assert scale.ir(x, 3.0) is not k1
    assert scale.ir(np.ones((4, 16), np.float32)) is not k1
    np.testing.assert_array_equal(scale(x, 3.0), 3 * x)


def test_abstract_arguments_trace_but_do_not_run():
    spec = nt.tensor[[128, 64], nl.bfloat16]
    assert "bfloat16" in str(scale.ir(spec))
    with pytest.raises(TypeError, match="abstract"):
        scale(spec)


@nki.jit
def grid_fill(x):
    out = nl.ndarray((nl.num_programs(0) * 128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(4)[None, :]
    nl.store(out[i * 128 + ip, jf], value=nl.full((128, 4), 1.0, nl.float32))
    return out


def test_spmd_grid_runs_every_program():
    out = grid_fill[3](np.zeros(1, np.float32))
    assert out.shape == (384, 4)
    assert (out == 1).all()


def test_torch_tensors_in_torch_tensors_out():
    torch = pytest.importorskip("torch")
    x = torch.arange(32, dtype=torch.bfloat16).reshape(4, 8)
    out = scale(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert torch.equal(out, x * 2)
    # non-contiguous input
    xt = torch.arange(32, dtype=torch.float32).reshape(8, 4).t()
    assert torch.equal(scale(xt), xt * 2)


@nki.jit
def branches_on_loop_var(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        if i == 0:
            nl.store(out, value=nl.load(x))
    return out


def test_python_control_flow_on_a_loop_variable_is_rejected():
    with pytest.raises(nki.NkiError) as e:
        branches_on_loop_var(np.zeros((4, 4), np.float32))
    assert e.value.name == "err_dynamic_control_flow_not_supported"
    assert e.value.loc.text == "if i == 0:"


@nki.jit
def branches_on_arange(x):
    ip = nl.arange(4)[:, None]
    if ip < 2:
        pass
    return x


def test_python_control_flow_on_an_arange_is_rejected():
    with pytest.raises(nki.NkiError) as e:
        branches_on_arange(np.zeros((4, 4), np.float32))
    assert e.value.name == "err_control_flow_condition_depending_on_arange"


@nki.jit
def one_d_arange(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x[nl.arange(4), nl.arange(4)[None, :]]))
    return out


def test_1d_arange_index_is_rejected():
    with pytest.raises(nki.NkiError) as e:
        one_d_arange(np.zeros((4, 4), np.float32))
    assert e.value.name == "err_1d_arange_not_supported"


def test_nki_api_outside_a_kernel():
    with pytest.raises(nki.NkiError) as e:
        nl.ndarray((4, 4), nl.float32)
    assert e.value.name == "err_nki_api_outside_of_nki_kernel"


def test_error_traceback_hides_nkikit_frames():
    with pytest.raises(nki.NkiError) as e:
        branches_on_loop_var(np.zeros((4, 4), np.float32))
    files = []
    tb = e.value.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    internal = [f for f in files if "/nkikit/" in f]
    # only the API boundary that re-raises remains; the tracer, builder and simulator are gone
    assert [f.rsplit("/", 1)[-1] for f in internal] == ["jit.py"]
    assert any(f.endswith("test_jit.py") for f in files[-1:])
