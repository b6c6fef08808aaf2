"""The FP4 ops (NVFP4 and MXFP4: E2M1 values, a scale per block, packed two to a byte):
rms_norm_fp4_quant, add_rms_norm_fp4_quant and silu_and_mul_fp4_quant, their planted bugs and
correct variants."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import fp4_round_scale, fp4_scales_in, pack_fp4, rms_formula, to_e2m1, to_e4m3, up
from .....oracle.fp4 import BLOCK_FORMATS, padded
from ..expect import bug, correct
from ._helpers import _rms

__all__ = ["fp4_nibbles_swapped", "fp4_scale_rounded_down", "fp4_swizzle_transposed", "fp4_swizzled_as_linear",
           "fp4_global_scale_ignored", "fp4_global_scale_twice", "fp4_max_four", "fp4_amax_before_weight",
           "fp4_rcp_approx", "add_fp4_scale_before_add", "add_fp4_sum_in_x_dtype", "add_fp4_unfused",
           "silu_fp4_scale_of_gate", "silu_fp4_halves_swapped", "silu_fp4_rcp_approx"]


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


# ------------------------------------------------------------------ rms_norm_fp4_quant correct variants
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


# ------------------------------------------------------------------ add_rms_norm_fp4_quant bugs and correct variants
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


# ------------------------------------------------------------------ silu_and_mul_fp4_quant bugs and correct variants
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
