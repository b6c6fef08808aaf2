"""Triton kernel for RMSNorm with dynamic per-group FP8 quantisation, alone and fused with the
residual add (``rms_norm_group_quant``, ``add_rms_norm_group_quant``): forward only, as vLLM's
``rms_norm_per_block_quant`` (with and without its residual) and DeepSeek-style 1 x 128 activation
quantisation ship it.

The maths is ``oracle/dynamic_quant.py``'s; per row of length n, split into groups of ``group``,
s = x (or x + residual, in the compute format, stored rounded as residual_out):

    v     = s rho w,  rho = 1 / sqrt(mean(s^2) + eps)
    scale = max(max_{i in group} |v_i| / 448, 1 / (512 * 448))     stored in float32, per group;
            "ue8m0": rounded up to a power of two (the float32 bits: exponent up where the
            significand is not zero), so that no group's peak saturates
    y     = e4m3(v / scale)

BLOCK_R rows per program (``triton_norms.tile``: a function of n alone, so a row's bits do not depend
on the batch): the mean square over column blocks (storing residual_out), then BLOCK_G groups at a
time as a (BLOCK_R, BLOCK_G, GROUP) tile, each group's peak a reduction over the tile's last axis
(a NaN in a group makes its scale NaN: counted, as a max may drop it).  y is v divided by the
*stored* scale, as the check expects.  The scales are written through their strides: (rows, groups)
contiguous, or groups first ("column_major").  float64 x is not supported (no single-rounding float64 -> e4m3 conversion on a GPU).

A row need not be a multiple of the group (declared ``tail=partial``): it has ceil(n / group) groups,
the last one's columns past n masked off (loaded as 0, which never raises a peak; not stored), so
its scale is of its own elements' peak, as ``oracle.dynamic_quant`` says.

Declared choices (``properties.declared.domain``): nan=propagate (the NaN count, as tl.max drops a
NaN), the default scale floor 1 / (512 * 448), tail=partial.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..oracle.dynamic_quant import MIN_SCALE, qmax
from ..oracle.kinds import KINDS

from . import make
from .triton_norms import TILE, as_rows, compute_dtype, div_rn, load_sum, rsqrt_rn, scalar, tile


@triton.jit
def store_quantised(v, row, g, col, in_rows, in_groups, m, Y, y_stride, SCALES, ssr, ssg, q, min_scale,
                    UE8M0: tl.constexpr, ACC: tl.constexpr):
    """The (BLOCK_R, BLOCK_G, GROUP) tile v quantised per group and stored: each group's scale
    max(peak / q, min_scale) (UE8M0: rounded up to a power of two; NaN where the group holds a NaN,
    counted, as a max may drop it) at SCALES through its strides, and y = e4m3(v / scale), with the
    stored scale, at Y (rows ``y_stride`` apart; ``col``: the groups' columns, ``m``: the tile's mask)."""
    peak = tl.max(tl.abs(v), 2)
    nans = tl.sum((v != v).to(tl.int32), 2)
    scale = tl.maximum(div_rn(peak, tl.full([], q, ACC)), tl.full([], min_scale, ACC)).to(tl.float32)
    if UE8M0:  # a positive normal float32 rounded up to a power of two, exactly
        bits = scale.to(tl.int32, bitcast=True)
        scale = ((bits + 0x7FFFFF) & -0x800000).to(tl.float32, bitcast=True)
    scale = tl.where(nans > 0, float("nan"), scale)
    tl.store(SCALES + row[:, None] * ssr + g[None, :] * ssg, scale, mask=in_rows[:, None] & in_groups[None, :])
    t = div_rn(v, scale.to(ACC)[:, :, None])
    y = tl.clamp(t, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL).to(Y.dtype.element_ty)
    tl.store(Y + row[:, None, None] * y_stride + col[None, :, :], y, mask=m)


def refuse_unsupported(op, x, group) -> None:
    """NotImplementedError for float64 x (no single-rounding float64 -> float8_e4m3fn conversion on a
    GPU) and for a group that is not a power of two (a tile's width)."""
    if x.dtype == torch.float64:
        raise NotImplementedError(f"{op}: float64 input (no single-rounding float64 -> float8_e4m3fn conversion)")
    if group & (group - 1):
        raise NotImplementedError(f"{op}: group {group} is not a power of two (a tile's width)")


def check_group_args(op, x, group, scale_format, layout) -> None:
    """The one-line errors of bad arguments (the group a positive integer: any row, tail=partial; its
    rows ``x``), then ``refuse_unsupported``."""
    KINDS["group"].check(op, "group", group, None)
    for name, value in (("scale_format", scale_format), ("layout", layout)):
        KINDS[name].check(op, name, value, x)
    refuse_unsupported(op, x, group)


def scales_buffer(lead, groups, rows, layout, device):
    """The float32 scales of ``rows`` rows (leading dims ``lead``) of ``groups`` groups in ``layout``,
    and their (row, group) strides: (rows, groups) contiguous, or groups first ("column_major")."""
    if layout == "row_major":
        return torch.empty(lead + (groups,), dtype=torch.float32, device=device), groups, 1
    return torch.empty((groups,) + lead, dtype=torch.float32, device=device).movedim(0, -1), 1, rows


def block_groups(block_r, groups, group) -> int:
    """Groups per program: as many as fit a tile of ``TILE`` elements with ``block_r`` rows, at least 1."""
    return max(1, min(triton.next_power_of_2(groups), TILE // (block_r * group)))


@triton.jit
def mean_square_rstd(X, sxr, sxc, R, srr, src, RES, row, in_rows, n, EPS, FUSED: tl.constexpr, ACC: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """rho = 1 / sqrt(mean(s^2) + eps) of rows ``row`` (BLOCK_R of them), s = x or x + residual
    (FUSED, then stored rounded at RES, rows n apart), over column blocks of BLOCK_N."""
    acc = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    for c0 in range(0, n, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < n)[None, :]
        s = load_sum(X, sxr, sxc, R, srr, src, row[:, None], col[None, :], m, FUSED, ACC)
        if FUSED:
            tl.store(RES + row[:, None] * n + col[None, :], s.to(RES.dtype.element_ty), mask=m)
        acc += s * s
    return rsqrt_rn(div_rn(tl.sum(acc, 1), tl.full([], n, ACC)) + tl.load(EPS))


@triton.jit
def _group_quant_kernel(
    X, sxr, sxc, R, srr, src, W, EPS, Y, SCALES, RES, ssr, ssg, rows, n, groups, q, min_scale,
    FUSED: tl.constexpr, UE8M0: tl.constexpr, ACC: tl.constexpr, GROUP: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = row < rows
    rstd = mean_square_rstd(X, sxr, sxc, R, srr, src, RES, row, in_rows, n, EPS, FUSED, ACC, BLOCK_R,
                            BLOCK_N)[:, None, None]
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        in_groups = g < groups
        col = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # (BLOCK_G, GROUP)
        in_cols = in_groups[:, None] & (col < n)
        m = in_rows[:, None, None] & in_cols[None, :, :]
        w = tl.load(W + col, mask=in_cols, other=0.0).to(ACC)[None, :, :]
        v = load_sum(X, sxr, sxc, R, srr, src, row[:, None, None], col[None, :, :], m, FUSED, ACC) * rstd * w
        store_quantised(v, row, g, col, in_rows, in_groups, m, Y, n, SCALES, ssr, ssg, q, min_scale, UE8M0, ACC)


def _forward(op, x, residual, weight, eps, group, scale_format, layout):
    check_group_args(op, x, group, scale_format, layout)
    n = x.shape[-1]
    acc, acc_t = compute_dtype(x.dtype)
    x2 = as_rows(x, n)
    r2 = x2 if residual is None else as_rows(residual, n)
    rows, groups = x2.shape[0], -(-n // group)  # a partial last group where group does not divide n
    lead = tuple(x.shape[:-1])
    y = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=x.device)
    res = None if residual is None else torch.empty((rows, n), dtype=residual.dtype, device=x.device)
    scales, ssr, ssg = scales_buffer(lead, groups, rows, layout, x.device)
    if rows * n:
        block_r, block_n = tile(n)
        block_g = block_groups(block_r, groups, group)
        q = qmax("float8_e4m3fn")
        _group_quant_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1), weight.contiguous(),
            scalar(eps, acc_t, x.device), y, scales, y if res is None else res, ssr, ssg, rows, n, groups, q,
            MIN_SCALE / q, FUSED=residual is not None, UE8M0=scale_format == "ue8m0", ACC=acc, GROUP=group,
            BLOCK_R=block_r, BLOCK_G=block_g, BLOCK_N=block_n)
    y = y.reshape(x.shape)
    return (y, scales) if res is None else (y, scales, res.reshape(x.shape))


def rms_norm_group_quant(x, weight, eps, group, scale_format, layout):
    return _forward("rms_norm_group_quant", x, None, weight, eps, group, scale_format, layout)


def add_rms_norm_group_quant(x, residual, weight, eps, group, scale_format, layout):
    return _forward("add_rms_norm_group_quant", x, residual, weight, eps, group, scale_format, layout)


_NO_FLOAT64 = "dtypes=float32,float16,bfloat16 nan=propagate scale_floor=1/512q tail=partial"  # see _forward

IMPLS = [
    make("rms_norm_group_quant", "triton", "triton", rms_norm_group_quant, devices=("cpu", "cuda"), domain=_NO_FLOAT64),
    make("add_rms_norm_group_quant", "triton", "triton", add_rms_norm_group_quant, devices=("cpu", "cuda"),
         domain=_NO_FLOAT64),
]
