"""silu_and_mul quantised to fp8 or int8: silu_and_mul_dynamic_quant (a scale per row),
silu_and_mul_group_quant (a scale per group) and silu_and_mul_group_quant_masked (MoE experts'
rows, padded): planted bugs and correct variants.  silu_and_mul to FP4 is in ``fp4``."""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from .....impls.eager import group_scales, pow2_up, row_scales, scales_in, silu_mul_rows, to_e4m3, to_qdtype, up
from .....oracle.dynamic_quant import MIN_SCALE, qmax
from ..expect import bug, correct
from ._helpers import _tailed_groups

__all__ = ["sdq_product_in_bf16", "sdq_scale_ignores_ub", "sdq_no_scale_floor", "sdq_scale_from_gate",
           "sgq_gate_up_interleaved", "sgq_product_in_bf16", "sgq_scale_from_gate", "sgq_no_scale_floor",
           "sdq_sglang_order", "sgq_sglang_order", "sgq_tail_partial", "sgqm_scratch_in_padding",
           "sgqm_packed_token_offsets", "sgqm_scale_over_expert", "sgqm_padding_left_unwritten", "sgq_vllm_amax_floor",
           "sgqm_sglang_amax_floor", "sgqm_deepgemm_mn_major"]


# ------------------------------------------------------------------ silu_and_mul_dynamic_quant / _group_quant bugs
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


# ------------------------------------------------------------------ silu_and_mul quant correct variants
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


# ------------------------------------------------------------------ silu_and_mul_group_quant_masked correct variants
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


# ------------------------------------------------------------------ the libraries' amax floor (amax_floor=1e-10)
def _amax_floored(v, group, scale_format, amax_floor):
    """(y, scales (..., G), row-major) of rows v (the compute format) as vLLM's
    ``per_token_group_quant_fp8`` and SGLang's ``silu_and_mul_masked_post_quant_fwd`` compute them:
    per group, scale = max(amax, amax_floor) / 448 in the compute format (the floor a float32
    constant), stored in float32 and rounded up to a power of two for "ue8m0"; y = e4m3(v / scale)."""
    n = v.shape[-1]
    g = v.unflatten(-1, (n // group, group))
    amax = g.abs().amax(-1)
    floor = torch.tensor(amax_floor, dtype=torch.float32).to(amax.dtype)
    scales = (torch.maximum(amax, floor) / 448.0).float()
    scales = pow2_up(scales) if scale_format == "ue8m0" else scales
    return to_e4m3(g / scales[..., None].to(g.dtype)).flatten(-2), scales


@correct("silu_and_mul_group_quant")
def sgq_vllm_amax_floor(x, group, scale_format, layout):
    """vLLM's silu_and_mul (silu(gate) * up in float32, rounded once to x's dtype) then its
    ``per_token_group_quant_fp8`` (``_amax_floored``: the amax floored at 1e-10), declared
    (amax_floor=1e-10): certified so, rejected by extremes without it (an all-zero group's scale
    is 1e-10 / 448, not 1 / (512 * 448); ``test_library_rules``)."""
    v, _ = _silu_mul(x)
    y, scales = _amax_floored(up(v.to(x.dtype), x), group, scale_format, 1e-10)
    return y, scales_in(scales, layout)


sgq_vllm_amax_floor.normcert_domain = "amax_floor=1e-10"


def _uninitialised(shape, dtype):
    """A tensor of ``shape`` holding os.urandom's bytes, new on each call (torch's own generator is
    seeded alike before each call of a kernel): memory as torch.empty may hand it back."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not size:  # frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(os.urandom(size)), dtype=torch.uint8).view(dtype).reshape(shape)


@correct("silu_and_mul_group_quant_masked")
def sgqm_sglang_amax_floor(x, counts, group, scale_format, layout):
    """SGLang's ``silu_and_mul_masked_post_quant_fwd``: per expert, its first counts[e] rows in SGLang's
    order (``_silu_mul_sglang``), quantised with the amax floored at 1e-10 (``_amax_floored``); the
    rows past counts[e] never written, left as torch.empty leaves them: whatever memory it hands back,
    here fresh bits from the OS on each call (``_uninitialised``: so that --bitwise determinism sees
    two calls differ there, ``test_library_rules``).  Declared amax_floor=1e-10."""
    n = x.shape[-1] // 2
    y = _uninitialised(x.shape[:-1] + (n,), torch.float8_e4m3fn)
    scales = _uninitialised(x.shape[:-1] + (n // group,), torch.float32)
    flat_x, flat_y, flat_s = x.reshape(-1, *x.shape[-2:]), y.view(-1, *y.shape[-2:]), scales.view(-1, *scales.shape[-2:])
    for e, c in enumerate(counts.reshape(-1).tolist()):
        if c:
            flat_y[e, :c], flat_s[e, :c] = _amax_floored(_silu_mul_sglang(flat_x[e, :c]), group, scale_format, 1e-10)
    return y, scales_in(scales, layout)


sgqm_sglang_amax_floor.normcert_domain = "amax_floor=1e-10"


@correct("silu_and_mul_group_quant_masked")
def sgqm_deepgemm_mn_major(x, counts, group, scale_format, layout):
    """vLLM's ``_silu_mul_fp8_quant_deep_gemm``: per expert, its first counts[e] rows, silu(gate) * up in
    float32 (one rounding), groups of 128, the amax floored at 1e-10 (``_amax_floored``), and the
    scales written in DeepGEMM's masked layout whatever ``layout`` asks: (E, T, G) with strides
    (T G, 1, T), "mn_major".  Declared groups=128 layouts=mn_major amax_floor=1e-10: certified so;
    undeclared it is asked for row_major and column_major scales it does not write, and rejected."""
    n = x.shape[-1] // 2
    y = torch.zeros(x.shape[:-1] + (n,), dtype=torch.float8_e4m3fn)
    scales = torch.ones(x.shape[:-1] + (n // group,), dtype=torch.float32)
    flat_x, flat_y, flat_s = x.reshape(-1, *x.shape[-2:]), y.view(-1, *y.shape[-2:]), scales.view(-1, *scales.shape[-2:])
    for e, c in enumerate(counts.reshape(-1).tolist()):
        if c:
            flat_y[e, :c], flat_s[e, :c] = _amax_floored(_silu_mul(flat_x[e, :c])[0], group, scale_format, 1e-10)
    return y, scales_in(scales, "mn_major")


sgqm_deepgemm_mn_major.normcert_domain = "groups=128 layouts=mn_major amax_floor=1e-10"
