"""FP4 kernels that make a documented block-scale choice (``oracle.fp4_scales``, ``nan=unspecified``):
each correct under its declaration, and the meta-tests reject it without one.

    mx_floor_scale / mx_ceil_scale / mx_even_scale   rms_norm_fp4_quant whose MXFP4 shared exponent
        is OCP MX's floor(log2 a) - 2, torchao's CEIL ceil(log2 a) - 2, torchao's EVEN (a's significand
        rounded to one bit, halves up, then floor) with a = amax / g, elements saturating at 6
    nvfp4_scale_floored   rms_norm_fp4_quant whose E4M3 block scale is clamped to >= 2**-6 first
    fp4_nan_any_scale     rms_norm_fp4_quant whose amax drops a NaN (so a block holding one gets
        the finite scale of its other elements): right only where NaN blocks carry no claim
    add_fp4_nan_any_scale  the same after the residual add (add_rms_norm_fp4_quant), declaring
        nan=unspecified: the fusion family compares it with the unfused kernel on the blocks both
        claim alone (a NaN block's bounds are -inf on both sides)
    silu_fp4_byte0_unit_reciprocal  (a bug) silu_and_mul_fp4_quant whose MXFP4 values are multiplied
        by 1.0 where the block's UE8M0 exponent byte is 0 (s = 2**-127), torchao RCEIL's corner: such
        a block comes out all zeros; only the tiny-scale buckets reach it
    mx_without_global_scale  rms_norm_fp4_quant applying the global scale to NVFP4 only, as OCP MX has
        none: right where MXFP4 is called with 1 (the default), wrong declaring mx_global_scale=taken
    fp4_ties_half_away   (a bug) rms_norm_fp4_quant declaring arithmetic=ieee whose E2M1 rounds ties
        half away from zero: only the ties buckets (``buckets.ties_buckets``) put w exactly on a tie
    fp4_ieee_ties_even   its twin, nearest-even, declaring arithmetic=ieee: certified
    silu_fp4_float16_product  (a bug under the default intermediate=float32) silu_and_mul_fp4_quant
        rounding v = silu(gate) up to x's dtype before its amax (vLLM's unfused order): a float16 product
        past 65504 is inf, its block scaled as an infinite one; right where intermediate=input is declared
        (``test_fp4_rules``: the catalogue holds it undeclared)
    silu_fp4_inf_peak_unit_scale  (a bug) silu_and_mul_fp4_quant giving a block whose peak is infinite
        the scale 1 (UE8M0 byte 127) where the rule rounds inf / (6 g) to its largest (byte 254, 448)
    silu_fp4_float32_product  their correct twin: v held in the compute format, every block by the rule
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import fp4_round_scale, fp4_scales_in, pack_fp4, rms_formula, to_e2m1, to_e4m3, up
from .....oracle.fp4 import BLOCK_FORMATS
from ..expect import bucket_bug, bug, correct

__all__ = ["mx_floor_scale", "mx_ceil_scale", "mx_even_scale", "nvfp4_scale_floored", "fp4_nan_any_scale",
           "add_fp4_nan_any_scale", "mx_without_global_scale", "silu_fp4_byte0_unit_reciprocal", "fp4_ties_half_away",
           "fp4_ieee_ties_even", "silu_fp4_float16_product", "silu_fp4_inf_peak_unit_scale", "silu_fp4_float32_product"]


def _exponent(a, mode):
    """The MX shared exponent k of each block amax ratio a >= 0 (in the compute format) under ``mode``, clamped to
    UE8M0's [-127, 127]; a = 0 gives -127."""
    m, e = torch.frexp(a)  # a = m 2**e, m in [0.5, 1)
    top = e - 1  # floor(log2 a)
    if mode == "ceil":
        top = torch.where(m == 0.5, top, top + 1)
    elif mode == "even":
        top = torch.where(m >= 0.875, top + 1, top)
    return torch.where(a > 0, top - 2, -127).clamp(-127, 127)


def _e2m1_half_away(w):
    """w rounded to E2M1 to nearest, ties half away from zero (0.25 -> 0.5, 1.25 -> 1.5, 2.5 -> 3,
    5 -> 6), saturating at +-6: differs from nearest-even (``impls.eager.to_e2m1``) on those ties alone."""
    a = w.abs().clamp(max=6.0)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(w.dtype)
    return torch.sign(w) * torch.floor(a / step + 0.5) * step


def _quantise(v, block_format, global_scale, layout, mode=None, least=None, drop_nan=False, e2m1=to_e2m1):
    """v (compute format) per block: the scale by the MX ``mode`` (mxfp4), or E4M3 of the scale
    clamped to >= ``least`` (nvfp4), or as the eager kernel; y = E2M1(v / (s g)), 0 where s = 0."""
    block = BLOCK_FORMATS[block_format].block
    blocks = v.unflatten(-1, (v.shape[-1] // block, block))
    a = blocks.abs()
    peak = (torch.where(a.isnan(), 0.0, a) if drop_nan else a).amax(-1)
    if block_format == "mxfp4" and mode is not None:
        k = _exponent(peak / global_scale, mode)
        scales = torch.ldexp(torch.ones_like(peak, dtype=torch.float64), k).float()
        scales = torch.where(peak.isnan(), float("nan"), scales)
    elif block_format == "nvfp4" and least is not None:
        scales = to_e4m3((peak / (6.0 * global_scale)).clamp(min=least)).float()
    else:
        scales = fp4_round_scale(peak / (6.0 * global_scale), block_format)
    s = scales[..., None].to(v.dtype)
    y = torch.where(s == 0, 0.0, e2m1(blocks / (s * global_scale))).flatten(-2)
    return pack_fp4(y), fp4_scales_in(scales, block_format, layout)


def _ieee_formula(s, w, eps):
    """s / sqrt(mean(s**2) + eps) * w with a correctly rounded square root and division on every
    device (CUDA's rsqrt is rsqrt.approx; its sqrt and / round correctly)."""
    return s * (1.0 / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + eps)) * w


def _ruled(mode=None, least=None, drop_nan=False, mx_global=True, domain="", doc="", e2m1=to_e2m1):
    formula = _ieee_formula if "arithmetic=ieee" in domain else rms_formula

    def kernel(x, weight, eps, block_format, global_scale, layout):
        v = formula(up(x), up(weight, x), eps)
        g = global_scale if mx_global or block_format == "nvfp4" else 1.0
        return _quantise(v, block_format, g, layout, mode, least, drop_nan, e2m1)
    kernel.__doc__ = doc
    kernel.normcert_domain = domain
    return kernel


mx_floor_scale = correct("rms_norm_fp4_quant")(_ruled(
    mode="floor", domain="mx_scale=floor",
    doc="MXFP4 by OCP MX 1.0 section 6.3: s = 2**(floor(log2(amax / g)) - 2), elements saturating at 6."))
mx_ceil_scale = correct("rms_norm_fp4_quant")(_ruled(
    mode="ceil", domain="mx_scale=ceil", doc="MXFP4 by torchao's CEIL: s = 2**(ceil(log2(amax / g)) - 2)."))
mx_even_scale = correct("rms_norm_fp4_quant")(_ruled(
    mode="even", domain="mx_scale=even",
    doc="MXFP4 by torchao's EVEN: amax / g's significand rounded to one bit (halves up), then floor, minus 2."))
nvfp4_scale_floored = correct("rms_norm_fp4_quant")(_ruled(
    least=2.0 ** -6, domain="block_floor=2^-6",
    doc="NVFP4 with each block scale clamped to >= 2**-6 before its E4M3 cast (torchao's nvfp4_quantize)."))
fp4_nan_any_scale = correct("rms_norm_fp4_quant")(_ruled(
    drop_nan=True, domain="nan=unspecified",
    doc="A block holding a NaN gets the finite scale of its other elements (its amax drops the NaN)."))


@correct("add_rms_norm_fp4_quant")
def add_fp4_nan_any_scale(x, residual, weight, eps, block_format, global_scale, layout):
    """fp4_nan_any_scale after the residual add: a block holding a NaN gets its other elements' scale."""
    s = up(x) + up(residual)
    return (*_quantise(rms_formula(s, up(weight, x), eps), block_format, global_scale, layout, drop_nan=True),
            s.to(residual.dtype))


add_fp4_nan_any_scale.normcert_domain = "nan=unspecified"

mx_without_global_scale = correct("rms_norm_fp4_quant")(_ruled(
    mx_global=False, doc="The global scale applied to NVFP4 blocks only: an MXFP4 block is scaled by amax / 6 alone."))

fp4_ties_half_away = bucket_bug("rms_norm_fp4_quant", "accuracy")(_ruled(
    domain="arithmetic=ieee", e2m1=_e2m1_half_away,
    doc="E2M1 rounded half away from zero; its square root and divisions correctly rounded (it declares ieee)."))
fp4_ieee_ties_even = correct("rms_norm_fp4_quant")(_ruled(
    domain="arithmetic=ieee", doc="E2M1 nearest-even, its square root and divisions correctly rounded."))


@bucket_bug("silu_and_mul_fp4_quant", "accuracy")
def silu_fp4_byte0_unit_reciprocal(x, block_format, global_scale, layout):
    """RCEIL MXFP4 whose reciprocal of the scale is 1.0 where the exponent byte is 0 (s = 2**-127),
    as torchao's ``_to_mx_rceil`` sets it: a block with 0 < amax <= 6 2**-127 is quantised unscaled."""
    gate, value = (up(t) for t in x.chunk(2, dim=-1))
    v = F.silu(gate) * value
    if block_format != "mxfp4":
        return _quantise(v, block_format, global_scale, layout)
    blocks = v.unflatten(-1, (v.shape[-1] // 32, 32))
    scales = fp4_round_scale(blocks.abs().amax(-1) / (6.0 * global_scale), block_format)
    s = scales[..., None].to(v.dtype)
    rcp = torch.where(s == 2.0 ** -127, 1.0, 1.0 / (s * global_scale))
    y = to_e2m1(blocks * rcp).flatten(-2)
    return pack_fp4(y), fp4_scales_in(scales, block_format, layout)


def _silu_v(x, stored=None):
    """v = silu(gate) up in the compute format (x = [gate | up]), rounded to ``stored`` and back if given."""
    gate, value = (up(t) for t in x.chunk(2, dim=-1))
    v = F.silu(gate) * value
    return v if stored is None else v.to(stored).to(v.dtype)


@bug("silu_and_mul_fp4_quant", "extremes")
def silu_fp4_float16_product(x, block_format, global_scale, layout):
    """v rounded to x's dtype before the quant, as an unfused silu_and_mul then FP4 quant stores it."""
    return _quantise(_silu_v(x, stored=x.dtype), block_format, global_scale, layout)



@bug("silu_and_mul_fp4_quant", "extremes")
def silu_fp4_inf_peak_unit_scale(x, block_format, global_scale, layout):
    """A block whose amax is inf gets the scale 1 (its y still E2M1(v / g)); every other block by the rule."""
    v = _silu_v(x)
    block = BLOCK_FORMATS[block_format].block
    blocks = v.unflatten(-1, (v.shape[-1] // block, block))
    peak = blocks.abs().amax(-1)
    scales = torch.where(peak.isinf(), 1.0, fp4_round_scale(peak / (6.0 * global_scale), block_format))
    s = scales[..., None].to(v.dtype)
    y = torch.where(s == 0, 0.0, to_e2m1(blocks / (s * global_scale))).flatten(-2)
    return pack_fp4(y), fp4_scales_in(scales, block_format, layout)


@correct("silu_and_mul_fp4_quant")
def silu_fp4_float32_product(x, block_format, global_scale, layout):
    """v = silu(gate) up held in the compute format, quantised by the rule (an infinite peak's scale its largest)."""
    return _quantise(_silu_v(x), block_format, global_scale, layout)


for _name in __all__:
    globals()[_name].__name__ = globals()[_name].__qualname__ = _name
