"""layer_norm, add_layer_norm and deep_norm (a LayerNorm of alpha x + sublayer(x)): their planted bugs
and correct variants.

layer_norm's bugs that show in one bucket of rows are in ``shapes``; batch_norm is in ``batch_norm``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import _or, layer_norm, up
from ..expect import bucket_bug, bug, correct
from ._helpers import _sequential_column_sum, _sequential_mean

__all__ = ["ln_one_pass", "ln_std_plus_eps", "ln_unbiased", "ln_no_bias", "ln_low_precision_mean",
           "ln_weightless_bias_as_ones", "ln_uncentred_backward", "ln_welford", "ln_sequential_sum",
           "add_ln_mean_of_x_alone", "add_ln_stream_narrowed", "add_ln_residual_grad_narrowed", "add_ln_unfused",
           "add_ln_torch_ops", "deep_beta_input", "deep_alpha_on_branch", "deep_norm_z_in_fp32"]


# ------------------------------------------------------------------ helpers
def _ln(x, eps, var_fn):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var_fn(x, mu) + eps)


def _two_pass_var(x, mu):
    return (x - mu).pow(2).mean(-1, keepdim=True)


# ------------------------------------------------------------------ layer_norm bugs
@bug("layer_norm", "accuracy", "extremes", "invariance")
def ln_one_pass(x, weight, bias, eps):
    xf = up(x)
    return (_ln(xf, eps, lambda v, mu: v.pow(2).mean(-1, keepdim=True) - mu * mu) * up(weight) + up(bias)).to(x.dtype)


@bug("layer_norm", "accuracy", "extremes", "invariance")
def ln_std_plus_eps(x, weight, bias, eps):
    xf = up(x)
    d = xf - xf.mean(-1, keepdim=True)
    return (d / (d.pow(2).mean(-1, keepdim=True).sqrt() + eps) * up(weight) + up(bias)).to(x.dtype)


@bug("layer_norm", "accuracy", "extremes")
def ln_unbiased(x, weight, bias, eps):
    xf = up(x)
    return (_ln(xf, eps, lambda v, mu: v.var(-1, keepdim=True, unbiased=True)) * up(weight) + up(bias)).to(x.dtype)


@bug("layer_norm", "accuracy", "extremes")
def ln_no_bias(x, weight, bias, eps):
    return (_ln(up(x), eps, _two_pass_var) * up(weight)).to(x.dtype)


@bug("layer_norm", "accuracy", "extremes", "invariance")
def ln_low_precision_mean(x, weight, bias, eps):
    """Statistics in the input dtype (bf16 sums lose the mean)."""
    mu = x.cumsum(-1)[..., -1:] / x.shape[-1]
    xf = up(x)
    d = xf - up(mu)
    return (d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps) * up(weight) + up(bias)).to(x.dtype)


@bug("layer_norm", "accuracy", "extremes")
def ln_weightless_bias_as_ones(x, weight, bias, eps):
    """bias=None filled like a missing weight: ones, not zeros."""
    ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    return layer_norm(x, ones if weight is None else weight, ones if bias is None else bias, eps)


# ------------------------------------------------------------------ layer_norm near misses: wrong by a small factor
class _LnUncentredBackward(torch.autograd.Function):
    """layer_norm with PyTorch 2.13's CPU backward (``layer_norm_kernel.cpp``): dx = a g + b x + c with
    b = (db mean - ds) a^3 / n from the *uncentred* ds = sum g x, which cancels like a one-pass
    variance on rows with |mean| >> std (a = rstd, g = dy w, db = sum g)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xf = up(x)
        mu = xf.mean(-1, keepdim=True)
        a = torch.rsqrt((xf - mu).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, bias, mu, a)
        return ((xf - mu) * a * up(weight) + up(bias)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mu, a = ctx.saved_tensors
        xf, d, n = up(x), up(dy), x.shape[-1]
        g = d * up(weight)
        ds, db = (g * xf).sum(-1, keepdim=True), g.sum(-1, keepdim=True)
        b = (db * mu - ds) * a.pow(3) / n
        c = -b * mu - db * a / n
        dx = a * g + b * xf + c
        xhat = (xf - mu) * a
        dw = (d * xhat).reshape(-1, n).sum(0).to(weight.dtype)
        dbias = d.reshape(-1, n).sum(0).to(bias.dtype)
        return dx.to(x.dtype), dw, dbias, None


@bucket_bug("layer_norm", "gradients")
def ln_uncentred_backward(x, weight, bias, eps):
    """Killed by the near-constant buckets (``strategies.near_constant_buckets``) on every seed."""
    return _LnUncentredBackward.apply(x, weight, bias, eps)


# ------------------------------------------------------------------ layer_norm correct variants
@correct("layer_norm")
def ln_welford(x, weight, bias, eps):
    """Welford's update, vectorised across rows, in 64-column chunks."""
    return _welford_layer_norm(up(x), weight, bias, eps).to(x.dtype)


def _welford_layer_norm(xf, weight, bias, eps):
    """LayerNorm of xf in its own dtype, the statistics by Welford's update in 64-column chunks."""
    n = xf.shape[-1]
    mean = torch.zeros(xf.shape[:-1] + (1,), dtype=xf.dtype, device=xf.device)
    m2 = torch.zeros_like(mean)
    count = 0
    for start in range(0, n, 64):
        chunk = xf[..., start:start + 64]
        k = chunk.shape[-1]
        c_mean = chunk.mean(-1, keepdim=True)
        c_m2 = (chunk - c_mean).pow(2).sum(-1, keepdim=True)
        delta = c_mean - mean
        total = count + k
        mean = mean + delta * (k / total)
        m2 = m2 + c_m2 + delta * delta * (count * k / total)
        count = total
    var = m2 / max(n, 1)
    return (xf - mean) * torch.rsqrt(var + eps) * up(weight, xf) + up(bias, xf)


class _LnSequential(torch.autograd.Function):
    """Two-pass LayerNorm whose every mean, forward and backward, is a left-to-right sum, and whose
    dweight and dbias sum the rows left to right: dx = rho (g - mean g - xhat mean(g xhat)),
    g = dy w."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xf = up(x)
        d = xf - _sequential_mean(xf)
        rho = torch.rsqrt(_sequential_mean(d * d) + eps)
        xhat = d * rho
        ctx.save_for_backward(x, weight, bias, xhat, rho)
        return (xhat * _or(weight, x, 1.0) + _or(bias, x, 0.0)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, xhat, rho = ctx.saved_tensors
        n, d = x.shape[-1], up(dy, x)
        g = d * _or(weight, x, 1.0)
        dx = rho * (g - _sequential_mean(g) - xhat * _sequential_mean(g * xhat))
        dw = None if weight is None else _sequential_column_sum((d * xhat).reshape(-1, n)).to(weight.dtype)
        db = None if bias is None else _sequential_column_sum(d.reshape(-1, n)).to(bias.dtype)
        return dx.to(x.dtype), dw, db, None


@correct("layer_norm")
def ln_sequential_sum(x, weight, bias, eps):
    """Every sum left to right (``_sequential_mean``), forward and backward."""
    return _LnSequential.apply(x, weight, bias, eps)


# ------------------------------------------------------------------ add_layer_norm bugs
@bug("add_layer_norm", "accuracy", "extremes", "fusion")
def add_ln_mean_of_x_alone(x, residual, weight, bias, eps):
    """Centres the sum with the mean of x alone (the residual's mean never subtracted)."""
    s = up(x) + up(residual)
    d = s - up(x).mean(-1, keepdim=True)
    y = d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps) * up(weight, x) + up(bias, x)
    return y.to(x.dtype), s.to(residual.dtype)


@bug("add_layer_norm", "accuracy", "extremes", "fusion")
def add_ln_stream_narrowed(x, residual, weight, bias, eps):
    """A float32 residual stream's residual_out rounded to x's dtype first, then stored as float32."""
    s = up(x) + up(residual)
    y = _ln(s, eps, _two_pass_var) * up(weight, x) + up(bias, x)
    return y.to(x.dtype), s.to(x.dtype).to(residual.dtype)


class _AddLnResidualGradNarrowed(torch.autograd.Function):
    """add_layer_norm as flash-linear-attention's ``layer_norm(..., residual, prenorm=True)`` stores
    it: s = x + r formed in float32 and stored as residual_out in the stream's dtype, the two-pass
    LayerNorm of it; the backward forms dx = rho (g - mean g - xhat mean(g xhat)) + dresidual_out in
    float32, right, and then casts it to x's dtype before storing the residual's gradient, though
    that gradient is returned in the stream's dtype (float32 beside a bfloat16 x)."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps):
        s = (up(x) + up(residual)).to(residual.dtype)
        sf = up(s, x)
        d = sf - sf.mean(-1, keepdim=True)
        rho = torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
        xhat = d * rho
        ctx.save_for_backward(x, residual, weight, bias, xhat, rho)
        return (xhat * up(weight, x) + up(bias, x)).to(x.dtype), s

    @staticmethod
    def backward(ctx, dy, dres):
        x, residual, weight, bias, xhat, rho = ctx.saved_tensors
        n, d = x.shape[-1], up(dy, x)
        g = d * up(weight, x)
        dx = rho * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) + up(dres, x)
        dw = (d * xhat).reshape(-1, n).sum(0).to(weight.dtype)
        db = d.reshape(-1, n).sum(0).to(bias.dtype)
        return dx.to(x.dtype), dx.to(x.dtype).to(residual.dtype), dw, db, None


@bug("add_layer_norm", "gradients")
def add_ln_residual_grad_narrowed(x, residual, weight, bias, eps):
    """The residual's float32 gradient passed through x's dtype (flash-linear-attention's
    ``layer_norm`` backward on rows wider than 512): in bfloat16 it carries u_bf16 of |dx|, 2**16
    times the float32 rounding a float32 gradient may have."""
    return _AddLnResidualGradNarrowed.apply(x, residual, weight, bias, eps)


# ------------------------------------------------------------------ add_layer_norm correct variants
@correct("add_layer_norm")
def add_ln_unfused(x, residual, weight, bias, eps):
    """The sum rounded to the stream first, then ``ln_sequential_sum`` of it."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return _LnSequential.apply(s, weight, bias, eps).to(x.dtype), s


@correct("add_layer_norm")
def add_ln_torch_ops(x, residual, weight, bias, eps):
    """The plainest add + LayerNorm: torch ops in the compute format, BERT's two-pass LayerNorm (the
    centred s - mu formed twice, for the variance and for the output; a division by the standard
    deviation), autograd for the backward: s's gradient sums the residual_out cotangent with three
    VJP terms, each addition rounding on a partial sum that holds the cotangent
    (``bounds_norms.NormInput.carried``)."""
    s = up(x) + up(residual)
    mu = s.mean(-1, keepdim=True)
    var = (s - mu).pow(2).mean(-1, keepdim=True)
    y = (s - mu) / torch.sqrt(var + eps) * up(weight, x) + up(bias, x)
    return y.to(x.dtype), s.to(residual.dtype)


# ------------------------------------------------------------------ deep_norm bugs
@bug("deep_norm", "accuracy", "extremes")
def deep_beta_input(x, sublayer, alpha, weight, bias, eps):
    beta = (4 * alpha ** 4) ** -0.25  # DeepNet's beta, wrongly applied to the sublayer's input
    z = alpha * x + sublayer(x * beta)
    return F.layer_norm(up(z), (x.shape[-1],), up(weight), up(bias), eps).to(x.dtype)


@bug("deep_norm", "accuracy", "extremes")
def deep_alpha_on_branch(x, sublayer, alpha, weight, bias, eps):
    z = x + alpha * sublayer(x)
    return F.layer_norm(up(z), (x.shape[-1],), up(weight), up(bias), eps).to(x.dtype)


# ------------------------------------------------------------------ deep_norm correct variants
@correct("deep_norm")
def deep_norm_z_in_fp32(x, sublayer, alpha, weight, bias, eps):
    """z = alpha x + sublayer(x) formed in float32, the suite's sublayer called on float32 x (so its
    output is rounded to float32, not to x's dtype: the fixture called in c, ``bounds_norms._deep_z``),
    then Welford's LayerNorm of z, rounded once to x's dtype."""
    xf = up(x)
    return _welford_layer_norm(alpha * xf + sublayer(xf), weight, bias, eps).to(x.dtype)
