r"""Error-model bounds of the dynamically quantised forms (``dynamic_quant``), from the base op's.

Notation and the reference kernel as in ``error_model``; v is the base op's first output and B_v
its bound (x.dtype's roundings included: vLLM rounds x rho to x.dtype, then its product with the
weight), q the quantised format's largest value, S the exact scale of a row, s_k the kernel's.

    scale   the kernel takes A_k = max_i |v_k,i| of its own v, within max_i B_v,i of A = max_i |v_i|
            (|max|a| - max|b|| <= max|a - b|); the cap at scale_ub and the floor are 1-Lipschitz and
            exact; the division by q (or a product with a rounded 1 / q) costs 2 u_c S, the float32
            store u_32 S, and the float64 oracle's own division ORACLE S:

                B_s = |s_k - S| <= max_i B_v,i / q + (2 u_c + u_32 + ORACLE) S

    y       against the kernel's own scale (``kernel_scale``, the accuracy check): w = v / s_k, and
            the kernel's value before its last rounding is within B_v / s_k + 2 u_c |w| of it (a
            division, or a rounded reciprocal and a product), plus ORACLE |w| (w formed in float64).
            y must lie in [Q(w - B), Q(w + B)] (``assessment.assess``): bit-exact where B reaches no
            midpoint.  Against the exact scale (two calls of a kernel compared): any scale within
            B_s of S, so B_v / (S - B_s) + 2 u_c |w| + |v| B_s / (S (S - B_s)) around w = v / S.
            No claim (bound -inf) where the scale is not a positive finite number (its own check
            says so, or its row has no claim) or, for int8, which has no NaN, where v is NaN.
"""
from __future__ import annotations

import numpy as np
import torch

from .dynamic_quant import QDTYPES, qmax
from .error_model import ORACLE, Context
from .formats import FORMATS, IntegerFormat, fmt

U_32 = FORMATS[torch.float32].u  # the scales are stored in float32


def rescaled(y, scale, kernel_scale):
    """w = v / s_k from the oracle's y = v / S and S: the exact value over the kernel's own scale."""
    with np.errstate(all="ignore"):
        return y * np.asarray(scale)[..., None] / np.asarray(kernel_scale, dtype=np.float64)[..., None]


def dynamic(base, main: str, qdtype: str):
    """The bounds (y's, the scale's, the rest) of base dynamically quantised, y's against the exact
    scale or, given ``kernel_scale`` (one per row), against that; other keywords (a fused form's
    ``rows=``) go to base."""

    def bound(args, exact, kernel=True, kernel_scale=None, **kw):
        ctx = Context(args[main].dtype, kernel=kernel)
        y, scale = exact[0], exact[1]
        with np.errstate(all="ignore"):
            v = y * scale[..., None]
            v_bound, *rest = base(args, (v, *exact[2:]), kernel, **kw)
            peak_err = np.max(np.where(np.isnan(v_bound), np.inf, v_bound), axis=-1, initial=0.0)
            scale_bound = peak_err / qmax(args[qdtype]) + (2 * ctx.uc + (U_32 if kernel else 0.0) + ORACLE) * scale
            if kernel_scale is None:
                s, sb = scale[..., None], scale_bound[..., None]
                low = np.where(s > sb, s - sb, 0.0)
                y_bound = v_bound / low + (2 * ctx.uc + ORACLE) * np.abs(v / s) + np.abs(v) * sb / (s * low)
            else:
                s = np.asarray(kernel_scale, dtype=np.float64)[..., None]
                y_bound = v_bound / s + (2 * ctx.uc + ORACLE) * np.abs(v / s)
            no_claim = ~(np.isfinite(s) & (s > 0))
            if isinstance(fmt(QDTYPES[args[qdtype]]), IntegerFormat):
                no_claim = no_claim | np.isnan(v)
            y_bound = np.where(no_claim, -np.inf, np.where(np.isnan(y_bound), np.inf, y_bound))
        return (y_bound, scale_bound, *rest)

    return bound
