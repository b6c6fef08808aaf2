"""An autotuned kernel in the usual package layout, for the meta-tests: its launcher reaches the
``@triton.autotune`` kernel through a module attribute (``lib.kernel[grid](...)``), with no
global name of its own bound to the autotuner.

``rms_norm_tuned_drops_tail`` launches ``planted_tuned._tuned_drops_tail`` so: right under
``BLOCK=1024``, the last ``n % 32`` outputs of each row never written under ``BLOCK=32``.
``rms_norm_tuned_by_name`` launches ``planted_tuned._tuned`` (correct) through a name in a string,
which no reading of its code finds: its autotuner is not forced, and the failure must say so.
"""
from __future__ import annotations

import torch

from . import planted_tuned as lib


def rms_norm_tuned_drops_tail(x, weight, eps):
    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty_like(rows)
    if out.numel():
        lib._tuned_drops_tail[(rows.shape[0],)](rows, weight.contiguous(), out, n, eps)
    return out.reshape(x.shape)


def rms_norm_tuned_by_name(x, weight, eps):
    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty_like(rows)
    if out.numel():
        getattr(lib, "_" + "tuned")[(rows.shape[0],)](rows, weight.contiguous(), out, n, eps)
    return out.reshape(x.shape)


for _kernel in (rms_norm_tuned_drops_tail, rms_norm_tuned_by_name):
    _kernel.normcert_domain = lib.DOMAIN
