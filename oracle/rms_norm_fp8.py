"""RMSNorm, and RMSNorm fused with the residual add, quantised to FP8 with a static scale.

Per row (last dim, length n), with weight w and a per-tensor scale s > 0
(vLLM's ``rms_norm_static_fp8_quant`` and ``fused_add_rms_norm_static_fp8_quant``):

    v    = rms_norm(x, w, eps) / s                      (the exact real value)
    y    = Q(v)                                          rms_norm_fp8(x, w, eps, s)

    v    = rms_norm(x + r, w, eps) / s,  y = Q(v),  res = RNE_{x.dtype}(x + r)
                                                         add_rms_norm_fp8(x, r, w, eps, s)

Q rounds to float8_e4m3fn: nearest, ties to even, and *saturating*: a v past
the largest finite value 448 gives ±448 (the format has no infinities).  NaN
policy: NaN stays NaN -- a row holding NaN, or ±inf (rms_norm's inf * 0), gives
NaN where rms_norm does; a kernel that clamps with fmin / fmax, which drop a
NaN, turns it into ±448 and hides it.

The oracle's outputs are v (rounded once to float64) and res; Q is applied by
whoever needs the rounded value (``formats.E4M3``).  Where v's float64 error
could put it on the wrong side of a midpoint of Q, ``oracle.forward`` resolves
the row with mpmath, so Q(v) is the exactly rounded value.

No backward: these are inference ops (the output is an FP8 activation).
"""
from __future__ import annotations

from . import rms_norm


def forward(B, x, weight, eps, scale):
    return (rms_norm.forward(B, x, weight, eps)[0] / scale,)


def add_forward(B, x, residual, weight, eps, scale):
    y, res = rms_norm.add_forward(B, x, residual, weight, eps)
    return y / scale, res
