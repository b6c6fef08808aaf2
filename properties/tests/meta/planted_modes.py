"""Kernels right the way a test calls them and wrong the way a server does (``modes``): one bug
per calling mode, and a correct twin that takes every fast path correctly.

Each is an rms_norm(x, weight, eps); ``test_modes`` says which family kills each (``served``,
or for the warm-up bug any family, through its first call).
"""
from __future__ import annotations

import torch

from ....impls.eager import rms_norm as eager_rms_norm


def _plain_rms(x, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_no_grad_drops_eps(x, weight, eps):
    """Its "no autograd needed" fast path (grad off, inference mode) drops eps and the weight."""
    if not torch.is_grad_enabled():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True))).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def rms_autocast_bf16_stats(x, weight, eps):
    """Under autocast it rounds its statistics to bfloat16: a float32 output 2**-8 off."""
    if torch.is_autocast_enabled(x.device.type):
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps).to(torch.bfloat16).float()
        return (xf * inv * (1 if weight is None else weight.float())).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


class _SavesBf16UnderAutocast(torch.autograd.Function):
    """RMSNorm whose forward is right under autocast, and whose saved 1/rms is rounded to bfloat16
    when autocast was on (a training kernel that keeps its statistics in the autocast dtype)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = (xf * inv * weight.float()).to(x.dtype)
        kept = inv.to(torch.bfloat16).float() if torch.is_autocast_enabled(x.device.type) else inv
        ctx.save_for_backward(x, weight, kept)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, inv = ctx.saved_tensors
        xf, g = x.float(), dy.float() * weight.float()
        xhat = xf * inv
        dx = inv * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (dy.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


def rms_autocast_backward_bf16(x, weight, eps):
    """Its forward is right in every mode; under autocast its backward uses a bfloat16 1/rms."""
    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    return _SavesBf16UnderAutocast.apply(x, weight, eps)


_RESULTS: dict = {}


def rms_cached_by_address(x, weight, eps):
    """Caches its result by x's address, shape, strides and dtype: a buffer reused with new values
    (a serving loop's) gets the old rows back."""
    key = (x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype, weight is None or weight.data_ptr(), eps)
    if key not in _RESULTS:
        if len(_RESULTS) > 64:
            _RESULTS.clear()
        with torch.no_grad():
            _RESULTS[key] = eager_rms_norm(x, weight, eps)
    return _RESULTS[key].clone()


_WARM: set = set()


def rms_first_call_zeros(x, weight, eps):
    """Its first call of each dtype in the process returns zeros (a warm-up that fills a buffer late)."""
    if x.dtype not in _WARM:
        _WARM.add(x.dtype)
        return torch.zeros_like(x)
    return eager_rms_norm(x, weight, eps)


rms_first_call_zeros.forget = _WARM.clear  # the meta-test's fresh process


def rms_wrong_multithreaded(x, weight, eps):
    """With more than one intra-op thread it reduces only the first thread's half of each row."""
    if torch.get_num_threads() > 1 and x.shape[-1] > 1:
        half = x.float()[..., : (x.shape[-1] + 1) // 2]
        inv = torch.rsqrt(half.pow(2).mean(-1, keepdim=True) + eps)
        return (x.float() * inv * (1 if weight is None else weight.float())).to(x.dtype)
    return eager_rms_norm(x, weight, eps)


def rms_served_twin(x, weight, eps):
    """Correct on every path: grad off, a float64 fast path; under autocast, autocast turned off
    around its float32 work; otherwise the eager kernel."""
    if not torch.is_grad_enabled():
        xd = x.double()
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
        return (y if weight is None else y * weight.double()).to(x.dtype)
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return eager_rms_norm(x, weight, eps)
    return eager_rms_norm(x, weight, eps)


def rms_host_sync(x, weight, eps):
    """Correct, and not capturable in a CUDA graph: it reads a value back to the host (``.item()``) to
    choose its path, a sync a capture refuses."""
    if x.numel() and bool(torch.isfinite(x).all().item()):
        return eager_rms_norm(x, weight, eps)
    return eager_rms_norm(x, weight, eps)


BUGS = {rms_no_grad_drops_eps: "served", rms_autocast_bf16_stats: "served", rms_cached_by_address: "served",
        rms_first_call_zeros: "accuracy", rms_wrong_multithreaded: "served", rms_autocast_backward_bf16: "served"}
"""Each bug, and the family that must kill it (the warm-up bug: the first family to call it)."""
