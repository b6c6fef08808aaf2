"""Eager torch implementations: torch.nn.functional where it keeps the op's meaning on every
device, else the formula in torch ops (RMSNorm: ``rms_formula``; LayerNorm: see ``layer_norm``).

Inputs of reduced precision are computed in float32 and rounded once at the
end; float64 stays float64.  (Calling F.layer_norm directly on bfloat16/float16
CPU tensors is *not* done here: its backward accumulates dweight/dbias in the
low precision, which the suite rejects -- see the case-study table.)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..oracle.dynamic_quant import MIN_SCALE, qmax
from ..oracle.fp4 import BLOCK_FORMATS, swizzle
from ..oracle.kinds import APPROXIMATE, KINDS
from ..oracle.validate import boolean, one_of, positive

from . import make


def up(t: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """t in the compute precision of ``like`` (default t): float64 stays float64, the rest float32."""
    ref = t if like is None else like
    return t.to(torch.float64 if ref.dtype == torch.float64 else torch.float32)


def rms_formula(s, w, eps):
    """s * rsqrt(mean(s^2) + eps) * w in s's precision.  Not F.rms_norm: on CUDA (torch 2.11) it
    returns NaN for the finite elements of a row holding +-inf, whose exact value is
    x_i / inf = 0 (the case-study table), and this kernel is the suite's reference partner;
    the planted variants build on it too."""
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w


def _or(t, like, identity):
    """t in like's compute precision; a weightless call's None as ``identity`` (exact: * 1, + 0)."""
    return identity if t is None else up(t, like)


def rms_norm(x, weight, eps):
    return rms_formula(up(x), _or(weight, x, 1.0), eps).to(x.dtype)


def gemma_rms_norm(x, weight, eps):
    """The offset added in the compute format, after the upcast (not in bfloat16)."""
    return rms_formula(up(x), up(weight, x) + 1, eps).to(x.dtype)


def add_rms_norm(x, residual, weight, eps):
    s = up(x) + up(residual)
    return rms_formula(s, up(weight, x), eps).to(x.dtype), s.to(residual.dtype)


def to_e4m3(v):
    """v rounded once to float8_e4m3fn: nearest-even, saturating at +-448, NaN kept (torch.clamp
    keeps it).  float64 is first rounded to the format's quantum 2**(max(e, -6) - 3), e = floor(log2
    |v|) read from v's exponent bits, in float64 (exact: torch.round ties to even): torch's float64
    -> float8 cast goes through float32 and rounds twice (17 + 2**-30 gives 16, not 18).  (Not
    torch.frexp: inductor's C++ code for its exponent does not compile, torch 2.13.)  From float32
    the cast itself is exact RNE."""
    if v.dtype == torch.float64:
        e = ((v.view(torch.int64) >> 52) & 0x7FF) - 1023
        quantum = ((e.clamp(min=-6) - 3 + 1023) << 52).view(torch.float64)
        v = torch.round(v / quantum) * quantum
    return v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def rms_norm_gated(x, z, weight, eps, norm_before_gate, group_size=None):
    """rms_norm(x) w silu(z), or rms_norm(x silu(z)) w, in the compute format (F.silu), the statistics
    taken per group: with G = group_size (None: G = n, the whole row) and the row's groups
    J_j = {jG, ..., jG + G - 1},

        y_i = q_i rho_j w_i (s_i if norm_before_gate),   rho_j = 1 / sqrt((1/G) sum_{k in J_j} q_k^2 + eps),
        i in J_j,   q = x (norm_before_gate) or x s,   s = silu(z),

    the last dim viewed as (n / G, G) and normalised over the second (the weight alike)."""
    boolean("rms_norm_gated", "norm_before_gate", norm_before_gate)
    KINDS["group_size"].check("rms_norm_gated", "group_size", group_size, x)
    s, w = F.silu(up(z)), up(weight, x)
    q = up(x) if norm_before_gate else up(x) * s
    if group_size is None:
        y = rms_formula(q, w, eps)
    else:
        y = rms_formula(q.unflatten(-1, (-1, group_size)), w.unflatten(-1, (-1, group_size)), eps).flatten(-2)
    return (y * s if norm_before_gate else y).to(x.dtype)


def rms_norm_fp8(x, weight, eps, scale):
    positive("rms_norm_fp8", "scale", scale)
    return to_e4m3(rms_formula(up(x), up(weight, x), eps) / scale)


def add_rms_norm_fp8(x, residual, weight, eps, scale):
    positive("add_rms_norm_fp8", "scale", scale)
    s = up(x) + up(residual)
    return to_e4m3(rms_formula(s, up(weight, x), eps) / scale), s.to(residual.dtype)


def row_scales(rows, scale_ub, q, floor):
    """max(min(amax |rows|, scale_ub) / q, floor) per row (keepdim), NaN kept (amax and clamp
    propagate it), stored in float32."""
    amax = rows.abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub)
    return (amax / q).clamp(min=floor).float()


def to_qdtype(t, qdtype):
    """t rounded once to the quantised format named ``qdtype``, saturating: ``to_e4m3``, or the
    nearest integer (torch.round: ties to even) clamped to int8's [-128, 127]."""
    return torch.round(t).clamp(-128, 127).to(torch.int8) if qdtype == "int8" else to_e4m3(t)


def quantise_rows(op, v, qdtype, scale_ub):
    """(y, scales) of rows v (in the compute format): scale = max(min(amax |v|, scale_ub) / q,
    1 / (512 q)) per row (``row_scales``); y = Q(v / the stored scale) (``to_qdtype``).  The
    arguments are checked by their kinds."""
    KINDS["qdtype"].check(op, "qdtype", qdtype, v)
    KINDS["scale_ub"].check(op, "scale_ub", scale_ub, v)
    q = qmax(qdtype)
    scales = row_scales(v, scale_ub, q, MIN_SCALE / q)
    return to_qdtype(v / scales.to(v.dtype), qdtype), scales[..., 0]


def rms_norm_dynamic_quant(x, weight, eps, qdtype, scale_ub):
    """SGLang's order: v = x rho w in the compute format, y = Q(v / scale)."""
    return quantise_rows("rms_norm_dynamic_quant", rms_formula(up(x), up(weight, x), eps), qdtype, scale_ub)


def add_rms_norm_dynamic_quant(x, residual, weight, eps, qdtype, scale_ub):
    s = up(x) + up(residual)
    y, scales = quantise_rows("add_rms_norm_dynamic_quant", rms_formula(s, up(weight, x), eps), qdtype, scale_ub)
    return y, scales, s.to(residual.dtype)


def pow2_up(s):
    """Each positive s rounded up to a power of two, exactly (frexp: 2**e where the mantissa is not
    already 1/2), for UE8M0 scales; NaN stays NaN."""
    m, e = torch.frexp(s)
    return torch.where((m == 0.5) | s.isnan(), s, torch.ldexp(torch.ones_like(s), e))


def group_scales(peak, scale_format, q, round_up=pow2_up):
    """max(peak / q, 1 / (512 q)) per group from the groups' peaks, stored in float32, and for
    "ue8m0" rounded up to a power of two (``round_up``); NaN kept."""
    scales = (peak / q).clamp(min=MIN_SCALE / q).float()
    return round_up(scales) if scale_format == "ue8m0" else scales


def scales_in(scales, layout):
    """A (..., groups) tensor of scales laid out as ``layout`` says: contiguous ("row_major"), or
    groups first in memory ("column_major": a (groups, ...) buffer seen through movedim), or each
    matrix of the last two dims groups first ("mn_major": (..., groups, tokens) seen transposed)."""
    if layout == "row_major":
        return scales.contiguous()
    if layout == "mn_major":
        return scales.transpose(-1, -2).contiguous().transpose(-1, -2)
    return scales.movedim(-1, 0).contiguous().movedim(0, -1)


def quantise_groups(op, v, group, scale_format, layout):
    """(y, scales) of rows v (in the compute format): per group of ``group`` elements of a row,
    scale = max(amax |v| / 448, 1 / (512 * 448)) (rounded up to a power of two for "ue8m0"), stored
    in float32 and laid out as ``layout`` says; y = e4m3(v / the stored scale).  A row the group does
    not divide has ceil(n / group) groups, the last of the n mod group elements left (tail=partial):
    the row is padded with zeros to whole groups (a zero never raises an amax) and y cut back to n.
    The arguments are checked by their kinds (the group against no row: any row length)."""
    KINDS["group"].check(op, "group", group, None)
    for name, value in (("scale_format", scale_format), ("layout", layout)):
        KINDS[name].check(op, name, value, v)
    n = v.shape[-1]
    count = -(-n // group)
    g = torch.nn.functional.pad(v, (0, count * group - n)).unflatten(-1, (count, group))
    scales = group_scales(g.abs().amax(-1), scale_format, qmax("float8_e4m3fn"))
    y = to_e4m3(g / scales[..., None].to(v.dtype)).flatten(-2)[..., :n]
    return y.contiguous(), scales_in(scales, layout)


def rms_norm_group_quant(x, weight, eps, group, scale_format, layout):
    """v = x rho w in the compute format, quantised per group (``quantise_groups``)."""
    return quantise_groups("rms_norm_group_quant", rms_formula(up(x), up(weight, x), eps), group, scale_format, layout)


def add_rms_norm_group_quant(x, residual, weight, eps, group, scale_format, layout):
    """s = x + residual in the compute format, v = s rho w quantised per group; residual_out = s
    rounded once to the residual's dtype."""
    s = up(x) + up(residual)
    y, scales = quantise_groups("add_rms_norm_group_quant", rms_formula(s, up(weight, x), eps), group, scale_format,
                                layout)
    return y, scales, s.to(residual.dtype)


def to_e2m1(w):
    """w rounded to E2M1 (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}): nearest even, saturating at +-6, in w's
    precision: steps of 0.5 below 2, 1 below 4, 2 from 4 (torch.round ties to even; scaling by a
    power of two is exact).  NaN stays NaN (it has no E2M1 value)."""
    w = w.clamp(-6.0, 6.0)
    a = w.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(w.dtype)
    return torch.round(w / step) * step


def pack_fp4(y):
    """E2M1 values (..., n) as uint8 (..., n / 2): element 2j in byte j's low nibble, 2j + 1 in its
    high one; a code is sign << 3 | index, index 2|y| below 2, |y| + 2 below 4, |y| / 2 + 4 from 4."""
    a = y.abs()
    index = torch.where(a < 2, 2 * a, torch.where(a < 4, a + 2, a / 2 + 4)).nan_to_num(0.0).to(torch.int32)
    code = index | (torch.signbit(y).to(torch.int32) << 3)
    pairs = code.unflatten(-1, (-1, 2))
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def fp4_round_scale(exact, block_format):
    """A block scale rounded into its format, as float32: E4M3 (nearest even, saturating) for
    "nvfp4", the power of two at or above it, in [2**-127, 2**127], for "mxfp4" (in exact's own
    precision: a float64 scale cast to float32 first could round below a power of two); NaN kept."""
    if block_format == "nvfp4":
        return to_e4m3(exact).float()
    return pow2_up(exact.clamp(2.0 ** -127, 2.0 ** 127)).float()


def fp4_block_scales(peak, block_format, global_scale):
    """R(peak / (6 g)) in float32 (``fp4_round_scale``), the peak in the compute format."""
    return fp4_round_scale(peak / (6.0 * global_scale), block_format)


def fp4_scales_in(scales, block_format, layout):
    """The block scales (float32 values) in their format's dtype and ``layout`` ("linear": as they
    are, contiguous; "swizzled": the 128 x 4 tiles, ``oracle.fp4.swizzle``)."""
    stored = scales.to(BLOCK_FORMATS[block_format].scale_dtype)
    return swizzle(stored) if layout == "swizzled" else stored.contiguous()


def check_fp4_args(op, v, block_format, global_scale, layout):
    """ValueError naming the argument where block_format, global_scale or layout is not one of its
    kind's (checked by the kinds, against rows v of the quantised width)."""
    for name, value in (("block_format", block_format), ("global_scale", global_scale), ("layout", layout)):
        KINDS[{"layout": "block_layout"}.get(name, name)].check(op, name, value, v)


def quantise_fp4(op, v, block_format, global_scale, layout):
    """(y packed, scales) of rows v (in the compute format) quantised to FP4 (``oracle.fp4``): per
    block, s = R(amax |v| / (6 g)), y = E2M1(v / (s g)), 0 where s is 0.  The arguments are checked
    by their kinds."""
    check_fp4_args(op, v, block_format, global_scale, layout)
    block = BLOCK_FORMATS[block_format].block
    g = v.unflatten(-1, (v.shape[-1] // block, block))
    scales = fp4_block_scales(g.abs().amax(-1), block_format, global_scale)
    s = scales[..., None].to(v.dtype)
    y = torch.where(s == 0, 0.0, to_e2m1(g / (s * global_scale))).flatten(-2)
    return pack_fp4(y), fp4_scales_in(scales, block_format, layout)


def rms_norm_fp4_quant(x, weight, eps, block_format, global_scale, layout):
    """v = x rho w in the compute format, quantised to FP4 per block (``quantise_fp4``)."""
    return quantise_fp4("rms_norm_fp4_quant", rms_formula(up(x), up(weight, x), eps), block_format, global_scale,
                        layout)


def add_rms_norm_fp4_quant(x, residual, weight, eps, block_format, global_scale, layout):
    """s = x + residual in the compute format, v = s rho w quantised to FP4 per block; residual_out
    = s rounded once to the residual's dtype."""
    s = up(x) + up(residual)
    y, scales = quantise_fp4("add_rms_norm_fp4_quant", rms_formula(s, up(weight, x), eps), block_format,
                             global_scale, layout)
    return y, scales, s.to(residual.dtype)


def layer_norm(x, weight, bias, eps):
    """Centered two-pass ops, not F.layer_norm: its CPU backward forms dx from the
    uncentered x (b*x + c), which cancels on rows with |mean| >> std (see the
    case-study table), while autograd through x - mean stays centered."""
    xf = up(x)
    d = xf - xf.mean(-1, keepdim=True)
    xhat = d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    return (xhat * _or(weight, x, 1.0) + _or(bias, x, 0.0)).to(x.dtype)


def add_layer_norm(x, residual, weight, bias, eps):
    """layer_norm of s = x + residual formed in the compute format; residual_out is s in the
    residual's dtype (a float32 stream stays float32)."""
    s = up(x) + up(residual)
    return layer_norm(s, up(weight, x), up(bias, x), eps).to(x.dtype), s.to(residual.dtype)


def batch_norm(x, weight, bias, eps, mask=None):
    """Two-pass masked statistics over positions (rows of x flattened to (P, C)).

    Padded values are replaced before any arithmetic, so NaN there never
    reaches a sum.  (Flattening also avoids torch's sum(dim=()), which reduces
    over *every* dim for rank-1 x.)
    """
    rows = up(x).reshape(-1, x.shape[-1])
    keep = (torch.ones(rows.shape[0], dtype=torch.bool, device=x.device) if mask is None
            else mask.reshape(-1)).unsqueeze(-1)
    zero = torch.zeros((), dtype=rows.dtype, device=x.device)
    count = keep.sum(0).to(rows.dtype)
    mu = torch.where(keep, rows, zero).sum(0) / count
    d = torch.where(keep, rows - mu, zero)
    var = (d * d).sum(0) / count
    y = d * torch.rsqrt(var + eps) * up(weight, x) + up(bias, x)
    return y.reshape(x.shape).to(x.dtype)


def deep_norm(x, sublayer, alpha, weight, bias, eps):
    z = alpha * x + sublayer(x)
    return layer_norm(z, weight, bias, eps)


def swiglu(gate, up_):
    return (F.silu(up(gate)) * up(up_)).to(gate.dtype)


def silu_and_mul(x):
    gate, value = x.chunk(2, dim=-1)
    return swiglu(gate, value)


def silu_mul_rows(x):
    """silu(gate) * up of x = [gate | up] in the compute format, not rounded to x's dtype: what the
    fused quant kernels below quantise."""
    gate, value = x.chunk(2, dim=-1)
    return F.silu(up(gate)) * up(value)


def silu_and_mul_dynamic_quant(x, qdtype, scale_ub):
    """v = silu(gate) * up in the compute format, quantised per row (``quantise_rows``): vLLM's
    ``silu_and_mul_per_token_group_quant`` with the whole row as its group."""
    return quantise_rows("silu_and_mul_dynamic_quant", silu_mul_rows(x), qdtype, scale_ub)


def silu_and_mul_group_quant(x, group, scale_format, layout):
    """v = silu(gate) * up in the compute format, quantised per group of its row (``quantise_groups``):
    the groups are of the output row, H = n / 2 wide, never across the gate / up boundary."""
    return quantise_groups("silu_and_mul_group_quant", silu_mul_rows(x), group, scale_format, layout)


def valid_tokens(op, x, counts):
    """The rows of x = (experts..., tokens, 2H) within each expert's count, as a bool tensor of
    x.shape[:-1] (counts checked by its kind: an integer tensor of x.shape[:-2], each in [0, tokens])."""
    KINDS["counts"].check(op, "counts", counts, x)
    return torch.arange(x.shape[-2], device=x.device) < counts[..., None]


def silu_and_mul_group_quant_masked(x, counts, group, scale_format, layout):
    """silu_and_mul_group_quant of each expert's first counts[e] tokens; the rows past them are
    replaced by zeros before any arithmetic (never read: a NaN there reaches nothing), so their
    outputs are y = 0 with the floor scale, which no check reads."""
    op = "silu_and_mul_group_quant_masked"
    valid = valid_tokens(op, x, counts)
    kept = torch.where(valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
    return quantise_groups(op, silu_mul_rows(kept), group, scale_format, layout)


def silu_and_mul_fp4_quant(x, block_format, global_scale, layout):
    """v = silu(gate) * up in the compute format (x = [gate | up]), quantised to FP4 per block."""
    gate, value = x.chunk(2, dim=-1)
    return quantise_fp4("silu_and_mul_fp4_quant", F.silu(up(gate)) * up(value), block_format, global_scale, layout)


def gelu(g, approximate):
    """GELU by its defining formulas in g's precision: 0.5 g (1 + erf(g / sqrt 2)), or 0.5 g (1 +
    tanh(sqrt(2 / pi) (g + 0.044715 g**3))).  Not F.gelu: on the CPU (torch 2.13) its erf form gives
    NaN at g = +inf, whose value is +inf * 1 = +inf."""
    one_of("gelu", "approximate", approximate, APPROXIMATE)
    if approximate == "tanh":
        return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g * g * g)))
    return 0.5 * g * (1 + torch.erf(g * math.sqrt(0.5)))


def geglu(gate, up_, approximate):
    return (gelu(up(gate), approximate) * up(up_)).to(gate.dtype)


def gelu_and_mul(x, approximate):
    gate, value = x.chunk(2, dim=-1)
    return geglu(gate, value, approximate)


PARTIAL = "tail=partial"  # the group quants take a last group shorter than the group (``quantise_groups``)

IMPLS = [
    make("rms_norm", "eager", "eager", rms_norm),
    make("gemma_rms_norm", "eager", "eager", gemma_rms_norm),
    make("add_rms_norm", "eager", "eager", add_rms_norm),
    make("rms_norm_gated", "eager", "eager", rms_norm_gated),
    make("rms_norm_fp8", "eager", "eager", rms_norm_fp8),
    make("add_rms_norm_fp8", "eager", "eager", add_rms_norm_fp8),
    make("rms_norm_dynamic_quant", "eager", "eager", rms_norm_dynamic_quant),
    make("add_rms_norm_dynamic_quant", "eager", "eager", add_rms_norm_dynamic_quant),
    make("rms_norm_group_quant", "eager", "eager", rms_norm_group_quant, domain=PARTIAL),
    make("add_rms_norm_group_quant", "eager", "eager", add_rms_norm_group_quant, domain=PARTIAL),
    make("rms_norm_fp4_quant", "eager", "eager", rms_norm_fp4_quant),
    make("add_rms_norm_fp4_quant", "eager", "eager", add_rms_norm_fp4_quant),
    make("silu_and_mul_fp4_quant", "eager", "eager", silu_and_mul_fp4_quant),
    make("layer_norm", "eager", "eager", layer_norm),
    make("add_layer_norm", "eager", "eager", add_layer_norm),
    make("batch_norm", "eager", "eager", batch_norm),
    make("deep_norm", "eager", "eager", deep_norm),
    make("swiglu", "eager", "eager", swiglu),
    make("silu_and_mul", "eager", "eager", silu_and_mul),
    make("silu_and_mul_dynamic_quant", "eager", "eager", silu_and_mul_dynamic_quant),
    make("silu_and_mul_group_quant", "eager", "eager", silu_and_mul_group_quant, domain=PARTIAL),
    make("silu_and_mul_group_quant_masked", "eager", "eager", silu_and_mul_group_quant_masked, domain=PARTIAL),
    make("geglu", "eager", "eager", geglu),
    make("gelu_and_mul", "eager", "eager", gelu_and_mul),
]
