r"""Error-model bounds of the gated RMSNorm (``rms_norm_gated``), from rms_norm's and SiLU's.

Notation and the reference kernel as in ``error_model``; s = silu(z), r = x rho w (rms_norm's
output), g = x s.  A correct kernel forms s in c to ``silu_rel`` relative (``bounds_gated``), or,
where sigma(z) is below lam_c (z < -87 in float32), flushes it: s is then off by lam_c |z| at most,
and s itself may flush (lam_c).  The float64 oracle forms s to 6 u_64 (exp 2, 1 + e, the division,
z sigma: 1 each; sigma's relative sensitivity to e is at most 1) and rounds a product with it once
more, or exactly rounds an element it redoes (subnormal: 2**-1075 absolutely): ORACLE |s| + ORACLE
LAM_64 covers both.  So each s_i is off by

    e_s = (silu_rel(z) + u_c + ORACLE) |s| + lam_c (1 + |z|) + ORACLE LAM_64

(u_c: the one product in c that uses it).  Forward, per output element:

    norm_before_gate      y = r s:  B_r |s| + |r| e_s + u_c |y| + round_out(|y|),  B_r rms_norm's
                          bound on r (its output roundings allow a kernel to round r to x.dtype
                          before gating)
    not norm_before_gate  y = rms_norm(g):  rms_norm's bound with g's values moved by |x| e_s
                          (``bounds_norms.NormInput.error``: s_i's own move and rho's), plus,
                          where the weight is not in x's dtype, its rounding to x's dtype:
                          u_o (|y_i| + lam_o |ghat_i|), ghat = g rho_g (``_weight_rounding``)

The weight's rounding.  The transformers order (Qwen3-Next's ``RMSNormGated`` gating after, the
Mamba-2 ``MambaRMSNormGated`` gating first) multiplies by the weight in x's dtype: the normalised
value rounded to o, times w rounded to o (exact where w is already in x's dtype, u_o |w_i| where it is
a float32 weight beside a float16 / bfloat16 x, or u_o lam_o below lam_o), the product rounded to o,
and, gating after, times s in c and rounded to o again.  Gating after, that is four roundings to o
on |y|, the two of r's bound (``ROUNDINGS``, times |s|) and the two of y's round_out: no term is
needed.  Gating first, y = RNE_o(w_o RNE_o(ghat)) is three, one past rms_norm's two, so the bound
adds the weight's: |ghat_i| |w_i - w_o,i| <= u_o (|y_i| + lam_o |ghat_i|) (to first order; the
product with the other roundings' relative errors is within rms_norm's second-order slack, as
u_o^2 < u_c).  Observed without it: float16 extremes, a float32 weight (w = 2.17, x ~ 3e4, z = 309),
y = 2.21484375 against 2.21208, 1.07 of the bound (1.41 ulp of float16: three roundings of 0.5 ulp
each, less what cancels, where the bound allowed 1.32).

Gradients (s' = silu'(z) = sigma (1 + z (1 - sigma)), off by e_s' = (silu_rel + 3 u_c + ORACLE)
sigma (1 + |z| (1 - sigma)) + lam_c (1 + |z|), as ``bounds_gated.swiglu_bwd``: its terms in absolute
value, since 1 + z (1 - sigma) cancels near z = -1.28, where s' = 0):

    norm_before_gate      dx, dw: rms_norm's at x for the cotangent dy s, off by |dy| e_s
                          (``rms_norm_bwd``'s cotangent_error); dz = dy r s':
                          |dy| (|r s'| (rho_rel + SAVED + u_c) + |r| e_s') + 2 u_c |dz| + round_out + lam_c
    not norm_before_gate  dg, dw: rms_norm's at g (moved as the forward's) for dy, dg's bound B_g;
                          dx = dg s:   B_g |s| + |dg| e_s + u_c |dx| + round_out(|dx|)
                          dz = dg x s': B_g |x s'| + |dg x| e_s' + 2 u_c |dz| + round_out(|dz|) + lam_c
                          (|dg| from its formula in float64)

Groups (``group_size`` = G dividing n; ``rms_norm_gated``'s docstring): on the columns J_j of group j
the op is the ungrouped one on rows of length G, with w[J_j] and z[J_j], and no quantity of one group
enters another's outputs; a correct grouped kernel is, on those columns, a correct ungrouped kernel on
rows of length G (it may order the group's sum as it likes, as an ungrouped one its row's).  So every
bound above holds per group with the group in place of the row (``per_group`` evaluates each on the
group's columns and joins them):

    n -> G in rho's relative error, gam(G+1)/2 + (FN_ULPS + 2) u_c + G lam_c / (ms_j + eps), with
           ms_j = mean(q^2) over the group, not the row (a group of small values beside a large
           one has its own, larger lam_c term: its rho is the one that may lose bits);
    n -> G in dx's mean of products, gam(G + 2) on its signed reach, and in the claim: a group
           carries one where 4 G peak_j^2 < max_c (its own sum of squares cannot overflow c), so
           an overflowing group takes no claim from the others;
    dw[J_j] sums dy c_i qhat_i over the rows as before: gam(rows + 2), the rows' count, not n,
           its claim that of every row's group j.

With G = n (group_size None or n) it is the bound above exactly.

A bound that is +inf (no claim: rms_norm's rows outside the compute format) stays +inf where it is
multiplied by a zero (s = 0 at z = 0).  Where s = +inf, y = r s may come back NaN from a correct kernel
(``rms_norm_gated_indeterminate``).  In unclaimed rows y = r s may be infinite exactly (float64 x and
z near float64's largest value): its bound there is -inf, no claim at all (``assessment.assess``).
"""
from __future__ import annotations

import numpy as np
import torch

from .bounds_gated import silu_rel
from .bounds_norms import NormInput, inverse_rms, affine_values, rms_norm_bwd, rms_norm_fwd
from .error_model import LAM_64, ORACLE, ROUNDINGS, Context, claimable_rows, row_mean
from .formats import to_float64
from .rms_norm_gated import group_columns


def per_group(bound):
    """``bound(args, ...)`` evaluated on each group's columns (module docstring: a grouped op is the
    ungrouped op per group) and joined along the last dim; the whole row where there is one group.
    Every tensor or array among the arguments (x, z, the weight, cotangents, exact values) is sliced
    along its last dim; a tuple or dict of them alike, and the results joined as they came."""
    def cut(a, cols):
        if isinstance(a, tuple):
            return tuple(cut(v, cols) for v in a)
        if isinstance(a, dict):
            return {k: cut(v, cols) for k, v in a.items()}
        return a[..., cols] if getattr(a, "ndim", 0) else a

    def join(parts):
        if isinstance(parts[0], tuple):
            return tuple(join([p[i] for p in parts]) for i in range(len(parts[0])))
        if isinstance(parts[0], dict):
            return {k: join([p[k] for p in parts]) for k in parts[0]}
        return np.concatenate(parts, axis=-1)

    def grouped(args, *rest, **kw):
        cols = group_columns(args["x"].shape[-1], args.get("group_size"))
        if cols is None:
            return bound(args, *rest, **kw)
        return join([bound(cut(args, c), *cut(rest, c), **kw) for c in cols])

    grouped.__name__, grouped.__doc__ = bound.__name__, bound.__doc__
    return grouped


def _times(bound, factor):
    """bound * factor, +inf wherever the bound is (no claim is not lost to a zero factor)."""
    with np.errstate(all="ignore"):
        return np.where(np.isfinite(bound), bound * factor, np.inf)


def _silu(ctx, z):
    """(s, e_s, s', e_s') in float64 (module docstring)."""
    with np.errstate(all="ignore"):
        sigma, one_minus = 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(z))
        s, slope = z * sigma, sigma * (1 + z * one_minus)
        floor = ctx.lam_c * (1 + np.abs(z))
        rel = silu_rel(ctx, z)
        return (s, (rel + ctx.uc + ORACLE) * np.abs(s) + floor + ORACLE * LAM_64,
                slope, (rel + 3 * ctx.uc + ORACLE) * sigma * (1 + np.abs(z) * one_minus) + floor)


def _normalised(ctx, args):
    """(x, r = x rho w, rho, rho_rel) in float64."""
    x = to_float64(args["x"])
    rho, rho_rel = inverse_rms(ctx, x, args["eps"])
    with np.errstate(all="ignore"):
        return x, x * rho * affine_values(args, "weight"), rho, rho_rel


def _gated_rows(x, s, s_err):
    """g = x s as the rows rms_norm normalises, each moved by |x| e_s and by the float64 oracle's own
    rounding of g (ORACLE LAM_64 where it is subnormal; its relative rounding is in e_s's ORACLE)."""
    with np.errstate(all="ignore"):
        return NormInput(x * s, error=np.abs(x) * s_err + ORACLE * LAM_64)


@per_group
def rms_norm_gated_fwd(args, exact, kernel=True):
    ctx = Context(args["x"].dtype, kernel=kernel)
    s, s_err, _, _ = _silu(ctx, to_float64(args["z"]))
    x, r, _, _ = _normalised(ctx, args)
    if not args["norm_before_gate"]:
        rows = _gated_rows(x, s, s_err)
        (bound,) = rms_norm_fwd(args, exact, kernel, rows=rows)
        return (bound + _weight_rounding(ctx, args, rows.values, np.abs(exact[0])),)
    (r_bound,) = rms_norm_fwd(args, (r,), kernel)
    y = np.abs(exact[0])
    with np.errstate(all="ignore"):
        bound = _times(r_bound, np.abs(s)) + np.abs(r) * s_err + ctx.uc * y + ctx.round_out(y)
    return (np.where(np.isinf(r_bound) & np.isinf(y), -np.inf, bound),)


def _weight_rounding(ctx, args, g, y):
    """u_o (|y_i| + lam_o |ghat_i|), ghat = g rho_g: the move of y = w ghat when the kernel multiplies
    by the weight rounded to x's dtype (module docstring); 0 where the weight is in x's dtype."""
    if args["weight"].dtype == args["x"].dtype:
        return 0.0
    with np.errstate(all="ignore"):
        rho, _ = inverse_rms(ctx, g, args["eps"])
        return ctx.uo * (y + ctx.lam_o * np.abs(g * rho))


@per_group
def rms_norm_gated_bwd(args, cot, exact):
    ctx = Context(args["x"].dtype)
    z, dy = to_float64(args["z"]), to_float64(cot[0])
    s, s_err, slope, slope_err = _silu(ctx, z)
    x, r, rho, rho_rel = _normalised(ctx, args)
    with np.errstate(all="ignore"):
        if args["norm_before_gate"]:
            grads = rms_norm_bwd(args, (torch.from_numpy(dy * s),), exact, cotangent_error=np.abs(dy) * s_err)
            dz = (np.abs(dy) * (np.abs(r * slope) * (rho_rel + ROUNDINGS * ctx.uo + ctx.uc) + np.abs(r) * slope_err)
                  + 2 * ctx.uc * np.abs(exact["z"]) + ctx.round_out(np.abs(exact["z"])) + ctx.lam_c)
            claim = claimable_rows(ctx, x)
            return {"x": grads["x"], "z": np.where(claim, dz, np.inf), "weight": grads["weight"]}
        rows = _gated_rows(x, s, s_err)
        grads = rms_norm_bwd(args, cot, exact, rows=rows)
        dg = _rms_vjp(rows.values, affine_values(args, "weight"), dy, args["eps"])
        g_bound = grads["x"]
        dx = (_times(g_bound, np.abs(s)) + np.abs(dg) * s_err + ctx.uc * np.abs(exact["x"])
              + ctx.round_out(np.abs(exact["x"])))
        dz = (_times(g_bound, np.abs(x * slope)) + np.abs(dg * x) * slope_err + 2 * ctx.uc * np.abs(exact["z"])
              + ctx.round_out(np.abs(exact["z"])) + ctx.lam_c)
        return {"x": dx, "z": dz, "weight": grads["weight"]}


def _rms_vjp(g, w, dy, eps):
    """rms_norm's dx at rows g, in float64: rho (dy w - ghat mean(dy w ghat)), ghat = g rho."""
    rho = 1 / np.sqrt(row_mean(g * g) + eps)
    ghat = g * rho
    return rho * (dy * w - ghat * row_mean(dy * w * ghat))


@per_group
def rms_norm_gated_indeterminate(args):
    """Gate after: y = r s with s = silu(+inf) = +inf is infinite exactly wherever r != 0, but a
    correct kernel may round r to x.dtype, or flush it, to 0 where |r| < lam_o (the model's output
    roundings and flushes), and 0 * inf = NaN (as ``bounds_gated.swiglu_indeterminate``).  Gate
    first, no output is infinite: an infinite s makes its row's mean square infinite."""
    ctx = Context(args["x"].dtype)
    z = to_float64(args["z"])
    if not args["norm_before_gate"]:
        return np.zeros(z.shape, bool)
    _, r, _, _ = _normalised(ctx, args)
    with np.errstate(all="ignore"):
        return np.isinf(z) & (np.abs(r) < max(ctx.lam_o, ctx.lam_c))
