"""numpy reference for attention (forward, backward and the log-sum-exp the forward saves),
computed in float64."""

from __future__ import annotations

import math

import numpy as np


def _expand(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    group = q.shape[1] // k.shape[1]
    k64 = np.repeat(np.asarray(k, dtype=np.float64), group, axis=1)
    v64 = np.repeat(np.asarray(v, dtype=np.float64), group, axis=1)
    return np.asarray(q, dtype=np.float64), k64, v64, group


def _probs(q64, k64, causal: bool, scale: float) -> np.ndarray:
    s = scale * np.einsum("bhqd,bhkd->bhqk", q64, k64)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    scale: float = 0.0,
    softmax: str = "two_pass",
) -> np.ndarray:
    """``softmax(scale * q @ k.T [+ causal mask]) @ v`` in float64; q [B, H, S, D], k and v
    [B, Hkv, S, D] (query head h uses KV head h // (H // Hkv)); scale 0 means 1/sqrt(D).
    ``softmax`` names the kernel's algorithm; the exact result does not depend on it."""
    q64, k64, v64, _ = _expand(q, k, v)
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    return np.einsum("bhqk,bhkd->bhqd", _probs(q64, k64, causal, scale), v64)


def attention_backward(
    grad: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    scale: float = 0.0,
    softmax: str = "two_pass",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``attention`` for the output gradient ``grad``, in float64
    (``softmax``: as in ``attention``)."""
    q64, k64, v64, group = _expand(q, k, v)
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    g = np.asarray(grad, dtype=np.float64)
    p = _probs(q64, k64, causal, scale)
    dv = np.einsum("bhqk,bhqd->bhkd", p, g)
    dp = np.einsum("bhqd,bhkd->bhqk", g, v64)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, k64)
    dk = scale * np.einsum("bhqk,bhqd->bhkd", ds, q64)
    b, hkv = k.shape[:2]
    fold = lambda t: t.reshape(b, hkv, group, *t.shape[2:]).sum(axis=2)  # noqa: E731
    return dq, fold(dk), fold(dv)


def logsumexp(
    q: np.ndarray, k: np.ndarray, *, causal: bool = True, scale: float = 0.0
) -> np.ndarray:
    """The log-sum-exp of the scaled (masked) scores per query row, [B, H, S] float64: what
    the forward kernels return as ``lse`` for the backward."""
    q64, k64, _, _ = _expand(q, k, k)
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    s = scale * np.einsum("bhqd,bhkd->bhqk", q64, k64)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
