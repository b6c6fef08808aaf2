"""The gated activations: swiglu and silu_and_mul (SiLU), geglu and gelu_and_mul (GELU, erf or tanh
form): their planted bugs and correct variants.  Their quantised forms are in ``activation_quant``
and ``fp4``."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .....impls.eager import up
from ..expect import bug, correct

__all__ = ["swiglu_wrong_derivative", "swiglu_no_upcast", "silu_and_mul_swapped", "swiglu_empty_crash",
           "swiglu_sigmoid_by_tanh", "swiglu_sigmoid_form", "TANH_C", "geglu_tanh_always", "geglu_quick_gelu",
           "gelu_and_mul_swapped", "geglu_no_upcast", "geglu_cdf_only_derivative", "geglu_tanh_derivative_no_3",
           "geglu_other_routes", "swiglu_backward_over_inputs", "swiglu_backward_beside_inputs",
           "geglu_tanh_only", "geglu_backward_rounds_dy_up", "geglu_backward_keeps_dy_up"]


# ------------------------------------------------------------------ swiglu / silu_and_mul bugs
class _SwiGLUGrad(torch.autograd.Function):
    """SwiGLU's forward; its backward takes dy up silu'(g) from ``derivative`` (of dy up, g and
    s = sigmoid(g)) and, with ``over``, writes the gradients into the saved gate and up and returns those (Liger's
    SwiGLU saves memory so: the caller's gate and up hold gradients after the backward)."""

    @staticmethod
    def forward(ctx, gate, up_, derivative, over):
        ctx.save_for_backward(gate, up_)
        ctx.derivative, ctx.over = derivative, over
        return (F.silu(up(gate)) * up(up_)).to(gate.dtype)

    @staticmethod
    def backward(ctx, dy):
        gate, up_ = ctx.saved_tensors
        g, u, d = up(gate), up(up_), up(dy)
        s = torch.sigmoid(g)
        dgate, dup = ctx.derivative(d * u, g, s).to(gate.dtype), (d * g * s).to(up_.dtype)
        if ctx.over:
            return gate.copy_(dgate), up_.copy_(dup), None, None
        return dgate, dup, None, None


def _dsilu(du, g, s):
    return du * s * (1 + g * (1 - s))


@bug("swiglu", "gradients")
def swiglu_wrong_derivative(gate, up_):
    return _SwiGLUGrad.apply(gate, up_, lambda du, g, s: du * s, False)  # d silu = s (1 + g (1 - s)), not s


@bug("swiglu", "gradients")
def swiglu_backward_over_inputs(gate, up_):
    return _SwiGLUGrad.apply(gate, up_, _dsilu, True)


@correct("swiglu")
def swiglu_backward_beside_inputs(gate, up_):
    """``swiglu_backward_over_inputs``' twin: its gradients in tensors of their own."""
    return _SwiGLUGrad.apply(gate, up_, _dsilu, False)


@bug("swiglu", "accuracy", "extremes")
def swiglu_no_upcast(gate, up_):
    return gate / (1 + torch.exp(-gate)) * up_


@bug("silu_and_mul", "accuracy", "extremes")
def silu_and_mul_swapped(x):
    value, gate = x.chunk(2, dim=-1)
    return (F.silu(up(gate)) * up(value)).to(x.dtype)


@bug("swiglu", "accuracy", "contract", "extremes", "gradients")
def swiglu_empty_crash(gate, up_):
    if gate.numel() == 0:
        raise RuntimeError("grid must be non-empty")
    return (F.silu(up(gate)) * up(up_)).to(gate.dtype)


# ------------------------------------------------------------------ swiglu near misses: wrong by a small factor
@bug("swiglu", "accuracy", "extremes")
def swiglu_sigmoid_by_tanh(gate, up_):
    """sigmoid(g) as tanh(g / 2) / 2 + 1/2 (vLLM#24833): 1/2 - 1/2 cancels for g << 0, where
    silu(g) = g sigmoid(g) is tiny but not 0."""
    g = up(gate)
    return (g * (torch.tanh(g / 2) / 2 + 0.5) * up(up_)).to(gate.dtype)


# ------------------------------------------------------------------ swiglu correct variants
@correct("swiglu")
def swiglu_sigmoid_form(gate, up_):
    g = up(gate)
    return (g * torch.sigmoid(g) * up(up_)).to(gate.dtype)


# ------------------------------------------------------------------ geglu / gelu_and_mul bugs
TANH_C = 0.7978845608028654  # sqrt(2 / pi)


def _gelu_tanh(g):
    return 0.5 * g * (1 + torch.tanh(TANH_C * (g + 0.044715 * g * g * g)))


@bug("geglu", "accuracy", "extremes")
def geglu_tanh_always(gate, up_, approximate):
    """The tanh form whatever ``approximate`` says: T5 v1.1 asks for erf-GELU, Gemma for tanh."""
    return (_gelu_tanh(up(gate)) * up(up_)).to(gate.dtype)


def geglu_tanh_only(gate, up_, approximate):
    """The tanh form, right, and NotImplementedError for the erf form (Liger's GeGLU computes tanh
    only): certified under ``approximate=tanh``, rejected without it (its sample asks for erf)."""
    if approximate != "tanh":
        raise NotImplementedError(f"approximate={approximate!r}: the tanh form only")
    return (_gelu_tanh(up(gate)) * up(up_)).to(gate.dtype)


@bug("geglu", "accuracy", "extremes")
def geglu_quick_gelu(gate, up_, approximate):
    """g sigma(1.702 g) (CLIP's QuickGELU) taken for the tanh form."""
    g = up(gate)
    gelu = g * torch.sigmoid(1.702 * g) if approximate == "tanh" else F.gelu(g)
    return (gelu * up(up_)).to(gate.dtype)


@bug("gelu_and_mul", "accuracy", "extremes")
def gelu_and_mul_swapped(x, approximate):
    """gelu(up) * gate: the halves the other way round."""
    value, gate = x.chunk(2, dim=-1)
    return (F.gelu(up(gate), approximate=approximate) * up(value)).to(x.dtype)


@bug("geglu", "accuracy", "extremes")
def geglu_no_upcast(gate, up_, approximate):
    """The formula in x.dtype: every step rounds to bfloat16 / float16."""
    if approximate == "tanh":
        return _gelu_tanh(gate) * up_
    return 0.5 * gate * (1 + torch.erf(gate * 0.7071067811865476)) * up_


class _GeGLUGrad(torch.autograd.Function):
    """The erf form's forward; its backward takes gelu'(g) from ``derivative``."""

    @staticmethod
    def forward(ctx, gate, up_, approximate, derivative):
        ctx.save_for_backward(gate, up_)
        ctx.approximate, ctx.derivative = approximate, derivative
        return (F.gelu(up(gate), approximate=approximate) * up(up_)).to(gate.dtype)

    @staticmethod
    def backward(ctx, dy):
        gate, up_ = ctx.saved_tensors
        g, u, d = up(gate), up(up_), up(dy)
        return ((d * u * ctx.derivative(g, ctx.approximate)).to(gate.dtype),
                (d * F.gelu(g, approximate=ctx.approximate)).to(up_.dtype), None, None)


def _dgelu(g, approximate):
    """gelu'(g): Phi(g) + g phi(g), or for the tanh form (1 + tanh t) / 2 + g (1 - tanh(t)**2) t'(g) / 2."""
    if approximate == "none":
        return 0.5 * (1 + torch.erf(g * 0.7071067811865476)) + g * torch.exp(-0.5 * g * g) * 0.3989422804014327
    th = torch.tanh(TANH_C * (g + 0.044715 * g ** 3))
    return 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * TANH_C * (1 + 3 * 0.044715 * g * g)


class _GeGLUGradRounded(torch.autograd.Function):
    """Right (computed in float64); with ``rounds``, dy * up rounded to the input dtype before the product
    with gelu'(gate) (Liger's GeGLU backward): in float16 a dy * up past 65504 is inf, and so is
    dgate, where the exact dy up gelu'(gate) is finite (gate about 1: gelu' well below 1)."""

    @staticmethod
    def forward(ctx, gate, up_, approximate, rounds):
        ctx.save_for_backward(gate, up_)
        ctx.approximate, ctx.rounds = approximate, rounds
        return (F.gelu(gate.double(), approximate=approximate) * up_.double()).to(gate.dtype)  # float32's tail: not enough

    @staticmethod
    def backward(ctx, dy):
        gate, up_ = ctx.saved_tensors
        g, u, d = gate.double(), up_.double(), dy.double()
        du = (d * u).to(gate.dtype).double() if ctx.rounds else d * u
        return ((du * _dgelu(g, ctx.approximate)).to(gate.dtype),
                (d * F.gelu(g, approximate=ctx.approximate)).to(up_.dtype), None, None)


@bug("geglu", "gradients")
def geglu_backward_rounds_dy_up(gate, up_, approximate):
    return _GeGLUGradRounded.apply(gate, up_, approximate, True)


@correct("geglu")
def geglu_backward_keeps_dy_up(gate, up_, approximate):
    """``geglu_backward_rounds_dy_up``'s twin: dy * up kept in float64."""
    return _GeGLUGradRounded.apply(gate, up_, approximate, False)


def _cdf_only(g, approximate):
    """gelu'(g) taken as Phi(g) (or (1 + tanh t) / 2): the g phi(g) term forgotten."""
    if approximate == "tanh":
        return 0.5 * (1 + torch.tanh(TANH_C * (g + 0.044715 * g ** 3)))
    return 0.5 * (1 + torch.erf(g * 0.7071067811865476))


def _tanh_derivative_no_3(g, approximate):
    """t'(g) = sqrt(2 / pi) (1 + 0.044715 g**2): the 3 of d(g**3)/dg forgotten (the erf form is right)."""
    if approximate == "none":
        return 0.5 * (1 + torch.erf(g * 0.7071067811865476)) + g * torch.exp(-0.5 * g * g) * 0.3989422804014327
    th = torch.tanh(TANH_C * (g + 0.044715 * g ** 3))
    return 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * TANH_C * (1 + 0.044715 * g * g)


@bug("geglu", "gradients")
def geglu_cdf_only_derivative(gate, up_, approximate):
    return _GeGLUGrad.apply(gate, up_, approximate, _cdf_only)


@bug("geglu", "gradients")
def geglu_tanh_derivative_no_3(gate, up_, approximate):
    return _GeGLUGrad.apply(gate, up_, approximate, _tanh_derivative_no_3)


# ------------------------------------------------------------------ geglu correct variants
@correct("geglu")
def geglu_other_routes(gate, up_, approximate):
    """erf form by erfc: g erfc(-g / sqrt 2) / 2 (no cancellation for g << 0); tanh form by the
    sigmoid: g sigma(2 t), as GPU kernels take it."""
    g = up(gate)
    if approximate == "tanh":
        gelu = g * torch.sigmoid(2 * TANH_C * (g + 0.044715 * g * g * g))
    else:
        gelu = 0.5 * g * torch.special.erfc(-g * 0.7071067811865476)
    return (gelu * up(up_)).to(gate.dtype)
