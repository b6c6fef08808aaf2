"""rms_norm quantised to fp8 or int8: rms_norm_dynamic_quant (a scale per row), rms_norm_group_quant
(a scale per group), rms_norm_fp8 (a static scale) and their add_ forms: planted bugs and correct
variants.  rms_norm to FP4 is in ``fp4``."""
from __future__ import annotations

import torch

from .....impls.eager import group_scales, pow2_up, rms_formula, row_scales, scales_in, to_e4m3, to_qdtype, up
from .....oracle.dynamic_quant import EPS32, MIN_SCALE, qmax
from ..expect import bug, correct
from ._helpers import _rms_sequential, _tailed_groups

__all__ = ["dq_scale_from_x", "dq_fp8_max_224", "dq_bf16_before_cast", "dq_times_scale", "dq_int8_truncated",
           "dq_no_scale_floor", "add_dq_scale_before_add", "dq_nan_ignored_nan_zeroed", "dq_floor_not_as_declared",
           "dq_vllm_order", "dq_nan_ignored", "dq_eps32_floor", "add_dq_unfused", "gq_ue8m0_rounded_down",
           "gq_groups_across_rows", "gq_scale_per_row", "gq_layout_ignored", "gq_fp8_max_224",
           "gq_tail_scale_of_previous_group", "gq_tail_values_dropped", "add_gq_scale_before_add",
           "add_gq_sum_in_x_dtype", "gq_vllm_order", "gq_tail_partial", "add_gq_unfused", "fp8_nan_to_max",
           "fp8_overflow_to_nan", "fp8_scale_multiplied", "fp8_truncates", "add_fp8_normalises_x",
           "add_fp8_residual_scaled", "rms_fp8_vllm_order", "add_rms_fp8_unfused"]


# ------------------------------------------------------------------ (add_)rms_norm_dynamic_quant bugs
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


# ------------------------------------------------------------------ (add_)rms_norm_dynamic_quant correct variants
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


@correct("add_rms_norm_dynamic_quant")
def add_dq_unfused(x, residual, weight, eps, qdtype, scale_ub):
    """The sum rounded to the residual stream's dtype first, then vLLM's rms_norm_dynamic_quant of it
    (its intermediates rounded to the stream's dtype)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return (*dq_vllm_order(s, weight, eps, qdtype, scale_ub), s)


# ------------------------------------------------------------------ (add_)rms_norm_group_quant bugs
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


# ------------------------------------------------------------------ (add_)rms_norm_group_quant correct variants
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


@correct("add_rms_norm_group_quant")
def add_gq_unfused(x, residual, weight, eps, group, scale_format, layout):
    """The sum rounded to the residual stream's dtype first, then vLLM's rms_norm_group_quant of it
    (its intermediates rounded to the stream's dtype)."""
    s = (up(x) + up(residual)).to(residual.dtype)
    return (*gq_vllm_order(s, weight, eps, group, scale_format, layout), s)


# ------------------------------------------------------------------ (add_)rms_norm_fp8 bugs
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


# ------------------------------------------------------------------ (add_)rms_norm_fp8 correct variants
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
