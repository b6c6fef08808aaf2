"""Kernels with planted bugs the suite must reject, and correct variants it must certify.

Each bug is a small, plausible mistake (the kind seen in real kernels), grouped by op
(and, after the ops, the bugs that hide in one scheduled shape, the kernels as inference
libraries ship them, and those that write into caller buffers).  Each planted kernel says
what the meta-tests expect of it on its own decorator (``expect``: ``@bug``,
``@bucket_bug``, ``@batch_size_bug``, ``@correct``); ``test_meta.py`` reads the
catalogues with ``expect.catalogue``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ....impls.compiled import compiled_at_first_call
from ....impls.eager import (_or, fp4_round_scale, fp4_scales_in, group_scales, layer_norm, pack_fp4, pow2_up,
                             rms_formula, row_scales, scales_in, silu_mul_rows, to_e2m1, to_e4m3, to_qdtype, up)
from ....oracle.fp4 import BLOCK_FORMATS, padded
from ....oracle.dynamic_quant import EPS32, MIN_SCALE, qmax
from ....impls.eager import rms_norm as eager_rms_norm

from .expect import batch_size_bug, bucket_bug, bug, correct

# ------------------------------------------------------------------ helpers


def _rms(x, eps):
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _sequential_sum(v, dim):
    """Sum along ``dim`` (kept) by a left-to-right sum in v's dtype, every partial sum rounded
    (numpy's ``add.accumulate``; ``torch.cumsum`` accumulates float32 in float64 on CPU): the
    order whose error grows as n u, the error model's gam(n) S1, where a tree order's grows as
    log2(n) u.  A correct kernel may sum in any order; this one shows how much of the bound
    that freedom needs (``benchmarks/tightness.py``)."""
    if v.shape[dim] == 0:
        return v.sum(dim, keepdim=True)
    s = np.take(np.add.accumulate(v.detach().cpu().numpy(), axis=dim), [-1], axis=dim)
    return torch.from_numpy(np.ascontiguousarray(s)).to(v.device)


def _sequential_mean(v):
    """The mean over the last dim by ``_sequential_sum`` (0 for an empty row)."""
    return _sequential_sum(v, -1) / max(v.shape[-1], 1)


def _sequential_column_sum(v):
    """The sum over the rows of a 2-D v by ``_sequential_sum``."""
    return _sequential_sum(v, 0).squeeze(0)


def _rms_sequential(x, eps):
    """``_rms`` with the mean square summed left to right (``_sequential_mean``)."""
    return torch.rsqrt(_sequential_mean(x * x) + eps)


def _ln(x, eps, var_fn):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var_fn(x, mu) + eps)


def _two_pass_var(x, mu):
    return (x - mu).pow(2).mean(-1, keepdim=True)


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
    """Correct gradients, but dx is written over the incoming dy (an "in-place" backward)."""

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
        return dy.copy_(dx), dw, None


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
# Right on every shape the random search draws; wrong only on the shapes ``strategies.buckets``
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


# ------------------------------------------------------------------ rms_norm_gated bugs
def _grouped_rms(q, w, eps, group_size, interleaved=False):
    """rms_formula on each group of ``group_size`` consecutive elements of q's rows (None: the row);
    ``interleaved``: the groups taken at the wrong stride, group j the elements i = j mod k (k groups),
    as a kernel that indexes element t of group j at t k + j instead of j G + t."""
    if group_size is None:
        return rms_formula(q, w, eps)
    k = q.shape[-1] // group_size
    if not interleaved:
        return rms_formula(q.unflatten(-1, (k, group_size)), w.unflatten(-1, (k, group_size)), eps).flatten(-2)
    qt, wt = q.unflatten(-1, (group_size, k)).transpose(-1, -2), w.unflatten(-1, (group_size, k)).transpose(-1, -2)
    return rms_formula(qt, wt, eps).transpose(-1, -2).flatten(-2)


def _gated(x, z, weight, eps, norm_before_gate, group_size=None, gate_of=lambda x, z: z, interleaved=False):
    """The gated norm in the compute format, gated by silu(gate_of(x, z)), its statistics per group."""
    s = F.silu(up(gate_of(x, z)))
    if norm_before_gate:
        return (_grouped_rms(up(x), up(weight, x), eps, group_size, interleaved) * s).to(x.dtype)
    return _grouped_rms(up(x) * s, up(weight, x), eps, group_size, interleaved).to(x.dtype)


@bug("rms_norm_gated", "accuracy", "extremes", "gradients")
def gated_silu_of_x(x, z, weight, eps, norm_before_gate, group_size=None):
    """silu applied to x where the gate z is meant (a swapped argument of a fused kernel)."""
    return _gated(x, z, weight, eps, norm_before_gate, group_size, gate_of=lambda x, z: x)


@bug("rms_norm_gated", "accuracy", "extremes", "gradients")
def gated_order_ignored(x, z, weight, eps, norm_before_gate, group_size=None):
    """Always gate before normalising (Mamba-2's default), whatever ``norm_before_gate`` says."""
    return _gated(x, z, weight, eps, False, group_size)


@bug("rms_norm_gated", "accuracy", "extremes", "gradients")
def gated_groups_ignored(x, z, weight, eps, norm_before_gate, group_size=None):
    """group_size taken and ignored: the statistics over the whole row (a kernel written for
    flash-linear-attention's ungrouped norm, given Mamba-2's groups)."""
    return _gated(x, z, weight, eps, norm_before_gate)


@bug("rms_norm_gated", "accuracy", "extremes", "gradients")
def gated_group_stride(x, z, weight, eps, norm_before_gate, group_size=None):
    """The groups at the wrong stride: group j's statistics over the elements j, j + k, j + 2k, ...
    (k groups) instead of its G consecutive ones (the offset t k + j for j G + t)."""
    return _gated(x, z, weight, eps, norm_before_gate, group_size, interleaved=True)


class _GatedFp32Backward(torch.autograd.Function):
    """``forward_fn``'s forward with the gated norm's backward in fp32 (autograd through ``_gated``);
    ``drop_dz``: z's gradient 0, the dz path forgotten; ``backward_groups`` False: the backward's
    statistics over the whole row whatever group_size says."""

    @staticmethod
    def forward(ctx, x, z, weight, eps, norm_before_gate, group_size, forward_fn, drop_dz, backward_groups=True):
        ctx.save_for_backward(x, z, weight)
        ctx.eps, ctx.norm_before_gate, ctx.drop_dz = eps, norm_before_gate, drop_dz
        ctx.group_size = group_size if backward_groups else None
        return forward_fn(x, z, weight, eps, norm_before_gate, group_size)

    @staticmethod
    def backward(ctx, dy):
        x, z, weight = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (x, z, weight)]
            dx, dz, dw = torch.autograd.grad(_gated(*leaves, ctx.eps, ctx.norm_before_gate, ctx.group_size), leaves, dy)
        return dx, torch.zeros_like(z) if ctx.drop_dz else dz, dw, None, None, None, None, None, None


@bug("rms_norm_gated", "gradients")
def gated_no_dz(x, z, weight, eps, norm_before_gate, group_size=None):
    """Right forward, dx and dweight; the backward forgets z's path: dz = 0."""
    return _GatedFp32Backward.apply(x, z, weight, eps, norm_before_gate, group_size, _gated, True)


@bug("rms_norm_gated", "gradients")
def gated_backward_ignores_groups(x, z, weight, eps, norm_before_gate, group_size=None):
    """Right (grouped) forward; the backward normalises the whole row, as an ungrouped kernel's would."""
    return _GatedFp32Backward.apply(x, z, weight, eps, norm_before_gate, group_size, _gated, False, False)


# ------------------------------------------------------------------ rms_norm_dynamic_quant bugs
def _dq(x, weight, eps, qdtype, scale_ub, q=None, peak_of=None, cast=to_qdtype, divide=True, floor=True):
    """The eager dynamic quantisation with one thing changed: qmax ``q``, the rows the peak is
    taken of (``peak_of(x, v)``), the conversion ``cast(t, qdtype)``, a product for the division,
    no floor."""
    v = rms_formula(up(x), up(weight, x), eps)
    q = qmax(qdtype) if q is None else q
    scale = row_scales(v if peak_of is None else peak_of(up(x), v), scale_ub, q, MIN_SCALE / q if floor else 0.0)
    return cast(v / scale if divide else v * scale, qdtype), scale[..., 0]


@bug("rms_norm_dynamic_quant", "accuracy", "extremes")
def dq_scale_from_x(x, weight, eps, qdtype, scale_ub):
    """The scale from the unnormalised x's peak, not rms_norm(x) w's."""
    return _dq(x, weight, eps, qdtype, scale_ub, peak_of=lambda x, v: x)


@bug("rms_norm_dynamic_quant", "accuracy", "extremes")
def dq_fp8_max_224(x, weight, eps, qdtype, scale_ub):
    """e4m3fnuz's largest value, 224, for an e4m3fn output: every scale 2x too large (sglang#30900)."""
    return _dq(x, weight, eps, qdtype, scale_ub, q=224.0 if qdtype == "float8_e4m3fn" else None)


@bug("rms_norm_dynamic_quant", "accuracy", "extremes")
def dq_bf16_before_cast(x, weight, eps, qdtype, scale_ub):
    """v / scale rounded to bfloat16, then to the quantised format: two roundings (flashinfer#4167)."""
    return _dq(x, weight, eps, qdtype, scale_ub, cast=lambda t, qd: to_qdtype(t.to(torch.bfloat16).float(), qd))


@bug("rms_norm_dynamic_quant", "accuracy", "extremes")
def dq_times_scale(x, weight, eps, qdtype, scale_ub):
    """y = Q(v * scale) where the contract is v / scale (flashinfer#3758, vLLM#55643)."""
    return _dq(x, weight, eps, qdtype, scale_ub, divide=False)


@bug("rms_norm_dynamic_quant", "accuracy", "extremes")
def dq_int8_truncated(x, weight, eps, qdtype, scale_ub):
    """int8 by a float -> int conversion, which truncates toward zero, instead of rounding."""
    def cast(t, qd):
        return t.clamp(-128, 127).to(torch.int8) if qd == "int8" else to_qdtype(t, qd)
    return _dq(x, weight, eps, qdtype, scale_ub, cast=cast)


@bug("rms_norm_dynamic_quant", "extremes")
def dq_no_scale_floor(x, weight, eps, qdtype, scale_ub):
    """No floor on the scale: an all-zero row gets scale 0 and y = 0 / 0."""
    return _dq(x, weight, eps, qdtype, scale_ub, floor=False)


@bug("add_rms_norm_dynamic_quant", "accuracy", "extremes", "fusion")
def add_dq_scale_before_add(x, residual, weight, eps, qdtype, scale_ub):
    """y and residual_out of s = x + residual, but the scale taken of rms_norm(x) w, before the add."""
    s = up(x) + up(residual)
    v = rms_formula(s, up(weight, x), eps)
    _, scale = _dq(x, weight, eps, qdtype, scale_ub)
    return to_qdtype(v / scale[..., None], qdtype), scale, s.to(residual.dtype)


def _nan_dropping_peak(v):
    """amax |v| per row (keepdim) as IEEE maximumNumber takes it (Triton's tl.max): a NaN element
    dropped, 0 where a row has no other."""
    return torch.where(v.isnan(), 0.0, v.abs()).amax(-1, keepdim=True)


def _dq_nan_ignored(x, weight, eps, qdtype, scale_ub, zero_nan=False):
    """SGLang's order (v = x rho w in the compute format) with the peak of maximumNumber; y keeps NaN
    where v is NaN, or (``zero_nan``) quantises those elements as 0."""
    v = rms_formula(up(x), up(weight, x), eps)
    q = qmax(qdtype)
    peak = _nan_dropping_peak(v)
    scale = ((peak if scale_ub is None else peak.clamp(max=scale_ub)) / q).clamp(min=MIN_SCALE / q).float()
    return to_qdtype(torch.where(v.isnan(), 0.0, v) / scale if zero_nan else v / scale, qdtype), scale[..., 0]


@bug("rms_norm_dynamic_quant", "extremes")
def dq_nan_ignored_nan_zeroed(x, weight, eps, qdtype, scale_ub):
    """Declares nan=ignore and takes its amax so, but reads NaN elements as 0 in y too: a NaN
    activation comes out 0 (the contract keeps y NaN where v is, float8's NaN encoding)."""
    return _dq_nan_ignored(x, weight, eps, qdtype, scale_ub, zero_nan=True)


dq_nan_ignored_nan_zeroed.normcert_domain = "nan=ignore"


def _dq_floored(x, weight, eps, qdtype, scale_ub, floor):
    """SGLang's order (v = x rho w in the compute format) with the scale floored at ``floor``."""
    v = rms_formula(up(x), up(weight, x), eps)
    scale = row_scales(v, scale_ub, qmax(qdtype), floor)
    return to_qdtype(v / scale, qdtype), scale[..., 0]


@bug("rms_norm_dynamic_quant", "extremes")
def dq_floor_not_as_declared(x, weight, eps, qdtype, scale_ub):
    """Declares scale_floor=eps32 (float32's machine epsilon) but floors at vLLM's 1 / (512 q): an
    all-zero row's scale is not the one its contract says."""
    return _dq_floored(x, weight, eps, qdtype, scale_ub, MIN_SCALE / qmax(qdtype))


dq_floor_not_as_declared.normcert_domain = "scale_floor=eps32"


# ------------------------------------------------------------------ rms_norm_fp4_quant bugs
def _fp4(x, weight, eps, block_format, global_scale, layout, six=6.0, peak_of=None, scale_of=None,
         value_global=None, round_values=to_e2m1, pack=pack_fp4, lay=None, recip=None):
    """The eager FP4 quantisation with one thing changed: the 6 the scale divides the peak by, the
    values the peaks are taken of (``peak_of(x, v)``), the scale (``scale_of(peak, block_format,
    global_scale)``), the global scale the values are divided by, the E2M1 rounding, the packing,
    the scales' layout (``lay(scales, block_format, layout)``), the reciprocal (``recip``: a
    division is v * recip(d))."""
    v = rms_formula(up(x), up(weight, x), eps)
    block = BLOCK_FORMATS[block_format].block
    blocks = lambda t: t.unflatten(-1, (t.shape[-1] // block, block))  # noqa: E731
    peak = blocks(v if peak_of is None else peak_of(up(x), v)).abs().amax(-1)
    if scale_of is None:
        scales = fp4_round_scale(peak / (six * global_scale), block_format)
    else:
        scales = scale_of(peak, block_format, global_scale)
    s = scales[..., None].to(v.dtype)
    gv = global_scale if value_global is None else value_global
    w = blocks(v) / (s * gv) if recip is None else blocks(v) * recip(s * gv)
    y = torch.where(s == 0, 0.0, round_values(w)).flatten(-2)
    return pack(y), (lay or fp4_scales_in)(scales, block_format, layout)


def _scale_down(exact, block_format):
    """The block scale rounded *down* into its format (E4M3 toward zero, UE8M0 to the power of two
    at or below): the block's peak over it passes 6."""
    if block_format == "mxfp4":
        exact = exact.clamp(2.0 ** -127, 2.0 ** 127)
        m, e = torch.frexp(exact)
        return torch.where(m == 0.5, exact, torch.ldexp(torch.ones_like(exact), e - 1)).float()
    s = to_e4m3(exact).float()
    below = (s.to(torch.float8_e4m3fn).view(torch.uint8) - 1).view(torch.float8_e4m3fn).float()
    return torch.where((s > exact) & (s > 0), below, s)


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_nibbles_swapped(x, weight, eps, block_format, global_scale, layout):
    """Element 2j in the high nibble of byte j, 2j + 1 in the low one."""
    swap = lambda y: pack_fp4(y.unflatten(-1, (-1, 2)).flip(-1).flatten(-2))  # noqa: E731
    return _fp4(x, weight, eps, block_format, global_scale, layout, pack=swap)


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_scale_rounded_down(x, weight, eps, block_format, global_scale, layout):
    """The block scale rounded down (E4M3 toward zero, UE8M0 to the power of two below), so a
    block's peak over it passes 6 and saturates."""
    return _fp4(x, weight, eps, block_format, global_scale, layout,
                scale_of=lambda peak, f, g: _scale_down(peak / (6.0 * g), f))


def _swizzle_with(offsets):
    def lay(scales, block_format, layout):
        if layout != "swizzled":
            return fp4_scales_in(scales, block_format, layout)
        stored = scales.to(BLOCK_FORMATS[block_format].scale_dtype)
        g = stored.shape[-1]
        flat = stored.reshape(-1, g).view(torch.uint8)
        rp, gp = padded(flat.shape[0], g)
        out = torch.zeros(rp * gp, dtype=torch.uint8)
        out[offsets(flat.shape[0], g, gp).flatten()] = flat.flatten()
        return out.view(stored.dtype).view(rp, gp)
    return lay


def _transposed_tiles(rows, groups, gp):
    """Each 128 x 4 tile stored column-major (scale (r, k) of a tile at (r mod 128) + 128 (k mod 4))."""
    r, k = torch.arange(rows)[:, None], torch.arange(groups)[None, :]
    return 512 * ((r // 128) * (gp // 4) + k // 4) + r % 128 + 128 * (k % 4)


def _linear_in_padded(rows, groups, gp):
    """The swizzled tensor indexed as if linear: scale (r, k) at r G' + k."""
    return torch.arange(rows)[:, None] * gp + torch.arange(groups)[None, :]


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_swizzle_transposed(x, weight, eps, block_format, global_scale, layout):
    """The swizzle's index map transposed within a tile: the 128 x 4 tile column-major."""
    return _fp4(x, weight, eps, block_format, global_scale, layout, lay=_swizzle_with(_transposed_tiles))


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_swizzled_as_linear(x, weight, eps, block_format, global_scale, layout):
    """The swizzled layout's padded tensor written as a linear one (row r's scales at r G')."""
    return _fp4(x, weight, eps, block_format, global_scale, layout, lay=_swizzle_with(_linear_in_padded))


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_global_scale_ignored(x, weight, eps, block_format, global_scale, layout):
    """The values divided by the block scale alone, not by block scale x global scale."""
    return _fp4(x, weight, eps, block_format, global_scale, layout, value_global=1.0)


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_global_scale_twice(x, weight, eps, block_format, global_scale, layout):
    """The global scale applied twice to the values."""
    return _fp4(x, weight, eps, block_format, global_scale, layout, value_global=global_scale ** 2)


# Not planted: e2m1 rounded half away from zero.  It differs from nearest-even only where v / (s g)
# is exactly a tie (0.25, 0.75, ..., 5), which the exact value is not here (rho = 1 / sqrt(mean + eps)
# is rational only where that sum is a square); wherever the kernel's rounded quotient lands on a tie, the exact one
# lies within its bound of the midpoint, so both neighbours are correct and either kernel passes.
# The rounding itself is checked against the format where it is defined (``test_fp4``).


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_max_four(x, weight, eps, block_format, global_scale, layout):
    """The block scale of amax / 4: E2M1's 6.0 replaced by 4.0 (values never reach 6)."""
    return _fp4(x, weight, eps, block_format, global_scale, layout, six=4.0)


@bug("rms_norm_fp4_quant", "accuracy", "extremes")
def fp4_amax_before_weight(x, weight, eps, block_format, global_scale, layout):
    """The block's amax taken of x rho, before the weight."""
    return _fp4(x, weight, eps, block_format, global_scale, layout, peak_of=lambda xf, v: xf * _rms(xf, eps))


def _rcp_approx(t):
    """1 / t one ulp of t's format off (up), as PTX's rcp.approx.ftz may be: within FN_ULPS = 2."""
    r = 1.0 / t
    return torch.nextafter(r, torch.full_like(r, float("inf")))


@correct("rms_norm_fp4_quant")
def fp4_rcp_approx(x, weight, eps, block_format, global_scale, layout):
    """FlashInfer's arithmetic: the values times an approximate reciprocal of (scale x global),
    one float32 ulp off (PTX rcp.approx.ftz), and the scale as the peak times approximate
    reciprocals of 6 and of g: judged by the bound's derived allowance, not a looser tolerance."""
    def scale(peak, block_format, g):  # peak * rcp(6) * rcp(g), each product rounded
        rcp = lambda c: _rcp_approx(torch.tensor(c, dtype=peak.dtype))  # noqa: E731
        return fp4_round_scale(peak * rcp(6.0) * rcp(float(g)), block_format)
    return _fp4(x, weight, eps, block_format, global_scale, layout, scale_of=scale, recip=_rcp_approx)


# ------------------------------------------------------------------ rms_norm_group_quant bugs
def _gq(x, weight, eps, group, scale_format, layout, q=448.0, peak_of=None, round_up=pow2_up, per_row=False):
    """The eager per-group quantisation with one thing changed: qmax ``q``, the values the peaks
    are taken of (``peak_of(x, v)``), the rounding of a UE8M0 scale, one scale per row."""
    v = rms_formula(up(x), up(weight, x), eps)
    n = v.shape[-1]
    grouped = lambda t: t.unflatten(-1, (n // group, group))  # noqa: E731
    src = grouped(v if peak_of is None else peak_of(up(x), v))
    peak = src.abs().amax(-1)
    if per_row:
        peak = peak.amax(-1, keepdim=True).expand_as(peak)
    scales = group_scales(peak, scale_format, q, round_up)
    return to_e4m3(grouped(v) / scales[..., None]).flatten(-2), scales_in(scales, layout)


def _pow2_down(s):
    m, e = torch.frexp(s)
    return torch.where((m == 0.5) | s.isnan(), s, torch.ldexp(torch.ones_like(s), e - 1))


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_ue8m0_rounded_down(x, weight, eps, group, scale_format, layout):
    """A UE8M0 scale rounded *down* to a power of two: a group's peak over it reaches up to 2 x 448
    and saturates."""
    return _gq(x, weight, eps, group, scale_format, layout, round_up=_pow2_down)


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_groups_across_rows(x, weight, eps, group, scale_format, layout):
    """Walks x's memory as if its rows were packed back to back (a kernel indexing row * n + col):
    for strided or transposed rows its groups take elements of other rows, or the gaps between them."""
    packed = torch.as_strided(x, x.shape, torch.empty(x.shape).stride(), x.storage_offset())
    return _gq(packed, weight, eps, group, scale_format, layout)


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_scale_per_row(x, weight, eps, group, scale_format, layout):
    """One scale per row (a per-token kernel's), repeated for each of its groups."""
    return _gq(x, weight, eps, group, scale_format, layout, per_row=True)


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_layout_ignored(x, weight, eps, group, scale_format, layout):
    """The scales always row-major, whatever ``layout`` asks (a GEMM reading them column-major
    would read other groups' scales)."""
    return _gq(x, weight, eps, group, scale_format, "row_major")


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_fp8_max_224(x, weight, eps, group, scale_format, layout):
    """e4m3fnuz's largest value, 224, for an e4m3fn output: every scale 2x too large."""
    return _gq(x, weight, eps, group, scale_format, layout, q=224.0)


def _tailed_groups(v, group, scale_format, layout, tail_scale="own", tail_values="kept"):
    """v's rows (in the compute format) quantised per group of ``group`` elements, the last one
    partial where group does not divide the row (tail=partial): the row padded with zeros to
    ceil(n / group) whole groups (a zero never raises an amax; a NaN is kept), each group's peak and
    scale, y = e4m3(v times the scale's reciprocal) cut back to n.  One thing changed for a bug: the
    partial group's scale that of the whole group before it (``tail_scale="previous"``), or its
    values dropped, quantised as the pad's zeros (``tail_values="dropped"``)."""
    n = v.shape[-1]
    count, partial = -(-n // group), n % group
    g = F.pad(v, (0, count * group - n)).unflatten(-1, (count, group))
    scales = group_scales(g.abs().amax(-1), scale_format, 448.0)
    if partial and count > 1 and tail_scale == "previous":
        scales = torch.cat([scales[..., :-1], scales[..., -2:-1]], dim=-1)
    w = (g * (1 / scales[..., None].to(g.dtype))).flatten(-2)[..., :n]
    if partial and tail_values == "dropped":
        w = torch.cat([w[..., :n - partial], torch.zeros_like(w[..., n - partial:])], dim=-1)
    return to_e4m3(w).contiguous(), scales_in(scales, layout)


def _gq_tailed(x, weight, eps, group, scale_format, layout, **bug):
    """vLLM's rms_norm_group_quant order (``gq_vllm_order``) with a partial last group (``_tailed_groups``)."""
    xf = up(x)
    v = up((up((xf * _rms_sequential(xf, eps)).to(x.dtype), x) * up(weight, x)).to(x.dtype), x)
    return _tailed_groups(v, group, scale_format, layout, **bug)


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_tail_scale_of_previous_group(x, weight, eps, group, scale_format, layout):
    """Declares tail=partial but scales its partial last group by the whole group before it (a kernel
    that reads the last full group's amax for the leftover elements)."""
    return _gq_tailed(x, weight, eps, group, scale_format, layout, tail_scale="previous")


gq_tail_scale_of_previous_group.normcert_domain = "tail=partial"


@bug("rms_norm_group_quant", "accuracy", "extremes")
def gq_tail_values_dropped(x, weight, eps, group, scale_format, layout):
    """Declares tail=partial, pads the tail with zeros and takes its amax over the pad (right: a zero
    raises no amax), but drops its values: the partial group's y comes out 0."""
    return _gq_tailed(x, weight, eps, group, scale_format, layout, tail_values="dropped")


gq_tail_values_dropped.normcert_domain = "tail=partial"


@bug("add_rms_norm_group_quant", "accuracy", "extremes", "fusion")
def add_gq_scale_before_add(x, residual, weight, eps, group, scale_format, layout):
    """y and residual_out of s = x + residual, but each group's scale taken of rms_norm(x) w, before
    the add."""
    s = up(x) + up(residual)
    v = rms_formula(s, up(weight, x), eps)
    _, scales = _gq(x, weight, eps, group, scale_format, "row_major")
    n = v.shape[-1]
    y = to_e4m3(v.unflatten(-1, (n // group, group)) / scales[..., None]).flatten(-2)
    return y, scales_in(scales, layout), s.to(residual.dtype)


@bug("add_rms_norm_group_quant", "accuracy", "fusion")
def add_gq_sum_in_x_dtype(x, residual, weight, eps, group, scale_format, layout):
    """x + residual rounded to x's dtype, normalised and stored as residual_out: right for a stream
    in x's dtype, but a float32 residual stream (``residual_in_fp32``) loses its low bits each layer."""
    s = (up(x) + up(residual)).to(x.dtype)
    y, scales = _gq(s, weight, eps, group, scale_format, layout)
    return y, scales, s.to(residual.dtype)


# ------------------------------------------------------------------ silu_and_mul quant bugs
def _silu_mul(x, product_dtype=None, peak_of=None):
    """(v, the values the scale's peak is taken of): v = silu(gate) * up in the compute format (or
    rounded to ``product_dtype``), the peak of v unless ``peak_of(gate, v)`` says otherwise."""
    gate, value = up(x).chunk(2, dim=-1)
    v = F.silu(gate) * value
    if product_dtype is not None:
        v = up(v.to(product_dtype), x)
    return v, v if peak_of is None else peak_of(gate, v)


def _sdq(x, qdtype, scale_ub, product_dtype=None, peak_of=None, cap=True, floor=True):
    """The eager silu_and_mul_dynamic_quant with one thing changed: v rounded to ``product_dtype``,
    the peak of other values, no cap at scale_ub, no floor."""
    v, src = _silu_mul(x, product_dtype, peak_of)
    q = qmax(qdtype)
    scale = row_scales(src, scale_ub if cap else None, q, MIN_SCALE / q if floor else 0.0)
    return to_qdtype(v / scale, qdtype), scale[..., 0]


@bug("silu_and_mul_dynamic_quant", "accuracy", "extremes")
def sdq_product_in_bf16(x, qdtype, scale_ub):
    """silu(gate) * up rounded to bfloat16 before the scale and the division, whatever x's dtype
    (a kernel written for bfloat16 activations): right for bfloat16 x, where that is one of the two
    roundings to x's dtype a correct kernel may make, 2**-9 relative off for float16 and float32."""
    return _sdq(x, qdtype, scale_ub, product_dtype=torch.bfloat16)


@bug("silu_and_mul_dynamic_quant", "accuracy", "extremes")
def sdq_scale_ignores_ub(x, qdtype, scale_ub):
    """The scale of the row's peak, not capped at scale_ub: rows past the bound keep their range
    instead of saturating."""
    return _sdq(x, qdtype, scale_ub, cap=False)


@bug("silu_and_mul_dynamic_quant", "extremes")
def sdq_no_scale_floor(x, qdtype, scale_ub):
    """No floor on the scale: an all-zero row (gate 0, or up 0) gets scale 0 and y = 0 / 0."""
    return _sdq(x, qdtype, scale_ub, floor=False)


@bug("silu_and_mul_dynamic_quant", "accuracy", "extremes")
def sdq_scale_from_gate(x, qdtype, scale_ub):
    """The scale from silu(gate)'s peak instead of the product's: y saturates wherever |up| > 1."""
    return _sdq(x, qdtype, scale_ub, peak_of=lambda gate, v: F.silu(gate))


def _sgq(x, group, scale_format, layout, product_dtype=None, peak_of=None, floor=True, interleaved=False):
    """The eager silu_and_mul_group_quant with one thing changed: v rounded to ``product_dtype``,
    the peaks of other values, no floor, gate and up taken from interleaved blocks of ``group``."""
    if interleaved:  # x as [gate_0 | up_0 | gate_1 | up_1 | ...], blocks of ``group``
        blocks = x.unflatten(-1, (x.shape[-1] // (2 * group), 2, group))
        x = torch.cat([blocks[..., 0, :].flatten(-2), blocks[..., 1, :].flatten(-2)], dim=-1)
    v, src = _silu_mul(x, product_dtype, peak_of)
    n = v.shape[-1]
    grouped = lambda t: t.unflatten(-1, (n // group, group))  # noqa: E731
    q = qmax("float8_e4m3fn")
    peak = grouped(src).abs().amax(-1)
    scales = group_scales(peak, scale_format, q) if floor else \
        (lambda s: pow2_up(s) if scale_format == "ue8m0" else s)((peak / q).float())
    return to_e4m3(grouped(v) / scales[..., None]).flatten(-2), scales_in(scales, layout)


@bug("silu_and_mul_group_quant", "accuracy", "extremes")
def sgq_gate_up_interleaved(x, group, scale_format, layout):
    """Gate and up read as interleaved blocks of one group each ([gate_0 | up_0 | gate_1 | ...], a
    layout some fused MoE weights use) where the contract is x = [gate | up]: every group of the
    product crosses the gate / up boundary of x."""
    return _sgq(x, group, scale_format, layout, interleaved=True)


@bug("silu_and_mul_group_quant", "accuracy", "extremes")
def sgq_product_in_bf16(x, group, scale_format, layout):
    """silu(gate) * up rounded to bfloat16 before the scales, whatever x's dtype."""
    return _sgq(x, group, scale_format, layout, product_dtype=torch.bfloat16)


@bug("silu_and_mul_group_quant", "accuracy", "extremes")
def sgq_scale_from_gate(x, group, scale_format, layout):
    """Each group's scale from silu(gate)'s peak over the group instead of the product's."""
    return _sgq(x, group, scale_format, layout, peak_of=lambda gate, v: F.silu(gate))


@bug("silu_and_mul_group_quant", "extremes")
def sgq_no_scale_floor(x, group, scale_format, layout):
    """No floor on the scales: an all-zero group gets scale 0 and y = 0 / 0."""
    return _sgq(x, group, scale_format, layout, floor=False)


# ------------------------------------------------------------------ silu_and_mul_group_quant_masked bugs
def _masked(x, counts):
    """(valid rows, x with the rows past counts zeroed), as the eager masked kernel forms them."""
    valid = torch.arange(x.shape[-2], device=x.device) < counts[..., None]
    return valid, torch.where(valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))


@bug("silu_and_mul_group_quant_masked", "accuracy", "extremes", "padding")
def sgqm_scratch_in_padding(x, counts, group, scale_format, layout):
    """Right outputs, but silu(gate) * up is staged in x's own rows past counts[e] (they hold no
    token, so the kernel takes them as free scratch): it writes outside its outputs, into its input."""
    valid, kept = _masked(x, counts)
    v = silu_mul_rows(kept)
    x[..., : v.shape[-1]][~valid] = v[~valid].to(x.dtype)
    return _sgq(kept, group, scale_format, layout)


@bug("silu_and_mul_group_quant_masked", "accuracy", "extremes", "padding")
def sgqm_packed_token_offsets(x, counts, group, scale_format, layout):
    """Expert e's tokens read from row sum(counts[:e]) + t of x's rows flattened, as if the experts'
    tokens were packed back to back (a grouped-GEMM layout) where the contract pads each to tokens."""
    valid = torch.arange(x.shape[-2], device=x.device) < counts[..., None]
    tokens, flat = x.shape[-2], x.reshape(-1, x.shape[-1])
    c = counts.reshape(-1).long()
    start = torch.cumsum(c, 0) - c
    rows = (start[:, None] + torch.arange(tokens, device=x.device)[None, :]).clamp(max=max(flat.shape[0] - 1, 0))
    packed = flat[rows.reshape(-1)].reshape(x.shape) if flat.shape[0] else x
    return _sgq(torch.where(valid[..., None], packed, torch.zeros((), dtype=x.dtype)), group, scale_format, layout)


@bug("silu_and_mul_group_quant_masked", "accuracy", "extremes", "padding")
def sgqm_scale_over_expert(x, counts, group, scale_format, layout):
    """Each group's scale the peak over all of the expert's rows, padding included (one scale per
    expert and group, read from rows that hold no token)."""
    v = silu_mul_rows(x)
    n = v.shape[-1]
    g = v.unflatten(-1, (n // group, group))
    peak = g.abs().amax(-1).amax(-2, keepdim=True).expand(g.shape[:-1])
    scales = group_scales(peak, scale_format, 448.0)
    return to_e4m3(g / scales[..., None]).flatten(-2), scales_in(scales, layout)


# ------------------------------------------------------------------ add_rms_norm_fp4_quant bugs
@bug("add_rms_norm_fp4_quant", "accuracy", "extremes", "fusion")
def add_fp4_scale_before_add(x, residual, weight, eps, block_format, global_scale, layout):
    """y and residual_out of s = x + residual, but each block's amax taken of rms_norm(x) w, before
    the add."""
    s = up(x) + up(residual)
    return (*_fp4(s, weight, eps, block_format, global_scale, layout,
                  peak_of=lambda sf, v: rms_formula(up(x), up(weight, x), eps)), s.to(residual.dtype))


@bug("add_rms_norm_fp4_quant", "accuracy", "fusion")
def add_fp4_sum_in_x_dtype(x, residual, weight, eps, block_format, global_scale, layout):
    """x + residual rounded to x's dtype, normalised and stored as residual_out: wrong for a float32
    residual stream beside a half-precision x."""
    s = (up(x) + up(residual)).to(x.dtype)
    return (*_fp4(s, weight, eps, block_format, global_scale, layout), s.to(residual.dtype))


@correct("add_rms_norm_fp4_quant")
def add_fp4_unfused(x, residual, weight, eps, block_format, global_scale, layout):
    """The sum rounded to the residual stream's dtype first, then the approximate-reciprocal
    rms_norm_fp4_quant of it."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return (*fp4_rcp_approx(s, weight, eps, block_format, global_scale, layout), s)


# ------------------------------------------------------------------ silu_and_mul_fp4_quant bugs
def _silu_fp4(x, block_format, global_scale, layout, v_of=None, peak_of=None, recip=None):
    """The eager silu_and_mul_fp4_quant with one thing changed: v (``v_of(gate, up)``), the values
    the block peaks are taken of (``peak_of(gate, up, v)``), the reciprocal."""
    gate, value = (up(t) for t in x.chunk(2, dim=-1))
    v = F.silu(gate) * value if v_of is None else v_of(gate, value)
    block = BLOCK_FORMATS[block_format].block
    blocks = lambda t: t.unflatten(-1, (t.shape[-1] // block, block))  # noqa: E731
    peak = blocks(v if peak_of is None else peak_of(gate, value, v)).abs().amax(-1)
    scales = fp4_round_scale(peak / (6.0 * global_scale), block_format)
    s = scales[..., None].to(v.dtype)
    w = blocks(v) / (s * global_scale) if recip is None else blocks(v) * recip(s * global_scale)
    y = torch.where(s == 0, 0.0, to_e2m1(w)).flatten(-2)
    return pack_fp4(y), fp4_scales_in(scales, block_format, layout)


@bug("silu_and_mul_fp4_quant", "accuracy", "extremes")
def silu_fp4_scale_of_gate(x, block_format, global_scale, layout):
    """Each block's scale taken of silu(gate) alone, not of the product it quantises."""
    return _silu_fp4(x, block_format, global_scale, layout, peak_of=lambda g, u, v: F.silu(g))


@bug("silu_and_mul_fp4_quant", "accuracy", "extremes")
def silu_fp4_halves_swapped(x, block_format, global_scale, layout):
    """silu(up) * gate: x's halves read the other way round."""
    return _silu_fp4(x, block_format, global_scale, layout, v_of=lambda g, u: F.silu(u) * g)


@correct("silu_and_mul_fp4_quant")
def silu_fp4_rcp_approx(x, block_format, global_scale, layout):
    """Quantised with reciprocals one ulp off (PTX rcp.approx).  (Not a twin that stores
    silu(gate) * up in x's dtype first: in float16 that product overflows where the FP4 scale
    holds it, silu(1e3) * 1e3 = 1e6, and the meta-test rightly rejected it.)"""
    return _silu_fp4(x, block_format, global_scale, layout, recip=_rcp_approx)


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


# ------------------------------------------------------------------ swiglu bugs
class _SwiGLUWrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up_):
        ctx.save_for_backward(gate, up_)
        return (F.silu(up(gate)) * up(up_)).to(gate.dtype)

    @staticmethod
    def backward(ctx, dy):
        gate, up_ = ctx.saved_tensors
        g, u, d = up(gate), up(up_), up(dy)
        s = torch.sigmoid(g)
        return (d * u * s).to(gate.dtype), (d * g * s).to(up_.dtype)  # d silu = s (1 + g (1 - s)), not s


@bug("swiglu", "gradients")
def swiglu_wrong_derivative(gate, up_):
    return _SwiGLUWrongGrad.apply(gate, up_)


@bug("swiglu", "accuracy", "extremes")
def swiglu_no_upcast(gate, up_):
    return gate / (1 + torch.exp(-gate)) * up_


@bug("silu_and_mul", "accuracy", "extremes")
def silu_and_mul_swapped(x):
    value, gate = x.chunk(2, dim=-1)
    return (F.silu(up(gate)) * up(value)).to(x.dtype)


@bug("swiglu", "accuracy", "contract", "extremes", "gradients")
def swiglu_empty_crash(gate, up_):
    if gate.numel() == 0:
        raise RuntimeError("grid must be non-empty")
    return (F.silu(up(gate)) * up(up_)).to(gate.dtype)


# ------------------------------------------------------------------ weightless-call bugs
@bug("rms_norm", "accuracy", "extremes")
def rms_weightless_as_zeros(x, weight, eps):
    """weight=None read as a buffer of zeros (a default allocated with zeros, not ones)."""
    w = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device) if weight is None else weight
    return rms_formula(up(x), up(w, x), eps).to(x.dtype)


@bug("layer_norm", "accuracy", "extremes")
def ln_weightless_bias_as_ones(x, weight, bias, eps):
    """bias=None filled like a missing weight: ones, not zeros."""
    ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    return layer_norm(x, ones if weight is None else weight, ones if bias is None else bias, eps)


# ------------------------------------------------------------------ geglu / gelu_and_mul bugs
TANH_C = 0.7978845608028654  # sqrt(2 / pi)


def _gelu_tanh(g):
    return 0.5 * g * (1 + torch.tanh(TANH_C * (g + 0.044715 * g * g * g)))


@bug("geglu", "accuracy", "extremes")
def geglu_tanh_always(gate, up_, approximate):
    """The tanh form whatever ``approximate`` says: T5 v1.1 asks for erf-GELU, Gemma for tanh."""
    return (_gelu_tanh(up(gate)) * up(up_)).to(gate.dtype)


@bug("geglu", "accuracy", "extremes")
def geglu_quick_gelu(gate, up_, approximate):
    """g sigma(1.702 g) (CLIP's QuickGELU) taken for the tanh form."""
    g = up(gate)
    gelu = g * torch.sigmoid(1.702 * g) if approximate == "tanh" else F.gelu(g)
    return (gelu * up(up_)).to(gate.dtype)


@bug("gelu_and_mul", "accuracy", "extremes")
def gelu_and_mul_swapped(x, approximate):
    """gelu(up) * gate: the halves the other way round."""
    value, gate = x.chunk(2, dim=-1)
    return (F.gelu(up(gate), approximate=approximate) * up(value)).to(x.dtype)


@bug("geglu", "accuracy", "extremes")
def geglu_no_upcast(gate, up_, approximate):
    """The formula in x.dtype: every step rounds to bfloat16 / float16."""
    if approximate == "tanh":
        return _gelu_tanh(gate) * up_
    return 0.5 * gate * (1 + torch.erf(gate * 0.7071067811865476)) * up_


class _GeGLUGrad(torch.autograd.Function):
    """The erf form's forward; its backward takes gelu'(g) from ``derivative``."""

    @staticmethod
    def forward(ctx, gate, up_, approximate, derivative):
        ctx.save_for_backward(gate, up_)
        ctx.approximate, ctx.derivative = approximate, derivative
        return (F.gelu(up(gate), approximate=approximate) * up(up_)).to(gate.dtype)

    @staticmethod
    def backward(ctx, dy):
        gate, up_ = ctx.saved_tensors
        g, u, d = up(gate), up(up_), up(dy)
        return ((d * u * ctx.derivative(g, ctx.approximate)).to(gate.dtype),
                (d * F.gelu(g, approximate=ctx.approximate)).to(up_.dtype), None, None)


def _cdf_only(g, approximate):
    """gelu'(g) taken as Phi(g) (or (1 + tanh t) / 2): the g phi(g) term forgotten."""
    if approximate == "tanh":
        return 0.5 * (1 + torch.tanh(TANH_C * (g + 0.044715 * g ** 3)))
    return 0.5 * (1 + torch.erf(g * 0.7071067811865476))


def _tanh_derivative_no_3(g, approximate):
    """t'(g) = sqrt(2 / pi) (1 + 0.044715 g**2): the 3 of d(g**3)/dg forgotten (the erf form is right)."""
    if approximate == "none":
        return 0.5 * (1 + torch.erf(g * 0.7071067811865476)) + g * torch.exp(-0.5 * g * g) * 0.3989422804014327
    th = torch.tanh(TANH_C * (g + 0.044715 * g ** 3))
    return 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * TANH_C * (1 + 0.044715 * g * g)


@bug("geglu", "gradients")
def geglu_cdf_only_derivative(gate, up_, approximate):
    return _GeGLUGrad.apply(gate, up_, approximate, _cdf_only)


@bug("geglu", "gradients")
def geglu_tanh_derivative_no_3(gate, up_, approximate):
    return _GeGLUGrad.apply(gate, up_, approximate, _tanh_derivative_no_3)


# ------------------------------------------------------------------ near misses: wrong by a small factor
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


@bug("swiglu", "accuracy", "extremes")
def swiglu_sigmoid_by_tanh(gate, up_):
    """sigmoid(g) as tanh(g / 2) / 2 + 1/2 (vLLM#24833): 1/2 - 1/2 cancels for g << 0, where
    silu(g) = g sigmoid(g) is tiny but not 0."""
    g = up(gate)
    return (g * (torch.tanh(g / 2) / 2 + 0.5) * up(up_)).to(gate.dtype)


# ------------------------------------------------------------------ correct variants
@correct("rms_norm")
def rms_llama_order(x, weight, eps):
    """Compute in fp32, round x*rho to x.dtype, multiply by the weight (as given), round again."""
    xf = up(x)
    return (up((xf * _rms(xf, eps)).to(x.dtype), x) * up(weight, x)).to(x.dtype)


def rms_once_twin(x, weight, eps):
    """rms_norm's eager kernel as a kernel of another name and module (the same bits: ``--agree``'s
    passing pair with the eager kernel; rms_llama_order is its failing one)."""
    return eager_rms_norm(x, weight, eps)


@correct("gemma_rms_norm")
def gemma_llama_order(x, weight, eps):
    """Gemma in the llama order: round x*rho to x.dtype, times 1 + w formed in fp32, round again."""
    xf = up(x)
    return (up((xf * _rms(xf, eps)).to(x.dtype), x) * (up(weight, x) + 1)).to(x.dtype)


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


def _gated_vllm_forward(x, z, weight, eps, norm_before_gate, group_size=None):
    """vLLM's RMSNormGated order: gate first in fp32 (x silu(z)); or normalise, round w x rho to
    x.dtype, then multiply by silu(z) in fp32 and round again (per group, as ``_grouped_rms``)."""
    if not norm_before_gate:
        return _gated(x, z, weight, eps, False, group_size)
    return (up(_grouped_rms(up(x), up(weight, x), eps, group_size).to(x.dtype)) * F.silu(up(z))).to(x.dtype)


@correct("rms_norm_gated")
def gated_vllm_order(x, z, weight, eps, norm_before_gate, group_size=None):
    """vLLM's forward order (an inference kernel) with a training kernel's backward, all in fp32.
    (Autograd through its rounding of r would round r's cotangent dy silu(z) to x.dtype, which
    overflows float16 where silu(z) is large: no correct backward does that.)"""
    return _GatedFp32Backward.apply(x, z, weight, eps, norm_before_gate, group_size, _gated_vllm_forward, False)


def _gated_transformers_forward(x, z, weight, eps, norm_before_gate, group_size=None):
    """transformers' order, the weight in x's dtype (a module cast to it): gating after (Qwen3-Next's
    RMSNormGated), x rho rounded to x.dtype, times the weight, rounded, times silu(z) in fp32,
    rounded again; gating first (Mamba-2's MambaRMSNormGated), x silu(z) normalised in fp32, rounded
    to x.dtype, times the weight, rounded."""
    xf, w = up(x), weight.to(x.dtype)
    ones = xf.new_ones(xf.shape[-1])
    normalised = lambda q: _grouped_rms(q, ones, eps, group_size)  # noqa: E731 - q rho per group
    if not norm_before_gate:
        g = xf * F.silu(up(z, x))
        return w * normalised(g).to(x.dtype)
    return (up(w * normalised(xf).to(x.dtype), x) * F.silu(up(z, x))).to(x.dtype)


@correct("rms_norm_gated")
def gated_transformers_order(x, z, weight, eps, norm_before_gate, group_size=None):
    """transformers' forward order with a training kernel's backward in fp32 (``gated_vllm_order``'s):
    a float32 weight beside a half-precision x is rounded to x's dtype, one more rounding than
    rms_norm's two where the gate comes first (``bounds_gated_norm._weight_rounding``)."""
    return _GatedFp32Backward.apply(x, z, weight, eps, norm_before_gate, group_size, _gated_transformers_forward,
                                    False)


@correct("rms_norm_dynamic_quant")
def dq_vllm_order(x, weight, eps, qdtype, scale_ub):
    """vLLM's order: x rho rounded to x.dtype, times the weight and rounded again (v in x.dtype);
    the peak of that; y = v times the reciprocal of the float32 scale, taken in the compute
    format (a float32 reciprocal of a float64 v errs by u_32, past float64's bound).  Its sum of
    squares is left to right (``_rms_sequential``: the order whose roundings can add up to the
    model's gam(n))."""
    xf = up(x)
    v = up((up((xf * _rms_sequential(xf, eps)).to(x.dtype), x) * up(weight, x)).to(x.dtype), x)
    q = qmax(qdtype)
    scale = row_scales(v, scale_ub, q, MIN_SCALE / q)
    return to_qdtype(v * (1 / scale.to(v.dtype)), qdtype), scale[..., 0]


@correct("rms_norm_dynamic_quant")
def dq_nan_ignored(x, weight, eps, qdtype, scale_ub):
    """A Triton-style per-token kernel's amax (maximumNumber: NaN dropped, ``_dq_nan_ignored``),
    declared: certified under nan=ignore, rejected by extremes without it (``test_contract_choices``)."""
    return _dq_nan_ignored(x, weight, eps, qdtype, scale_ub)


dq_nan_ignored.normcert_domain = "nan=ignore"


@correct("rms_norm_dynamic_quant")
def dq_eps32_floor(x, weight, eps, qdtype, scale_ub):
    """An int8 path's floor: the scale clamped to float32's machine epsilon, declared
    (scale_floor=eps32): certified so, rejected by extremes without it (``test_contract_choices``)."""
    return _dq_floored(x, weight, eps, qdtype, scale_ub, EPS32)


dq_eps32_floor.normcert_domain = "scale_floor=eps32"


@correct("rms_norm_group_quant")
def gq_vllm_order(x, weight, eps, group, scale_format, layout):
    """vLLM's order: v = x rho rounded to x.dtype, times the weight and rounded again; per group,
    the peak of that; y = v times the reciprocal of the float32 scale, taken in the compute
    format.  Its sum of squares is left to right (``_rms_sequential``)."""
    xf = up(x)
    v = up((up((xf * _rms_sequential(xf, eps)).to(x.dtype), x) * up(weight, x)).to(x.dtype), x)
    n = v.shape[-1]
    g = v.unflatten(-1, (n // group, group))
    scales = group_scales(g.abs().amax(-1), scale_format, 448.0)
    return to_e4m3(g * (1 / scales[..., None].to(g.dtype))).flatten(-2), scales_in(scales, layout)


@correct("rms_norm_group_quant")
def gq_tail_partial(x, weight, eps, group, scale_format, layout):
    """vLLM's order with a partial last group of its own scale (``_tailed_groups``), declared
    (tail=partial): fitted rows that are not a multiple of the group, and certified on them; the same
    kernel undeclared is drawn whole groups only (``test_tail``)."""
    return _gq_tailed(x, weight, eps, group, scale_format, layout)


gq_tail_partial.normcert_domain = "tail=partial"


def _silu_mul_sglang(x):
    """SGLang's order (``silu_and_mul_masked_post_quant_fwd``): silu(gate) in the compute format
    rounded to x's dtype, its product with up rounded to x's dtype again (two roundings)."""
    gate, value = x.chunk(2, dim=-1)
    s = F.silu(up(gate)).to(x.dtype)
    return up((up(s, x) * up(value)).to(x.dtype), x)


@correct("silu_and_mul_dynamic_quant")
def sdq_sglang_order(x, qdtype, scale_ub):
    """v in SGLang's order (``_silu_mul_sglang``), its peak, y = v times the reciprocal of the
    float32 scale taken in the compute format."""
    v = _silu_mul_sglang(x)
    q = qmax(qdtype)
    scale = row_scales(v, scale_ub, q, MIN_SCALE / q)
    return to_qdtype(v * (1 / scale.to(v.dtype)), qdtype), scale[..., 0]


@correct("silu_and_mul_group_quant")
def sgq_sglang_order(x, group, scale_format, layout):
    """v in SGLang's order (``_silu_mul_sglang``); per group, the peak of that; y = v times the
    reciprocal of the float32 scale taken in the compute format."""
    v = _silu_mul_sglang(x)
    n = v.shape[-1]
    g = v.unflatten(-1, (n // group, group))
    scales = group_scales(g.abs().amax(-1), scale_format, 448.0)
    return to_e4m3(g * (1 / scales[..., None].to(g.dtype))).flatten(-2), scales_in(scales, layout)


@correct("silu_and_mul_group_quant")
def sgq_tail_partial(x, group, scale_format, layout):
    """SGLang's order (``_silu_mul_sglang``) with a partial last group of the output row
    (``_tailed_groups``), declared (tail=partial)."""
    return _tailed_groups(_silu_mul_sglang(x), group, scale_format, layout)


sgq_tail_partial.normcert_domain = "tail=partial"


@correct("silu_and_mul_group_quant_masked")
def sgqm_padding_left_unwritten(x, counts, group, scale_format, layout):
    """Only each expert's first counts[e] rows computed, one expert at a time; the outputs past them
    left as an uninitialised buffer may leave them (NaN bits here, so that a check reading them
    would fail): the contract does not read them."""
    n = x.shape[-1] // 2
    y = torch.full(x.shape[:-1] + (n,), float("nan"), dtype=torch.float32).to(torch.float8_e4m3fn)
    scales = torch.full(x.shape[:-1] + (n // group,), float("nan"), dtype=torch.float32)
    flat_x, flat_y, flat_s = x.reshape(-1, *x.shape[-2:]), y.view(-1, *y.shape[-2:]), scales.view(-1, *scales.shape[-2:])
    for e, c in enumerate(counts.reshape(-1).tolist()):
        if c:
            flat_y[e, :c], flat_s[e, :c] = _sgq(flat_x[e, :c], group, scale_format, "row_major")
    return y, scales_in(scales, layout)


@correct("add_rms_norm_group_quant")
def add_gq_unfused(x, residual, weight, eps, group, scale_format, layout):
    """The sum rounded to the residual stream's dtype first, then vLLM's rms_norm_group_quant of it
    (its intermediates rounded to the stream's dtype)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return (*gq_vllm_order(s, weight, eps, group, scale_format, layout), s)


@correct("add_rms_norm_dynamic_quant")
def add_dq_unfused(x, residual, weight, eps, qdtype, scale_ub):
    """The sum rounded to the residual stream's dtype first, then vLLM's rms_norm_dynamic_quant of it
    (its intermediates rounded to the stream's dtype)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return (*dq_vllm_order(s, weight, eps, qdtype, scale_ub), s)


@correct("rms_norm_fp8")
def rms_fp8_vllm_order(x, weight, eps, scale):
    """vLLM's order: x rho rounded to x.dtype, times the weight and rounded again, then times
    1 / scale (the reciprocal in the compute format) and converted.  Its sum of squares is left to
    right (``_rms_sequential``)."""
    xf = up(x)
    y = (up((xf * _rms_sequential(xf, eps)).to(x.dtype), x) * up(weight, x)).to(x.dtype)
    return to_e4m3(up(y) * (1 / torch.tensor(scale, dtype=xf.dtype)))


@correct("add_rms_norm_fp8")
def add_rms_fp8_unfused(x, residual, weight, eps, scale):
    """The sum rounded to the residual stream's dtype first, then vLLM's rms_norm_fp8 of it (its
    intermediates rounded to the stream's dtype)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return rms_fp8_vllm_order(s, weight, eps, scale), s


@correct("add_rms_norm")
def add_rms_unfused(x, residual, weight, eps):
    """The sum rounded to the stream first, then ``rms_sequential_sum`` of it (every sum left to right)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return _RmsSequential.apply(s, weight, eps).to(x.dtype), s


@correct("layer_norm")
def ln_welford(x, weight, bias, eps):
    """Welford's update, vectorised across rows, in 64-column chunks."""
    return _welford_layer_norm(up(x), weight, bias, eps).to(x.dtype)


@correct("deep_norm")
def deep_norm_z_in_fp32(x, sublayer, alpha, weight, bias, eps):
    """z = alpha x + sublayer(x) formed in float32, the suite's sublayer called on float32 x (so its
    output is rounded to float32, not to x's dtype: the fixture called in c, ``bounds_norms._deep_z``),
    then Welford's LayerNorm of z, rounded once to x's dtype."""
    xf = up(x)
    return _welford_layer_norm(alpha * xf + sublayer(xf), weight, bias, eps).to(x.dtype)


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


@correct("gemma_rms_norm")
def gemma_sequential_sum(x, weight, eps):
    """``rms_sequential_sum`` with the weight 1 + w formed in the compute format."""
    return _RmsSequential.apply(x, up(weight, x) + 1, eps)


@correct("swiglu")
def swiglu_sigmoid_form(gate, up_):
    g = up(gate)
    return (g * torch.sigmoid(g) * up(up_)).to(gate.dtype)


@correct("rms_norm")
def rms_weight_required(x, weight, eps):
    """The README's example kernel: a weight is required (weight.to(...) raises on None).  Not a
    defect: its cases give ones where a weightless call would give None."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(compute)).to(x.dtype)


@correct("geglu")
def geglu_other_routes(gate, up_, approximate):
    """erf form by erfc: g erfc(-g / sqrt 2) / 2 (no cancellation for g << 0); tanh form by the
    sigmoid: g sigma(2 t), as GPU kernels take it."""
    g = up(gate)
    if approximate == "tanh":
        gelu = g * torch.sigmoid(2 * TANH_C * (g + 0.044715 * g * g * g))
    else:
        gelu = 0.5 * g * torch.special.erfc(-g * 0.7071067811865476)
    return (gelu * up(up_)).to(gate.dtype)


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


# ------------------------------------------------------------------ rms_norm_fp8 / add_rms_norm_fp8 bugs
def _fp8_value(x, weight, eps, scale):
    """v = rms_norm(x) / scale in the compute format."""
    return rms_formula(up(x), up(weight, x), eps) / scale


@bug("rms_norm_fp8", "extremes")
def fp8_nan_to_max(x, weight, eps, scale):
    """Saturates with fmin / fmax, which drop a NaN (as vLLM's scaled_fp8_conversion does,
    fmaxf(fminf(v, 448), -448)): a NaN row comes out as +448, the NaN hidden."""
    v = _fp8_value(x, weight, eps, scale)
    top = torch.full_like(v, 448.0)
    return to_e4m3(torch.fmax(torch.fmin(v, top), -top))


@bug("rms_norm_fp8", "accuracy", "extremes")
def fp8_overflow_to_nan(x, weight, eps, scale):
    """A non-saturating conversion (CUDA's __NV_NOSAT): what rounds past 448 is NaN, e4m3fn has no inf."""
    v = _fp8_value(x, weight, eps, scale)
    q = to_e4m3(v).to(v.dtype)
    return torch.where(v.abs() >= 464, torch.full_like(q, float("nan")), q).to(torch.float8_e4m3fn)


@bug("rms_norm_fp8", "accuracy", "extremes")
def fp8_scale_multiplied(x, weight, eps, scale):
    """Multiplies by the scale instead of dividing: the scale taken for its inverse (scale_inv)."""
    return to_e4m3(rms_formula(up(x), up(weight, x), eps) * scale)


@bug("rms_norm_fp8", "accuracy", "extremes")
def fp8_truncates(x, weight, eps, scale):
    """Rounds toward zero (an rtz conversion): one step down wherever nearest rounding went up."""
    v = _fp8_value(x, weight, eps, scale)
    q = to_e4m3(v)
    away = q.to(v.dtype).abs() > v.abs()
    bits = q.view(torch.uint8)
    down = torch.where(away & (bits & 0x7F > 0), bits - 1, bits)  # one step less in magnitude
    return down.view(torch.float8_e4m3fn)


@bug("add_rms_norm_fp8", "accuracy", "extremes", "fusion")
def add_fp8_normalises_x(x, residual, weight, eps, scale):
    """Stores the new residual stream but normalises x alone: the add forgotten for y."""
    return to_e4m3(_fp8_value(x, weight, eps, scale)), (up(x) + up(residual)).to(x.dtype)


@bug("add_rms_norm_fp8", "accuracy", "extremes", "fusion")
def add_fp8_residual_scaled(x, residual, weight, eps, scale):
    """Applies the quantisation scale to the residual stream too."""
    s = up(x) + up(residual)
    return to_e4m3(rms_formula(s, up(weight, x), eps) / scale), (s / scale).to(x.dtype)


# ------------------------------------------------------------------ kernels as inference libraries ship them
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


