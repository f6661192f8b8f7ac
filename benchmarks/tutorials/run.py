"""Run AWS's NKI Beta-1 tutorials on nkikit, imports changed only.

The tutorials are not part of this repository.  Bring a copy of the ``src/nki_samples/tutorials``
folder of ``aws-neuron/nki-samples`` at commit ``fc5c69f`` (the last Beta-1 version), e.g.::

    git -C nki-samples archive fc5c69f src/nki_samples/tutorials | tar -x -C /tmp/nki
    python -m benchmarks.tutorials /tmp/nki/src/nki_samples/tutorials [--only attn] [--no-profile]

The runner copies every ``.py`` file of that folder to a temporary directory and rewrites its
imports only (:func:`rewrite_imports`): ``neuronxcc.nki`` becomes ``nkikit`` (``nki.language``
-> ``nkikit.language`` and so on), and imports of device-only or absent packages
(``torch_xla``, ``torch_neuronx``, ``loguru``, ``transformers``) are commented out -- the cases
below never call the code that uses them.  Each :class:`Case` then imports the rewritten module,
calls the tutorial's kernel at the tutorial's own shapes and dtypes (from its ``__main__`` block,
its ``*_torch.py`` driver or its test file) on the simulator, compares the result with a numpy
or torch reference of the same math (written here, or the tutorial's own numpy reference where it
has one), and profiles the same call on the cost model (``nki.profile_kernel``, trn2) -- for the
attention tutorial with the bfloat16 inputs its test profiles and benchmarks with.  It
prints one line per case -- pass/fail, the modeled time, the first line of the error -- and the
number of cases passing.  Exit status 0 when every case passes.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

TARGET = "trn2"
ABSENT = ("torch_xla", "torch_neuronx", "loguru", "transformers")

_IMPORT_RULES = [
    (re.compile(r"^(\s*)from neuronxcc import nki\b"), r"\1import nkikit as nki"),
    (re.compile(r"\bneuronxcc\.nki\b"), "nkikit"),
]


def rewrite_imports(source: str) -> str:
    """The tutorial source with its import lines rewritten for nkikit; other lines untouched."""
    out = []
    for line in source.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped.startswith(("import ", "from ")):
            if any(re.search(rf"\b{m}\b", stripped.split("#")[0]) for m in ABSENT):
                indent = line[: len(line) - len(stripped)]
                # keep the block non-empty where the import was a block's only statement
                line = f"{indent}pass  # nkikit: {stripped}"
            else:
                for pat, rep in _IMPORT_RULES:
                    line = pat.sub(rep, line)
        out.append(line)
    return "".join(out)


def copy_tutorials(src: Path, dst: Path) -> None:
    """Copy every ``.py`` file under ``src`` to ``dst`` with :func:`rewrite_imports`."""
    for f in sorted(src.rglob("*.py")):
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rewrite_imports(f.read_text()))


_modules: dict[Path, Any] = {}


def forget_modules() -> None:
    """Drop the tutorial modules imported so far: the next case imports its file anew, as a
    test process of its own would, so module-level state (the attention tutorial's SBUF bump
    allocator) starts from zero in every case."""
    for path in _modules:
        sys.modules.pop(path.stem, None)
    _modules.clear()


def load(root: Path, relpath: str) -> Any:
    """Import ``root/relpath`` as a module (its folder on ``sys.path`` for sibling imports)."""
    path = root / relpath
    if path in _modules:
        return _modules[path]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    _modules[path] = mod
    return mod


@dataclass
class Case:
    """One tutorial call: ``setup(root)`` returns ``(run, launch, expected, tol)`` where
    ``run()`` calls the tutorial's code on the simulator, ``launch`` is ``(jit kernel, args)``
    for the cost model and ``tol`` is ``(rtol, atol)`` (``None``: exact)."""

    name: str
    setup: Callable[[Path], tuple]


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _to_np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().float().numpy()
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# numpy references (the tutorials' math, written out here)


def ref_layernorm(x, eps, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


def ref_rmsnorm(a, g):
    return a / np.sqrt((a * a).mean(axis=1, keepdims=True)) * g


def ref_softmax_rows(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ref_attention_dT(q, k, v):
    """Attention with q, k, v given as [d_head, seqlen]: softmax(q.T @ k) @ v.T."""
    return ref_softmax_rows(q.T.astype(np.float64) @ k) @ v.T


def ref_mamba(delta, u, A, B, C):
    dA = np.exp(delta[:, :, None, :] * A[None, :, :, None])
    dBu = delta[:, :, None, :] * B[:, None, :, :] * u[:, :, None, :]
    state = np.zeros(dA.shape[:-1], np.float64)
    scan = np.empty(dA.shape, np.float64)
    for t in range(dA.shape[-1]):
        state = dA[..., t] * state + dBu[..., t]
        scan[..., t] = state
    return (C[:, None, :, :] * scan).sum(axis=-2)


def ref_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None] + rot * sin[:, None]


def ref_avgpool(x, p):
    c, h, w = x.shape
    return x.reshape(c, h // p, p, w // p, p).astype(np.float32).mean(axis=(2, 4))


# ---------------------------------------------------------------------------------------------
# the cases


def _tensor_add(rel, fn, dtype, shape, grid, nc2=False):
    def setup(root):
        import nkikit.language as nl

        m = load(root, rel)
        r = _rng()
        a = r.random(shape).astype(np.float32)
        b = r.random(shape).astype(np.float32)
        if dtype == "bf16":
            import torch

            a, b = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
            exp = (a.float() + b.float()).bfloat16().float().numpy()
        else:
            a, b = a.astype(np.float16), b.astype(np.float16)
            exp = (a + b).astype(np.float32)
        k = m.nki_tensor_add_kernel_
        if grid is not None:
            g = grid(shape)
            k = k[nl.spmd_dim(g[0], nl.nc(2)), g[1]] if nc2 else k[g]
        return (lambda: getattr(m, fn)(a, b)), (k, (a, b)), exp, (1e-2, 1e-4)

    return setup


def _transpose2d(root):
    m = load(root, "transpose2d/transpose2d_nki_kernels.py")
    P, X, Y = 5, 3, 4
    a = np.arange(P * X * Y, dtype=np.int8).reshape((P, X * Y))
    exp = np.transpose(a.reshape(P, X, Y), (0, 2, 1)).reshape(P, X * Y)
    k = m.tensor_transpose2D_kernel_
    return (lambda: k(a, (X, Y))), (k, (a, (X, Y))), exp, None


def _avgpool(dtype):
    def setup(root):
        m = load(root, "average_pool2d/average_pool2d_nki_kernels.py")
        C, H, W, p = 2, 6, 6, 2
        x = np.arange(C * H * W, dtype=np.float32).reshape(C, H, W)
        if dtype == "bf16":
            import torch

            x = torch.from_numpy(x).bfloat16()
            exp = torch.nn.functional.avg_pool2d(x.float()[None], p, p)[0].bfloat16().float()
            exp = exp.numpy()
        else:
            x = x.astype(np.float16)
            exp = ref_avgpool(x, p).astype(np.float16).astype(np.float32)
        k = m.tensor_avgpool_kernel
        return (lambda: k(x, p)), (k, (x, p)), exp, None

    return setup


def _rmsnorm(rows):
    def setup(root):
        m = load(root, "rmsnorm/rmsnorm_nki_kernels.py")
        r = _rng()
        a = r.random((rows, 512)).astype(np.float32)
        g = r.random(512).astype(np.float32)
        k = m.nki_rmsnorm_kernel
        return (lambda: k(a, g)), (k, (a, g)), ref_rmsnorm(a, g), (1e-3, 1e-5)

    return setup


def _layernorm(fn):
    def setup(root):
        m = load(root, "layernorm/layernorm_nki_kernel.py")
        r = _rng()
        x = r.random((4 * 1024, 8 * 1024)).astype(np.float32)
        g = r.random(8 * 1024).astype(np.float32)
        b = r.random(8 * 1024).astype(np.float32)
        k = getattr(m, fn)
        args = (x, 1e-5, g, b)
        return (lambda: k(*args)), (k, args), ref_layernorm(x, 1e-5, g, b), (1e-2, 1e-3)

    return setup


def _matmul(fn, M, K, N):
    def setup(root):
        import torch

        m = load(root, "matrix_multiplication/matrix_multiplication_nki_kernels.py")
        g = torch.Generator().manual_seed(0)
        lhs = torch.rand((M, K), dtype=torch.bfloat16, generator=g)
        rhs = torch.rand((K, N), dtype=torch.bfloat16, generator=g)
        lhsT = lhs.T.contiguous()
        exp = (lhs.float() @ rhs.float()).bfloat16().float().numpy()
        k = getattr(m, fn)
        return (lambda: k(lhsT, rhs)), (k, (lhsT, rhs)), exp, (1e-2, 1e-4)

    return setup


def _softmax(root):
    import torch

    m = load(root, "softmax/softmax_nki_kernels.py")
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    k = m.nki_softmax_kernel
    exp = torch.softmax(x, dim=-1).numpy()
    return (lambda: k(x)), (k, (x,)), exp, (1e-5, 1e-5)


def _mamba(fn):
    def setup(root):
        m = load(root, "fused_mamba/mamba_nki_kernels.py")
        batch, seq, ch, st = 1, 2048, 256, 16
        delta = np.ones((batch, ch, seq), np.float32)
        u = np.ones((batch, ch, seq), np.float32)
        A = -np.ones((ch, st), np.float32)
        B = np.ones((batch, st, seq), np.float32)
        C = np.ones((batch, st, seq), np.float32)
        k = getattr(m, fn)
        args = (delta, u, A, B, C)
        return (lambda: k(*args)), (k, args), ref_mamba(*args), (1e-2, 1e-2)

    return setup


def _sd_attention(root):
    m = load(root, "sd_attention/sd_attention_nki_kernels.py")
    r = _rng()
    q, k_, v = (r.random((4096, 64)).astype(np.float32) for _ in range(3))
    k = m.fused_self_attn_for_SD_small_head_size
    exp = m.cpu_golden_attn(q, k_, v)
    return (lambda: k(q, k_, v)), (k, (q, k_, v)), exp, (1e-3, 1e-5)


def _attention(version):
    def setup(root):
        import nkikit.language as nl

        m = load(root, "attention_fwd_performance/attention_kernels.py")
        seqlen = 128 if version in ("v1", "v2") else 4096
        r = _rng()
        raw = [(r.random((128, seqlen)) - 0.5) * 2 for _ in range(3)]
        # the tutorial's test: float32 for accuracy, bfloat16 for its profile/benchmark modes
        q, k_, v = (nl.static_cast(t, nl.float32) for t in raw)
        bf16 = tuple(nl.static_cast(t, nl.bfloat16) for t in raw)
        k = getattr(m, f"attn_fwd_{version}")
        return (lambda: k(q, k_, v)), (k, bf16), ref_attention_dT(q, k_, v), (0, 1e-2)

    return setup


def _rotary(seq):
    def setup(root):
        import torch

        m = load(root, "rotary/rotary_nki_kernels.py")
        bs, nh, hd = 2, 32, 128
        g = torch.Generator().manual_seed(0)
        q = torch.randn(bs, nh, seq, hd, generator=g)
        k_ = torch.randn(bs, nh, seq, hd, generator=g)
        cos, sin = m.generate_pos_embedding(hd, torch.stack([torch.arange(seq)] * bs))
        c, s = cos.numpy(), sin.numpy()
        exp = np.stack([ref_rotary(q.numpy(), c, s), ref_rotary(k_.numpy(), c, s)])
        k = m.nki_apply_rotary_embedding[bs, nh]
        args = (q, k_, cos, sin)
        return (lambda: k(*args)), (k, args), exp, (1e-5, 1e-5)

    return setup


_ADD = "tensor_addition/"
CASES = [
    Case(
        "tensor_add fp16",
        _tensor_add(
            _ADD + "tensor_addition_nki_kernels.py", "nki_tensor_add", "fp16", (256, 1024), None
        ),
    ),
    Case(
        "spmd_tensor_add fp16",
        _tensor_add(
            _ADD + "spmd_tensor_addition_nki_kernels.py",
            "nki_tensor_add",
            "fp16",
            (256, 1024),
            lambda s: (s[0] // 128, s[1] // 512),
        ),
    ),
    Case(
        "spmd_multiple_nc_tensor_add fp16",
        _tensor_add(
            _ADD + "spmd_multiple_nc_tensor_addition_nki_kernels.py",
            "nki_tensor_add_nc2",
            "fp16",
            (512, 2048),
            lambda s: (s[0] // 256, s[1] // 512),
            nc2=True,
        ),
    ),
    Case("transpose2d int8", _transpose2d),
    Case("average_pool2d fp16", _avgpool("fp16")),
    Case("average_pool2d bf16 (torch)", _avgpool("bf16")),
    Case("rmsnorm 128x512", _rmsnorm(128)),
    Case("rmsnorm 250x512 (torch)", _rmsnorm(250)),
    Case("layernorm v1 4096x8192", _layernorm("nki_layernorm_kernel_v1")),
    Case("layernorm v2 4096x8192", _layernorm("nki_layernorm_kernel_v2")),
    Case("matmul basic 64x128x512", _matmul("nki_matmul_basic_", 64, 128, 512)),
    Case("matmul tiled", _matmul("nki_matmul_tiled_", 4096, 1024, 2048)),
    Case("matmul hoist_load", _matmul("nki_matmul_hoist_load_", 4096, 1024, 2048)),
    Case(
        "matmul block_free_dimension", _matmul("nki_matmul_block_free_dimension_", 4096, 1024, 2048)
    ),
    Case("matmul fully_optimized", _matmul("nki_matmul_fully_optimized_", 4096, 1024, 2048)),
    Case("softmax (torch)", _softmax),
    Case("mamba v1", _mamba("mamba_v1")),
    Case("mamba v2", _mamba("mamba_v2")),
    Case("mamba v3", _mamba("mamba_v3")),
    Case("sd_attention 4096x64", _sd_attention),
    *[
        Case(f"attention {v}", _attention(v))
        for v in ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v8a", "v9", "v10", "v11")
    ],
    *[Case(f"rotary seq {s}", _rotary(s)) for s in (64, 128, 256)],
]


def run_case(case: Case, root: Path, profile: bool) -> dict:
    """Simulate one case, compare, and profile it; never raises."""
    import nkikit as nki

    res: dict = {"name": case.name, "ok": False, "us": None, "error": ""}
    t0 = time.perf_counter()
    try:
        run, launch, expected, tol = case.setup(root)
        got = _to_np(run())
        expected = _to_np(expected)
        if got.shape != expected.shape:
            raise AssertionError(f"shape {got.shape} != reference {expected.shape}")
        if tol is None:
            ok = bool(np.array_equal(got, expected))
        else:
            ok = bool(np.allclose(got, expected, rtol=tol[0], atol=tol[1]))
        if not ok:
            err = float(np.nanmax(np.abs(got - expected)))
            raise AssertionError(f"mismatch with the reference: max abs error {err:.3g}")
        res["ok"] = True
        if profile:
            kernel, args = launch
            res["us"] = nki.profile_kernel(kernel, *args, target=TARGET).total_us
    except Exception as e:  # noqa: BLE001 - the runner reports every failure as one line
        res["ok"] = False
        msg = str(e).strip().splitlines()
        res["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"
        res["traceback"] = traceback.format_exc()
    res["seconds"] = time.perf_counter() - t0
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tutorials", type=Path, help="the src/nki_samples/tutorials folder")
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    p.add_argument("--no-profile", action="store_true", help="skip the cost model")
    p.add_argument("--traceback", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)
    src = args.tutorials.resolve()
    if not src.is_dir():
        p.error(f"{src} is not a folder")
    tmp = Path(tempfile.mkdtemp(prefix="nkikit-tutorials-"))
    try:
        copy_tutorials(src, tmp)
        cases = [c for c in CASES if args.only in c.name]
        results = []
        for case in cases:
            r = run_case(case, tmp, not args.no_profile)
            forget_modules()
            results.append(r)
            us = f"{r['us']:10.1f} us" if r["us"] is not None else " " * 13
            status = "pass" if r["ok"] else "FAIL"
            print(f"{status}  {us}  {r['seconds']:6.1f}s  {r['name']}  {r['error']}", flush=True)
            if not r["ok"] and args.traceback:
                print(r["traceback"])
        passed = sum(r["ok"] for r in results)
        print(f"{passed} of {len(results)} cases pass (modeled on {TARGET})")
        return 0 if passed == len(results) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        forget_modules()


if __name__ == "__main__":
    sys.exit(main())
