"""Differential tests: the fast simulator (nkikit.sim.fast) against the reference interpreter.

Every kernel here runs on both, and the outputs (and any argument the kernel writes) must be
bit-identical: same dtype, same shape, ``np.array_equal(..., equal_nan=True)`` on the exact
values.  Errors must match too: same NKI error name when the reference raises.

Kernels come from four places: the benchmark kernels, the kernel library's manifests
(``kernels/*/kernel.toml`` examples), kernels written here in the style of the NKI tutorials,
and a hypothesis strategy that builds random legal kernels (elementwise, scalar, activation,
reduction, matmul, transpose, select and copy instructions; affine/sequential loops, SPMD
grids, inner loops over column chunks, masks on ragged tiles; fp32/bf16/fp16).
"""

from __future__ import annotations

import importlib
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nkikit as nki
import nkikit.isa as nisa
import nkikit.language as nl
import nkikit.sim.interp as interp
import nkikit.typing as nt
from nkikit import dtypes
from nkikit.errors import NkiError
from nkikit.sim import fast

ROOT = Path(__file__).resolve().parents[2]
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": BF16, "float16": np.dtype(np.float16)}
REFERENCE = interp.simulate


# ---------------------------------------------------------------------------------------------
# the comparison


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "iub":
        return np.array_equal(a, b)
    return np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True)


def run_both(kernel, args: list[np.ndarray]) -> list[np.ndarray]:
    """Run the IR on both simulators (each on its own copy of ``args``); assert identical
    outputs, identical argument write-back and identical errors.  ``args`` ends up as the
    reference left it, so this can stand in for ``simulate``."""
    fast_args = [a.copy() for a in args]
    ref_err = fast_err = None
    try:
        ref = REFERENCE(kernel, args)
    except NkiError as e:
        ref_err = e
    try:
        got = fast.simulate(kernel, fast_args)
    except NkiError as e:
        fast_err = e
    if ref_err is not None or fast_err is not None:
        assert ref_err is not None and fast_err is not None, (
            f"{kernel.name}: reference raised {ref_err!r}, fast raised {fast_err!r}"
        )
        assert ref_err.name == fast_err.name, (ref_err, fast_err)
        raise ref_err
    assert len(ref) == len(got)
    for i, (r, g) in enumerate(zip(ref, got)):
        assert _same(r, g), f"{kernel.name}: output {i} differs ({_diff(r, g)})"
    for i, (a, b) in enumerate(zip(args, fast_args)):
        assert _same(a, b), f"{kernel.name}: argument {i} written differently"
    return ref


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    bad = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    idx = tuple(int(i[0]) for i in np.nonzero(bad))
    return f"{int(bad.sum())} elements, first at {idx}: {x[idx]} vs {y[idx]}"


@pytest.fixture
def differential(monkeypatch):
    """Route every ``@nki.jit`` call to ``run_both``."""
    import nkikit.sim as sim_pkg

    monkeypatch.setattr(interp, "simulate", lambda k, a, **kw: run_both(k, a))
    if hasattr(sim_pkg, "simulate"):
        monkeypatch.setattr(sim_pkg, "simulate", lambda k, a, **kw: run_both(k, a))
    return run_both


def _rand(rng: np.random.Generator, shape, dt: np.dtype, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dt)


# ---------------------------------------------------------------------------------------------
# benchmark kernels


def _bench():
    from benchmarks.sim import kernels as K

    return K


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [128, 300])
def test_benchmark_norm_kernels(differential, dt, rows):
    K = _bench()
    rng = np.random.default_rng(rows)
    d = DTYPES[dt]
    x, w, b = _rand(rng, (rows, 640), d), _rand(rng, 640, d), _rand(rng, 640, d)
    K.rmsnorm_kernel(x, w, 1e-6)
    K.softmax_kernel(x)
    K.layernorm_kernel(x, w, b, 1e-5)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_benchmark_matmul_and_attention(differential, dt):
    K = _bench()
    rng = np.random.default_rng(1)
    d = DTYPES[dt]
    K.matmul_kernel(_rand(rng, (256, 256), d), _rand(rng, (256, 1024), d))
    q, k, v = (_rand(rng, (2, 512, 64), d) for _ in range(3))
    K.attention_kernel(q, k, v)


# ---------------------------------------------------------------------------------------------
# the kernel library, from its manifests


def _library_functions():
    out = []
    for toml_path in sorted((ROOT / "kernels").glob("*/kernel.toml")):
        manifest = tomllib.loads(toml_path.read_text())
        for fname, spec in manifest.get("functions", {}).items():
            for dt in spec.get("dtypes", ["float32"]):
                out.append(
                    pytest.param(
                        toml_path.parent.name,
                        fname,
                        spec,
                        dt,
                        id=f"{toml_path.parent.name}.{fname}-{dt}",
                    )
                )
    return out


@pytest.mark.parametrize("package, fname, spec, dt", _library_functions())
def test_library_kernels(differential, package, fname, spec, dt):
    mod_name, attr = spec["entry"].split(":")
    mod = importlib.import_module(f"nkikit.library.{package}.{mod_name}")
    fn = getattr(mod, attr)
    rng = np.random.default_rng(7)
    d = dtypes.as_dtype(dt)
    example = spec.get("example", {})
    inputs = [_rand(rng, tuple(example[name]), d) for name in spec["inputs"]]
    fn(*inputs, **spec.get("attrs", {}))
    # a ragged variant: one more row than the example, where the first dim is free
    shape0 = tuple(example[spec["inputs"][0]])
    if len(shape0) >= 2 and package in ("rmsnorm", "layernorm", "softmax", "tensor_add"):
        ragged = [
            _rand(rng, (shape0[0] + 1,) + tuple(example[n])[1:], d)
            if len(example[n]) == len(shape0)
            else _rand(rng, tuple(example[n]), d)
            for n in spec["inputs"]
        ]
        fn(*ragged, **spec.get("attrs", {}))


# ---------------------------------------------------------------------------------------------
# tutorial-style kernels (written for these tests; the same idioms as the NKI tutorials)


@nki.jit
def add_spmd(a, b):
    """Tensor add over a 2-D launch grid of 128 x 512 tiles."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i0 = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    i1 = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    nl.store(out[i0, i1], nl.add(nl.load(a[i0, i1]), nl.load(b[i0, i1])))
    return out


@nki.jit
def transpose_blocks(x, bx: int, by: int):
    """(P, bx*by) -> (P, by*bx): swap two free axes with an index permutation."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
    ip = nl.arange(x.shape[0])[:, None, None]
    t = nl.load(x)
    y = nl.ndarray((x.shape[0], by, bx), dtype=x.dtype)
    for i in nl.affine_range(bx):
        for j in nl.affine_range(by):
            y[ip, j, i] = nl.copy(t[ip, i * by + j])
    nl.store(out.reshape((x.shape[0], by, bx)), y)
    return out


@nki.jit
def avgpool(x, k: int):
    """2-D average pooling with a k x k window (channels on partitions)."""
    c, h, w = x.shape
    out = nl.ndarray((c, h // k, w // k), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    ic = nl.arange(c)[:, None, None, None, None]
    ih = nl.arange(h // k)[None, :, None, None, None]
    iw = nl.arange(w // k)[None, None, :, None, None]
    ikh = nl.arange(k)[None, None, None, :, None]
    ikw = nl.arange(k)[None, None, None, None, :]
    s = nl.sum(t[ic, ih * k + ikh, iw * k + ikw], axis=[3, 4])
    nl.store(out, nl.multiply(s, 1.0 / (k * k), dtype=x.dtype))
    return out


@nki.jit
def matmul_tiled(lhs_t, rhs):
    """lhs_t.T @ rhs with tiles loaded inside the K loop (as in the tiled tutorial)."""
    k_dim, m_dim = lhs_t.shape
    n_dim = rhs.shape[1]
    out = nl.ndarray((m_dim, n_dim), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // 128):
        for n in nl.affine_range(n_dim // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // 128):
                a = nl.load(lhs_t[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
                b = nl.load(rhs[k * 128 : (k + 1) * 128, n * 512 : (n + 1) * 512])
                acc += nl.matmul(a, b, transpose_x=True)
            nl.store(
                out[m * 128 : (m + 1) * 128, n * 512 : (n + 1) * 512], nl.copy(acc, dtype=out.dtype)
            )
    return out


@nki.jit
def matmul_untransposed(lhs, rhs):
    """lhs @ rhs with lhs given as [M, K]: nl.matmul transposes on the TensorE."""
    out = nl.ndarray((lhs.shape[0], rhs.shape[1]), dtype=lhs.dtype, buffer=nl.shared_hbm)
    acc = nl.matmul(nl.load(lhs), nl.load(rhs))
    nl.store(out, nl.copy(acc, dtype=out.dtype))
    return out


@nki.jit
def attention_small(q, k, v, causal: bool):
    """Single-head attention with d <= 128 and seq <= 512, transposed loads and a causal mask."""
    seq, d = q.shape
    out = nl.ndarray((seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    k_t = nl.load_transpose2d(k)
    ip, i_d, iseq = nl.arange(128)[:, None], nl.arange(d)[None, :], nl.arange(seq)[None, :]
    v_t = nl.ndarray((seq // 128, nl.par_dim(128), d), dtype=v.dtype)
    for j in nl.affine_range(seq // 128):
        v_t[j, ip, i_d] = nl.load(v[j * 128 + ip, i_d])
    for i in nl.affine_range(seq // 128):
        q_t = nl.load_transpose2d(q[i * 128 + ip, i_d])
        s = nisa.nc_matmul(q_t, k_t)
        if causal:
            s2 = nisa.affine_select(
                pred=(i * 128 + ip - iseq >= 0), on_true_tile=s, on_false_value=-9984.0
            )
        else:
            s2 = nl.copy(s)
        p = nl.softmax(nl.multiply(s2, 1.0 / math.sqrt(d)), axis=1)
        acc = nl.zeros((128, d), nl.float32, buffer=nl.psum)
        for j in nl.affine_range(seq // 128):
            pt = nl.copy(nisa.nc_transpose(p[ip, j * 128 + nl.arange(128)[None, :]]), dtype=q.dtype)
            acc += nisa.nc_matmul(pt, v_t[j, ip, i_d])
        nl.store(out[i * 128 + ip, i_d], nl.copy(acc, dtype=q.dtype))
    return out


@nki.jit
def layernorm_bn(x, g, b):
    """LayerNorm with bn_stats/bn_aggr per 512-wide chunk, ragged rows masked."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    ip, iy = nl.arange(128)[:, None], nl.arange(d)[None, :]
    gt = nl.load(g.reshape((1, d))).broadcast_to((128, d))
    bt = nl.load(b.reshape((1, d))).broadcast_to((128, d))
    chunks = math.ceil(d / 512)
    for i in nl.affine_range(math.ceil(n / 128)):
        rows = i * 128 + ip
        t = nl.load(x[rows, iy], mask=(rows < n))
        stats = nl.ndarray((128, 6 * chunks), dtype=nl.float32)
        for c in nl.affine_range(chunks):
            stats[ip, c * 6 + nl.arange(6)[None, :]] = nisa.bn_stats(
                t[ip, c * 512 + nl.arange(512)[None, :]],
                mask=(c * 512 + nl.arange(512)[None, :] < d),
            )
        mv = nisa.bn_aggr(stats)
        y = nisa.tensor_scalar(
            t, np.subtract, mv[ip, 0], op1=np.multiply, operand1=nl.rsqrt(mv[ip, 1] + 1e-5)
        )
        nl.store(out[rows, iy], y * gt + bt, mask=(rows < n))
    return out


@nki.jit
def scan_rows(a, b):
    """A sequential running recurrence h = a * h + b along the free axis, in chunks."""
    n, f = a.shape
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(n)[:, None]
    h = nl.zeros((n, 1), nl.float32)
    for c in nl.sequential_range(f // 64):
        ic = c * 64 + nl.arange(64)[None, :]
        ta, tb = nl.load(a[ip, ic]), nl.load(b[ip, ic])
        y = nisa.tensor_tensor_scan(ta, tb, h, np.multiply, np.add)
        h[...] = nl.copy(y[ip, 63])
        nl.store(out[ip, ic], y)
    return out


@nki.jit
def oob_read(x):
    """Reads one tile past the end: both simulators must raise the same bounds error."""
    out = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(x[i * 128 + nl.arange(128)[:, None], nl.arange(64)[None, :]])
        nl.store(out, t)
    return out


@nki.jit
def read_uninitialized(x):
    """Half of a tile is never written: the poison (NaN) must show in both."""
    out = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), dtype=x.dtype)
    t[:, 0:32] = nl.load(x[:, 0:32])
    nl.store(out, nl.exp(t))
    return out


@nki.jit
def scale_in_place(t: nt.mutable_tensor, acc: nt.mutable_tensor):
    """Mutable parameters: t *= 2 tile by tile (ragged rows masked), acc += row sums."""
    n, f = t.shape
    ip, iy = nl.arange(128)[:, None], nl.arange(f)[None, :]
    for i in nl.affine_range(math.ceil(n / 128)):
        rows = i * 128 + ip
        x = nl.load(t[rows, iy], mask=(rows < n))
        nl.store(t[rows, iy], nl.multiply(x, 2.0), mask=(rows < n))
        a = nl.load(acc[rows, nl.arange(1)[None, :]], mask=(rows < n))
        nl.store(
            acc[rows, nl.arange(1)[None, :]],
            nl.add(a, nl.sum(x, axis=1, keepdims=True)),
            mask=(rows < n),
        )


@nki.jit
def dtype_zoo(x):
    """Round through tf32, fp8, fp16, int32, uint8 and bool tiles and back to fp32."""
    out = nl.ndarray((128, 64, 6), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    results = []
    for dt in (nl.tfloat32, nl.float8_e4m3, nl.float8_e5m2, nl.float16, nl.int32, nl.uint8):
        y = nl.multiply(t, 3.7, dtype=dt)
        z = nl.add(y, y, dtype=dt)
        results.append(nl.copy(z, dtype=nl.float32))
        nl.store(out[:, :, len(results) - 1], results[-1])
    return out


@nki.jit
def prim_zoo(x, idx):
    """One of (nearly) every instruction, including the ones the fast path leaves to the
    reference interpreter; ``idx`` is a uint16 (128, 4) index tile for local_gather."""
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    small = nl.ndarray((p, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    ip, iy = nl.arange(p)[:, None], nl.arange(f)[None, :]
    t = nl.load(x)
    io = nisa.iota(ip * 3 + iy, dtype=nl.float32)
    sel = nl.where(nl.greater(t, 0.0), t, io)
    rs = nl.ndarray((p, 1), dtype=nl.float32)
    r = nisa.range_select(
        on_true_tile=sel,
        comp_op0=np.greater_equal,
        comp_op1=np.less,
        bound0=2.0,
        bound1=float(f - 3),
        reduce_res=rs,
        reduce_op=np.max,
        range_start=0,
    )
    sr = nl.ndarray((p, 1), dtype=nl.float32)
    s2 = nisa.select_reduce(
        predicate=nl.less(t, 0.5), on_true=r, on_false=-1.0, reduce_res=sr, reduce_op=np.max
    )
    m8 = nisa.max8(src=s2)
    i8 = nisa.nc_find_index8(data=s2, vals=m8)
    rep = nisa.nc_match_replace8(data=s2, vals=m8, imm=-5.0)
    pr = nisa.tensor_partition_reduce(np.add, rep)
    drop = nisa.dropout(rep, 0.25)
    shuf = nl.zeros((p, f), nl.float32)
    nisa.nc_stream_shuffle(src=drop, dst=shuf, shuffle_mask=[(i * 7) % 32 for i in range(32)])
    g = nisa.local_gather(shuf, nl.load(idx), num_elem_per_idx=16)
    bc = nl.broadcast_to(pr, (p, f))
    acc = nl.add(nl.add(shuf, bc), nl.copy(i8[ip, 0], dtype=nl.float32))
    sm = nl.softmax(acc, axis=1)
    mv = nl.add(nl.mean(sm, axis=1, keepdims=True), nl.var(sm, axis=1, keepdims=True))
    y = nisa.tensor_scalar(sm, np.multiply, mv, op1=np.add, operand1=nl.add(rs, sr))
    y2 = nl.rms_norm(y, nl.load(x[0:1, :]), axis=1)
    nl.store(out, y2)
    nl.store(small, nl.copy(g[ip, nl.arange(64)[None, :]], dtype=nl.float32))
    # a read-modify-write DMA into an output written just before
    nisa.dma_copy(
        dst=out[:, 0:64],
        src=nl.copy(g[ip, nl.arange(64)[None, :]], dtype=nl.float32),
        dst_rmw_op=np.add,
    )
    return out, small


@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16"])
def test_tutorial_style_kernels(differential, dt):
    rng = np.random.default_rng(3)
    d = DTYPES[dt]
    add_spmd[2, 2](_rand(rng, (256, 1024), d), _rand(rng, (256, 1024), d))
    transpose_blocks(_rand(rng, (5, 12), d), 3, 4)
    avgpool(_rand(rng, (3, 8, 8), d), 2)
    matmul_tiled(_rand(rng, (256, 256), d), _rand(rng, (256, 1024), d))
    matmul_untransposed(_rand(rng, (64, 128), d), _rand(rng, (128, 256), d))
    for causal in (False, True):
        attention_small(
            _rand(rng, (256, 64), d), _rand(rng, (256, 64), d), _rand(rng, (256, 64), d), causal
        )
    layernorm_bn(_rand(rng, (200, 700), d), _rand(rng, 700, d), _rand(rng, 700, d))
    scan_rows(_rand(rng, (64, 256), d, 0.5), _rand(rng, (64, 256), d))
    read_uninitialized(_rand(rng, (128, 64), d))
    dtype_zoo(_rand(rng, (128, 64), d, 40.0))
    t, acc = _rand(rng, (200, 96), d), _rand(rng, (200, 1), d)
    t0 = t.copy()
    scale_in_place(t, acc)
    assert _same(t, (t0.astype(np.float32) * 2).astype(d))  # written back to the caller
    idx = rng.integers(0, 128 - 16, size=(128, 4)).astype(np.uint16)  # element offsets in a row
    prim_zoo(_rand(rng, (128, 128), d), idx)


def test_errors_match(differential):
    with pytest.raises(NkiError) as e:
        oob_read(np.zeros((200, 64), np.float32))
    assert e.value.name == "err_tensor_access_out_of_bound"


def test_cached_program_is_reused():
    x = np.ones((128, 64), np.float32)
    kern, _ = read_uninitialized.specialize(x)
    assert fast.compile_kernel(kern) is fast.compile_kernel(kern)
    assert "def _kernel" in fast.explain(kern)


def test_written_params():
    import nkikit.sim as sim

    x = np.ones((128, 64), np.float32)
    assert sim.written_params(read_uninitialized.specialize(x)[0]) == frozenset()

    @nki.jit
    def bump(t: nt.mutable_tensor):
        nl.store(t, nl.add(nl.load(t), 1.0))

    k = bump.specialize(x)[0]
    assert sim.written_params(k) == frozenset({"t"})
    assert fast.compile_kernel(k).written_params == frozenset({"t"})


def test_env_switch(monkeypatch):
    import nkikit.sim as sim

    kern, _ = read_uninitialized.specialize(np.ones((128, 64), np.float32))
    for mode in ("reference", "fast"):
        monkeypatch.setenv("NKIKIT_SIM", mode)
        out = sim.simulate(kern, [np.ones((128, 64), np.float32)])
        assert np.isnan(out[0][:, 32:]).all()
    monkeypatch.setenv("NKIKIT_SIM", "check")
    out = sim.simulate(kern, [np.ones((128, 64), np.float32)])
    assert np.isnan(out[0][:, 32:]).all() and np.allclose(out[0][:, :32], np.e)
    monkeypatch.setenv("NKIKIT_SIM", "bogus")
    with pytest.raises(ValueError, match="NKIKIT_SIM"):
        sim.simulate(kern, [np.ones((128, 64), np.float32)])


# ---------------------------------------------------------------------------------------------
# indirect DMA: gathers and scatters by a runtime index tile


@nki.jit
def ind_gather(data, idx, n):
    """Gather rows by an index tile (load-forwarded: a view of the HBM indices), masked to
    the first ``n`` partitions, cast on the way in; then a second, unmasked gather by an
    iota index tile through a view with a loop-dependent start."""
    out = nl.ndarray((128, data.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    out2 = nl.ndarray((2, 64, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    it = nl.load(idx[i_p], mask=(i_p < n))
    rows = nl.load(data[it, i_f], mask=(i_p < n), dtype=nl.float32)
    nl.store(out[i_p, i_f], value=rows, mask=(i_p < n))
    ev = nisa.iota(2 * nl.arange(64)[:, None], dtype=nl.uint32)
    for t in nl.affine_range(2):
        view = data[t : t + 100, 0 : data.shape[1]]
        nl.store(out2[t], value=nl.load(view[ev, i_f]))
    return out, out2


@nki.jit
def ind_scatter(src, idx):
    """Scatter rows (duplicates: the last partition wins), then scatter-add with atomic_rmw
    (duplicates accumulate, rounded once per update)."""
    out = nl.ndarray((40, src.shape[1]), dtype=src.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((40, src.shape[1]), dtype=src.dtype, buffer=nl.shared_hbm)
    zero = nl.zeros((40, src.shape[1]), dtype=src.dtype)
    nl.store(out, value=zero)
    nl.store(acc, value=zero)
    i_p = nl.arange(src.shape[0])[:, None]
    i_f = nl.arange(src.shape[1])[None, :]
    it = nl.load(idx[i_p])
    x = nl.load(src)
    nl.store(out[it, i_f], value=x)
    nl.atomic_rmw(acc[it, i_f], value=x, op=np.add)
    nl.atomic_rmw(acc[it, i_f], value=1.0, op=np.add)
    return out, acc


@nki.jit
def ind_oob(data, idx):
    out = nl.ndarray((16, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(16)[:, None]
    it = nl.load(idx[i_p])
    nl.store(out, value=nl.load(data[it, nl.arange(data.shape[1])[None, :]]))
    return out


@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16"])
def test_indirect_dma_kernels(differential, dt):
    rng = np.random.default_rng(5)
    d = DTYPES[dt]
    data = _rand(rng, (200, 48), d)
    idx = np.full(128, 2**31 - 1, np.int32)  # masked-off partitions hold junk indices
    idx[:90] = rng.integers(0, 200, 90)
    out, out2 = ind_gather(data, idx, 90)
    assert _same(out[:90], data[idx[:90]].astype(np.float32))
    assert _same(out2[1], data[1 : 1 + 128 : 2])
    src = _rand(rng, (64, 24), d)
    dup = rng.integers(0, 40, 64).astype(np.int32)
    out, acc = ind_scatter(src, dup)
    last = {int(r): p for p, r in enumerate(dup)}
    for r, p in last.items():
        assert _same(out[r], src[p])


def test_indirect_dma_is_compiled_by_the_fast_path():
    rng = np.random.default_rng(6)
    data = _rand(rng, (200, 48), np.dtype(np.float32))
    k, _ = ind_gather.specialize(data, np.zeros(128, np.int32), 128)
    src = fast.explain(k)
    # both gathers: no mask left, so compiled -- one runtime row per partition and the rest
    # slices, so as row copies (numpy's row-array indexing), not an element-wise fancy index
    assert src.count(".astype(np.int64) + (") == 2 and "_ind(" not in src
    k, _ = ind_scatter.specialize(
        _rand(rng, (64, 24), np.dtype(np.float32)), np.zeros(64, np.int32)
    )
    src = fast.explain(k)
    # rows are assigned; of partitions with one row index only the last one writes
    assert "K = _last_rows(R)" in src


def test_indirect_out_of_bounds_errors_match(differential):
    data = np.zeros((50, 8), np.float32)
    idx = np.arange(16, dtype=np.int32)
    idx[7] = 50
    with pytest.raises(NkiError) as e:
        ind_oob(data, idx)
    assert e.value.name == "err_tensor_access_out_of_bound"
    assert "partition 7" in str(e.value)
    idx[7] = -1
    with pytest.raises(NkiError) as e:
        ind_oob(data, idx)
    assert "index -1" in str(e.value) or "reaches index -1" in str(e.value)


# ---------------------------------------------------------------------------------------------
# random legal kernels


@dataclass(frozen=True)
class Spec:
    """A random kernel: row tiles of 128 over an (n, f) input, a body of ops on a pool of
    (128, f) tiles and (128, 1) columns, stored at the end.  Hashable: it is a constexpr
    argument of the jitted kernel."""

    n: int
    f: int
    loop: str  # "affine" | "sequential" | "grid"
    masked: bool  # mask loads/stores/compute with rows < n
    ops: tuple
    out_dtype: str


BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "divide"]
UNARY = [
    "exp",
    "tanh",
    "square",
    "abs",
    "negative",
    "sigmoid",
    "relu",
    "gelu",
    "sqrt",
    "sin",
    "log",
]
REDUCE = ["add", "max", "min"]
DT_NAMES = ["float32", "bfloat16", "float16"]


@st.composite
def specs(draw) -> Spec:
    n = draw(st.sampled_from([1, 64, 128, 130, 256, 300]))
    f = draw(st.sampled_from([1, 8, 64, 128, 200, 512]))
    loop = draw(st.sampled_from(["affine", "sequential", "grid"]))
    masked = draw(st.booleans()) or n % 128 != 0 and loop == "grid"
    n_tiles, n_cols = 2, 0
    ops = []
    for _ in range(draw(st.integers(1, 7))):
        dt = draw(st.sampled_from(DT_NAMES))
        kinds = [
            "binary",
            "scalar",
            "unary",
            "act",
            "reduce",
            "copy",
            "select",
            "chunked",
            "accumulate",
            "dropout",
        ]
        if n_cols:
            kinds += ["ts", "act_bias"]
        if f <= 512:
            kinds.append("matmul")
        if f == 128:
            kinds.append("transpose")
        kind = draw(st.sampled_from(kinds))
        a = draw(st.integers(0, n_tiles - 1))
        if kind == "binary":
            ops.append(
                (kind, draw(st.sampled_from(BINARY)), a, draw(st.integers(0, n_tiles - 1)), dt)
            )
        elif kind == "scalar":
            ops.append(
                (
                    kind,
                    draw(st.sampled_from(BINARY)),
                    a,
                    draw(st.sampled_from([0.5, -2.0, 3.0])),
                    draw(st.booleans()),
                    dt,
                )
            )
        elif kind == "unary":
            ops.append((kind, draw(st.sampled_from(UNARY)), a, dt))
        elif kind == "act":
            ops.append(
                (
                    kind,
                    draw(st.sampled_from(["exp", "tanh", "square", "silu", "copy"])),
                    a,
                    draw(st.sampled_from([1.0, 0.5])),
                    draw(st.booleans()),
                    dt,
                )
            )
        elif kind == "act_bias":
            ops.append(
                (
                    kind,
                    draw(st.sampled_from(["exp", "tanh", "square"])),
                    a,
                    draw(st.integers(0, n_cols - 1)),
                    dt,
                )
            )
        elif kind == "ts":
            ops.append(
                (
                    kind,
                    draw(st.sampled_from(BINARY)),
                    draw(st.sampled_from(BINARY[:3])),
                    a,
                    draw(st.integers(0, n_cols - 1)),
                    dt,
                )
            )
        elif kind == "reduce":
            ops.append((kind, draw(st.sampled_from(REDUCE)), a, draw(st.booleans())))
            n_cols += 1
            continue
        elif kind == "copy":
            ops.append((kind, a, dt))
        elif kind == "select":
            ops.append((kind, a, draw(st.integers(-3, 3))))
        elif kind == "chunked":
            ops.append(
                (kind, draw(st.sampled_from(BINARY[:3])), a, draw(st.sampled_from([1, 2, 4])), dt)
            )
        elif kind == "accumulate":
            ops.append((kind, a))
        elif kind == "dropout":  # seeded by the loop iteration: the env must match
            ops.append((kind, a, dt))
        elif kind == "matmul":
            ops.append((kind, a, dt))
        elif kind == "transpose":
            ops.append((kind, a, dt))
        n_tiles += 1
    return Spec(n, f, loop, masked, tuple(ops), draw(st.sampled_from(DT_NAMES)))


@nki.jit
def random_kernel(x, y, w, spec: Spec):
    n, f = x.shape
    out = nl.ndarray((n, f), dtype=DTYPES[spec.out_dtype], buffer=nl.shared_hbm)
    red = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    acc_out = nl.ndarray((128, f), dtype=nl.float32, buffer=nl.shared_hbm)
    ip, iy = nl.arange(128)[:, None], nl.arange(f)[None, :]
    w_tile = nl.load(w)  # (128, 128) stationary operand for matmuls
    acc = nl.zeros((128, f), nl.float32)
    tiles_n = math.ceil(n / 128)

    def body(i):
        rows = i * 128 + ip
        mask = (rows < n) if spec.masked or n % 128 else None
        tiles = [nl.load(x[rows, iy], mask=mask), nl.load(y[rows, iy], mask=mask)]
        cols = []
        cmask = mask if spec.masked else None
        for op in spec.ops:
            kind = op[0]
            if kind == "binary":
                _, name, a, b, dt = op
                tiles.append(getattr(nl, name)(tiles[a], tiles[b], dtype=DTYPES[dt], mask=cmask))
            elif kind == "scalar":
                _, name, a, c, rev, dt = op
                fn = getattr(nl, name)
                tiles.append(
                    fn(c, tiles[a], dtype=DTYPES[dt])
                    if rev
                    else fn(tiles[a], c, dtype=DTYPES[dt], mask=cmask)
                )
            elif kind == "unary":
                _, name, a, dt = op
                tiles.append(getattr(nl, name)(tiles[a], dtype=DTYPES[dt], mask=cmask))
            elif kind == "act":
                _, name, a, scale, with_red, dt = op
                if with_red:
                    r = nl.ndarray((128, 1), dtype=nl.float32)
                    tiles.append(
                        nisa.activation_reduce(
                            op=getattr(nl, name),
                            data=tiles[a],
                            reduce_op=nl.add,
                            reduce_res=r,
                            scale=scale,
                            dtype=DTYPES[dt],
                        )
                    )
                    cols.append(r)
                else:
                    tiles.append(
                        nisa.activation(
                            op=getattr(nl, name),
                            data=tiles[a],
                            scale=scale,
                            dtype=DTYPES[dt],
                            mask=cmask,
                        )
                    )
            elif kind == "act_bias":
                _, name, a, c, dt = op
                tiles.append(
                    nisa.activation(
                        op=getattr(nl, name),
                        data=tiles[a],
                        bias=cols[c],
                        scale=0.25,
                        dtype=DTYPES[dt],
                    )
                )
            elif kind == "ts":
                _, op0, op1, a, c, dt = op
                tiles.append(
                    nisa.tensor_scalar(
                        tiles[a],
                        getattr(np, op0),
                        cols[c],
                        op1=getattr(np, op1),
                        operand1=1.5,
                        dtype=DTYPES[dt],
                        mask=cmask,
                    )
                )
            elif kind == "reduce":
                _, name, a, neg = op
                cols.append(
                    nisa.tensor_reduce(
                        getattr(np, name),
                        tiles[a],
                        axis=1,
                        negate=neg,
                        keepdims=True,
                        dtype=nl.float32,
                        mask=cmask,
                    )
                )
            elif kind == "copy":
                _, a, dt = op
                tiles.append(nl.copy(tiles[a], dtype=DTYPES[dt]))
            elif kind == "select":
                _, a, shift = op
                tiles.append(
                    nisa.affine_select(
                        pred=(i * 128 + ip - iy + shift >= 0),
                        on_true_tile=tiles[a],
                        on_false_value=-7.0,
                        dtype=nl.float32,
                    )
                )
            elif kind == "chunked":
                _, name, a, parts, dt = op
                t = nl.ndarray((128, f), dtype=DTYPES[dt])
                if f % parts == 0:
                    c = f // parts
                    ic = nl.arange(c)[None, :]
                    for j in nl.affine_range(parts):
                        t[ip, j * c + ic] = getattr(nl, name)(
                            tiles[a][ip, j * c + ic], tiles[0][ip, j * c + ic]
                        )
                else:  # a ragged last chunk: the mask leaves part of t unwritten (poison)
                    c = math.ceil(f / parts)
                    ic = nl.arange(c)[None, :]
                    for j in nl.affine_range(parts):
                        t[ip, j * c + ic] = getattr(nl, name)(
                            tiles[a][ip, j * c + ic], 2.0, mask=(j * c + ic < f)
                        )
                tiles.append(t)
            elif kind == "dropout":
                _, a, dt = op
                tiles.append(nisa.dropout(tiles[a], 0.3, dtype=DTYPES[dt]))
            elif kind == "accumulate":
                _, a = op
                acc[...] += tiles[a]
                tiles.append(nl.copy(acc))
            elif kind == "matmul":
                _, a, dt = op
                mv = tiles[a]
                ps = nisa.nc_matmul(
                    w_tile if mv.dtype == w_tile.dtype else nl.copy(w_tile, dtype=mv.dtype), mv
                )
                tiles.append(nl.copy(ps, dtype=DTYPES[dt]))
            elif kind == "transpose":
                _, a, dt = op
                tiles.append(nl.copy(nisa.nc_transpose(tiles[a]), dtype=DTYPES[dt]))
        nl.store(out[rows, iy], tiles[-1], mask=mask)
        if cols:
            nl.store(red[rows, nl.arange(1)[None, :]], cols[-1], mask=mask)
        else:
            nl.store(red[rows, nl.arange(1)[None, :]], nl.zeros((128, 1), nl.float32), mask=mask)

    if spec.loop == "grid":
        body(nl.program_id(0))
        return out, red  # acc_out would be written by every program: not a legal output
    rng = nl.affine_range if spec.loop == "affine" else nl.sequential_range
    for i in rng(tiles_n):
        body(i)
    nl.store(acc_out, acc)
    return out, red, acc_out


@given(spec=specs(), in_dtype=st.sampled_from(DT_NAMES), seed=st.integers(0, 2**16))
@settings(deadline=None)
def test_random_kernels(spec, in_dtype, seed):
    rng = np.random.default_rng(seed)
    d = DTYPES[in_dtype]
    x = _rand(rng, (spec.n, spec.f), d)
    y = _rand(rng, (spec.n, spec.f), d)
    w = _rand(rng, (128, 128), d, 0.1)
    jk = random_kernel[math.ceil(spec.n / 128)] if spec.loop == "grid" else random_kernel
    try:
        kernel, _ = jk.specialize(x, y, w, spec)
    except NkiError:
        return  # a spec the verifier rejects is not a legal kernel
    run_both(kernel, [x, y, w])
