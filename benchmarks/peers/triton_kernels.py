"""The benchmark's algorithms as Triton kernels, run by Triton's interpreter on CPU tensors.

Import this module only with ``TRITON_INTERPRET=1`` in the environment (``benchmarks.peers``
sets it before importing triton).  Every kernel computes in fp32 (the interpreter cannot do
bf16 arithmetic) and stores in the output's dtype, like the NKI kernels do.  Each ``run_*``
function takes torch CPU tensors and returns the output tensor.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * n_cols + cols, (x * inv * w).to(out_ptr.dtype.element_ty), mask=m)


def run_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n_rows, n_cols = x.shape
    _rmsnorm[(n_rows,)](x, w, out, n_cols, eps, BLOCK=triton.next_power_of_2(n_cols))
    return out


@triton.jit
def _softmax(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    y = e * (1.0 / tl.sum(e, axis=0))
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def run_softmax(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n_rows, n_cols = x.shape
    _softmax[(n_rows,)](x, out, n_cols, BLOCK=triton.next_power_of_2(n_cols))
    return out


@triton.jit
def _layernorm(x_ptr, g_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(m, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    g = tl.load(g_ptr + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (xc * rstd * g + b).to(out_ptr.dtype.element_ty), mask=m)


def run_layernorm(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n_rows, n_cols = x.shape
    _layernorm[(n_rows,)](x, g, b, out, n_cols, eps, BLOCK=triton.next_power_of_2(n_cols))
    return out


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # a is lhsT [K, M]: C = a.T @ b
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + (k0 + rk)[None, :] * M + rm[:, None]).to(tl.float32)  # [BM, BK]
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :]).to(tl.float32)  # [BK, BN]
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty))


def run_matmul(lhsT: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:  # noqa: N803
    k, m = lhsT.shape
    n = rhs.shape[1]
    out = torch.empty((m, n), dtype=lhsT.dtype)
    bm, bn, bk = 128, 128, 64
    _matmul[(m // bm, n // bn)](lhsT, rhs, out, m, n, k, BM=bm, BN=bn, BK=bk)
    return out


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, seq, scale, D: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr):
    # flash attention forward, causal: one program per (query block, head)
    qb = tl.program_id(0)
    h = tl.program_id(1)
    base = h * seq * D
    rm = qb * BM + tl.arange(0, BM)
    rd = tl.arange(0, D)
    q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :]).to(tl.float32)
    m_i = tl.full((BM,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    for start in range(0, (qb + 1) * BM, BN):
        rn = start + tl.arange(0, BN)
        k = tl.load(k_ptr + base + rn[:, None] * D + rd[None, :]).to(tl.float32)
        v = tl.load(v_ptr + base + rn[:, None] * D + rd[None, :]).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(rm[:, None] >= rn[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], out.to(o_ptr.dtype.element_ty))


def run_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    h, seq, d = q.shape
    out = torch.empty_like(q)
    bm, bn = 128, 64
    _attention[(seq // bm, h)](q, k, v, out, seq, 1.0 / math.sqrt(d), D=d, BM=bm, BN=bn)
    return out
