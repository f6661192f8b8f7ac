"""The region code generator: generated NKI kernels against CPU torch and numpy, per op and
dtype, fused chains, reductions over every dim, the cache, the source as a file, and reasons.

Regions are built from torch functions with ``make_fx`` (ATen ops as torch dispatches them),
so the tests see the graphs the device and the compile backend see.  Tolerances are
``nkikit.testing.tolerances``' per dtype and op kind, doubled: torch rounds too.
"""

from __future__ import annotations

import importlib.util
import math
import operator
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from nkikit.compiler.launches import Session
from nkikit.testing.tolerances import tolerance
from nkikit.torch.convert import to_numpy
from nkikit.torch.neuron.codegen import compile_region, render, supported
from nkikit.torch.neuron.layout import Unsupported
from nkikit.torch.neuron.region import Node, Region, Value

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def region_from(fn, *tensors: torch.Tensor) -> Region:
    """The ATen graph of ``fn`` on ``tensors`` as a region (values t0, t1, ... in order)."""
    gm = make_fx(fn)(*tensors)
    names: dict = {}
    inputs, nodes, outputs = [], [], []

    def conv(a):
        if isinstance(a, torch.fx.Node):
            return names[a]
        if isinstance(a, list | tuple):
            return tuple(conv(e) for e in a)
        if isinstance(a, torch.dtype):
            return _dtype_name(a)
        return a

    for n in gm.graph.nodes:
        if n.op == "output":
            res = n.args[0]
            outputs = [names[a] for a in (res if isinstance(res, list | tuple) else [res])]
            continue
        names[n] = f"t{len(names)}"
        val = n.meta["val"]
        val = val[0] if isinstance(val, list | tuple) else val
        v = Value(names[n], tuple(val.shape), _dtype_name(val.dtype))
        if n.op == "placeholder":
            inputs.append(v)
        else:
            op = "getitem" if n.target is operator.getitem else n.target.__name__
            op = op if "." in op or op == "getitem" else op + ".default"
            kwargs = tuple((k, conv(a)) for k, a in n.kwargs.items())
            nodes.append(Node(op, conv(n.args), kwargs, v))
    return Region(tuple(inputs), tuple(nodes), tuple(outputs))


def run_on_device(fn, *tensors: torch.Tensor) -> tuple[np.ndarray, ...]:
    region = region_from(fn, *tensors)
    return compile_region(region).run(*[to_numpy(t) for t in tensors])


def assert_matches_torch(fn, *tensors: torch.Tensor, kind: str = "elementwise") -> None:
    outs = run_on_device(fn, *tensors)
    ref = fn(*tensors)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert o.shape == tuple(r.shape)
        assert str(o.dtype) == _dtype_name(r.dtype)
        if r.dtype == torch.bool:
            np.testing.assert_array_equal(o, r.numpy())
            continue
        tol = tolerance(_dtype_name(r.dtype), kind)
        np.testing.assert_allclose(
            o.astype(np.float64),
            r.double().numpy(),
            rtol=2 * tol.rtol,
            atol=2 * tol.atol,
            equal_nan=True,
        )


def _randn(*shape: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _positive(t: torch.Tensor) -> torch.Tensor:
    return t.abs() + 0.25


# (name, fn, op kind, number of inputs, input transform): every op against CPU torch
UNARY = [
    ("neg", torch.neg, "elementwise", None),
    ("abs", torch.abs, "elementwise", None),
    ("exp", torch.exp, "transcendental", None),
    ("log", torch.log, "transcendental", _positive),
    ("sqrt", torch.sqrt, "transcendental", _positive),
    ("rsqrt", torch.rsqrt, "transcendental", _positive),
    ("reciprocal", torch.reciprocal, "elementwise", _positive),
    ("sin", torch.sin, "transcendental", None),
    ("cos", torch.cos, "transcendental", None),
    ("tanh", torch.tanh, "transcendental", None),
    ("sigmoid", torch.sigmoid, "transcendental", None),
    ("silu", lambda x: F.silu(x), "transcendental", None),
    ("gelu", lambda x: F.gelu(x), "transcendental", None),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "transcendental", None),
    ("relu", lambda x: F.relu(x), "elementwise", None),
    ("erf", torch.erf, "transcendental", None),
    ("square", lambda x: x * x, "elementwise", None),
    ("pow2", lambda x: x**2, "elementwise", None),
    ("pow3", lambda x: x**3, "transcendental", None),
    ("pow_half", lambda x: x**0.5, "transcendental", _positive),
    ("clamp", lambda x: x.clamp(-0.5, 0.7), "elementwise", None),
    ("mul_scalar", lambda x: x * 3.0, "elementwise", None),
    ("add_scalar", lambda x: x + 1.5, "elementwise", None),
    ("rsub_scalar", lambda x: 2.0 - x, "elementwise", None),
    ("div_scalar", lambda x: x / 3.0, "elementwise", None),
    ("clone", torch.clone, "elementwise", None),
    ("zeros_like", torch.zeros_like, "elementwise", None),
    ("full_like", lambda x: torch.full_like(x, 2.5), "elementwise", None),
    ("cmp_scalar", lambda x: x >= 0.1, "elementwise", None),
    ("to_float16", lambda x: x.to(torch.float16), "elementwise", None),
    ("to_bool", lambda x: F.relu(x).to(torch.bool), "elementwise", None),
]

BINARY = [
    ("add", lambda x, y: x + y),
    ("add_alpha", lambda x, y: torch.add(x, y, alpha=0.5)),
    ("sub", lambda x, y: x - y),
    ("mul", lambda x, y: x * y),
    ("div", lambda x, y: x / y),
    ("maximum", torch.maximum),
    ("minimum", torch.minimum),
    ("eq", lambda x, y: x == y),
    ("ne", lambda x, y: x != y),
    ("lt", lambda x, y: x < y),
    ("le", lambda x, y: x <= y),
    ("gt", lambda x, y: x > y),
    ("ge", lambda x, y: x >= y),
    ("where", lambda x, y: torch.where(x > y, x, y)),
    ("pow", lambda x, y: torch.pow(x.abs() + 0.5, y)),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name,fn,kind,prep", UNARY, ids=[u[0] for u in UNARY])
def test_unary_op_matches_torch(name, fn, kind, prep, dtype):
    x = _randn(130, 72, dtype=DTYPES[dtype])
    if prep is not None:
        x = prep(x)
    assert_matches_torch(fn, x, kind=kind)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name,fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary_op_matches_torch(name, fn, dtype):
    x = _randn(130, 72, dtype=DTYPES[dtype])
    y = _randn(130, 72, dtype=DTYPES[dtype], seed=1)
    y[::3] = x[::3]  # some equal elements, for the comparisons
    kind = "transcendental" if name == "pow" else "elementwise"
    assert_matches_torch(fn, x, y, kind=kind)


def test_fp32_elementwise_is_exact_against_numpy():
    """One ALU op per element in fp32: the engines' result is numpy's, bit for bit."""
    x, y = _randn(300, 40), _randn(300, 40, seed=1)
    fn = lambda a, b: torch.where(a > b, a * b - 2.0, a / (b + 3.0))  # noqa: E731
    (out,) = run_on_device(fn, x, y)
    a, b = x.numpy(), y.numpy()
    ref = np.where(a > b, a * b - np.float32(2.0), a / (b + np.float32(3.0)))
    np.testing.assert_array_equal(out, ref)


def test_bf16_rounds_once_per_op_as_torch_does():
    """A chain of bf16 ops, one instruction each, rounds after each op as torch's bf16 ops
    do: bit for bit."""
    x, y = _randn(257, 33, dtype=torch.bfloat16), _randn(33, dtype=torch.bfloat16, seed=1)
    fn = lambda a, b: torch.sigmoid(torch.maximum(a * b, a)) - a  # noqa: E731
    (out,) = run_on_device(fn, x, y)
    np.testing.assert_array_equal(out.astype(np.float32), fn(x, y).float().numpy())


# -- broadcasting over hypothesis shapes ---------------------------------------------------------


@st.composite
def broadcast_pair(draw):
    rank = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([1, 2, 3, 5, 7, 64, 129, 300])) for _ in range(rank)]
    while math.prod(sizes) > 40_000:  # one large dimension at most: the tests stay fast
        sizes[sizes.index(max(sizes))] = 7
    other = [s if draw(st.booleans()) else 1 for s in sizes]
    drop = draw(st.integers(0, rank - 1))
    return tuple(sizes), tuple(other[drop:])


@settings(max_examples=12, deadline=None)
@given(shapes=broadcast_pair(), dtype=st.sampled_from(list(DTYPES)), swap=st.booleans())
def test_broadcasting_chain_matches_torch(shapes, dtype, swap):
    a = _randn(*shapes[0], dtype=DTYPES[dtype])
    b = _randn(*shapes[1], dtype=DTYPES[dtype], seed=1)
    if swap:
        a, b = b, a
    assert_matches_torch(lambda x, y: torch.exp(x - y) * y + x, a, b, kind="transcendental")


# -- reductions --------------------------------------------------------------------------------


REDUCTIONS = [
    ("sum", lambda x, d: x.sum(d), "reduction"),
    ("sum_keepdim", lambda x, d: x.sum(d, keepdim=True), "reduction"),
    ("mean", lambda x, d: x.mean(d, keepdim=True), "reduction"),
    ("amax", lambda x, d: x.amax(d), "reduction"),
    ("amin", lambda x, d: x.amin(d, keepdim=True), "reduction"),
    ("var", lambda x, d: x.var(d), "normalization"),
    ("var_mean", lambda x, d: torch.var_mean(x, d, correction=0), "normalization"),
    ("softmax", lambda x, d: torch.softmax(x, d), "normalization"),
    ("log_softmax", lambda x, d: torch.log_softmax(x, d), "normalization"),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name,fn,kind", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction_over_every_dim(name, fn, kind, dtype):
    x = _randn(3, 20, 5, 6, dtype=DTYPES[dtype])
    for d in range(-4, 0):
        assert_matches_torch(_bind(fn, d), x, kind=kind)


def _bind(fn, d):
    return lambda t: fn(t, d)


@st.composite
def shape_and_dim(draw):
    rank = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([1, 2, 3, 5, 33, 129, 200])) for _ in range(rank)]
    while math.prod(sizes) > 30_000:
        sizes[sizes.index(max(sizes))] = 5
    return tuple(sizes), draw(st.integers(-rank, rank - 1))


@settings(max_examples=10, deadline=None)
@given(case=shape_and_dim(), dtype=st.sampled_from(list(DTYPES)))
def test_fused_normalization_over_any_dim(case, dtype):
    """An rms-norm-like chain over a drawn dimension: one kernel, the dimension on the free
    axis wherever it is."""
    shape, d = case
    x = _randn(*shape, dtype=DTYPES[dtype])

    def fn(t):
        scale = t.amax(d, keepdim=True).abs() + 1.0  # a product: no cancellation to amplify
        return t * torch.rsqrt(t.pow(2).mean(d, keepdim=True) + 1e-6) * scale

    assert_matches_torch(fn, x, kind="normalization")


def test_reduction_over_several_dims():
    x = _randn(4, 9, 130, 3)
    assert_matches_torch(lambda t: t.sum((0, 3), keepdim=True), x, kind="reduction")
    assert_matches_torch(lambda t: t.mean((1, 2)), x, kind="reduction")
    assert_matches_torch(lambda t: t.sum(), x, kind="reduction")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_whole_tensor_reductions_fold_onto_partitions(dtype):
    """A region that reduces everything spreads the elements over the partitions and finishes
    with a cross-partition reduce."""
    x = _randn(6, 50, 100, dtype=DTYPES[dtype])
    region = region_from(lambda t: (t * t).mean(), x)
    assert "tensor_partition_reduce" in compile_region(region).source
    assert_matches_torch(lambda t: (t * t).mean(), x, kind="reduction")
    assert_matches_torch(lambda t: t.amin(), x, kind="reduction")
    assert_matches_torch(lambda t: t.amax(), x, kind="reduction")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_norms_match_torch(dtype):
    dt = DTYPES[dtype]
    x, w, b = (
        _randn(2, 150, 96, dtype=dt),
        _randn(96, dtype=dt, seed=1),
        _randn(96, dtype=dt, seed=2),
    )
    assert_matches_torch(
        lambda t, w, b: F.layer_norm(t, (96,), w, b), x, w, b, kind="normalization"
    )
    assert_matches_torch(lambda t: F.layer_norm(t, (5, 96)), x[:, :5], kind="normalization")
    assert_matches_torch(lambda t, w: torch.rms_norm(t, (96,), w, 1e-6), x, w, kind="normalization")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_rms_norm_node_is_one_kernel(dtype):
    """``rms_norm.default`` as one node (the device keeps torch.rms_norm whole): torch's
    numerics (fp32 math, rounded to the input dtype before the weight)."""
    dt = DTYPES[dtype]
    x, w = _randn(300, 256, dtype=dt), _randn(256, dtype=dt, seed=1)
    region = Region(
        (Value("x", (300, 256), dtype), Value("w", (256,), dtype)),
        (Node("rms_norm.default", ("x", [256], "w", 1e-5), (), Value("y", (300, 256), dtype)),),
        ("y",),
    )
    (out,) = compile_region(region).run(to_numpy(x), to_numpy(w))
    ref = torch.rms_norm(x, (256,), w, 1e-5)
    tol = tolerance(dtype, "normalization")
    np.testing.assert_allclose(
        out.astype(np.float64), ref.double().numpy(), 2 * tol.rtol, 2 * tol.atol
    )


def test_decomposed_rms_norm_fuses_into_one_kernel():
    """torch.rms_norm as dispatched (pow, mean, add, rsqrt, mul, mul): one kernel, one
    launch, with the reduced axis on the free dimension."""
    x, w = _randn(256, 512, dtype=torch.bfloat16), _randn(512, dtype=torch.bfloat16, seed=1)
    fn = lambda t, w: torch.rms_norm(t, (512,), w, 1e-6)  # noqa: E731
    region = region_from(fn, x, w)
    assert len(region.nodes) >= 5
    compiled = compile_region(region)
    with Session() as s:
        (out,) = compiled.run(to_numpy(x), to_numpy(w))
    assert [r.kernel for r in s.records] == [compiled.name]
    assert "nisa.tensor_reduce" in compiled.source or "reduce_res" in compiled.source
    tol = tolerance("bfloat16", "normalization")
    np.testing.assert_allclose(
        out.astype(np.float32), fn(x, w).float().numpy(), 2 * tol.rtol, 2 * tol.atol
    )


aten = torch.ops.aten
BACKWARD = [
    ("softmax", torch.softmax, lambda g, y: aten._softmax_backward_data(g, y, -1, y.dtype)),
    (
        "log_softmax",
        torch.log_softmax,
        lambda g, y: aten._log_softmax_backward_data(g, y, -1, y.dtype),
    ),
    ("silu", None, aten.silu_backward),
    ("gelu", None, aten.gelu_backward),
    ("relu", F.relu, lambda g, y: aten.threshold_backward(g, y, 0)),
    ("sigmoid", torch.sigmoid, aten.sigmoid_backward),
    ("tanh", torch.tanh, aten.tanh_backward),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name,forward,backward", BACKWARD, ids=[b[0] for b in BACKWARD])
def test_backward_op_matches_torch(name, forward, backward, dtype):
    """Each backward ATen op autograd dispatches, on the tensors it is given (the forward's
    input or output, as torch saves it)."""
    x = _randn(140, 48, dtype=DTYPES[dtype])
    g = _randn(140, 48, dtype=DTYPES[dtype], seed=1)
    saved = x if forward is None else forward(x, -1) if name.endswith("softmax") else forward(x)
    assert_matches_torch(lambda g, s: backward(g, s), g, saved, kind="normalization")


@pytest.mark.parametrize(
    "name,fn", [("softmax", torch.softmax), ("log_softmax", torch.log_softmax)]
)
def test_forward_and_backward_in_one_region(name, fn):
    """An autograd graph (forward, detach, backward) as one fp32 region."""
    x = _randn(140, 48).requires_grad_(True)
    g = _randn(140, 48, seed=1)

    def grad(x, g):
        return torch.autograd.grad(fn(x, -1), x, g)[0]

    region = region_from(grad, x, g)
    assert any("backward" in n.op for n in region.nodes)
    (out,) = compile_region(region).run(x.detach().numpy(), g.numpy())
    tol = tolerance("float32", "normalization")
    np.testing.assert_allclose(out, grad(x, g).numpy(), 2 * tol.rtol, 2 * tol.atol)


# -- the cache, the source, the profile --------------------------------------------------------


def _chain(prefix: str) -> Region:
    x, y = Value(f"{prefix}x", (200, 64), "float32"), Value(f"{prefix}y", (200, 64), "float32")
    a = Node("add.Tensor", (x.name, y.name), (), Value(f"{prefix}a", (200, 64), "float32"))
    m = Node("mul.Tensor", (a.out.name, x.name), (), Value(f"{prefix}m", (200, 64), "float32"))
    return Region((x, y), (a, m), (m.out.name,))


def test_cache_hit_for_a_renamed_region():
    first = compile_region(_chain("p_"))
    again = compile_region(_chain("q_"))
    assert again is first
    assert again.kernel is first.kernel
    assert compile_region(_chain("p_"), target="trn1") is not first


def test_source_is_nki_that_runs_from_a_file(tmp_path):
    """The printed source, saved as a file that says ``import nki``, runs on nkikit through
    the NKI 0.x alias and gives the same result as the cached kernel."""
    x, w = _randn(200, 96), _randn(96, seed=1)
    compiled = compile_region(region_from(lambda t, w: torch.softmax(t * w, -1), x, w))
    assert (
        compiled.source.splitlines()[compiled.source.splitlines().index("import nki")]
        == "import nki"
    )
    assert f"def {compiled.name}(" in compiled.source
    path = tmp_path / "kernel.py"
    path.write_text(compiled.source)
    saved = {k: v for k, v in sys.modules.items() if k == "nki" or k.startswith("nki.")}
    try:
        import nkikit.nki

        nkikit.nki.install_alias()
        spec = importlib.util.spec_from_file_location("published_kernel", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        from_file = getattr(module, compiled.name)(x.numpy(), w.numpy())
    finally:
        for k in [k for k in sys.modules if k == "nki" or k.startswith("nki.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    (cached,) = compiled.run(x.numpy(), w.numpy())
    np.testing.assert_array_equal(np.asarray(from_file), cached)


def test_run_records_a_launch_with_modeled_time():
    compiled = compile_region(_chain("r_"))
    x = np.ones((200, 64), np.float32)
    with Session() as s:
        compiled.run(x, x)
    (rec,) = s.records
    assert rec.kernel == compiled.name
    assert rec.profile is not None and rec.profile.total_us > 0


def test_bf16_arrays_are_ml_dtypes():
    x = _randn(5, 7, dtype=torch.bfloat16)
    (out,) = run_on_device(lambda t: t * 2.0, x)
    assert out.dtype == ml_dtypes.bfloat16


# -- reasons -----------------------------------------------------------------------------------


def test_unsupported_op_gives_a_reason():
    x = Value("x", (4, 4), "float32")
    node = Node("cumsum.default", ("x", 0), (), Value("y", (4, 4), "float32"))
    region = Region((x,), (node,), ("y",))
    assert supported(node, region) == "no NKI code generator for aten.cumsum.default"
    with pytest.raises(Unsupported, match="cumsum"):
        compile_region(region)


@pytest.mark.parametrize(
    "fn,dtype,reason",
    [
        (lambda t: t + 1, torch.int64, "int64"),
        (lambda t: t.to(torch.int32), torch.float32, "round to nearest"),
        (lambda t: torch.div(t, 2.0, rounding_mode="floor"), torch.float32, "rounding_mode"),
        (lambda t: t.cumsum(0), torch.float32, "no NKI code generator"),
    ],
)
def test_reasons(fn, dtype, reason):
    x = torch.arange(12).reshape(3, 4).to(dtype)
    region = region_from(fn, x)
    why = supported(region.nodes[-1], region)
    assert why is not None and reason in why, why
    with pytest.raises(Unsupported, match=reason):
        render(region)


def test_region_reducing_two_different_axes_is_refused():
    x = _randn(8, 16)
    region = region_from(lambda t: t.sum(0, keepdim=True) + t.sum(1, keepdim=True), x)
    reasons = [supported(n, region) for n in region.nodes]
    assert any(r and "reduces" in r for r in reasons), reasons


def test_views_that_move_no_element_fuse():
    """unsqueeze / view / expand that only add, drop or broadcast size-1 dimensions are free
    inside a region; a view that regroups elements is refused with the reason."""
    x = _randn(6, 130, 40)
    assert_matches_torch(lambda t: t * t.sum(-1).unsqueeze(-1), x, kind="reduction")
    assert_matches_torch(lambda t: t.mean(-1).view(6, 130, 1) + t, x, kind="reduction")
    assert_matches_torch(lambda t, w: t * w.expand(6, 130, 40), x, _randn(40), kind="reduction")
    region = region_from(lambda t: t.view(6, 40, 130) + 1, x)
    assert "moves elements" in supported(region.nodes[0], region)


def test_scalars_masks_fills_and_passthrough():
    """0-d tensor operands, bool masks, factory ops inside a region, and a region that also
    returns one of its inputs."""
    x = _randn(200, 30)
    assert_matches_torch(lambda x, s: x * s + s, x, torch.tensor(2.5))
    assert_matches_torch(lambda m, a, b: torch.where(m, a, b), x > 0, x, _randn(30, seed=1))
    assert_matches_torch(lambda m, a: a.masked_fill(m, -1e9), x > 0.5, x)
    assert_matches_torch(lambda t: t + torch.full((30,), 2.0), x)
    assert_matches_torch(lambda t: torch.where(t > 0, t, torch.scalar_tensor(0.5)), x)
    assert_matches_torch(lambda t: t.exp(), _randn(()))
    region = Region(
        (Value("a", (3, 4), "float32"),),
        (Node("full.default", ([3, 4], 2.0), (), Value("b", (3, 4), "float32")),),
        ("a", "b"),
    )
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    same, full = compile_region(region).run(a)
    np.testing.assert_array_equal(same, a)
    np.testing.assert_array_equal(full, np.full((3, 4), 2.0, np.float32))


def test_mean_plus_eps_folds_into_the_rsqrt_activation():
    # rsqrt(mean(x^2) + eps): the mean's 1/n and the eps ride on one ScalarE activation's scale
    # and bias (no VectorE tensor_scalar between the row sum and the rsqrt)
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = torch.randn(256, 512), torch.randn(512)
    source = compile_region(region_from(rms, x, w)).source
    assert "op=nl.rsqrt, data=" in source and "scale=" in source and "bias=1e-06" in source
    assert "op0=nl.divide" not in source
    got = run_on_device(rms, x, w)[0]
    np.testing.assert_allclose(got, rms(x, w).numpy(), rtol=2e-6, atol=2e-6)
