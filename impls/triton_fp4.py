"""Triton kernels for the FP4-quantised RMSNorm, add+RMSNorm and SiLU-and-mul (``rms_norm_fp4_quant``,
``add_rms_norm_fp4_quant``, ``silu_and_mul_fp4_quant``): forward only, as FlashInfer's
``rmsnorm_fp4quant`` / ``add_rmsnorm_fp4quant`` and vLLM's fused NVFP4 quant paths ship them.

The maths is ``oracle/fp4.py``'s; per row, v = s rho w (s = x, or x + residual in the compute
format, stored rounded as residual_out) or v = g sigma(g) u (x = [gate | up]), in float32, split
into blocks of ``block`` (16 for "nvfp4", 32 for "mxfp4"), with gs the global scale (applied to
both formats, as the oracle's S = A / (6 g) is: OCP MX has none, and an MXFP4 caller passes 1):

    A     = max_{i in block} |v_i|                   NaN where the block holds a NaN (counted: a
                                                     max may drop it)
    S     = A / (6 gs)                               6 gs rounded to float32, one division
    s     = E4M3(S)  "nvfp4": ``.to(tl.float8e4nv)``, the conversion a GPU runs (``cvt.rn.satfinite``:
                     nearest even, saturating at 448, below 2**-10 to 0), stored as float8_e4m3fn
                     and read back exactly;
            UE8M0(S) "mxfp4": on S's float32 bits, which order the values >= 0 as the values: clamped
                     to [0x400000, 0x7F000000] (2**-127, a subnormal, and 2**127), then rounded up to
                     a power of two, (bits + 0x7FFFFF) & ~0x7FFFFF (the exponent up one where the
                     significand is not zero; a subnormal above 2**-127 gives 2**-126), 2**-127 kept
                     as it is; stored as the exponent byte bits >> 23 (float8_e8m0fnu's pattern,
                     2**(byte - 127): 2**-127 is byte 0), 0xFF for NaN
    y_i   = E2M1(v_i / (s gs))   s gs rounded to float32, one division; 0 where s = 0

E2M1 in-kernel by comparisons on t = |v_i / (s gs)| against the midpoints of the codes 0..7 (values
0, 0.5, 1, 1.5, 2, 3, 4, 6): code = #{midpoints below t}, a tie counting where the code above it is
even (the midpoints 0.75, 1.75 and 3.5 taken with >=, 0.25, 1.25, 2.5 and 5 with >): nearest even,
and past 5 (inf included) code 7, saturating at 6; NaN compares false (code 0: E2M1 has no NaN and
the contract makes no claim there).  The sign is t's sign bit (bit 3 of the code; -0 is code 8).
Packing: the even elements 2j and the odd ones 2j + 1 of a block are taken as two (BLOCK_R, BLOCK_G,
block / 2) tiles, so byte j = code(y_2j) | code(y_2j+1) << 4 is formed without a reshape and stored
as uint8 (element 2i in the low nibble, ``oracle.fp4``'s order).

Scales ("layout"): "linear", scale (r, k) at r G + k of a contiguous (rows, G) tensor; "swizzled",
at off(r, k) = 512 ((r // 128) (G' / 4) + k // 4) + 16 (r mod 32) + 4 ((r // 32) mod 4) + k mod 4 of
a (R', G') tensor (``oracle.fp4.swizzled_offsets``; R' = 128 ceil(R / 128), G' = 4 ceil(G / 4)),
whose padding is zeroed on the host (outside the contract; a GEMM reading the tiles wants zeros).

BLOCK_R rows per program (``triton_norms.tile``: a function of the row length alone, so a row's bits
do not depend on the batch), BLOCK_G blocks at a time.  Under Triton's interpreter the stores go
through the conversions a GPU runs: fp32 -> float8e4nv through normcert's correction
(``interpreter_fp8``), the uint8 bytes and the float32 bit operations as they are (the probe
``interpreter_probes.fp4_mismatches`` pins that they need no correction).  float64 x is not
supported (no single-rounding float64 -> e4m3 conversion on a GPU; the UE8M0 round-up reads float32
bits).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..oracle.fp4 import BLOCK_FORMATS, padded

from . import make
from .eager import check_fp4_args
from .triton_group_quant import block_groups, mean_square_rstd, refuse_unsupported
from .triton_norms import as_rows, compute_dtype, div_rn, load_sum, scalar, tile
from .triton_swiglu import sigmoids


@triton.jit
def e2m1_codes(t):
    """The 4-bit E2M1 code of each float t: nearest even, saturating at 6, the sign bit from t's."""
    a = tl.abs(t)
    code = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
            + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32))
    negative = (t.to(tl.int32, bitcast=True) < 0).to(tl.int32)
    return code | (negative << 3)


@triton.jit
def ue8m0(exact):
    """(the UE8M0 scale as float32, its float8_e8m0fnu byte) of each float32 exact >= 0 or NaN, on
    its bits, which order the values >= 0: clamped to [2**-127 (0x400000), 2**127 (0x7F000000)],
    then rounded up to a power of two where not 2**-127 already; NaN gives NaN and byte 0xFF."""
    bits = tl.minimum(tl.maximum(exact.to(tl.int32, bitcast=True), 0x400000), 0x7F000000)
    bits = tl.where(bits == 0x400000, bits, (bits + 0x7FFFFF) & -0x800000)
    nan = exact != exact
    return tl.where(nan, float("nan"), bits.to(tl.float32, bitcast=True)), tl.where(nan, 0xFF, bits >> 23).to(tl.uint8)


@triton.jit
def store_fp4(ve, vo, row, g, j, in_rows, in_groups, m, Y, y_stride, SCALES, groups, tiles_per_row, gs,
              NVFP4: tl.constexpr, SWIZZLED: tl.constexpr):
    """The blocks whose even elements are ve and odd ones vo, (BLOCK_R, BLOCK_G, block / 2) float32
    tiles (0 where masked off), quantised to FP4 and stored (module docstring): each block's scale at
    SCALES in its layout (rows ``row``, blocks ``g``), and the packed bytes at Y (rows ``y_stride``
    bytes apart; ``j``: a block's byte offsets within the row, ``m``: the tile's mask)."""
    peak = tl.maximum(tl.max(tl.abs(ve), 2), tl.max(tl.abs(vo), 2))
    nans = tl.sum((ve != ve).to(tl.int32), 2) + tl.sum((vo != vo).to(tl.int32), 2)
    exact = tl.where(nans > 0, float("nan"), div_rn(peak, gs * 6.0))
    if NVFP4:
        stored = exact.to(tl.float8e4nv)
        scale = stored.to(tl.float32)
    else:
        scale, stored = ue8m0(exact)
    if SWIZZLED:
        at = (512 * ((row[:, None] // 128) * tiles_per_row + g[None, :] // 4) + 16 * (row[:, None] % 32)
              + 4 * ((row[:, None] // 32) % 4) + g[None, :] % 4)
    else:
        at = row[:, None] * groups + g[None, :]
    tl.store(SCALES + at, stored, mask=in_rows[:, None] & in_groups[None, :])
    divisor = (scale * gs)[:, :, None]
    zero = divisor == 0
    divisor = tl.where(zero, 1.0, divisor)
    low = tl.where(zero, 0, e2m1_codes(div_rn(ve, divisor)))
    high = tl.where(zero, 0, e2m1_codes(div_rn(vo, divisor)))
    tl.store(Y + row[:, None, None] * y_stride + j, (low | (high << 4)).to(tl.uint8), mask=m)


@triton.jit
def _block_columns(g0, groups, BLOCK_G: tl.constexpr, BLOCK: tl.constexpr):
    """Blocks g0 .. g0 + BLOCK_G - 1: their indices, which exist, their even elements' columns and
    their bytes' offsets in a packed row ((BLOCK_G, BLOCK / 2) each)."""
    g = g0 + tl.arange(0, BLOCK_G)
    half = tl.arange(0, BLOCK // 2)[None, :]
    return g, g < groups, g[:, None] * BLOCK + 2 * half, g[:, None] * (BLOCK // 2) + half


@triton.jit
def _rms_norm_fp4_kernel(
    X, sxr, sxc, R, srr, src, W, EPS, Y, SCALES, RES, rows, n, groups, tiles_per_row, gs,
    FUSED: tl.constexpr, NVFP4: tl.constexpr, SWIZZLED: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = row < rows
    rstd = mean_square_rstd(X, sxr, sxc, R, srr, src, RES, row, in_rows, n, EPS, FUSED, ACC, BLOCK_R, BLOCK_N)
    rstd = rstd[:, None, None]
    for g0 in range(0, groups, BLOCK_G):
        g, in_groups, even, j = _block_columns(g0, groups, BLOCK_G, BLOCK)
        m = in_rows[:, None, None] & in_groups[None, :, None]
        ve = load_sum(X, sxr, sxc, R, srr, src, row[:, None, None], even[None, :, :], m, FUSED, ACC) * rstd
        vo = load_sum(X, sxr, sxc, R, srr, src, row[:, None, None], even[None, :, :] + 1, m, FUSED, ACC) * rstd
        ve *= tl.load(W + even, mask=in_groups[:, None], other=0.0).to(ACC)[None, :, :]
        vo *= tl.load(W + even + 1, mask=in_groups[:, None], other=0.0).to(ACC)[None, :, :]
        store_fp4(ve, vo, row, g, j[None, :, :], in_rows, in_groups, m, Y, n // 2, SCALES, groups, tiles_per_row, gs,
                  NVFP4, SWIZZLED)


@triton.jit
def _silu_mul_fp4_kernel(
    X, sxr, sxc, Y, SCALES, rows, h, groups, tiles_per_row, gs,
    NVFP4: tl.constexpr, SWIZZLED: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = row < rows
    for g0 in range(0, groups, BLOCK_G):
        g, in_groups, even, j = _block_columns(g0, groups, BLOCK_G, BLOCK)
        m = in_rows[:, None, None] & in_groups[None, :, None]
        at = X + row[:, None, None] * sxr + even.to(tl.int64)[None, :, :] * sxc
        gate_e = tl.load(at, mask=m, other=0.0).to(ACC)
        gate_o = tl.load(at + sxc, mask=m, other=0.0).to(ACC)
        sigma_e, _ = sigmoids(gate_e)
        sigma_o, _ = sigmoids(gate_o)
        ve = gate_e * sigma_e * tl.load(at + h * sxc, mask=m, other=0.0).to(ACC)
        vo = gate_o * sigma_o * tl.load(at + (h + 1) * sxc, mask=m, other=0.0).to(ACC)
        store_fp4(ve, vo, row, g, j[None, :, :], in_rows, in_groups, m, Y, h // 2, SCALES, groups, tiles_per_row, gs,
                  NVFP4, SWIZZLED)


def _outputs(lead, rows, width, block_format, layout, device):
    """(y, its byte view, the scales as returned, their byte view for the kernel, G' / 4): y uint8
    (rows, width / 2); the scales float8_e4m3fn or float8_e8m0fnu, linear lead + (G,) or swizzled
    (R', G') with the padding zero."""
    f = BLOCK_FORMATS[block_format]
    groups = width // f.block
    y = torch.empty((rows, width // 2), dtype=torch.uint8, device=device)
    if layout == "swizzled":
        rp, gp = padded(rows, groups)
        raw = torch.zeros((rp, gp), dtype=torch.uint8, device=device)
    else:
        raw = torch.empty(lead + (groups,), dtype=torch.uint8, device=device)
        gp = groups
    scales = raw.view(f.scale_dtype)
    return y, scales, scales if block_format == "nvfp4" else raw, gp // 4


def _launch_shape(op, x, width, block_format, global_scale, layout):
    """Arguments checked and float64 refused; (block, G, BLOCK_R, BLOCK_G, BLOCK_N) for rows whose
    quantised part is ``width`` long."""
    check_fp4_args(op, x[..., :width], block_format, global_scale, layout)
    block = BLOCK_FORMATS[block_format].block
    refuse_unsupported(op, x, block)
    block_r, block_n = tile(width)
    groups = width // block
    return block, groups, block_r, block_groups(block_r, groups, block), block_n


def _rms_norm_fp4(op, x, residual, weight, eps, block_format, global_scale, layout):
    n = x.shape[-1]
    block, groups, block_r, block_g, block_n = _launch_shape(op, x, n, block_format, global_scale, layout)
    acc, acc_t = compute_dtype(x.dtype)
    x2 = as_rows(x, n)
    r2 = x2 if residual is None else as_rows(residual, n)
    rows, lead = x2.shape[0], tuple(x.shape[:-1])
    y, scales, raw, tiles_per_row = _outputs(lead, rows, n, block_format, layout, x.device)
    res = None if residual is None else torch.empty((rows, n), dtype=residual.dtype, device=x.device)
    if rows * n:
        _rms_norm_fp4_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1), weight.contiguous(),
            scalar(eps, acc_t, x.device), y, raw, y if res is None else res, rows, n, groups, tiles_per_row,
            float(global_scale), FUSED=residual is not None, NVFP4=block_format == "nvfp4",
            SWIZZLED=layout == "swizzled", ACC=acc, BLOCK=block, BLOCK_R=block_r, BLOCK_G=block_g, BLOCK_N=block_n)
    y = y.reshape(lead + (n // 2,))
    return (y, scales) if res is None else (y, scales, res.reshape(x.shape))


def rms_norm_fp4_quant(x, weight, eps, block_format, global_scale, layout):
    return _rms_norm_fp4("rms_norm_fp4_quant", x, None, weight, eps, block_format, global_scale, layout)


def add_rms_norm_fp4_quant(x, residual, weight, eps, block_format, global_scale, layout):
    return _rms_norm_fp4("add_rms_norm_fp4_quant", x, residual, weight, eps, block_format, global_scale, layout)


def silu_and_mul_fp4_quant(x, block_format, global_scale, layout):
    op = "silu_and_mul_fp4_quant"
    h = x.shape[-1] // 2
    block, groups, block_r, block_g, _ = _launch_shape(op, x, h, block_format, global_scale, layout)
    acc, _ = compute_dtype(x.dtype)
    x2 = as_rows(x, x.shape[-1])
    rows, lead = x2.shape[0], tuple(x.shape[:-1])
    y, scales, raw, tiles_per_row = _outputs(lead, rows, h, block_format, layout, x.device)
    if rows * h:
        _silu_mul_fp4_kernel[(triton.cdiv(rows, block_r),)](
            x2, x2.stride(0), x2.stride(1), y, raw, rows, h, groups, tiles_per_row, float(global_scale),
            NVFP4=block_format == "nvfp4", SWIZZLED=layout == "swizzled", ACC=acc, BLOCK=block, BLOCK_R=block_r,
            BLOCK_G=block_g)
    return y.reshape(lead + (h // 2,)), scales


_NO_FLOAT64 = "dtypes=float32,float16,bfloat16"  # see the module docstring

IMPLS = [
    make(op, "triton", "triton", fn, devices=("cpu", "cuda"), domain=_NO_FLOAT64)
    for op, fn in (("rms_norm_fp4_quant", rms_norm_fp4_quant), ("add_rms_norm_fp4_quant", add_rms_norm_fp4_quant),
                   ("silu_and_mul_fp4_quant", silu_and_mul_fp4_quant))
]
