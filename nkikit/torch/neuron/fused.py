"""``torch.rms_norm``, ``F.layer_norm`` and ``F.scaled_dot_product_attention`` as ONE library
kernel each on the ``neuron`` device, forward and backward.

These ops are CompositeImplicitAutograd in ATen: left alone they decompose before they reach
the device (rms_norm into pow, mean, add, rsqrt, mul, mul: six kernels).  Registering a kernel
at ``AutogradPrivateUse1`` keeps them whole: an ``autograd.Function`` whose forward is the
library kernel (``nkikit.library.rmsnorm`` / ``layernorm`` / ``attention``) and whose backward
is the library's backward kernel.  Calls the library cannot take (see each ``_fits``: an
attention mask, dropout, a dtype other than fp32/bf16, sizes beyond the kernel's limits) run
torch's own decomposition instead, op by op on the device, so nothing is ever refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .device import NeuronTensor, _tracing
from .kernels import launch, to_device, to_np

_FLOATS = (torch.float32, torch.bfloat16)


def _ones(d: int, dtype: torch.dtype) -> np.ndarray:
    return to_np(torch.ones(d, dtype=dtype))


def _zeros(d: int, dtype: torch.dtype) -> np.ndarray:
    return to_np(torch.zeros(d, dtype=dtype))


# -- rms_norm ----------------------------------------------------------------------------------


def _norm_fits(x: Any, nshape: Any, *params: Any) -> bool:
    d = math.prod(nshape)
    return (
        isinstance(x, NeuronTensor)
        # torch.compile traces with fake storage: the decomposition's ops trace, a launch cannot
        and not _tracing((x, *params), {})
        and x.dtype in _FLOATS
        and tuple(x.shape[x.dim() - len(nshape) :]) == tuple(nshape)
        and len(nshape) >= 1
        and 1 <= d <= 8192
        and all(
            p is None
            or (
                isinstance(p, NeuronTensor)
                and p.dtype == x.dtype
                and tuple(p.shape) == tuple(nshape)
            )
            for p in params
        )
    )


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, d, eps):
        from nkikit.library.rmsnorm import rmsnorm

        xs = to_np(x).reshape(-1, d)
        w = to_np(weight).reshape(d) if weight is not None else _ones(d, x.dtype)
        y = launch("rms_norm.default", "rmsnorm_kernel", rmsnorm, xs, w, eps=eps)
        ctx.save_for_backward(x, weight)
        ctx.d, ctx.eps = d, eps
        return to_device(y.reshape(tuple(x.shape)))

    @staticmethod
    def backward(ctx, grad):
        from nkikit.library.rmsnorm import rmsnorm_backward

        x, weight = ctx.saved_tensors
        d = ctx.d
        w = to_np(weight).reshape(d) if weight is not None else _ones(d, x.dtype)
        g = to_np(grad.to(x.dtype)).reshape(-1, d)
        gx, gw = launch(
            "rms_norm_backward", "rmsnorm_backward_kernel", rmsnorm_backward,
            g, to_np(x).reshape(-1, d), w, eps=ctx.eps,
        )  # fmt: skip
        gw_t = to_device(gw.reshape(tuple(weight.shape))) if weight is not None else None
        return to_device(gx.reshape(tuple(x.shape))), gw_t, None, None


def rms_norm(x, normalized_shape, weight=None, eps=None) -> torch.Tensor:  # aten's signature
    """aten::rms_norm on the device: one ``rmsnorm_kernel`` launch (see module doc)."""
    if not _norm_fits(x, normalized_shape, weight):
        return torch.ops.aten.rms_norm.default.decompose(x, normalized_shape, weight, eps)
    # torch's default: the epsilon of the op-math type, fp32 for bf16 too (ATen rms_norm)
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    return _RMSNorm.apply(x, weight, math.prod(normalized_shape), eps)


# -- layer_norm --------------------------------------------------------------------------------


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, d, eps):
        from nkikit.library.layernorm import layernorm

        w = to_np(weight).reshape(d) if weight is not None else _ones(d, x.dtype)
        b = to_np(bias).reshape(d) if bias is not None else _zeros(d, x.dtype)
        y = launch(
            "layer_norm.default", "layernorm_kernel", layernorm,
            to_np(x).reshape(-1, d), w, b, eps=eps,
        )  # fmt: skip
        ctx.save_for_backward(x, weight, bias)
        ctx.d, ctx.eps = d, eps
        return to_device(y.reshape(tuple(x.shape)))

    @staticmethod
    def backward(ctx, grad):
        from nkikit.library.layernorm import layernorm_backward

        x, weight, bias = ctx.saved_tensors
        d = ctx.d
        w = to_np(weight).reshape(d) if weight is not None else _ones(d, x.dtype)
        b = to_np(bias).reshape(d) if bias is not None else _zeros(d, x.dtype)
        gx, gw, gb = launch(
            "layer_norm_backward", "layernorm_backward_kernel", layernorm_backward,
            to_np(grad.to(x.dtype)).reshape(-1, d), to_np(x).reshape(-1, d), w, b, eps=ctx.eps,
        )  # fmt: skip
        gw_t = to_device(gw.reshape(tuple(weight.shape))) if weight is not None else None
        gb_t = to_device(gb.reshape(tuple(bias.shape))) if bias is not None else None
        return to_device(gx.reshape(tuple(x.shape))), gw_t, gb_t, None, None


def layer_norm(  # aten's signature
    x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True
) -> torch.Tensor:
    """aten::layer_norm on the device: one ``layernorm_kernel`` launch (see module doc)."""
    if not _norm_fits(x, normalized_shape, weight, bias):
        return torch.ops.aten.layer_norm.default.decompose(
            x, normalized_shape, weight, bias, eps, cudnn_enable
        )
    return _LayerNorm.apply(x, weight, bias, math.prod(normalized_shape), float(eps))


# -- scaled_dot_product_attention --------------------------------------------------------------


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        from nkikit.library.attention import attention

        out = launch(
            "scaled_dot_product_attention.default", "flash_attention_fwd_kernel", attention,
            to_np(q), to_np(k), to_np(v), causal=causal, scale=scale,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v)
        ctx.causal, ctx.scale = causal, scale
        return to_device(out)

    @staticmethod
    def backward(ctx, grad):
        from nkikit.library.attention import attention_backward

        q, k, v = ctx.saved_tensors
        # two launches: the forward kernel again (for out and the log-sum-exp), then the
        # backward kernel (the library's attention_backward)
        dq, dk, dv = launch(
            "scaled_dot_product_attention_backward", "flash_attention_bwd_kernel",
            attention_backward, to_np(grad.to(q.dtype)), to_np(q), to_np(k), to_np(v),
            causal=ctx.causal, scale=ctx.scale, launches=2,
        )  # fmt: skip
        return to_device(dq), to_device(dk), to_device(dv), None, None


def _attention_fits(q, k, v, attn_mask, dropout_p, enable_gqa) -> bool:
    if not all(isinstance(t, NeuronTensor) for t in (q, k, v)) or attn_mask is not None:
        return False
    if dropout_p or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _FLOATS):
        return False
    b, h, s, d = q.shape
    hkv = k.shape[1]
    if tuple(k.shape) != (b, hkv, s, d) or tuple(v.shape) != (b, hkv, s, d):
        return False
    return (hkv == h or (enable_gqa and h % hkv == 0)) and 1 <= d <= 128 and 1 <= s <= 4096


def scaled_dot_product_attention(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> torch.Tensor:  # aten's signature
    """aten::scaled_dot_product_attention on the device: the library's flash attention kernel
    (forward and backward); anything it cannot take runs torch's decomposition on the device."""
    if not _attention_fits(q, k, v, attn_mask, dropout_p, enable_gqa):
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    s = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if _tracing((q, k, v), {}):
        # torch.compile traces fake storage, where no kernel can launch: the graph gets the
        # flash-attention op (and autograd its backward op), which the compile backend runs on
        # the same library kernels; grouped heads decompose (the op takes equal head counts)
        if q.shape[1] != k.shape[1]:
            return torch.ops.aten.scaled_dot_product_attention.default.decompose(
                q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
        return flash(q, k, v, 0.0, bool(is_causal), scale=s)[0]
    return _Attention.apply(q, k, v, bool(is_causal), s)


def register() -> torch.library.Library:
    """Register the three kernels at AutogradPrivateUse1; returns the library (keep it alive)."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("rms_norm", rms_norm, "AutogradPrivateUse1")
    lib.impl("layer_norm", layer_norm, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
    return lib
