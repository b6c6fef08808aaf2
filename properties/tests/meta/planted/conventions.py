"""Kernels that write into caller buffers, as inference libraries call theirs: declared as
MODULE:ATTR@inplace / @out / @outkw (see normcert.properties.declared.conventions; ``test_conventions``).
Right ones of each convention first, then ones that break it.  None carries an ``expect`` decorator.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import rms_formula, to_e4m3, up
from ._helpers import _rms

__all__ = ["rms_out", "rms_outkw", "add_rms_inplace", "rms_fp8_out", "silu_and_mul_out", "rms_out_skips_last_column",
           "rms_out_returns_out", "add_rms_inplace_scales_weight", "add_rms_inplace_stale_residual",
           "add_rms_inplace_truncated_residual", "rms_outkw_ignores_out"]


# ------------------------------------------------------------------ kernels that write into caller buffers
# (declared as MODULE:ATTR@inplace / @out / @outkw; see normcert.properties.declared.conventions)
def _rms_value(x, weight, eps):
    xf = up(x)
    return (xf * _rms(xf, eps) * up(weight, x)).to(x.dtype)


def rms_out(out, x, weight, eps):
    """vLLM's convention: rms_norm(out, input, weight, eps) -> None."""
    out.copy_(_rms_value(x, weight, eps))


def rms_outkw(x, weight, eps, out=None):
    """FlashInfer's convention: rmsnorm(input, weight, eps, out=...) returns out."""
    return out.copy_(_rms_value(x, weight, eps))


def add_rms_inplace(x, residual, weight, eps):
    """vLLM's fused_add_rms_norm: residual <- x + residual, then x <- rms_norm(residual)."""
    s = up(x) + up(residual)
    residual.copy_(s.to(residual.dtype))
    x.copy_((s * _rms(s, eps) * up(weight, x)).to(x.dtype))


def rms_fp8_out(out, x, weight, eps, scale):
    """vLLM's rms_norm_static_fp8_quant(out, input, ...): out is float8_e4m3fn (its scale a float here)."""
    out.copy_(to_e4m3(rms_formula(up(x), up(weight, x), eps) / scale))


def silu_and_mul_out(out, x):
    """vLLM's silu_and_mul(out, x)."""
    h = x.shape[-1] // 2
    out.copy_((F.silu(up(x[..., :h])) * up(x[..., h:])).to(x.dtype))


def rms_out_skips_last_column(out, x, weight, eps):
    """A tail the kernel's last block never stores: the element stays as the caller left it."""
    out[..., :-1].copy_(_rms_value(x, weight, eps)[..., :-1])


def rms_out_returns_out(out, x, weight, eps):
    """Returns the buffer where the convention says None (a caller that ignores it is fine;
    one that relies on it is not: the convention is the promise)."""
    out.copy_(_rms_value(x, weight, eps))
    return out


def add_rms_inplace_scales_weight(x, residual, weight, eps):
    """Writes an input the convention does not mutate: folds a later scale into the weight."""
    add_rms_inplace(x, residual, weight, eps)
    weight.mul_(2.0)


def add_rms_inplace_stale_residual(x, residual, weight, eps):
    """Normalises x + residual but forgets to store the new residual stream."""
    s = up(x) + up(residual)
    x.copy_((s * _rms(s, eps) * up(weight, x)).to(x.dtype))


def add_rms_inplace_truncated_residual(x, residual, weight, eps):
    """Stores the new residual stream rounded toward zero instead of to nearest."""
    s = up(x) + up(residual)
    r = s.to(x.dtype)
    residual.copy_(torch.where(up(r).abs() > s.abs(), torch.nextafter(r, torch.zeros_like(r)), r))
    x.copy_((s * _rms(s, eps) * up(weight, x)).to(x.dtype))


def rms_outkw_ignores_out(x, weight, eps, out=None):
    """Takes out= and ignores it: returns a fresh tensor, the caller's buffer stays as it was."""
    return _rms_value(x, weight, eps)
