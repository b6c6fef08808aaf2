"""An op quantised with a static scale, from the op it quantises: its first output divided by a
per-tensor scale s > 0 and rounded once to a narrow format.

    v  = f(args)[0] / s                                  (the exact real value)
    y  = Q(v),  the other outputs as f gives them        op(args, s)

as vLLM's ``rms_norm_static_fp8_quant`` (f = rms_norm) and
``fused_add_rms_norm_static_fp8_quant`` (f = rms_norm fused with the residual add, whose
res = RNE(x + r) is unchanged).

Q rounds to the output's format (``record.Out.quantised``; float8_e4m3fn): nearest, ties to
even, and *saturating*: a v past the largest finite value 448 gives ±448 (the format has
no infinities).  NaN policy: NaN stays NaN -- a row holding NaN, or ±inf (rms_norm's
inf * 0), gives NaN where f does; a kernel that clamps with fmin / fmax, which drop a
NaN, turns it into ±448 and hides it.

The oracle's output is v (rounded once to float64); Q is applied by whoever needs the
rounded value (``formats.E4M3``).  Where v's float64 error could put it on the wrong
side of a midpoint of Q, ``oracle.forward`` resolves the row with mpmath, so Q(v) is
the exactly rounded value.

No backward: these are inference ops (the output is an FP8 activation).
"""
from __future__ import annotations


def forward(base, scale: str):
    """The quantised forward from base's, ``base(B, **args) -> outputs``: v = base's first / scale."""

    def quantised(B, **args):
        rest = {k: v for k, v in args.items() if k != scale}
        first, *others = base(B, **rest)
        return (first / args[scale], *others)

    return quantised
