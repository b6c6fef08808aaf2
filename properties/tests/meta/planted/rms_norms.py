"""rms_norm, add_rms_norm and gemma_rms_norm: their planted bugs and correct variants, and rms_norm
as inference libraries ship it (no autograd; ``test_forward_only``).

The bugs that show at some shapes only (a scheduled bucket, the batch size, past 2**31 elements)
are in ``shapes``; the kernels that write into caller buffers in ``conventions``.
"""
from __future__ import annotations

import torch

from .....impls.compiled import compiled_at_first_call
from .....impls.eager import _or, rms_formula, up
from .....impls.eager import rms_norm as eager_rms_norm
from ..expect import bug, correct
from ._helpers import _rms, _sequential_column_sum, _sequential_mean

__all__ = ["rms_eps_outside_sqrt", "rms_no_upcast", "rms_pow2_divisor", "rms_mutates_input", "rms_global_scale",
           "rms_wrong_backward", "rms_backward_over_dy", "rms_clamped_mean_square", "rms_returns_float32",
           "rms_returns_none", "rms_returns_tuple", "rms_ignores_strides", "rms_nondeterministic",
           "rms_weightless_as_zeros", "rms_dweight_in_bf16", "rms_eps_floored_fp16", "rms_inverse_rms_in_bf16",
           "rms_llama_order", "rms_once_twin", "rms_reversed_sum", "rms_float64_inside", "rms_compiled_llama",
           "rms_sequential_sum", "rms_weight_required", "rms_float64_in_float32", "rms_drops_last_column",
           "rms_forward_only", "rms_backward_on_small_rows",
           "add_rms_stale_residual", "add_rms_truncated_residual", "add_rms_forgets_add", "add_rms_stream_narrowed",
           "add_rms_y_from_narrowed_stream", "add_rms_unfused", "gemma_offset_forgotten",
           "gemma_offset_in_low_precision", "gemma_llama_order", "gemma_sequential_sum"]


# ------------------------------------------------------------------ rms_norm bugs
@bug("rms_norm", "accuracy", "extremes", "invariance")
def rms_eps_outside_sqrt(x, weight, eps):
    xf = up(x)
    return (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps) * up(weight)).to(x.dtype)


@bug("rms_norm", "accuracy", "extremes", "gradients")
def rms_no_upcast(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(x.dtype)


@bug("rms_norm", "accuracy", "extremes")
def rms_pow2_divisor(x, weight, eps):
    xf = up(x)
    n = x.shape[-1]
    denom = 1 << max(0, (n - 1).bit_length())  # "round the block up": divides by the padded length
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / denom + eps) * up(weight)).to(x.dtype)


@bug("rms_norm", "accuracy", "contract", "extremes", "gradients", "invariance")
def rms_mutates_input(x, weight, eps):
    xf = up(x)
    x.mul_(1)  # touches the caller's tensor in place (harmless-looking)
    x.copy_((xf * _rms(xf, eps)).to(x.dtype))
    return (up(x) * up(weight)).to(x.dtype)


@bug("rms_norm", "extremes", "row-independence")
def rms_global_scale(x, weight, eps):
    """Pre-scales by the *tensor's* max to avoid overflow: couples the rows."""
    xf = up(x)
    s = xf.abs().amax().clamp_min(1e-30)
    xs = xf / s
    return (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps / (s * s)) * up(weight)).to(x.dtype)


class _RmsNoSecondTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = up(x)
        r = _rms(xf, eps)
        ctx.save_for_backward(xf, weight, r)
        return (xf * r * up(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xf, weight, r = ctx.saved_tensors
        g = up(dy) * up(weight)
        dx = (g * r).to(dy.dtype)  # forgets -r^3 x mean(g x)
        dw = (up(dy) * xf * r).reshape(-1, xf.shape[-1]).sum(0).to(weight.dtype)
        return dx, dw, None


@bug("rms_norm", "gradients")
def rms_wrong_backward(x, weight, eps):
    return _RmsNoSecondTerm.apply(x, weight, eps)


class _RmsBackwardOverDy(torch.autograd.Function):
    """Correct gradients, but dx is written over the incoming dy where dy is contiguous (an
    "in-place" backward, as Liger's in_place=True; an expanded dy, as y.sum().backward() hands
    over, cannot take the write)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return rms_llama_order(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            xl, wl = x.detach().requires_grad_(), weight.detach().requires_grad_()
            dx, dw = torch.autograd.grad(rms_llama_order(xl, wl, ctx.eps), (xl, wl), dy)
        return (dy.copy_(dx) if dy.is_contiguous() else dx), dw, None


@bug("rms_norm", "gradients")
def rms_backward_over_dy(x, weight, eps):
    return _RmsBackwardOverDy.apply(x, weight, eps)


@bug("rms_norm", "accuracy", "extremes", "invariance")
def rms_clamped_mean_square(x, weight, eps):
    """Clamps the mean square at 1e-6 "for stability": breaks scale invariance for small rows."""
    xf = up(x)
    ms = xf.pow(2).mean(-1, keepdim=True).clamp_min(1e-6)
    return (xf * torch.rsqrt(ms + eps) * up(weight)).to(x.dtype)


@bug("rms_norm", "accuracy", "contract", "extremes", "gradients", "invariance")
def rms_returns_float32(x, weight, eps):
    xf = up(x)
    return xf * _rms(xf, eps) * up(weight)  # forgets to cast back


@bug("rms_norm", "accuracy", "contract", "extremes", "gradients", "invariance")
def rms_returns_none(x, weight, eps):
    return None


@bug("rms_norm", "accuracy", "contract", "extremes", "gradients", "invariance")
def rms_returns_tuple(x, weight, eps):
    return (rms_formula(up(x), up(weight), eps).to(x.dtype),)


@bug("rms_norm", "accuracy", "contract", "extremes", "invariance")
def rms_ignores_strides(x, weight, eps):
    """Reads the storage as if x were contiguous."""
    flat = torch.as_strided(x, x.shape, _contiguous_strides(x.shape), x.storage_offset())
    xf = up(flat)
    return (xf * _rms(xf, eps) * up(weight)).to(x.dtype)


def _contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


_RACES = torch.Generator().manual_seed(0)  # the hardware's whim: not torch's RNG, which the sandbox restores


@bug("rms_norm", "determinism")
def rms_nondeterministic(x, weight, eps):
    """Sums the squares in a random order each call (like racing atomics)."""
    xf = up(x)
    perm = torch.randperm(x.shape[-1], generator=_RACES).to(x.device)
    ms = xf[..., perm].pow(2).sum(-1, keepdim=True) / x.shape[-1]  # (CPU cumsum would hide it: it accumulates in double)
    return (xf * torch.rsqrt(ms + eps) * up(weight)).to(x.dtype)


@bug("rms_norm", "accuracy", "extremes")
def rms_weightless_as_zeros(x, weight, eps):
    """weight=None read as a buffer of zeros (a default allocated with zeros, not ones)."""
    w = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device) if weight is None else weight
    return rms_formula(up(x), up(w, x), eps).to(x.dtype)


# ------------------------------------------------------------------ rms_norm near misses: wrong by a small factor
class _RmsDweightBf16(torch.autograd.Function):
    """Right dx; dw = sum over rows of dy x rho accumulated in bfloat16, one row at a time
    (Liger-Kernel#950: the partial sums of dW kept in the weight's bfloat16)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return rms_formula(up(x), up(weight), eps).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            xl = x.detach().requires_grad_()
            dx, = torch.autograd.grad(rms_formula(up(xl), up(weight), ctx.eps).to(x.dtype), (xl,), dy)
        xf = up(x).reshape(-1, x.shape[-1])
        terms = (up(dy).reshape(xf.shape) * xf * _rms(xf, ctx.eps)).to(torch.bfloat16)
        acc = torch.zeros(xf.shape[-1], dtype=torch.bfloat16)
        for row in terms:
            acc = acc + row
        return dx, acc.to(weight.dtype), None


@bug("rms_norm", "gradients")
def rms_dweight_in_bf16(x, weight, eps):
    return _RmsDweightBf16.apply(x, weight, eps)


@bug("rms_norm", "accuracy", "extremes")
def rms_eps_floored_fp16(x, weight, eps):
    """eps raised to 1e-4 for float16 inputs ("to avoid overflow"): rows whose mean square is
    near 1e-4 or below are normalised by the wrong rms."""
    xf = up(x)
    return rms_formula(xf, up(weight, x), max(eps, 1e-4) if x.dtype == torch.float16 else eps).to(x.dtype)


@bug("rms_norm", "accuracy", "extremes")
def rms_inverse_rms_in_bf16(x, weight, eps):
    """The inverse rms rounded to bfloat16 before the multiply (a reported NPU kernel): a relative
    error of 2**-9 in every y, where the model allows float32's 2**-24 in the compute format.
    Killed in float32 and float16 on 10/10 seeds.  For bfloat16 inputs the model rightly accepts it:
    that rounding is one of the two roundings to x.dtype it allows (the llama order rounds x rho
    instead); it reaches 0.88 to 0.99 of the bound over seeds 0-9."""
    xf = up(x)
    rho = _rms(xf, eps).to(torch.bfloat16).to(xf.dtype)
    return (xf * rho * up(weight, x)).to(x.dtype)


# ------------------------------------------------------------------ rms_norm correct variants
@correct("rms_norm")
def rms_llama_order(x, weight, eps):
    """Compute in fp32, round x*rho to x.dtype, multiply by the weight (as given), round again."""
    xf = up(x)
    return (up((xf * _rms(xf, eps)).to(x.dtype), x) * up(weight, x)).to(x.dtype)


def rms_once_twin(x, weight, eps):
    """rms_norm's eager kernel as a kernel of another name and module (the same bits: ``--agree``'s
    passing pair with the eager kernel; rms_llama_order is its failing one)."""
    return eager_rms_norm(x, weight, eps)


@correct("rms_norm")
def rms_reversed_sum(x, weight, eps):
    xf = up(x)
    ms = xf.flip(-1).pow(2).cumsum(-1)[..., -1:] / x.shape[-1]  # sequential, right to left
    return (xf * torch.rsqrt(ms + eps) * up(weight)).to(x.dtype)


@correct("rms_norm")
def rms_float64_inside(x, weight, eps):
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


rms_compiled_llama = correct("rms_norm")(compiled_at_first_call(rms_llama_order, dynamic=True))


rms_compiled_llama.__name__ = "rms_compiled_llama"  # its own test id and replay target, not the eager one's


class _RmsSequential(torch.autograd.Function):
    """RMSNorm whose mean square and backward means are left-to-right sums:
    dx = rho (g - xhat mean(g xhat)), xhat = x rho, g = dy w; dweight sums the rows left to right."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = up(x)
        rho = torch.rsqrt(_sequential_mean(xf * xf) + eps)
        ctx.save_for_backward(x, weight, rho)
        return (xf * rho * _or(weight, x, 1.0)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rho = ctx.saved_tensors
        n, d, xhat = x.shape[-1], up(dy, x), up(x) * rho
        g = d * _or(weight, x, 1.0)
        dx = rho * (g - xhat * _sequential_mean(g * xhat))
        dw = None if weight is None else _sequential_column_sum((d * xhat).reshape(-1, n)).to(weight.dtype)
        return dx.to(x.dtype), dw, None


@correct("rms_norm")
def rms_sequential_sum(x, weight, eps):
    """Every sum left to right (``_sequential_mean``), forward and backward."""
    return _RmsSequential.apply(x, weight, eps)


@correct("rms_norm")
def rms_weight_required(x, weight, eps):
    """The README's example kernel: a weight is required (weight.to(...) raises on None).  Not a
    defect: its cases give ones where a weightless call would give None."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(compute)).to(x.dtype)


@bug("rms_norm", "accuracy", "extremes", "gradients", "served")
def rms_float64_in_float32(x, weight, eps):
    """The README's example kernel computing float64 inputs in float32 (its twin above computes them
    in float64): every float64 output off by float32's rounding, on any row of two elements."""
    xf = x.to(torch.float32)
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(torch.float32)).to(x.dtype)


@bug("rms_norm", "accuracy", "extremes")
def rms_drops_last_column(x, weight, eps):
    """A correct RMSNorm that leaves the last element of every row unwritten (zero): a loop bound one short."""
    y = rms_weight_required(x, weight, eps).clone()
    y[..., -1] = 0
    return y


# ------------------------------------------------------------------ rms_norm as inference libraries ship it
def rms_forward_only(x, weight, eps):
    """A correct forward with no autograd (what vLLM, FlashInfer and most Triton kernels are):
    not certified for gradients, never failed for it (unless --require-backward)."""
    with torch.no_grad():
        xf = up(x)
        return (xf * _rms(xf, eps) * up(weight, x)).to(x.dtype)


def rms_backward_on_small_rows(x, weight, eps):
    """A grad_fn on some inputs only: an autograd path for short rows, a detached fast path
    for the rest -- a training step would silently get no gradient."""
    xf = up(x)
    y = (xf * _rms(xf, eps) * up(weight, x)).to(x.dtype)
    return y if x.shape[-1] <= 16 else y.detach()


# ------------------------------------------------------------------ add_rms_norm bugs
@bug("add_rms_norm", "accuracy", "extremes", "fusion")
def add_rms_stale_residual(x, residual, weight, eps):
    s = up(x) + up(residual)
    return rms_formula(s, up(weight), eps).to(x.dtype), residual.clone()


@bug("add_rms_norm", "accuracy", "extremes", "fusion")
def add_rms_truncated_residual(x, residual, weight, eps):
    """Rounds the new residual toward zero instead of to nearest."""
    s = up(x) + up(residual)
    y = rms_formula(s, up(weight), eps).to(x.dtype)
    r = s.to(x.dtype)
    return y, torch.where(up(r).abs() > s.abs(), torch.nextafter(r, torch.zeros_like(r)), r)


@bug("add_rms_norm", "accuracy", "extremes", "fusion")
def add_rms_forgets_add(x, residual, weight, eps):
    s = up(x) + up(residual)
    return rms_formula(up(x), up(weight), eps).to(x.dtype), s.to(x.dtype)


@bug("add_rms_norm", "accuracy", "extremes", "fusion")
def add_rms_stream_narrowed(x, residual, weight, eps):
    """A float32 residual stream's residual_out rounded to x's dtype first, then stored as float32."""
    s = up(x) + up(residual)
    return rms_formula(s, up(weight), eps).to(x.dtype), s.to(x.dtype).to(residual.dtype)


@bug("add_rms_norm", "accuracy", "extremes", "fusion")
def add_rms_y_from_narrowed_stream(x, residual, weight, eps):
    """y normalised from x + r rounded to x's dtype, though the residual stream it stores is float32.
    In bfloat16 that rounding is relative, of the size of the x.dtype roundings the model grants any
    kernel (the llama order), so it shows where the rounding is not relative: float16's overflow past
    65504 (a NaN y) and its subnormals below 6.1e-5."""
    s = up(x) + up(residual)
    return rms_formula(up(s.to(x.dtype)), up(weight), eps).to(x.dtype), s.to(residual.dtype)


# ------------------------------------------------------------------ add_rms_norm correct variants
@correct("add_rms_norm")
def add_rms_unfused(x, residual, weight, eps):
    """The sum rounded to the stream first, then ``rms_sequential_sum`` of it (every sum left to right)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return _RmsSequential.apply(s, weight, eps).to(x.dtype), s


# ------------------------------------------------------------------ gemma_rms_norm bugs
@bug("gemma_rms_norm", "accuracy", "extremes", "gradients")
def gemma_offset_forgotten(x, weight, eps):
    """The stored weight used as is: rms_norm(x, w), not rms_norm(x, 1 + w) (Liger#74)."""
    xf = up(x)
    return (xf * _rms(xf, eps) * up(weight, x)).to(x.dtype)


@bug("gemma_rms_norm", "accuracy", "extremes", "gradients")
def gemma_offset_in_low_precision(x, weight, eps):
    """1 + w formed in the weight's dtype before the upcast (Liger PR #1462): in bfloat16
    1 + 0.0039 is 1.  Rejected where the weight's dtype is coarser than the compute format
    (a float32 weight with float64 x); with a bfloat16 weight its error, one rounding of
    the factor (1 + w) to bfloat16, fits in the two output roundings the model allows."""
    xf = up(x)
    return (xf * _rms(xf, eps) * up(1 + weight, x)).to(x.dtype)


# ------------------------------------------------------------------ gemma_rms_norm correct variants
@correct("gemma_rms_norm")
def gemma_llama_order(x, weight, eps):
    """Gemma in the llama order: round x*rho to x.dtype, times 1 + w formed in fp32, round again."""
    xf = up(x)
    return (up((xf * _rms(xf, eps)).to(x.dtype), x) * (up(weight, x) + 1)).to(x.dtype)


@correct("gemma_rms_norm")
def gemma_sequential_sum(x, weight, eps):
    """``rms_sequential_sum`` with the weight 1 + w formed in the compute format."""
    return _RmsSequential.apply(x, up(weight, x) + 1, eps)
