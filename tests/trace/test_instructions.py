"""The emit layer (``nkikit/trace/instructions.py``): one ``emit_<prim>`` per primitive, the only
way the front ends of both dialects reach ``Builder.emit``, and the checks it does for both."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable

import numpy as np
import pytest
from nki0x_helpers import load as load0  # tests/nki0x, see conftest.py
from nki0x_helpers import store as store0

import nkikit as nki1
import nkikit.isa as nisa1
import nkikit.language as nl1
import nkikit.nki as nki
import nkikit.nki.isa as nisa
import nkikit.nki.language as nl
from nkikit import dtypes
from nkikit.errors import NkiError, caller_loc
from nkikit.ir.affine import Affine, Axis, Predicate
from nkikit.ir.core import Access
from nkikit.ir.prims import PRIMS, PrimError
from nkikit.language.operands import new_tile
from nkikit.trace import instructions as E

PKG = os.path.dirname(os.path.abspath(nki1.__file__))
P, F = 128, 64
X = np.random.default_rng(0).standard_normal((P, F)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# every primitive has an emit function, and it emits that primitive


def test_every_primitive_has_an_emit_function():
    assert set(E.EMITTERS) == set(PRIMS), "add emit_<prim> to nkikit/trace/instructions.py"
    for prim, fn in E.EMITTERS.items():
        assert fn.__name__ == f"emit_{prim}"
        assert fn.__doc__ and fn.__doc__.strip(), f"emit_{prim} states no contract"


def _tile(shape, dtype=np.float32, buffer="sbuf") -> Access:
    return new_tile(shape, dtypes.as_dtype(dtype), caller_loc(), buffer=buffer)[1]


def sb(*shape, dtype=np.float32) -> Access:
    return _tile(shape, dtype)


def ps(*shape) -> Access:
    return _tile(shape, np.float32, "psum")


_GE = Predicate(((Affine.of(Axis(0)) - Affine.of(Axis(1)), ">="),))

# one legal call of every emit function (loc is added); ``a`` is the kernel input in HBM
SAMPLES: dict[str, Callable[[Access], tuple]] = {
    "dma_copy": lambda a: ((sb(P, F), a), {}),
    "nc_matmul": lambda a: ((ps(F, F), sb(P, F), sb(P, F)), {}),
    "nc_transpose": lambda a: ((ps(F, P), sb(P, F)), {}),
    "partition_broadcast": lambda a: ((sb(P, F), sb(1, F)), {}),
    "activation": lambda a: ((sb(P, F), sb(P, F)), {"op": np.exp}),
    "tensor_copy": lambda a: ((sb(P, F), sb(P, F)), {}),
    "memset": lambda a: ((sb(P, F),), {"value": 0}),
    "tensor_tensor": lambda a: ((sb(P, F), sb(P, F), sb(P, F)), {"op": np.add}),
    "tensor_scalar": lambda a: ((sb(P, F), sb(P, F), 2.0), {"op0": np.multiply}),
    "scalar_tensor_tensor": lambda a: (
        (sb(P, F), sb(P, F), 2.0, sb(P, F)),
        {"op0": np.multiply, "op1": np.add},
    ),
    "tensor_reduce": lambda a: ((sb(P, 1), sb(P, F)), {"op": np.add, "axes": (1,)}),
    "tensor_partition_reduce": lambda a: ((sb(1, F), sb(P, F)), {"op": np.add}),
    "tensor_tensor_scan": lambda a: (
        (sb(P, F), sb(P, F), sb(P, F), 0.0),
        {"op0": np.multiply, "op1": np.add},
    ),
    "reciprocal": lambda a: ((sb(P, F), sb(P, F)), {}),
    "select": lambda a: ((sb(P, F), sb(P, F), sb(P, F), 0.0), {}),
    "range_select": lambda a: (
        (sb(P, F), sb(P, F), sb(P, 1), sb(P, 1)),
        {"comp_op0": np.greater_equal, "comp_op1": np.less},
    ),
    "select_reduce": lambda a: ((sb(P, F), sb(P, F, dtype=np.uint8), sb(P, F), 0.0), {}),
    "bn_stats": lambda a: ((sb(P, 6), sb(P, F)), {}),
    "bn_aggr": lambda a: ((sb(P, 2), sb(P, 6)), {}),
    "dropout": lambda a: ((sb(P, F), sb(P, F), 0.5), {}),
    "max8": lambda a: ((sb(P, 8), sb(P, F)), {}),
    "nc_find_index8": lambda a: ((sb(P, 8, dtype=np.uint32), sb(P, F), sb(P, 8)), {}),
    "nc_match_replace8": lambda a: ((sb(P, F), sb(P, F), sb(P, 8)), {"imm": 0.0}),
    "nc_stream_shuffle": lambda a: ((sb(32, F), sb(32, F)), {"shuffle_mask": range(32)}),
    "iota": lambda a: ((sb(P, F, dtype=np.int32),), {"expr": Affine.of(Axis(1))}),
    "affine_select": lambda a: ((sb(P, F), sb(P, F)), {"pred": _GE, "on_false": 0.0}),
    "local_gather": lambda a: ((sb(P, 64), sb(P, F), sb(P, 4, dtype=np.uint16)), {}),
    "nc_n_gather": lambda a: ((sb(P, 4), sb(P, F), sb(P, 4, dtype=np.uint32)), {}),
    "nonzero_with_count": lambda a: ((sb(P, F + 1, dtype=np.int32), sb(P, F)), {}),
    "device_print": lambda a: ((sb(P, F),), {"prefix": "x"}),
    "activate2": lambda a: ((sb(P, F), sb(P, F), 2.0, 1.0), {"op": np.exp, "op0": np.multiply}),
    "exponential": lambda a: ((sb(P, F), sb(P, F), 1.0), {}),
    "tensor_scalar_cumulative": lambda a: (
        (sb(P, F), sb(P, F), 2.0, 0.0),
        {"op0": np.multiply, "op1": np.add},
    ),
    "sequence_bounds": lambda a: ((sb(1, 2 * F, dtype=np.int32), sb(1, F, dtype=np.int32)), {}),
    "topk": lambda a: (
        (
            sb(P, 8, dtype=dtypes.bfloat16),
            sb(P, 8, dtype=np.uint32),
            sb(P, F, dtype=dtypes.bfloat16),
        ),
        {"n": 64},
    ),
    "register_move": lambda a: ((sb(1, 1, dtype=np.int32), 3), {}),
    "rank_id": lambda a: ((sb(1, 1, dtype=np.int32),), {}),
    "scalar_arith": lambda a: (
        (sb(1, 1, dtype=np.int32), sb(1, 1, dtype=np.int32), 7),
        {"op": "multiply"},
    ),
    "rng": lambda a: ((sb(P, F, dtype=np.uint16),), {}),
    "rand2": lambda a: ((sb(P, F), 0.0, 2.0), {}),
    "set_rng_seed": lambda a: ((sb(1, 1, dtype=np.int32),), {}),
    "rand_set_state": lambda a: ((sb(P, 6, dtype=np.uint32),), {}),
    "rand_get_state": lambda a: ((sb(P, 6, dtype=np.uint32),), {}),
    "all_reduce": lambda a: ((sb(P, F), sb(P, F)), {"groups": ((0, 1),), "op": np.add}),
    "all_gather": lambda a: ((sb(P, 2 * F), sb(P, F)), {"groups": ((0, 1),), "dim": 1}),
    "reduce_scatter": lambda a: (
        (sb(P, F // 2), sb(P, F)),
        {"groups": ((0, 1),), "dim": 1, "op": np.add},
    ),
    "all_to_all": lambda a: ((sb(P, F), sb(P, F)), {"groups": ((0, 1),), "dim": 1}),
    "all_gather_v": lambda a: (
        (_tile((P, F), buffer="shared_hbm"), a, sb(4, 2, dtype=np.uint32)),
        {"groups": ((0, 1),)},
    ),
    "all_to_all_v": lambda a: (
        (_tile((P, F), buffer="shared_hbm"), a, sb(4, 2, dtype=np.uint32)),
        {"groups": ((0, 1),), "has_rdispls": True},
    ),
    "ring_rank_id": lambda a: ((sb(1, 1, dtype=np.int32),), {"groups": ((0, 1),), "iteration": 1}),
    "collective_permute": lambda a: ((_tile((P, F), buffer="shared_hbm"), a), {"pairs": ((0, 1),)}),
    "nc_matmul_mx": lambda a: (
        (
            ps(32, F),
            sb(P, 32, dtype=dtypes.float8_e4m3fn_x4),
            sb(P, F, dtype=dtypes.float4_e2m1fn_x4),
            sb(P, 32, dtype=np.uint8),
            sb(P, F, dtype=dtypes.float8_e8m0fnu),
        ),
        {},
    ),
    "quantize_mx": lambda a: (
        (
            sb(P, 16, dtype=dtypes.float8_e5m2_x4),
            sb(P, 16, dtype=np.uint8),
            sb(P, F, dtype=dtypes.bfloat16),
        ),
        {},
    ),
}


def _trace(body: Callable[[Access], None]):
    """The verified IR of a kernel that loads its input and then runs ``body(input access)``."""

    @nki1.jit
    def kern(a):
        out = nl1.ndarray(a.shape, dtype=a.dtype, buffer=nl1.shared_hbm)
        nl1.store(out, value=nl1.load(a))
        body(a.access)
        return out

    return kern.ir(X)


def test_the_samples_cover_every_primitive():
    assert set(SAMPLES) == set(PRIMS)


@pytest.mark.parametrize("prim", sorted(PRIMS))
def test_each_emit_function_emits_its_primitive(prim, monkeypatch):
    got = []
    if 3 not in PRIMS[prim].nc_versions:  # an NC-v4 instruction: verified for trn3
        monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    def body(a):
        args, kwargs = SAMPLES[prim](a)
        got.append(E.EMITTERS[prim](*args, **kwargs, loc=caller_loc()))

    kernel = _trace(body)  # verified: the sample is a legal op of its primitive
    (op,) = got
    assert op.prim == prim
    assert list(kernel.ops())[-1][0] is op  # appended to the kernel, after load and store
    assert list(op.attrs) == [a.name for a in PRIMS[prim].attrs]  # in the record's order


def test_operator_names_are_normalized():
    ops = []

    def body(a):
        for op in (np.add, "add", nl1.add, nl.add):
            ops.append(E.emit_tensor_tensor(sb(P, F), sb(P, F), sb(P, F), op=op, loc=caller_loc()))
        ops.append(
            E.emit_tensor_reduce(sb(P, 1), sb(P, F), op=np.amax, axes=(1,), loc=caller_loc())
        )

    _trace(body)
    assert [o.attrs["op"] for o in ops] == ["add"] * 4 + ["max"]


def test_default_engines_come_from_the_record_and_its_rules():
    ops = []

    def body(a):
        loc = caller_loc()
        ops.append(E.emit_tensor_tensor(sb(P, F), sb(P, F), sb(P, F), op=np.power, loc=loc))
        ops.append(E.emit_tensor_copy(sb(P, F), sb(P, F), engine="scalar", loc=loc))
        ops.append(E.emit_nc_transpose(sb(32, 32), sb(32, 32), loc=loc))  # SBUF: VectorE
        ops.append(E.emit_nc_transpose(ps(F, P), sb(P, F), loc=loc))  # PSUM: TensorE

    _trace(body)
    assert [o.attrs["engine"] for o in ops] == ["gpsimd", "scalar", "vector", "tensor"]


# ---------------------------------------------------------------------------------------------
# the checks, at the user's line


def _error(body: Callable[[Access], None]) -> NkiError:
    with pytest.raises(NkiError) as info:
        _trace(body)
    assert info.value.loc.file == __file__, str(info.value)
    return info.value


def test_an_engine_outside_the_record_is_the_users_error():
    err = _error(
        lambda a: E.emit_tensor_tensor(
            sb(P, F), sb(P, F), sb(P, F), op=np.add, engine="scalar", loc=caller_loc()
        )
    )
    assert err.name == "err_invalid_argument"
    assert "engine=scalar is not one of its engines (vector, gpsimd)" in str(err)


def test_operands_must_match_partitions_and_elements_per_partition():
    err = _error(
        lambda a: E.emit_tensor_scalar(sb(P, F), sb(P, F), sb(64, 1), op0="add", loc=caller_loc())
    )
    assert err.name == "err_num_partition_mismatch" and "128 and 64" in str(err)
    err = _error(lambda a: E.emit_tensor_copy(sb(P, F), sb(P, 32), loc=caller_loc()))
    assert err.name == "err_invalid_argument" and "32 and 64 elements per partition" in str(err)


def test_an_output_may_have_another_free_shape_of_the_same_size():
    ops = []
    _trace(lambda a: ops.append(E.emit_tensor_copy(sb(P, 4, 16), sb(P, F), loc=caller_loc())))
    assert ops[0].outs[0].shape == (P, 4, 16)


def test_elementwise_inputs_in_different_shapes_are_a_front_end_bug():
    with pytest.raises(PrimError, match="re-express them in one shape"):
        _trace(
            lambda a: E.emit_tensor_tensor(
                sb(P, F), sb(P, F), sb(P, 4, 16), op=np.add, loc=caller_loc()
            )
        )


@pytest.mark.parametrize(
    "body, role, memory",
    [
        (
            lambda a: E.emit_tensor_copy(sb(P, F), ps(P, F), engine="gpsimd", loc=caller_loc()),
            "src",
            "PSUM",
        ),
        (lambda a: E.emit_iota(ps(P, F), expr=Affine.of(Axis(1)), loc=caller_loc()), "dst", "PSUM"),
        (lambda a: E.emit_activation(sb(P, F), a, op=np.exp, loc=caller_loc()), "data", "HBM"),
        (lambda a: E.emit_dma_copy(sb(P, F), ps(P, F), loc=caller_loc()), "src", "PSUM"),
        (lambda a: E.emit_nc_matmul(sb(F, F), sb(P, F), sb(P, F), loc=caller_loc()), "dst", "SBUF"),
    ],
)
def test_operands_sit_where_their_engine_is_wired(body, role, memory):
    err = _error(body)
    assert err.name == "err_unsupported_memory"
    assert f"{role} '" in str(err) and f"got {memory}" in str(err)


def test_reductions_and_fills_the_isa_has_only_one_of():
    err = _error(
        lambda a: E.emit_select_reduce(
            sb(P, F),
            sb(P, F),
            sb(P, F),
            0.0,
            reduce_res=sb(P, 1),
            reduce_op=np.add,
            loc=caller_loc(),
        )
    )
    assert "np.max" in str(err)
    bounds = {"comp_op0": np.greater_equal, "comp_op1": np.less}
    err = _error(
        lambda a: E.emit_range_select(
            sb(P, F), sb(P, F), 0.0, 8.0, **bounds, on_false=0.0, loc=caller_loc()
        )
    )
    assert "nl.fp32.min" in str(err)
    # -3.4028235e38, as kernels write it, is fp32's minimum once rounded to fp32
    ops = []
    _trace(
        lambda a: ops.append(
            E.emit_range_select(
                sb(P, F), sb(P, F), 0.0, 8.0, **bounds, on_false=-3.4028235e38, loc=caller_loc()
            )
        )
    )
    assert ops[0].attrs["on_false"] == -3.4028235e38


def test_a_reduction_needs_its_result_tile_and_the_reverse():
    err = _error(
        lambda a: E.emit_activation(
            sb(P, F), sb(P, F), op=np.exp, reduce_op=np.add, loc=caller_loc()
        )
    )
    assert "reduce_op needs reduce_res" in str(err)
    err = _error(
        lambda a: E.emit_tensor_scalar(
            sb(P, F), sb(P, F), 1.0, op0="add", reduce_res=sb(P, 1), loc=caller_loc()
        )
    )
    assert "reduce_res needs reduce_op" in str(err)


# ---------------------------------------------------------------------------------------------
# both dialects: one emit layer, one IR, one error


def _ops(kernel):
    return [(op.prim, [o.shape for o in op.outs], dict(op.attrs)) for op, _ in kernel.ops()]


def test_tensor_scalar_and_activation_trace_the_same_ir_in_both_dialects():
    @nki.jit
    def k0(x):
        t = load0(x)
        r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0)
        s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        e = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=r, reduce_op=nl.add, reduce_res=s)
        return store0(e)

    @nki1.jit
    def k1(x):
        t = nl1.load(x)
        r = nisa1.tensor_scalar(t, np.multiply, 2.0, op1=np.add, operand1=1.0)
        s = nl1.ndarray((P, 1), dtype=nl1.float32, buffer=nl1.sbuf)
        e = nisa1.activation(np.exp, r, reduce_op=np.add, reduce_res=s)
        out = nl1.ndarray((P, F), dtype=nl1.float32, buffer=nl1.shared_hbm)
        nl1.store(out, value=e)
        return out

    assert _ops(k0.ir(X)) == _ops(k1.ir(X))
    np.testing.assert_array_equal(k0(X), k1(X))


def test_both_dialects_report_a_wrong_engine_alike():
    @nki.jit
    def k0(x):
        t = load0(x)
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add, engine=nisa.scalar_engine)
        return store0(t)

    @nki1.jit
    def k1(x):
        t = nl1.load(x)
        r = nisa1.tensor_tensor(t, t, np.add, engine=nisa1.engine.scalar)
        out = nl1.ndarray((P, F), dtype=nl1.float32, buffer=nl1.shared_hbm)
        nl1.store(out, value=r)
        return out

    errors = []
    for k in (k0, k1):
        with pytest.raises(NkiError) as info:
            k.ir(X)
        errors.append((info.value.name, info.value.detail))
    assert errors[0] == errors[1]
    assert errors[0][0] == "err_invalid_argument"


# ---------------------------------------------------------------------------------------------
# the front ends reach Builder.emit only through the emit layer


FRONT_ENDS = ("isa", "language", "nki", "trace")
EMIT_LAYER = {os.path.join("trace", "instructions.py"), os.path.join("trace", "builder.py")}


def _sources(folders):
    for folder in folders:
        for root, _, files in os.walk(os.path.join(PKG, folder)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    yield os.path.relpath(path, PKG), ast.parse(open(path).read(), path)


def test_front_ends_emit_only_through_the_emit_layer():
    direct = []
    users = set()
    for rel, tree in _sources(FRONT_ENDS):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "emit" and rel not in EMIT_LAYER:
                    direct.append(f"{rel}:{node.lineno}")
                if node.func.attr.startswith("emit_"):
                    users.add(rel.split(os.sep)[0])
    assert direct == [], "call the emit_<prim> functions of nkikit/trace/instructions.py"
    # the scan sees every front end's calls, and the accumulator chains of the emit layer
    # (trace/accumulators.py), which compose emit functions
    assert users == {"isa", "language", "nki", "trace"}


def test_the_emit_layer_imports_no_front_end():
    path = os.path.join(PKG, "trace", "instructions.py")
    tree = ast.parse(open(path).read(), path)
    imported = [
        (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    for name in imported:
        assert name.lstrip(".").split(".")[0] not in ("isa", "language", "nki"), name


def test_accumulator_chains_and_sequence_bounds_trace_the_same_ir_in_both_dialects():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], dtype=np.int32)
    cmd = nisa.reduce_cmd

    @nki.jit
    def k0(x, ids):
        t = load0(x)
        e = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, reduce_op=nl.add, reduce_cmd=cmd.reset_reduce)
        nisa.activation(
            dst=e, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=s, reduce_cmd=cmd.reduce
        )
        b = nl.ndarray((1, 2 * ids.shape[1]), dtype=nl.int32, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=b, segment_ids=load0(ids))
        return store0(s), store0(b)

    @nki1.jit
    def k1(x, ids):
        t = nl1.load(x)
        s = nl1.ndarray((P, 1), dtype=nl1.float32, buffer=nl1.sbuf)
        nisa1.activation(np.exp, t, reduce_op=np.add, reduce_cmd=cmd.reset_reduce)
        nisa1.activation(np.exp, t, reduce_op=np.add, reduce_res=s, reduce_cmd=cmd.reduce)
        b = nisa1.sequence_bounds(segment_ids=nl1.load(ids))
        out = nl1.ndarray((P, 1), dtype=nl1.float32, buffer=nl1.shared_hbm)
        bounds = nl1.ndarray(b.shape, dtype=nl1.int32, buffer=nl1.shared_hbm)
        nl1.store(out, value=s)
        nl1.store(bounds, value=b)
        return out, bounds

    assert _ops(k0.ir(X, ids)) == _ops(k1.ir(X, ids))
    (s0, b0), (s1, b1) = k0(X, ids), k1(X, ids)
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_allclose(s0[:, 0], 2 * np.exp(X).sum(1), rtol=1e-5)
    np.testing.assert_array_equal(b0, b1)
    np.testing.assert_array_equal(b1[0, 9:], [-1, 3, 3, 6, 6, 6, -1, 9, 9])


def test_an_assigned_activation_reduce_writes_its_target_directly():
    # the accumulator read-out follows the activation, which still writes t itself
    @nki1.jit
    def k(x):
        t = nl1.ndarray((P, F), dtype=nl1.float32, buffer=nl1.sbuf)
        s = nl1.ndarray((P, 1), dtype=nl1.float32, buffer=nl1.sbuf)
        t[...] = nisa1.activation_reduce(
            op=np.exp, data=nl1.load(x), reduce_op=np.add, reduce_res=s
        )
        out = nl1.ndarray((P, F), dtype=nl1.float32, buffer=nl1.shared_hbm)
        total = nl1.ndarray((P, 1), dtype=nl1.float32, buffer=nl1.shared_hbm)
        nl1.store(out, value=t)
        nl1.store(total, value=s)
        return out, total

    ops = [(op.prim, [o.shape for o in op.outs]) for op, _ in k.ir(X).ops()]
    assert ops.count(("tensor_copy", [(P, 1)])) == 1  # the read-out, no copy of the tile
    assert [p for p, _ in ops].count("tensor_copy") == 1
    out, total = k(X)
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)
    np.testing.assert_allclose(total[:, 0], np.exp(X).sum(1), rtol=1e-5)
