"""The probe kernels of ``interpreter`` (imported only where Triton is): each computes 0.5 on a GPU."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt


@triton.jit
def float_scalar(out, eps):
    tl.store(out, eps.to(tl.float32) * 2)


@triton.jit
def libdevice_rsqrt(out, x):
    tl.store(out, rsqrt(tl.load(x)))


def float_probe() -> bool:
    out = torch.zeros(1)
    float_scalar[(1,)](out, 0.25)
    return out.item() == 0.5


def libdevice_probe() -> bool:
    out, x = torch.zeros(1), torch.full((1,), 4.0)
    libdevice_rsqrt[(1,)](out, x)
    return out.item() == 0.5
