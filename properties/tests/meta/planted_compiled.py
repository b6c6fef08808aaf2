"""Kernels right when called eagerly and wrong as a compiled model calls them
(``families.compiled``); the registry's ``normcert.impls.custom_op:rms_norm`` is the correct twin.

Each is an rms_norm(x, weight, eps); ``test_compiled`` says what must reject each.
"""
from __future__ import annotations

import torch

from ....impls.eager import rms_norm as eager_rms_norm


@torch.library.custom_op("normcert_planted::rms_norm_fake_float32", mutates_args=())
def rms_fake_says_float32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A torch operator whose real kernel is right and whose fake implementation (what the compiler
    traces) says the output is float32 whatever x's dtype: a compiled model would plan its next ops
    on the wrong dtype."""
    return eager_rms_norm(x, weight, eps)


@rms_fake_says_float32.register_fake
def _(x, weight, eps):
    return torch.empty(x.shape, dtype=torch.float32, device=x.device)


def rms_compiled_drops_eps(x, weight, eps):
    """A plain kernel (checked under --compile) whose traced path drops eps: right eagerly, wrong
    once torch.compile traces it."""
    if torch.compiler.is_compiling():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True)) * (1 if weight is None else weight.float())).to(x.dtype)
    return eager_rms_norm(x, weight, eps)
