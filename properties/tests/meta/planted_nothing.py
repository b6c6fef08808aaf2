"""Kernels wrong everywhere, declaring a domain no case of their op fits (``test_nothing``): checked
on the 0-element cases such a domain fits every case to, every check would pass on nothing.

Each declares its domain on itself (``normcert_domain``), as a user's kernel would.
"""
from __future__ import annotations

import torch

from ....impls.eager import rms_norm_group_quant


def group_quant_forty_two(x, weight, eps, group, scale_format, layout):
    """Its quantised output and its scales are 42 everywhere."""
    y, scales = rms_norm_group_quant(x, weight, eps, group, scale_format, layout)
    return torch.full_like(y, 42), torch.full_like(scales, 42)


group_quant_forty_two.normcert_domain = "max_width=100"  # its rows are multiples of 128: none fits


def group_quant_doubled_scales(x, weight, eps, group, scale_format, layout):
    """Right values, each scale twice the right one."""
    y, scales = rms_norm_group_quant(x, weight, eps, group, scale_format, layout)
    return y, scales * 2


group_quant_doubled_scales.normcert_domain = "max_width=100"


def silu_and_mul_forty_two(x):
    """42 everywhere in silu(gate) * up's shape."""
    return torch.full((*x.shape[:-1], x.shape[-1] // 2), 42.0, dtype=x.dtype, device=x.device)


silu_and_mul_forty_two.normcert_domain = "max_width=1"  # its rows are [gate | up]: 2 at least
