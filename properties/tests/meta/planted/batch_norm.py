"""batch_norm (statistics per channel over the valid positions, a mask marking the padding): its
planted bugs and correct variants."""
from __future__ import annotations

import torch

from .....impls.eager import up
from ..expect import bug, correct
from ._helpers import _sequential_sum

__all__ = ["bn_ignores_mask", "bn_multiplies_by_mask", "bn_counts_padding", "bn_float64_stats", "bn_sequential_sum"]


# ------------------------------------------------------------------ batch_norm bugs
def _bn(x, weight, bias, eps, keep, count):
    """Masked two-pass batch_norm over positions; keep: (P, 1) multiplier, count: divisor."""
    rows = up(x).reshape(-1, x.shape[-1])
    mu = (rows * keep).sum(0) / count
    var = ((rows - mu).pow(2) * keep).sum(0) / count
    return ((rows - mu) * torch.rsqrt(var + eps) * up(weight) + up(bias)).reshape(x.shape).to(x.dtype)


def _keep(x, mask):
    m = torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device) if mask is None else mask
    return m.reshape(-1, 1)


@bug("batch_norm", "accuracy", "extremes", "padding")
def bn_ignores_mask(x, weight, bias, eps, mask=None):
    return _bn(x, weight, bias, eps, 1.0, max(1, x.numel() // max(1, x.shape[-1])))


@bug("batch_norm", "accuracy", "extremes", "padding")
def bn_multiplies_by_mask(x, weight, bias, eps, mask=None):
    """Zeroes padding by multiplying by the mask: 0 * NaN is NaN."""
    keep = _keep(x, mask).to(up(x).dtype)
    return _bn(x, weight, bias, eps, keep, keep.sum(0))


@bug("batch_norm", "accuracy", "extremes", "padding")
def bn_counts_padding(x, weight, bias, eps, mask=None):
    """Masks the sums but divides by all positions."""
    keep = _keep(x, mask)
    xf = torch.where(keep.reshape(x.shape[:-1] + (1,)), up(x), 0.0)
    return _bn(xf.to(x.dtype), weight, bias, eps, keep.to(xf.dtype), max(1, keep.numel()))


# ------------------------------------------------------------------ batch_norm correct variants
@correct("batch_norm")
def bn_float64_stats(x, weight, bias, eps, mask=None):
    rows = x.double().reshape(-1, x.shape[-1])
    keep = (torch.ones(rows.shape[0], dtype=torch.bool, device=x.device) if mask is None
            else mask.reshape(-1)).unsqueeze(-1)
    xd = torch.where(keep, rows, 0.0)
    count = keep.sum(0).double()
    mu = xd.sum(0) / count
    d = torch.where(keep, xd - mu, 0.0)
    var = d.pow(2).sum(0) / count
    return (d * torch.rsqrt(var + eps) * weight.double() + bias.double()).reshape(x.shape).to(x.dtype)


class _BnSequential(torch.autograd.Function):
    """Two-pass batch norm over the valid positions of each channel, every sum over positions left
    to right (``_sequential_sum``; a padded position's term is 0, which adds exactly):
    y = x_hat w + b, x_hat = (x - mu) rho; dx = rho (g - mean g - x_hat mean(g x_hat)) at valid
    positions and rho g at padded ones (the statistics do not see them), g = dy w; dweight and dbias
    sum the valid positions (a padded x may be NaN)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, mask):
        xf = up(x).reshape(-1, x.shape[-1])
        keep = (torch.ones(xf.shape[0], dtype=torch.bool, device=x.device) if mask is None
                else mask.reshape(-1)).unsqueeze(-1)
        count = keep.sum(0).to(xf.dtype)
        mu = _BnSequential.valid_sum(xf, keep) / count
        d = xf - mu
        rho = torch.rsqrt(_BnSequential.valid_sum(d * d, keep) / count + eps)
        ctx.save_for_backward(x, weight, d * rho, rho, keep, count)
        ctx.bias_dtype = bias.dtype
        return (d * rho * up(weight, x) + up(bias, x)).reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, xhat, rho, keep, count = ctx.saved_tensors
        valid_sum = _BnSequential.valid_sum
        d = up(dy, x).reshape(xhat.shape)
        g = d * up(weight, x)
        dx = torch.where(keep, rho * (g - valid_sum(g, keep) / count - xhat * (valid_sum(g * xhat, keep) / count)),
                         rho * g)
        dw = valid_sum(d * xhat, keep).squeeze(0).to(weight.dtype)
        db = valid_sum(d, keep).squeeze(0).to(ctx.bias_dtype)
        return dx.reshape(x.shape).to(x.dtype), dw, db, None, None

    @staticmethod
    def valid_sum(t, keep):
        """The sum of t over the valid positions (dim 0, kept), left to right."""
        return _sequential_sum(torch.where(keep, t, 0.0), 0)


@correct("batch_norm")
def bn_sequential_sum(x, weight, bias, eps, mask=None):
    """Every sum over positions left to right (``_BnSequential``), forward and backward."""
    return _BnSequential.apply(x, weight, bias, eps, mask)
