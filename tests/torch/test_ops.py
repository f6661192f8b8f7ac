"""Kernel functions as torch custom ops: schema, dtypes, layouts, opcheck, gradcheck, compile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nkikit.registry.errors import KernelCallError  # noqa: E402
from nkikit.registry.pull import pull  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_repo, hub_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    """The fixture kernel: a jitted rmsnorm with a backward, and add_sub returning a tuple."""
    return pull(
        "nkikit/tiny-rmsnorm", version=1, endpoint=hub_url, cache_dir=tmp_path_factory.mktemp("c")
    )


@pytest.fixture(scope="module")
def lib(rmsnorm_repo, hub_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    """The library's rmsnorm: a plain-Python entry, any number of leading dims; rmsnorm and
    add_rmsnorm (two outputs) have backward kernels."""
    return pull(
        "nkikit/rmsnorm", version=1, endpoint=hub_url, cache_dir=tmp_path_factory.mktemp("c")
    )


def _torch_ref(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def test_schemas(tiny) -> None:  # noqa: ANN001
    ns = tiny.namespace
    # torch prints float defaults at full precision (1e-06 -> 9.9999999999999995e-07)
    schema = tiny.rmsnorm.op._schema
    assert str(schema).startswith(f"{ns}::rmsnorm(Tensor x, Tensor weight, float eps=") and str(
        schema
    ).endswith(") -> Tensor")
    assert schema.arguments[2].default_value == pytest.approx(1e-6)
    assert (
        str(tiny.add_sub.op._schema)
        == f"{ns}::add_sub(Tensor a, Tensor b, float alpha=2.) -> (Tensor, Tensor)"
    )
    assert str(tiny.rmsnorm.torch.backward_op._schema).startswith(
        f"{ns}::rmsnorm_backward(Tensor grad, Tensor x, Tensor weight"
    )
    assert tiny.ops.rmsnorm.default is tiny.rmsnorm.op
    assert torch.Tag.pt2_compliant_tag in tiny.rmsnorm.op.tags


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_match_the_numpy_path(tiny, dtype: torch.dtype) -> None:  # noqa: ANN001
    x = torch.randn(130, 64).to(dtype)
    w = torch.rand(64).to(dtype)
    y = tiny.rmsnorm(x, w)
    assert y.dtype == dtype and y.shape == x.shape
    from nkikit.torch.convert import to_numpy

    expected = tiny.rmsnorm(to_numpy(x), to_numpy(w))
    np.testing.assert_array_equal(to_numpy(y).astype(np.float32), expected.astype(np.float32))
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(y.double(), _torch_ref(x, w), atol=tol, rtol=tol)


def test_non_contiguous_inputs(tiny, lib) -> None:  # noqa: ANN001
    base = torch.randn(64, 130)
    x = base.t()  # (130, 64), column-major
    assert not x.is_contiguous()
    w = torch.rand(128)[::2]  # strided weight
    torch.testing.assert_close(
        tiny.rmsnorm(x, w), tiny.rmsnorm(x.contiguous(), w.contiguous()), rtol=0, atol=0
    )
    torch.testing.assert_close(
        lib.rmsnorm(x, w), lib.rmsnorm(x.contiguous(), w.contiguous()), rtol=0, atol=0
    )


def test_eager_shortcut_and_dispatcher_agree(tiny) -> None:  # noqa: ANN001
    x, w = torch.randn(5, 64), torch.rand(64)
    torch.testing.assert_close(
        tiny.rmsnorm(x, w, eps=1e-3), tiny.rmsnorm.op(x, w, 1e-3), rtol=0, atol=0
    )
    s, m = tiny.add_sub(x, x, 0.5)
    s2, m2 = tiny.add_sub.op(x, x, alpha=0.5)
    torch.testing.assert_close((s, m), (s2, m2), rtol=0, atol=0)


def _opcheck_cases(tiny, lib):  # noqa: ANN001, ANN202
    x = torch.randn(20, 64)
    return [
        (tiny.rmsnorm.op, (x.clone().requires_grad_(), torch.rand(64).requires_grad_(), 1e-6)),
        (tiny.rmsnorm.op, (torch.randn(3, 64).bfloat16(), torch.rand(64).bfloat16())),
        (tiny.rmsnorm.op, (torch.randn(64, 20).t(), torch.rand(64))),
        (tiny.add_sub.op, (x, torch.randn(20, 64), 3.0)),
        (lib.rmsnorm.op, (torch.randn(2, 3, 64), torch.rand(64))),
        (lib.rmsnorm.op, (torch.randn(2, 3, 64).bfloat16(), torch.rand(64).bfloat16(), 1e-5)),
    ]


def test_opcheck(tiny, lib) -> None:  # noqa: ANN001
    for op, args in _opcheck_cases(tiny, lib):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_no_backward_kernel_says_so(tiny) -> None:  # noqa: ANN001
    """As torch's own custom ops without an autograd formula: the forward runs (its output
    requires grad), and a backward that reaches it fails naming the kernel and the fix."""
    from nkikit.errors import ErrKernelHasNoBackward

    x = torch.randn(128, 32, requires_grad=True)
    # add_sub (two outputs) has no backward kernel; rmsnorm has one
    assert tiny.add_sub.torch.backward_op is None
    s, _ = tiny.add_sub(x, torch.randn(128, 32))  # the forward works ...
    assert s.requires_grad
    message = rf"{tiny.namespace}::add_sub: .*'add_sub', which has no backward kernel.*kernel\.toml"
    with pytest.raises(ErrKernelHasNoBackward, match=message) as e:
        s.sum().backward()  # ... and backward names the kernel and the missing piece
    assert isinstance(e.value, RuntimeError)  # what torch raises there, for `except RuntimeError`
    with pytest.raises(ErrKernelHasNoBackward, match=message):  # the op itself, and torch.func
        torch.func.grad(lambda a: tiny.add_sub.op(a, a)[1].sum())(x.detach())
    with torch.no_grad():  # no gradient wanted: nothing to refuse
        assert not tiny.add_sub(x, x)[0].requires_grad


def _weighted_sum(y: torch.Tensor) -> torch.Tensor:
    return (y * torch.linspace(-1, 1, y.shape[-1])).sum()


def _rmsnorm_loss(op, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    return _weighted_sum(op(x, w, eps=1e-3))


@pytest.mark.parametrize("call", ["function", "op"])
def test_torch_func_grad_and_vjp(tiny, lib, call: str) -> None:  # noqa: ANN001
    """torch.func.grad / vjp of a bound function (or its op) give autograd's gradients."""
    torch.manual_seed(6)
    x, w = torch.randn(5, 64), torch.rand(64) + 0.5
    rms = tiny.rmsnorm if call == "function" else tiny.rmsnorm.op
    want = torch.autograd.grad(_rmsnorm_loss(rms, x.requires_grad_(), w.requires_grad_()), (x, w))
    x, w = x.detach(), w.detach()
    got = torch.func.grad(lambda a, b: _rmsnorm_loss(rms, a, b), argnums=(0, 1))(x, w)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # two outputs: vjp hands the backward one cotangent per output
    add = lib.add_rmsnorm if call == "function" else lib.add_rmsnorm.op
    r = torch.randn(5, 64)
    cy, ch = torch.randn(5, 64), torch.randn(5, 64)
    (y, h), vjp = torch.func.vjp(lambda a, b, c: add(a, b, c), x, r, w)
    leaves = [t.clone().requires_grad_() for t in (x, r, w)]
    y2, h2 = add(*leaves)
    want = torch.autograd.grad((y2, h2), leaves, (cy, ch))
    torch.testing.assert_close(vjp((cy, ch)), want, rtol=0, atol=0)
    torch.testing.assert_close((y, h), (y2, h2), rtol=0, atol=0)
    # a transform over w alone, x a leaf of plain autograd: the call is recorded at both levels
    xl = x.clone().requires_grad_()
    out, _ = torch.func.vjp(lambda b: rms(xl, b, eps=1e-3), w)
    (gx,) = torch.autograd.grad(_weighted_sum(out), xl)
    torch.testing.assert_close(gx, torch.autograd.grad(_rmsnorm_loss(rms, xl, w), xl)[0])


def test_torch_func_grad_under_compile(tiny) -> None:  # noqa: ANN001
    torch._dynamo.reset()
    x, w = torch.randn(5, 64), torch.rand(64) + 0.5

    def grad_x(a: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda b: _rmsnorm_loss(tiny.rmsnorm, b, w))(a)

    torch.testing.assert_close(torch.compile(grad_x, fullgraph=True)(x), grad_x(x))


def test_double_backward_is_refused(tiny) -> None:  # noqa: ANN001
    """create_graph=True gives the first-order gradients; differentiating them again fails
    naming the backward op, as torch's once-differentiable functions do."""
    from nkikit.errors import ErrDoubleBackwardNotSupported

    torch.manual_seed(7)
    x = torch.randn(5, 64, requires_grad=True)
    w = (torch.rand(64) + 0.5).requires_grad_()
    first = torch.autograd.grad(_rmsnorm_loss(tiny.rmsnorm, x, w), (x, w))
    gx, gw = torch.autograd.grad(_rmsnorm_loss(tiny.rmsnorm, x, w), (x, w), create_graph=True)
    torch.testing.assert_close((gx, gw), first, rtol=0, atol=0)
    message = rf"{tiny.namespace}::rmsnorm_backward .*does not support double backward"
    with pytest.raises(ErrDoubleBackwardNotSupported, match=message) as e:
        torch.autograd.grad((gx**2).sum() + gw.sum(), (x, w))
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(ErrDoubleBackwardNotSupported, match=message):  # and under torch.func
        torch.func.grad(
            lambda a: torch.func.grad(lambda b: _rmsnorm_loss(tiny.rmsnorm, b, w))(a).sum()
        )(x.detach())


@pytest.mark.parametrize("call", ["function", "op"])
def test_forward_mode_ad_is_refused(tiny, call: str) -> None:  # noqa: ANN001
    """A tangent is never dropped (a zero derivative): forward mode is refused, naming the op."""
    import torch.autograd.forward_ad as fwAD

    from nkikit.errors import ErrForwardModeAdNotSupported

    x, w, t = torch.randn(5, 64), torch.rand(64) + 0.5, torch.randn(5, 64)
    rms = tiny.rmsnorm if call == "function" else tiny.rmsnorm.op
    message = rf"{tiny.namespace}::rmsnorm does not support forward-mode AD"
    with pytest.raises(ErrForwardModeAdNotSupported, match=message):
        torch.func.jvp(lambda a: rms(a, w), (x,), (t,))
    with fwAD.dual_level(), pytest.raises(ErrForwardModeAdNotSupported, match=message):
        rms(fwAD.make_dual(x, t), w)
    with fwAD.dual_level():  # no tangent: the call runs as ever
        torch.testing.assert_close(rms(x, w), tiny.rmsnorm(x, w), rtol=0, atol=0)


def _torch_add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):  # noqa: ANN202
    h = x.double() + r.double()
    return _torch_ref(h, w, eps), h


def test_multi_output_backward_schema(lib) -> None:  # noqa: ANN001
    ns = lib.namespace
    assert str(lib.add_rmsnorm.op._schema).startswith(
        f"{ns}::add_rmsnorm(Tensor x, Tensor residual, Tensor weight, float eps="
    ) and str(lib.add_rmsnorm.op._schema).endswith(") -> (Tensor, Tensor)")
    assert str(lib.add_rmsnorm.torch.backward_op._schema).startswith(
        f"{ns}::add_rmsnorm_backward(Tensor grad_0, Tensor grad_1, Tensor x, Tensor residual, "
        "Tensor weight, float eps="
    )
    assert str(lib.add_rmsnorm.torch.backward_op._schema).endswith(") -> Tensor[]")


@pytest.mark.parametrize("used", ["both", "y", "h"])
def test_multi_output_backward_of_the_pulled_kernel(lib, used: str) -> None:  # noqa: ANN001
    """add_rmsnorm -> (y, h) pulled from the hub: gradients of a loss using both outputs or one
    of them (autograd hands the binding zeros for the other) match torch autograd in float64."""
    torch.manual_seed(4)
    x = torch.randn(2, 65, 64, requires_grad=True)
    r = torch.randn(2, 65, 64, requires_grad=True)
    w = (torch.rand(64) + 0.5).requires_grad_()
    cy, ch = torch.randn(2, 65, 64), torch.randn(2, 65, 64)

    def loss(y: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        parts = {"y": (y * cy).sum(), "h": (h * ch).sum()}
        return parts["y"] + parts["h"] if used == "both" else parts[used]

    got = torch.autograd.grad(loss(*lib.add_rmsnorm(x, r, w)), (x, r, w), allow_unused=True)
    leaves = [t.detach().double().requires_grad_() for t in (x, r, w)]
    want = torch.autograd.grad(loss(*_torch_add_rmsnorm(*leaves)), leaves, allow_unused=True)
    for g, ref in zip(got, want):
        ref = torch.zeros(g.shape, dtype=torch.float64) if ref is None else ref
        torch.testing.assert_close(g.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_multi_output_gradcheck_opcheck_compile(lib) -> None:  # noqa: ANN001
    torch.manual_seed(5)
    x = torch.randn(3, 8, requires_grad=True)
    r = torch.randn(3, 8, requires_grad=True)
    w = (torch.rand(8) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b, c: lib.add_rmsnorm(a, b, c, eps=1e-3),
        (x, r, w),
        eps=1e-2,
        atol=2e-2,
        rtol=2e-2,
    )
    result = torch.library.opcheck(lib.add_rmsnorm.op, (x, r, w, 1e-3))
    assert set(result.values()) == {"SUCCESS"}, result
    torch._dynamo.reset()

    def step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        y, h = lib.add_rmsnorm(a, b, c)
        return (y * h).sum()

    step(x, r, w).backward()
    eager = [t.grad.clone() for t in (x, r, w)]
    for t in (x, r, w):
        t.grad = None
    torch.compile(step, fullgraph=True)(x, r, w).backward()
    torch.testing.assert_close([t.grad for t in (x, r, w)], eager)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision:UserWarning")
def test_gradcheck_fp32(tiny) -> None:  # noqa: ANN001
    """The kernels compute in fp32 (NKI has no float64), so gradcheck runs in fp32 with
    finite-difference steps and tolerances sized for fp32 rounding; the test below checks the
    same gradients tightly against torch autograd of a float64 reference."""
    torch.manual_seed(0)
    x = torch.randn(3, 8, requires_grad=True)
    w = (torch.rand(8) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: tiny.rmsnorm(a, b, eps=1e-3), (x, w), eps=1e-2, atol=2e-2, rtol=2e-2
    )


def test_gradients_match_torch_autograd_of_the_reference(tiny) -> None:  # noqa: ANN001
    torch.manual_seed(1)
    x = torch.randn(130, 64, requires_grad=True)
    w = torch.rand(64, requires_grad=True)
    g = torch.randn(130, 64)
    tiny.rmsnorm(x, w).backward(g)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    _torch_ref(x64, w64).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-3, rtol=1e-4)


def test_compile_fullgraph(tiny, lib) -> None:  # noqa: ANN001
    torch._dynamo.reset()

    def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = tiny.rmsnorm(x * 2.0, w)
        s, m = tiny.add_sub(h, x)
        return lib.rmsnorm(s + m, w, eps=1e-5).relu()

    compiled = torch.compile(block, fullgraph=True)  # raises on any graph break
    x, w = torch.randn(6, 64), torch.rand(64)
    torch.testing.assert_close(compiled(x, w), block(x, w), rtol=0, atol=0)


def test_compile_with_backward(tiny) -> None:  # noqa: ANN001
    torch._dynamo.reset()
    x = torch.randn(10, 64, requires_grad=True)
    w = torch.rand(64, requires_grad=True)

    def loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (tiny.rmsnorm(a, b) ** 2).sum()

    loss(x, w).backward()
    eager = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    torch.compile(loss, fullgraph=True)(x, w).backward()
    torch.testing.assert_close((x.grad, w.grad), eager)


def test_fake_tensors_give_shapes_without_running(tiny, lib) -> None:  # noqa: ANN001
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = tiny.rmsnorm.op(torch.empty(300, 64), torch.empty(64))
        s, m = tiny.add_sub.op(torch.empty(7, 16), torch.empty(7, 16))
        z = lib.rmsnorm.op(
            torch.empty(2, 5, 32, dtype=torch.bfloat16), torch.empty(32, dtype=torch.bfloat16)
        )
    assert (y.shape, s.shape, m.shape) == ((300, 64), (7, 16), (7, 16))
    assert z.shape == (2, 5, 32) and z.dtype == torch.bfloat16


def test_wrong_dtype(tiny) -> None:  # noqa: ANN001
    x = torch.randn(4, 64, dtype=torch.float64)
    with pytest.raises(
        KernelCallError,
        match=r"input 'x' has dtype float64; this kernel supports float32, bfloat16, float16",
    ):
        tiny.rmsnorm(x, torch.rand(64, dtype=torch.float64))
    with pytest.raises(KernelCallError, match="has dtype float64"):
        tiny.rmsnorm.op(x, torch.rand(64, dtype=torch.float64))
    with pytest.raises(
        KernelCallError,
        match=r"add_sub\(\): input 'a' has dtype bfloat16; this kernel supports float32",
    ):
        tiny.add_sub(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2, dtype=torch.bfloat16))


def test_wrong_device(tiny) -> None:  # noqa: ANN001
    x = torch.empty(4, 64, device="meta")
    with pytest.raises(
        KernelCallError, match=r"input 'x' is on meta; nkikit runs kernels on the CPU simulator"
    ):
        tiny.rmsnorm(x, torch.empty(64, device="meta"))


def test_wrong_shape(tiny, lib) -> None:  # noqa: ANN001
    from nkikit.errors import NkiError

    with pytest.raises((NkiError, ValueError, IndexError)):
        tiny.rmsnorm(torch.randn(4, 64), torch.rand(65))
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        lib.rmsnorm(torch.randn(4, 64), torch.rand(65))
    with pytest.raises(ValueError, match="same shape"):
        tiny.add_sub(torch.ones(2, 3), torch.ones(3, 2))


def test_wrong_arguments(tiny) -> None:  # noqa: ANN001
    with pytest.raises(
        KernelCallError,
        match=r"rmsnorm\(x, weight, eps=1e-06\): missing a required argument: 'weight'",
    ):
        tiny.rmsnorm(torch.ones(2, 2))
    with pytest.raises(KernelCallError, match="unexpected keyword argument 'epsilon'"):
        tiny.rmsnorm(torch.ones(2, 2), torch.ones(2), epsilon=1.0)


def test_two_versions_register_distinct_ops(tiny, hub_url: str, tmp_path: Path) -> None:  # noqa: ANN001
    import shutil

    from hubfixtures import TINY

    from nkikit.registry.publish import publish

    folder = tmp_path / "k"
    shutil.copytree(TINY, folder)
    (folder / "reference.py").write_text((folder / "reference.py").read_text() + "\n# v2\n")
    publish(
        folder, "nkikit/tiny-rmsnorm-v2", endpoint=hub_url, run_tests=False, version=2, neuron=False
    )
    v2 = pull("nkikit/tiny-rmsnorm-v2", version=2, endpoint=hub_url, cache_dir=tmp_path / "c")
    assert v2.namespace != tiny.namespace
    x, w = torch.randn(3, 64), torch.rand(64)
    torch.testing.assert_close(
        getattr(torch.ops, v2.namespace).rmsnorm(x, w),
        getattr(torch.ops, tiny.namespace).rmsnorm(x, w),
    )


@pytest.mark.parametrize(
    "kwargs, argument, grad",
    [
        ({"eps": "big"}, "eps", False),  # the eager fast path
        ({"eps": None}, "eps", False),
        ({"eps": [1e-6]}, "eps", True),  # through the dispatcher (autograd)
    ],
)
def test_attrs_are_checked_against_the_schema_naming_the_argument(
    tiny, kwargs: dict, argument: str, grad: bool
) -> None:  # noqa: ANN001
    x = torch.randn(4, 64, requires_grad=grad)
    w = torch.rand(64)
    with pytest.raises(KernelCallError, match=rf"rmsnorm\(\).*argument '{argument}'"):
        tiny.rmsnorm(x, w, **kwargs)
    with pytest.raises(KernelCallError, match=rf"rmsnorm\(\): argument '{argument}' must be float"):
        tiny.rmsnorm(x.detach().numpy(), w.numpy(), **kwargs)  # the numpy path says the same


def test_attrs_the_schema_takes_still_run(tiny) -> None:  # noqa: ANN001
    x, w = torch.randn(4, 64), torch.rand(64)
    expected = tiny.rmsnorm(x, w, eps=1e-3)
    for eps in (np.float32(1e-3), torch.tensor(1e-3)):  # a 0-d tensor goes through the dispatcher
        torch.testing.assert_close(tiny.rmsnorm(x, w, eps=eps), expected)
    assert tiny.rmsnorm(x, w, eps=1).shape == x.shape  # an int is a float for the schema


def test_a_non_tensor_input_is_refused_naming_it(lib) -> None:  # noqa: ANN001
    x, w = torch.randn(4, 64), torch.rand(64)
    for bad in (1.0, w.numpy(), [1.0] * 64):
        with pytest.raises(KernelCallError, match="weight"):
            lib.rmsnorm(x, bad)


def test_an_int_attr_is_a_64_bit_integer(lib) -> None:  # noqa: ANN001
    from nkikit.registry.runtime import _accepts

    assert _accepts(0, 2**63 - 1) and _accepts(0, -(2**63))
    assert not _accepts(0, 2**63) and not _accepts([0], [1, 2**64])
    # a float attr takes any integer (as a double): rmsnorm's eps
    lib.rmsnorm.check_attr_ranges((10**30,))


def test_negated_views_and_tensors_of_the_emulated_device(lib) -> None:  # noqa: ANN001
    import nkikit.torch.neuron  # noqa: F401 - registers the "neuron" device

    x, w = torch.randn(4, 64), torch.rand(64)
    torch.testing.assert_close(lib.rmsnorm(torch._neg_view(x), w), lib.rmsnorm(-x, w))
    # a subclass of torch.Tensor is a tensor: the op runs (on the CPU, as the device's
    # fallback for ops it has no kernel for) and the result is on the device
    with pytest.warns(UserWarning):
        y = lib.rmsnorm(x.to("neuron"), w.to("neuron"))
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), lib.rmsnorm(x, w))
