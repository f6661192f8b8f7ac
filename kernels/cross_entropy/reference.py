"""numpy reference for per-row cross-entropy and its gradient, in float64."""

from __future__ import annotations

import numpy as np


def _prepare(logits, targets):
    x = np.asarray(logits, dtype=np.float64)
    t = np.asarray(targets)
    if t.dtype.kind == "f":
        t = np.rint(t)
    t = t.astype(np.int64)
    ok = (t >= 0) & (t < x.shape[1])
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    return x, np.where(ok, t, 0), ok, lse


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``logsumexp(x[r]) - x[r, t[r]]`` per row; 0 where ``t`` is outside ``[0, V)``."""
    x, t, ok, lse = _prepare(logits, targets)
    return np.where(ok, lse - x[np.arange(x.shape[0]), t], 0.0)


def cross_entropy_forward(logits, targets):
    """``(cross_entropy, logsumexp)``."""
    return cross_entropy(logits, targets), _prepare(logits, targets)[3]


def cross_entropy_backward(grad, logits, targets):
    """``((softmax - onehot) * grad[:, None] on valid rows, zeros like targets)``."""
    x, t, ok, lse = _prepare(logits, targets)
    p = np.exp(x - lse[:, None])
    p[np.arange(x.shape[0]), t] -= 1.0
    g = np.asarray(grad, dtype=np.float64) * ok
    return p * g[:, None], np.zeros(np.shape(targets))
