"""RMSNorm registered as a torch operator, as serving engines register their kernels
(``torch.ops.vllm.rms_norm``, ``torch.ops.sgl_kernel.rmsnorm``): ``torch.ops.normcert.rms_norm``,
made with ``torch.library.custom_op``, with

    a fake implementation   the output's shape, dtype and strides, for the compiler to trace:
                            y = empty_like(x) (x's shape, dtype and layout, as the kernel's own)
    an autograd formula     dx = r * (g - x_hat * mean(g * x_hat)),  dw = sum over rows of dy * x_hat,
                            with r = 1 / sqrt(mean(x^2) + eps), x_hat = x * r, g = dy * w
                            (in float32, or float64 for float64 inputs), saved r and x

The kernel under test is the operator itself (``torch.ops.normcert.rms_norm``): normcert checks
its registration with ``torch.library.opcheck`` and its compiled calls (``properties.families.compiled``)
besides every other family.  Its weight is not optional (an operator's schema has one
signature): the domain says ``weightless=no``.
"""
from __future__ import annotations

import torch

from . import make
from .eager import rms_formula, up


@torch.library.custom_op("normcert::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_formula(up(x), up(weight, x), eps).to(x.dtype)


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, weight, eps = inputs
    xf = up(x)
    ctx.save_for_backward(x, weight, torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def _backward(ctx, dy):
    x, weight, r = ctx.saved_tensors
    xf = up(x)
    x_hat = xf * r
    g = up(dy, x) * up(weight, x)
    dx = r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    dw = (up(dy, x) * x_hat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype), None


_rms_norm.register_autograd(_backward, setup_context=_setup)

rms_norm = torch.ops.normcert.rms_norm
"""The operator, as a compiled model calls it."""

IMPLS = [
    make("rms_norm", "custom_op", "custom-op", rms_norm, target="normcert.impls.custom_op:rms_norm",
         domain="weightless=no"),
]
