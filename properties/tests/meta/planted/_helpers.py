"""Private helpers that more than one module of the planted catalogue uses: the inverse rms, sums
taken left to right (the order whose error grows as n u), and the per-group quantisation with a
partial last group (rms_norm's and silu_and_mul's)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .....impls.eager import group_scales, scales_in, to_e4m3


def _rms(x, eps):
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _sequential_sum(v, dim):
    """Sum along ``dim`` (kept) by a left-to-right sum in v's dtype, every partial sum rounded
    (numpy's ``add.accumulate``; ``torch.cumsum`` accumulates float32 in float64 on CPU): the
    order whose error grows as n u, the error model's gam(n) S1, where a tree order's grows as
    log2(n) u.  A correct kernel may sum in any order; this one shows how much of the bound
    that freedom needs (``benchmarks/tightness.py``)."""
    if v.shape[dim] == 0:
        return v.sum(dim, keepdim=True)
    s = np.take(np.add.accumulate(v.detach().cpu().numpy(), axis=dim), [-1], axis=dim)
    return torch.from_numpy(np.ascontiguousarray(s)).to(v.device)


def _sequential_mean(v):
    """The mean over the last dim by ``_sequential_sum`` (0 for an empty row)."""
    return _sequential_sum(v, -1) / max(v.shape[-1], 1)


def _sequential_column_sum(v):
    """The sum over the rows of a 2-D v by ``_sequential_sum``."""
    return _sequential_sum(v, 0).squeeze(0)


def _rms_sequential(x, eps):
    """``_rms`` with the mean square summed left to right (``_sequential_mean``)."""
    return torch.rsqrt(_sequential_mean(x * x) + eps)


# ------------------------------------------------------------------ a partial last group (tail=partial)
def _tailed_groups(v, group, scale_format, layout, tail_scale="own", tail_values="kept"):
    """v's rows (in the compute format) quantised per group of ``group`` elements, the last one
    partial where group does not divide the row (tail=partial): the row padded with zeros to
    ceil(n / group) whole groups (a zero never raises an amax; a NaN is kept), each group's peak and
    scale, y = e4m3(v times the scale's reciprocal) cut back to n.  One thing changed for a bug: the
    partial group's scale that of the whole group before it (``tail_scale="previous"``), or its
    values dropped, quantised as the pad's zeros (``tail_values="dropped"``)."""
    n = v.shape[-1]
    count, partial = -(-n // group), n % group
    g = F.pad(v, (0, count * group - n)).unflatten(-1, (count, group))
    scales = group_scales(g.abs().amax(-1), scale_format, 448.0)
    if partial and count > 1 and tail_scale == "previous":
        scales = torch.cat([scales[..., :-1], scales[..., -2:-1]], dim=-1)
    w = (g * (1 / scales[..., None].to(g.dtype))).flatten(-2)[..., :n]
    if partial and tail_values == "dropped":
        w = torch.cat([w[..., :n - partial], torch.zeros_like(w[..., n - partial:])], dim=-1)
    return to_e4m3(w).contiguous(), scales_in(scales, layout)
