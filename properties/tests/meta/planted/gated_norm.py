"""rms_norm_gated (Mamba-2's and flash-linear-attention's gated RMSNorm, grouped or not): its planted
bugs and correct variants."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import rms_formula, up
from ..expect import bug, correct

__all__ = ["gated_silu_of_x", "gated_order_ignored", "gated_groups_ignored", "gated_group_stride", "gated_no_dz",
           "gated_backward_ignores_groups", "gated_vllm_order", "gated_transformers_order", "gated_five_arguments",
           "gated_five_arguments_silu_of_x", "gated_mamba2_no_float64", "gated_transformers_no_float64",
           "gated_mamba2_no_float64_silu_of_x"]


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


# ------------------------------------------------------------------ rms_norm_gated correct variants
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


# ------------------------------------------------------------------ written before group_size existed
@correct("rms_norm_gated")
def gated_five_arguments(x, z, weight, eps, norm_before_gate):
    """transformers' ``Qwen3NextRMSNormGated`` convention, written before the op gained ``group_size``:
    five arguments, the statistics over the whole row, the fp32 backward of the variants above.  Its
    signature has no group_size, so it is certified on the cases without groups and its domain says
    "group_size not supported" (``properties.declared.signature``)."""
    return _GatedFp32Backward.apply(x, z, weight, eps, norm_before_gate, None, _gated, False)


@bug("rms_norm_gated", "accuracy", "extremes", "gradients")
def gated_five_arguments_silu_of_x(x, z, weight, eps, norm_before_gate):
    """``gated_five_arguments`` with its gate swapped: silu applied to x where z is meant.  Narrowing
    its domain to whole rows must not certify a wrong kernel."""
    return _gated(x, z, weight, eps, norm_before_gate, gate_of=lambda x, z: x)


# ------------------------------------------------------------------ ... and refusing float64, undeclared
# Correct, but not ``@correct``: ``test_options`` checks what they claim (the narrowing, float64 refused
# undeclared) family by family, where test_meta's certification would repeat gated_five_arguments'.
def _no_float64(x):
    if x.dtype == torch.float64:
        raise NotImplementedError("float64 not supported")


def gated_mamba2_no_float64(x, z, weight, eps, norm_before_gate):
    """Mamba-2's gated RMSNorm as its kernels were called before ``group_size`` (five positional
    arguments, Mamba-2's names), which raises NotImplementedError on float64 as the contract allows a
    kernel that declares no domain: certified on "group_size not supported" (registration's
    narrowing, no declaration of the author's) with float64 refused (undeclared)."""
    _no_float64(x)
    return gated_five_arguments(x, z, weight, eps, norm_before_gate)


def gated_transformers_no_float64(hidden_states, gate, weight, variance_epsilon, norm_before_gate):
    """``gated_mamba2_no_float64`` under transformers' names (``Qwen3NextRMSNormGated``'s forward:
    hidden_states, gate): the same five positional arguments, float64 refused."""
    _no_float64(hidden_states)
    return gated_five_arguments(hidden_states, gate, weight, variance_epsilon, norm_before_gate)


@bug("rms_norm_gated", "accuracy", "extremes", "gradients")
def gated_mamba2_no_float64_silu_of_x(x, z, weight, eps, norm_before_gate):
    """``gated_mamba2_no_float64`` with its gate swapped (silu of x): refusing float64 does not
    certify what it gets wrong in the others."""
    _no_float64(x)
    return gated_five_arguments_silu_of_x(x, z, weight, eps, norm_before_gate)
