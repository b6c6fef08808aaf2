"""Triton kernels for RMSNorm with dynamic per-token quantisation, alone and fused with the residual
add (``rms_norm_dynamic_quant``, ``add_rms_norm_dynamic_quant``): forward only, as vLLM ships them.

The maths is ``oracle/dynamic_quant.py``'s; per row of length n, s = x (or x + residual, stored
rounded as residual_out):

    v     = s rho w,  rho = 1 / sqrt(mean(s^2) + eps)
    scale = max(min(max_i |v_i|, scale_ub) / q, 1 / (512 q))      stored in float32
    y     = Q(v / scale)                                           float8_e4m3fn or int8

Three passes over a row: the mean square, the peak of |v| (a NaN anywhere makes it NaN: a max
reduction may drop a NaN, so NaNs are counted), then y from v divided by the *stored* float32
scale, as the check expects (``bounds_quant.by_kernel_scale``).  float8: clamped to +-448 keeping
NaN, then converted (round to nearest even).  int8: ``rint`` (nearest, ties to even; libdevice),
clamped to [-128, 127], then converted (a GPU's float -> int conversion truncates; the value is
already an integer).  Numerics, tiles and layout as ``triton_norms``'s.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.libdevice import rint

from ..oracle.dynamic_quant import MIN_SCALE, QDTYPES, qmax
from ..oracle.kinds import KINDS

from . import make
from .triton_norms import as_rows, compute_dtype, div_rn, load_sum, rsqrt_rn, scalar, tile, tile_ptrs


@triton.jit
def _dynamic_quant_kernel(
    X, sxr, sxc, R, srr, src, W, EPS, UB, Y, SCALES, RES, rows, n, q, min_scale,
    FUSED: tl.constexpr, HAS_UB: tl.constexpr, INT8: tl.constexpr,
    ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = row < rows
    acc = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    for c0 in range(0, n, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < n)[None, :]
        s = load_sum(X, sxr, sxc, R, srr, src, row[:, None], col[None, :], m, FUSED, ACC)
        if FUSED:
            tl.store(tile_ptrs(RES, row, col, n, 1), s.to(RES.dtype.element_ty), mask=m)
        acc += s * s
    rstd = rsqrt_rn(div_rn(tl.sum(acc, 1), tl.full([], n, ACC)) + tl.load(EPS))[:, None]
    peak = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    nans = tl.zeros([BLOCK_R, BLOCK_N], tl.int32)
    for c0 in range(0, n, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < n)[None, :]
        w = tl.load(W + col, mask=col < n, other=0.0).to(ACC)[None, :]
        v = tl.where(m, load_sum(X, sxr, sxc, R, srr, src, row[:, None], col[None, :], m, FUSED, ACC) * rstd * w, 0.0)
        peak, nans = track_peak(peak, nans, v)
    scale = row_scale(peak, nans, UB, q, min_scale, HAS_UB, ACC)
    tl.store(SCALES + row, scale, mask=in_rows)
    stored = scale.to(ACC)[:, None]
    for c0 in range(0, n, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < n)[None, :]
        w = tl.load(W + col, mask=col < n, other=0.0).to(ACC)[None, :]
        t = div_rn(load_sum(X, sxr, sxc, R, srr, src, row[:, None], col[None, :], m, FUSED, ACC) * rstd * w, stored)
        tl.store(tile_ptrs(Y, row, col, n, 1), quantised(t, Y, INT8), mask=m)


@triton.jit
def track_peak(peak, nans, v):
    """The running (BLOCK_R, BLOCK_N) peaks of |v| and counts of NaNs (a max may drop a NaN: counted)."""
    return tl.maximum(peak, tl.abs(v)), nans + (v != v).to(tl.int32)


@triton.jit
def row_scale(peak, nans, UB, q, min_scale, HAS_UB: tl.constexpr, ACC: tl.constexpr):
    """Each row's scale, max(min(amax, scale_ub) / q, min_scale) in float32, from its running
    (BLOCK_R, BLOCK_N) peaks of |v| and NaN counts: NaN where the row holds a NaN."""
    amax = tl.max(peak, 1)
    if HAS_UB:
        amax = tl.minimum(amax, tl.load(UB))
    scale = tl.maximum(div_rn(amax, tl.full([], q, ACC)), tl.full([], min_scale, ACC))
    return tl.where(tl.sum(nans, 1) > 0, float("nan"), scale).to(tl.float32)


@triton.jit
def quantised(t, Y, INT8: tl.constexpr):
    """t = v / scale stored as Y's element type: int8 by ``rint`` and a clamp, float8 by a clamp
    keeping NaN and the conversion (module docstring)."""
    if INT8:
        y = tl.clamp(rint(t), -128.0, 127.0).to(tl.int8)
    else:
        y = tl.clamp(t, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL).to(Y.dtype.element_ty)
    return y


def check_args(op, x, qdtype, scale_ub):
    """ValueError naming a bad qdtype or scale_ub; float64 x is not supported (no single-rounding
    float64 -> float8_e4m3fn conversion on a GPU)."""
    KINDS["qdtype"].check(op, "qdtype", qdtype, x)
    KINDS["scale_ub"].check(op, "scale_ub", scale_ub, x)
    if x.dtype == torch.float64:
        raise NotImplementedError(f"{op}: float64 input (no single-rounding float64 -> {qdtype} conversion)")


def _forward(x, residual, weight, eps, qdtype, scale_ub):
    n = x.shape[-1]
    acc, acc_t = compute_dtype(x.dtype)
    x2 = as_rows(x, n)
    r2 = x2 if residual is None else as_rows(residual, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=QDTYPES[qdtype], device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    res = torch.empty((rows, n), dtype=residual.dtype, device=x.device) if residual is not None else None
    if rows * n:
        block_r, block_n = tile(n)
        eps_t = scalar(eps, acc_t, x.device)
        q = qmax(qdtype)
        _dynamic_quant_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1), weight.contiguous(), eps_t,
            eps_t if scale_ub is None else scalar(scale_ub, acc_t, x.device), y, scales, y if res is None else res,
            rows, n, q, MIN_SCALE / q, FUSED=residual is not None, HAS_UB=scale_ub is not None,
            INT8=qdtype == "int8", ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
    y, scales = y.reshape(x.shape), scales.reshape(x.shape[:-1])
    return (y, scales) if res is None else (y, scales, res.reshape(x.shape))


def rms_norm_dynamic_quant(x, weight, eps, qdtype, scale_ub):
    check_args("rms_norm_dynamic_quant", x, qdtype, scale_ub)
    return _forward(x, None, weight, eps, qdtype, scale_ub)


def add_rms_norm_dynamic_quant(x, residual, weight, eps, qdtype, scale_ub):
    check_args("add_rms_norm_dynamic_quant", x, qdtype, scale_ub)
    return _forward(x, residual, weight, eps, qdtype, scale_ub)


_NO_FLOAT64 = "dtypes=float32,float16,bfloat16 nan=propagate scale_floor=1/512q"  # see check_args; NaNs counted

IMPLS = [
    make("rms_norm_dynamic_quant", "triton", "triton", rms_norm_dynamic_quant, devices=("cpu", "cuda"),
         domain=_NO_FLOAT64),
    make("add_rms_norm_dynamic_quant", "triton", "triton", add_rms_norm_dynamic_quant, devices=("cpu", "cuda"),
         domain=_NO_FLOAT64),
]
