"""Norms as modules (``properties.declared.modules``): classes and an instance as models hold them.

``LlamaLikeRMSNorm`` is transformers' LlamaRMSNorm written afresh (statistics in float32, the weight
applied in its own dtype, ``variance_epsilon``); ``llama_instance`` one of width 4096 built with its
own eps, which normcert replaces per case; ``RMSNormFixedEps`` takes ``eps`` and ignores it (1e-6
always), rejected where a row's mean square is near eps; ``NoWeight`` holds no parameter, refused
at registration; ``no_eps_instance`` an instance holding no epsilon normcert can set.
"""
from __future__ import annotations

import torch
from torch import nn


class LlamaLikeRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight * h.to(x.dtype)) if self.weight.dtype == x.dtype else (self.weight * h).to(x.dtype)


LlamaLikeRMSNorm.normcert_domain = "dtypes=float32,float16,bfloat16"  # float32 statistics: float64 is not its claim

llama_instance = LlamaLikeRMSNorm(4096, eps=1e-5)


class RMSNormFixedEps(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = 1e-6  # the eps asked for is dropped

    def forward(self, x):
        xf = x.double()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.double()).to(x.dtype)


class RMSNormExact(RMSNormFixedEps):
    """``RMSNormFixedEps``' twin: the eps it is given."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps)
        self.eps = eps


class NoWeight(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x


no_eps_instance = nn.Identity()
