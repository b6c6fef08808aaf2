"""apex's and timm's autocast convention (``fused_rms_norm_affine``), declared ``autocast=casts``
(``properties.declared.domain``): inside ``torch.autocast`` the floating inputs are cast to the
autocast dtype, the statistics taken in float32, and y returned in the autocast dtype (bfloat16),
as every op on autocast's lower-precision list returns.  ``test_autocast`` holds each to the oracle of
the inputs cast to bfloat16.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ....impls.eager import rms_formula, up

BLOCK = 8  # the wrong twin's partial sums of squares, added in bfloat16


def _cast_if_autocast_enabled(*tensors):
    """apex's helper: each floating tensor in the autocast dtype where autocast is on."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def rms_apex_autocast(x, weight, eps):
    """apex's ``fused_rms_norm_affine``: inputs cast to the autocast dtype, float32 statistics,
    autocast off around the kernel, y in the dtype of the cast x (bfloat16 inside autocast)."""
    x, weight = _cast_if_autocast_enabled(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        return rms_formula(up(x), up(weight, x), eps).to(x.dtype)


def _bf16_partial_sums(xf):
    """mean(x^2) with the sum of each row taken as float32 sums of BLOCK squares, rounded to
    bfloat16 and added one after another in bfloat16."""
    n = xf.shape[-1]
    partial = F.pad(xf.pow(2), (0, -n % BLOCK)).unflatten(-1, (-1, BLOCK)).sum(-1).to(torch.bfloat16)
    acc = partial[..., 0]
    for k in range(1, partial.shape[-1]):
        acc = acc + partial[..., k]
    return acc.float().unsqueeze(-1) / n


def rms_apex_autocast_bf16_sums(x, weight, eps):
    """``rms_apex_autocast`` whose autocast path adds its partial sums of squares in bfloat16 (the
    autocast dtype) instead of float32: its rows of more than a few blocks are off by percents."""
    cast = torch.is_autocast_enabled(x.device.type)
    x, weight = _cast_if_autocast_enabled(x, weight)
    with torch.autocast(x.device.type, enabled=False):
        if not cast:
            return rms_formula(up(x), up(weight, x), eps).to(x.dtype)
        xf = up(x)
        return (xf * torch.rsqrt(_bf16_partial_sums(xf) + eps) * up(weight, x)).to(x.dtype)


rms_apex_autocast.normcert_domain = rms_apex_autocast_bf16_sums.normcert_domain = "autocast=casts"
