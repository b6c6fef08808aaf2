"""Bugs that show at some shapes only: with the batch size, in one bucket the random search never
draws (``buckets.buckets``: a row past 4096 columns, a partial block, more than 65,535 rows,
more than 32 heads, more than 2**20 elements), or past 2**31 elements (at 2**16 here, a CPU's scale).

Most are rms_norm's; two are layer_norm's, two a gated activation's (a row past the random search's
widths, an MLP's).  layer_norm's ``ln_uncentred_backward``, killed by the
near-constant buckets (rows of a value, not a shape), is in ``layer_norms``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import layer_norm, rms_formula, swiglu, up
from ..expect import batch_size_bug, bucket_bug, bug, correct

__all__ = ["rms_batch_dependent", "rms_block_size_by_batch", "rms_ignores_tail_past_4096", "rms_drops_partial_block",
           "ln_rows_past_65535_unlaunched", "rms_elements_past_2_20_unwritten", "rms_heads_past_32_unlaunched",
           "rms_grad_ignores_tail_past_4096", "ln_grad_rows_past_65535_unlaunched", "SMALL_LIMIT",
           "rms_offsets_wrap_past_2_16", "rms_drops_partial_block_past_8192", "rms_blocks_of_8192",
           "silu_and_mul_one_block_of_8192", "swiglu_one_block_of_16384"]


# ------------------------------------------------------------------ a reduction order that depends on the batch
@bug("rms_norm", "batch-invariance")
def rms_batch_dependent(x, weight, eps):
    """Different reduction order when there is more than one row."""
    xf = up(x)
    rows = xf.reshape(-1, x.shape[-1])
    sq = rows.pow(2)
    ms = (sq.cumsum(-1)[..., -1:] if rows.shape[0] > 1 else sq.flip(-1).cumsum(-1)[..., -1:]) / x.shape[-1]
    return (rows * torch.rsqrt(ms + eps)).reshape(x.shape).mul(up(weight)).to(x.dtype)


@batch_size_bug("rms_norm", "batch-invariance")
def rms_block_size_by_batch(x, weight, eps):
    """vLLM#48271's shape: the reduction's block is 1024 lanes below 256 rows and 256 lanes from
    there on, and a row's blocks are added lane by lane in the compute precision, so a row longer
    than 256 gets other bits in a batch of 300 than alone.  Accurate, and right for any one batch
    size: only comparing batch sizes shows it."""
    xf = up(x)
    rows = xf.reshape(-1, x.shape[-1])
    lanes = 1024 if rows.shape[0] < 256 else 256
    blocks = F.pad(rows.pow(2), (0, -rows.shape[-1] % lanes)).reshape(rows.shape[0], -1, lanes)
    acc = blocks[:, 0]
    for k in range(1, blocks.shape[1]):
        acc = acc + blocks[:, k]  # in the compute precision (CPU's float32 .sum accumulates in double)
    ms = acc.sum(-1, keepdim=True) / x.shape[-1]
    return (rows * torch.rsqrt(ms + eps)).reshape(x.shape).mul(up(weight)).to(x.dtype)


# ------------------------------------------------------------------ bugs that hide in one bucket
# Right on every shape the random search draws; wrong only on the shapes ``buckets.buckets``
# schedules (``BUCKET_BUGS``, test_meta.py).  The backward ones are right in the forward: only the
# gradients family's buckets can see them (its random search draws rows of at most 4096).
@bucket_bug("rms_norm", "accuracy")
def rms_ignores_tail_past_4096(x, weight, eps):
    """One block of 4096 columns, no loop: the squares past column 4096 are never summed."""
    xf = up(x)
    ms = xf[..., :4096].pow(2).sum(-1, keepdim=True) / x.shape[-1]
    return (xf * torch.rsqrt(ms + eps) * up(weight)).to(x.dtype)


@bucket_bug("rms_norm", "accuracy")
def rms_drops_partial_block(x, weight, eps):
    """Loops over blocks of 512 columns, but past one block forgets the last partial block."""
    xf = up(x)
    n = x.shape[-1]
    full = n if n <= 512 else n // 512 * 512
    ms = xf[..., :full].pow(2).sum(-1, keepdim=True) / n
    return (xf * torch.rsqrt(ms + eps) * up(weight)).to(x.dtype)


def _rms_blocks_of_8192(x, weight, eps, drop_tail: bool):
    """Forward only (no autograd, as inference kernels ship): rows up to 8192 summed whole, longer
    rows 8192 columns at a time, the last partial block added unless ``drop_tail``."""
    with torch.no_grad():
        xf = up(x)
        n = x.shape[-1]
        sq = xf.pow(2)
        full = n if n <= 8192 else n // 8192 * 8192
        ss = sq[..., :full].unflatten(-1, (-1, min(n, 8192))).sum(-1).sum(-1, keepdim=True)
        if not drop_tail:
            ss = ss + sq[..., full:].sum(-1, keepdim=True)
        return (xf * torch.rsqrt(ss / n + eps) * up(weight)).to(x.dtype)


@bucket_bug("rms_norm", "accuracy")
def rms_drops_partial_block_past_8192(x, weight, eps):
    """Rows past 8192 summed block by block, the last partial block forgotten: 22 % off (sqrt(3/2)) at
    a hidden size of 12288 (8192 + 4096), one dropped term of 8193 inside the bound, right at 16384.  float64
    declared unsupported, as most GPU kernels declare it: the "past" and "model" buckets
    (``buckets.BLOCKS``, ``buckets.MODEL_WIDTHS``) must find it without float64's gradcheck."""
    return _rms_blocks_of_8192(x, weight, eps, drop_tail=True)


@correct("rms_norm")
def rms_blocks_of_8192(x, weight, eps):
    """``rms_drops_partial_block_past_8192``'s twin: the last partial block added."""
    return _rms_blocks_of_8192(x, weight, eps, drop_tail=False)


rms_drops_partial_block_past_8192.normcert_domain = rms_blocks_of_8192.normcert_domain = \
    "dtypes=float32,float16,bfloat16"


def _one_block(y, block: int):
    """y with its columns past ``block`` left as an output buffer's zeros: one block of a row, no loop."""
    y = y.clone()
    y[..., block:] = 0
    return y


@bucket_bug("silu_and_mul", "accuracy")
def silu_and_mul_one_block_of_8192(x):
    """SiluAndMul written for hidden sizes: one block of 8192 output columns, no loop over the rest, so
    an MLP row (Llama-3 8B's 14,336, Llama-2 70B's 28,672) is written only up to 8192.  The random
    search's x rows end at 16,384 (8192 out): only the "model" bucket reaches past it."""
    gate, value = x.chunk(2, dim=-1)
    return _one_block(swiglu(gate, value), 8192)


@bucket_bug("swiglu", "accuracy")
def swiglu_one_block_of_16384(gate, up_):
    """SwiGLU with one block of 16,384 columns and no loop: right up to the random search's longest
    row, the columns past it of an MLP row (28,672, 53,248) left zero."""
    return _one_block(swiglu(gate, up_), 16384)


@bucket_bug("layer_norm", "accuracy")
def ln_rows_past_65535_unlaunched(x, weight, bias, eps):
    """One program per row on a grid dimension capped at 65,535 (apex#411): later rows are never
    written and keep the output buffer's zeros."""
    n = x.shape[-1]
    y = layer_norm(x, weight, bias, eps).reshape(-1, n).clone()
    y[65535:] = 0
    return y.reshape(x.shape)


@bucket_bug("rms_norm", "accuracy")
def rms_elements_past_2_20_unwritten(x, weight, eps):
    """A flat element offset held in 20 bits (a packed index, a fixed-size workspace): every element
    past 2**20 of the output keeps the buffer's zeros.  Right on every call of up to 2**20 elements."""
    y = rms_formula(up(x), up(weight, x), eps).to(x.dtype).contiguous()
    y.view(-1)[1 << 20:] = 0
    return y


@bucket_bug("rms_norm", "accuracy")
def rms_heads_past_32_unlaunched(x, weight, eps):
    """QK-norm on a (tokens, heads, head_dim) view launched on a (tokens, 32) grid: heads past
    32 are never written and keep the output buffer's zeros."""
    y = rms_formula(up(x), up(weight, x), eps).to(x.dtype)
    if x.dim() == 3:
        y[:, 32:] = 0
    return y


class _RmsGradTailPast4096(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = up(x)
        ctx.save_for_backward(xf, weight)
        ctx.eps = eps
        return rms_formula(xf, up(weight, x), eps).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xf, weight = ctx.saved_tensors
        n = xf.shape[-1]
        rho = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        g = up(dy, xf) * up(weight, xf)
        dot = (g * xf)[..., :4096].sum(-1, keepdim=True) / n
        dx = rho * g - rho.pow(3) * xf * dot
        dw = (up(dy, xf) * xf * rho).reshape(-1, n).sum(0)
        return dx.to(dy.dtype), dw.to(weight.dtype), None


@bucket_bug("rms_norm", "gradients")
def rms_grad_ignores_tail_past_4096(x, weight, eps):
    """A right forward; dx = rho g - rho**3 x mean(g x), g = dy w, rho = 1/sqrt(mean(x**2) + eps),
    with the dot product's reduction in one block of 4096 columns: past it g x is never summed."""
    return _RmsGradTailPast4096.apply(x, weight, eps)


class _LnGradRowsPast65535(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.save_for_backward(x, weight, bias)
        ctx.eps = eps
        return layer_norm(x, weight, bias, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            xl, wl, bl = (t.detach().requires_grad_() for t in (x, weight, bias))
            dx, dw, db = torch.autograd.grad(layer_norm(xl, wl, bl, ctx.eps), (xl, wl, bl), dy)
        dx = dx.reshape(-1, x.shape[-1]).clone()
        dx[65535:] = 0
        return dx.reshape(x.shape), dw, db, None


@bucket_bug("layer_norm", "gradients")
def ln_grad_rows_past_65535_unlaunched(x, weight, bias, eps):
    """A right forward; the backward's one-program-per-row grid is capped at 65,535 rows, so
    later rows of dx keep the buffer's zeros (apex#411, in the backward kernel)."""
    return _LnGradRowsPast65535.apply(x, weight, bias, eps)


# ------------------------------------------------------------------ a bug past 2**31 elements, at a CPU's scale
SMALL_LIMIT = 2 ** 16  # the large family's cases, made to cross this instead of 2**31 (test_meta)


def rms_offsets_wrap_past_2_16(x, weight, eps):
    """Row r read at element (offset + r * stride) mod 2**16 of x's storage: an int32 row offset
    wrapping past 2**31 (FlashInfer#3005), at a scale the CPU can run.  Right below 2**16."""
    n, stride = x.shape[-1], x.stride(0)
    storage = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
    storage = torch.cat([storage, storage.new_zeros(n)])  # a wrapped read past the end sees zeros
    starts = [(x.storage_offset() + r * stride) % SMALL_LIMIT for r in range(x.shape[0])]
    rows = torch.stack([storage[a:a + n] for a in starts]) if starts else x
    return rms_formula(up(rows), up(weight), eps).to(x.dtype)
