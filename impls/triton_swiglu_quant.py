"""Triton kernels for SiLU-and-mul with dynamic FP8 / int8 quantisation: per token
(``silu_and_mul_dynamic_quant``, as vLLM's fused silu_and_mul + per-token quant), and per group,
dense and masked by expert (``silu_and_mul_group_quant``, ``silu_and_mul_group_quant_masked``):
forward only, as the MoE path's fused SwiGLU + 1 x 128 quant kernels ship it (vLLM's
``_silu_mul_fp8_quant_deep_gemm``, SGLang's ``silu_and_mul_masked_post_quant_fwd``).

Per token: two passes over a row of H outputs, the peak of |v| (NaNs counted: a max may drop them)
and then y = Q(v / scale) by the *stored* float32 scale, scale = max(min(amax, scale_ub) / q,
1 / (512 q)): ``triton_dynamic_quant``'s ``row_scale`` and ``quantised``, on v = g sigma(g) u.

The maths is ``oracle/dynamic_quant.py``'s on silu_and_mul's output; per row of x = [gate | up],
H = n / 2, split into groups of ``group`` elements of the *output* row:

    v     = g sigma(g) u,  sigma from e = exp(-|g|) (``triton_swiglu.sigmoids``), in the compute format
    scale = max(max_{i in group} |v_i| / 448, 1 / (512 * 448))     stored in float32, per group;
            "ue8m0": rounded up to a power of two by the float32 bits
    y     = e4m3(v / scale)

BLOCK_R rows per program (``triton_norms.tile`` of H: a function of H alone), BLOCK_G groups at a
time as a (BLOCK_R, BLOCK_G, GROUP) tile; a NaN in a group makes its scale NaN (a max may drop it).
Masked: row r of x's rows flattened is token r mod T of expert r // T, valid where that token is
below counts[expert]; the loads and stores of other rows are masked off, so the kernel neither reads
them nor writes their outputs (left as ``torch.empty`` leaves them: the contract does not read
them).  float64 x is not supported (no single-rounding float64 -> e4m3 conversion on a GPU).

Per group, H need not be a multiple of the group (declared ``tail=partial``): ceil(H / group) groups,
the last one's columns past H masked off (loaded as 0: silu(0) 0 = 0 never raises a peak; not
stored).  Declared choices (``properties.declared.domain``): nan=propagate (NaNs counted, as tl.max
drops them) and the default floor 1 / (512 q) for every kernel here, tail=partial for the group ones.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..oracle.dynamic_quant import MIN_SCALE, QDTYPES, qmax
from ..oracle.kinds import KINDS

from . import make
from .triton_dynamic_quant import check_args, quantised, row_scale, track_peak
from .triton_group_quant import block_groups, check_group_args, scales_buffer, store_quantised
from .triton_norms import as_rows, compute_dtype, div_rn, scalar, tile, tile_ptrs
from .triton_swiglu import sigmoids


@triton.jit
def _silu_mul_at(at, h, sxc, m, ACC: tl.constexpr):
    """v = g sigma(g) u with g at the pointers ``at`` of x = [gate | up] and u h columns on (0 off the mask)."""
    gate = tl.load(at, mask=m, other=0.0).to(ACC)
    up = tl.load(at + h * sxc, mask=m, other=0.0).to(ACC)
    sigma, _ = sigmoids(gate)
    return gate * sigma * up


@triton.jit
def _silu_mul(X, sxr, sxc, row, col, h, m, ACC: tl.constexpr):
    """v on the (row, col) tile of the output rows (``_silu_mul_at``)."""
    return _silu_mul_at(X + row.to(tl.int64)[:, None] * sxr + col.to(tl.int64)[None, :] * sxc, h, sxc, m, ACC)


@triton.jit
def _silu_mul_dynamic_quant_kernel(
    X, sxr, sxc, UB, Y, SCALES, rows, h, q, min_scale,
    HAS_UB: tl.constexpr, INT8: tl.constexpr, ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = row < rows
    peak = tl.zeros([BLOCK_R, BLOCK_N], ACC)
    nans = tl.zeros([BLOCK_R, BLOCK_N], tl.int32)
    for c0 in range(0, h, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < h)[None, :]
        peak, nans = track_peak(peak, nans, _silu_mul(X, sxr, sxc, row, col, h, m, ACC))
    scale = row_scale(peak, nans, UB, q, min_scale, HAS_UB, ACC)
    tl.store(SCALES + row, scale, mask=in_rows)
    stored = scale.to(ACC)[:, None]
    for c0 in range(0, h, BLOCK_N):
        col = c0 + tl.arange(0, BLOCK_N)
        m = in_rows[:, None] & (col < h)[None, :]
        t = div_rn(_silu_mul(X, sxr, sxc, row, col, h, m, ACC), stored)
        tl.store(tile_ptrs(Y, row, col, h, 1), quantised(t, Y, INT8), mask=m)


@triton.jit
def _silu_mul_group_quant_kernel(
    X, sxr, sxc, C, tokens, Y, SCALES, ssr, ssg, rows, h, groups, q, min_scale,
    COUNTED: tl.constexpr, UE8M0: tl.constexpr, ACC: tl.constexpr, GROUP: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = row < rows
    if COUNTED:  # token row % tokens of expert row // tokens, valid below the expert's count
        count = tl.load(C + row // tokens, mask=in_rows, other=0).to(tl.int64)
        in_rows = in_rows & (row % tokens < count)
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        in_groups = g < groups
        col = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # (BLOCK_G, GROUP), of the output row
        in_cols = in_groups[:, None] & (col < h)
        m = in_rows[:, None, None] & in_cols[None, :, :]
        v = _silu_mul_at(X + row[:, None, None] * sxr + col.to(tl.int64)[None, :, :] * sxc, h, sxc, m, ACC)
        store_quantised(v, row, g, col, in_rows, in_groups, m, Y, h, SCALES, ssr, ssg, q, min_scale, UE8M0, ACC)


def _forward(op, x, counts, group, scale_format, layout):
    if counts is not None:
        KINDS["counts"].check(op, "counts", counts, x)
    h = x.shape[-1] // 2
    check_group_args(op, x[..., :h], group, scale_format, layout)
    acc, _ = compute_dtype(x.dtype)
    x2 = as_rows(x, x.shape[-1])
    rows, groups = x2.shape[0], -(-h // group)  # a partial last group where group does not divide h
    lead = tuple(x.shape[:-1])
    y = torch.empty((rows, h), dtype=torch.float8_e4m3fn, device=x.device)
    scales, ssr, ssg = scales_buffer(lead, groups, rows, layout, x.device)
    if rows * h:
        block_r, _ = tile(h)
        block_g = block_groups(block_r, groups, group)
        q = qmax("float8_e4m3fn")
        c = y if counts is None else counts.contiguous()
        _silu_mul_group_quant_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), c, max(x.shape[-2], 1) if x.dim() >= 2 else 1, y, scales, ssr, ssg,
            rows, h, groups, q, MIN_SCALE / q, COUNTED=counts is not None, UE8M0=scale_format == "ue8m0", ACC=acc,
            GROUP=group, BLOCK_R=block_r, BLOCK_G=block_g)
    return y.reshape(lead + (h,)), scales


def silu_and_mul_dynamic_quant(x, qdtype, scale_ub):
    op = "silu_and_mul_dynamic_quant"
    check_args(op, x, qdtype, scale_ub)
    h = x.shape[-1] // 2
    acc, acc_t = compute_dtype(x.dtype)
    x2 = as_rows(x, x.shape[-1])
    rows = x2.shape[0]
    y = torch.empty((rows, h), dtype=QDTYPES[qdtype], device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows * h:
        block_r, block_n = tile(h)
        q = qmax(qdtype)
        ub = scales if scale_ub is None else scalar(scale_ub, acc_t, x.device)  # unread without HAS_UB
        _silu_mul_dynamic_quant_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), ub, y, scales, rows, h, q, MIN_SCALE / q,
            HAS_UB=scale_ub is not None, INT8=qdtype == "int8", ACC=acc, BLOCK_R=block_r, BLOCK_N=block_n)
    return y.reshape(x.shape[:-1] + (h,)), scales.reshape(x.shape[:-1])


def silu_and_mul_group_quant(x, group, scale_format, layout):
    return _forward("silu_and_mul_group_quant", x, None, group, scale_format, layout)


def silu_and_mul_group_quant_masked(x, counts, group, scale_format, layout):
    return _forward("silu_and_mul_group_quant_masked", x, counts, group, scale_format, layout)


_NO_FLOAT64 = "dtypes=float32,float16,bfloat16 nan=propagate scale_floor=1/512q"  # see _forward and check_args
_GROUPS = _NO_FLOAT64 + " tail=partial"  # module docstring

IMPLS = [
    make("silu_and_mul_dynamic_quant", "triton", "triton", silu_and_mul_dynamic_quant, devices=("cpu", "cuda"),
         domain=_NO_FLOAT64),
    make("silu_and_mul_group_quant", "triton", "triton", silu_and_mul_group_quant, devices=("cpu", "cuda"),
         domain=_GROUPS),
    make("silu_and_mul_group_quant_masked", "triton", "triton", silu_and_mul_group_quant_masked,
         devices=("cpu", "cuda"), domain=_GROUPS),
]
