r"""Error-model bounds of the norms: rms_norm, gemma_rms_norm, layer_norm, batch_norm, deep_norm.

Notation and the reference kernel as in ``error_model``.  Forward bounds, per output element i:

    rms_norm      |y_i| (2 u_o + gam(n+1)/2 + (FN_ULPS + 2) u_c + n lam_c / (ms + eps) + ORACLE)
                  + lam_o (2 + |w_i|) + lam_c |w_i|     (ms = mean(x^2) of the row)
    gemma_rms_norm  rms_norm's with w replaced by 1 + w, plus u_c |y_i| (the offset added in c)
    layer_norm    |w_i| dxhat_i + (2 u_o + u_c + ORACLE)(|w_i xhat_i| + |b_i|) + floors,
                  dxhat from ``error_model.normalisation_error`` (two-pass *and* Welford
                  bounds; the mean's error is amplified by rho, so rows with
                  |mean| >> std, or constant rows with tiny eps, get the
                  large bound their conditioning demands, and a one-pass
                  variance, whose error grows with mean^2 / var, does not fit)
    batch_norm    layer_norm per channel over the valid positions; padded
                  positions carry no claim
    deep_norm     layer_norm at z = alpha x + A x + c, with the perturbation of
                  z (a matmul in c, three roundings to o) pushed through
                  the normalisation's Jacobian; rows where alpha x, A x + c
                  or z overflow o (what those roundings would give) carry no claim

The RMSNorm bounds take the rows they normalise as a ``NormInput``: x itself, or, for the form
fused with the residual add (``bounds_derived.fused_forward``), s = x + r, which the kernel may
round to the residual stream's dtype first (the residual_out it stores).  Gradient bounds: in the
docstring of each ``*_bwd``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .error_model import (COTANGENT_PATHS, FN_ULPS, ORACLE, ROUNDINGS, U_64, Context, affine_bound, claimable_rows,
                          normalisation_error, normalisation_vjp_error, row_mean, row_sum_error, signed_reach,
                          sum_over_rows)
from .formats import to_float64
from .lattice import exact_rms_rows
from .kinds import KINDS


def affine_values(args, name):
    """A weight or bias as float64; None (a weightless call) is its identity, ones or zeros."""
    t = args[name]
    return to_float64(t) if t is not None else np.full(args["x"].shape[-1], KINDS[name].identity)


def affine_grad_context(args, name):
    """The context of a weight's or bias's gradient (its dtype; x's for a weightless call)."""
    t = args[name]
    return Context(args["x"].dtype, (t if t is not None else args["x"]).dtype)


# ---------------------------------------------------------------- RMSNorm
@dataclass(frozen=True)
class NormInput:
    """The rows a norm's bound normalises, as a correct kernel may see them.

    values:    the exact rows, float64
    rounded:   the dtype the kernel may round them to before normalising (a fused sum x + r:
               the residual stream's, x's or float32), or None: exact
    claim:     rows the bound may claim at all (keepdims; the fused sum: RNE(x + r) finite)
    cotangent: a gradient reaching the rows directly, added to dx before it is rounded
               (add_rms_norm's residual_out cotangent), or 0
    error:     a bound on how far each value the kernel normalises may be from ``values``
               besides ``rounded``'s rounding, absolute (the gated norm's x silu(z), formed in c), or 0
    stored:    the dtype the rows' gradient is stored in where it is not x's, or None (x's): the
               fused form's residual gradient in a float32 stream beside a float16 / bfloat16 x.
               Its final roundings are that dtype's (``Context(x.dtype, stored)``: the sum with
               ``cotangent`` in c and the store), never x's: a correct kernel computes dx in c and
               stores it in the stream's dtype, and a rounding through x's dtype on the way
               (flash-linear-attention's layer_norm backward) is 2**16 float32 roundings in bfloat16.
               The terms of dx before its rounding (c's, and SAVED for intermediates a kernel may keep
               in x's dtype) are the same for both gradients
    """

    values: np.ndarray
    rounded: torch.dtype | None = None
    claim: np.ndarray | bool = True
    cotangent: np.ndarray | float = 0.0
    error: np.ndarray | float = 0.0
    stored: torch.dtype | None = None

    def carried(self, dtype) -> np.ndarray | float:
        """The error of the additions that carry ``cotangent``, past the one that dx's rounding
        (``Context.round_out``, its first rounding) already counts: (COTANGENT_PATHS - 1) u_c |cotangent|.

        Autograd through a decomposed forward sums s's gradient from each use of s, in c, the
        cotangent first: dx = ((cot + t_1) + t_2) + t_3 for a LayerNorm written as torch ops (BERT's:
        t_1, t_2, t_3 from the output's centring s - mu, the variance's (s - mu)**2 and the mean mu), or
        for an RMSNorm whose mean square is s * s (both operands, and s rho).  Each addition rounds in
        c on a partial sum that holds cot, so cot carries up to COTANGENT_PATHS u_c |cot|, where the
        model's dx rounding had counted one; the t_j's own magnitudes are the VJP's pointwise terms,
        rho P_i, whose roundings ``error_model.normalisation_vjp_error`` already bounds.  Observed: a
        float32 add + LayerNorm written as torch ops (two-pass, autograd) rejected with
        dx = dres + dx_norm, |dres| ~ 1 >> |dx_norm| ~ 1e-3 (residual ~ 1e3): error 1.33e-7 = 2.2 u_32
        |dx| against a bound of 2 u_32 |dx| plus the VJP's terms (1.29e-7)."""
        return (COTANGENT_PATHS - 1) * Context(dtype).uc * np.abs(self.cotangent)

    def stored_context(self, dtype) -> Context:
        """The context of the rows' gradient's final rounding for a kernel of main dtype ``dtype``:
        its compute format c, and ``stored`` (default ``dtype``) as the output dtype."""
        return Context(dtype, self.stored)

    def rounding(self, dtype, kernel=True) -> float:
        """The relative perturbation u_s of rounded rows for a kernel of main dtype ``dtype``: the
        unit roundoff of the dtype it may round them to, plus u_64, the float64 oracle's own: it
        forms s = fl64(x + r), which is not x + r where r is below u_64 of x (a float32 residual
        stream's subnormals beside a float16 x), and a centred norm's oracle then centres fl64(s).
        ``kernel=False`` (the oracle's own error): u_64 alone.  0 for rows that are not rounded."""
        if self.rounded is None:
            return 0.0
        return (Context(dtype, self.rounded).uo if kernel else 0.0) + U_64

    def perturbation(self, dtype, kernel=True) -> np.ndarray:
        """delta_i, how far each value the kernel normalises may be from s_i = ``values``:
        u_s |s_i| (``rounding``) + ``error``_i."""
        return self.rounding(dtype, kernel) * np.abs(self.values) + self.error


def moved_rho(rho, delta):
    """The relative change of rho = 1 / sqrt(mean(s^2) + eps) when each s_i moves by at most delta_i.

    sqrt(t^2 + eps) is 1-Lipschitz in t, and t = rms(s) moves by at most r = rms(delta) (Minkowski),
    so 1 / rho moves by at most r, and rho by at most r rho / (1 - r rho) relative; +inf once
    r rho >= 1 (no claim).  For s_i rounded, delta_i = u_s |s_i|, that is u_s (1 + O(u_s))."""
    with np.errstate(all="ignore"):
        r_rho = np.sqrt(row_mean(delta * delta)) * rho
        return np.where(r_rho < 1, r_rho / np.maximum(1 - r_rho, 2.0 ** -60), np.inf)


def inverse_rms(ctx, s, eps):
    """(rho, rho_rel): rho = 1 / sqrt(mean(s^2) + eps) and the bound on a correct kernel's relative
    error in it, gam(n+1)/2 + (FN_ULPS + 2) u_c + n lam_c / (ms + eps)."""
    n = s.shape[-1]
    with np.errstate(all="ignore"):
        mean_square = row_mean(s * s)
        rho = 1.0 / np.sqrt(mean_square + eps)
        rho_rel = ctx.gam(n + 1) / 2 + (FN_ULPS + 2) * ctx.uc + n * ctx.lam_c / (mean_square + eps)
    return rho, rho_rel


def rms_norm_fwd(args, exact, kernel=True, rows=None, extra_rel=0.0, multiplier=None):
    """rms_norm's forward bound (module docstring).

    rows: a ``NormInput`` (default: x); rows the kernel may see moved by delta_i
    (``NormInput.perturbation``: the fused sum rounded to the residual stream's dtype, u_s |s_i|)
    add |w_i| rho delta_i (s_i's own move) + |y_i| ``moved_rho`` (rho's): 2 u_s |y_i| for a rounded
    sum.  extra_rel: a further relative error of y; multiplier: the factor applied after
    normalising (default: the weight; gemma_rms_norm's is 1 + weight)."""
    ctx = Context(args["x"].dtype, kernel=kernel)
    rows = NormInput(to_float64(args["x"])) if rows is None else rows
    w = affine_values(args, "weight") if multiplier is None else multiplier
    delta = rows.perturbation(args["x"].dtype, kernel)
    rho, rho_rel = inverse_rms(ctx, rows.values, args["eps"])
    y = np.abs(exact[0])
    with np.errstate(all="ignore"):
        bound = ((rho_rel + extra_rel + moved_rho(rho, delta)) * y + np.abs(w) * rho * delta + ctx.round_out(y)
                 + ctx.lam_c * np.abs(w) + ctx.lam_o * np.abs(w))
    return (np.where(claimable_rows(ctx, rows.values) & rows.claim & np.isfinite(bound), bound, np.inf),)


def rms_norm_exact(args, rows=None) -> tuple[np.ndarray, np.ndarray]:
    """``lattice.exact_rms_rows`` of an rms_norm-based op's arguments (x, weight, eps by name), or of
    ``rows`` (a ``NormInput``: a fused op's s = x + r, which must be a number of x's
    dtype, ``lattice``)."""
    values = to_float64(args["x"]) if rows is None else rows.values
    return exact_rms_rows(values, affine_values(args, "weight"), float(args["eps"]), args["x"].dtype)


def gemma_rms_norm_fwd(args, exact, kernel=True):
    """rms_norm's bound with the multiplier 1 + w, plus u_c |y_i|: the kernel adds the offset
    in its compute format, one more rounding of the factor (1 + w_i)."""
    ctx = Context(args["x"].dtype, kernel=kernel)
    return rms_norm_fwd(args, exact, kernel, extra_rel=ctx.uc, multiplier=1.0 + affine_values(args, "weight"))


def rms_norm_bwd(args, cot, exact, rows=None, multiplier=None, multiplier_rel=0.0, cotangent_error=0.0):
    """dx_i = rho g_i - rho^3 x_i M, M = mean(g x), g = dy w; dw = sum_rows dy x rho.

    |d dx_i| <= rho|g_i| (rho_rel + 2u_c) + rho^3 |x_i| (|M| (3 rho_rel + 4 u_c) + gam(n+2) mean|g x|)
                + 2 u_o |dx_i| + floors, rho_rel = gam(n+1)/2 + (FN_ULPS+2) u_c, to first order;
    ``_rms_dx_error`` states it to all orders in the moved parts.
    A kernel may save xhat = x rho in x.dtype (the llama order; SAVED relative error) -- and a
    saved xhat that is subnormal in x.dtype, or flushed, is off by up to lam_x absolutely, not
    relatively.  Where |xhat| < 2 lam_x ("tiny"), xhat enters dw_j = sum_rows dy_j xhat_j (a floor of
    ROUNDINGS lam_x sum over tiny rows of |dy_j|) and dx_i = rho (g_i - xhat_i mean(g xhat)) (a floor
    of ROUNDINGS lam_x rho (rho |M| [i tiny] + rho |x_i| mean(|g| [tiny]))).  Without these floors
    the llama order was rejected in float16 on rows of |x| ~ 1e-4 with eps = 0.1 (xhat ~ 3e-5,
    below float16's smallest normal 6.1e-5): dweight 6.3 bounds off.

    Moved inputs and factors:
    rows: a ``NormInput`` (default: x) whose values the kernel may see moved by delta_i
    (``NormInput.perturbation``; the fused sum rounded, u_s |s_i|): rho moves by ``moved_rho``,
    which compounds with rho's own error, R = (1 + rho_rel)(1 + moved_rho) - 1; x_i and M move
    with the rows.  Its cotangent is added to dx before dx is rounded, and may ride along
    autograd's further additions (``NormInput.carried``).
    Overflow of the cotangent's products: where g = dy w, or the reach sum|g xhat| of n M, passes
    the compute format's largest value max_c in a row of finite x and dy (the gated norm's dy silu(z) near max), dx_i
    is inf - inf in every order (a correct kernel may return any sign, or NaN); the row takes no claim,
    -inf (``assessment.assess``), and so does any element whose bound itself overflowed to NaN.
    multiplier: the factor after normalising (default: the weight; gemma_rms_norm's is 1 + weight);
    multiplier_rel: its relative error in the kernel; cotangent_error: a bound on dy's own error (the
    gated norm's dy silu(z)), absolute.  Together g_i is off by e_i = multiplier_rel |g_i| + |w_i|
    cotangent_error_i, and dw_j's terms dy_j xhat_j by |xhat_j| cotangent_error_j.
    """
    ctx = Context(args["x"].dtype)
    rows = NormInput(to_float64(args["x"])) if rows is None else rows
    x, w = rows.values, affine_values(args, "weight") if multiplier is None else multiplier
    dy = to_float64(cot[0])
    delta = rows.perturbation(args["x"].dtype)
    rho, rho_rel = inverse_rms(ctx, x, args["eps"])
    claim = claimable_rows(ctx, x) & rows.claim
    with np.errstate(all="ignore"):
        rho_rel = (1 + rho_rel) * (1 + moved_rho(rho, delta)) - 1
        g = dy * w
        g_err = multiplier_rel * np.abs(g) + np.abs(w) * cotangent_error
        tiny = np.abs(x * rho) < 2 * ctx.lam_o  # xhat may be saved subnormal, or flushed
        dx_err = _rms_dx_error(ctx, x, g, rho, rho_rel, delta, g_err, rows.cotangent, tiny,
                               rows.stored_context(args["x"].dtype)) + rows.carried(args["x"].dtype)
        dw_err = _rms_dweight_error(ctx, affine_grad_context(args, "weight"), x, dy, rho, rho_rel, delta,
                                    cotangent_error, tiny, exact.get("weight", 0.0))
    claim = claim & np.isfinite(rho_rel)
    with np.errstate(all="ignore"):  # g = dy w or M's reach sum|g xhat| past max_c: dx_i = inf - inf
        finite = np.isfinite(dy).all(axis=-1, keepdims=True) & np.isfinite(x).all(axis=-1, keepdims=True)
        over = finite & ~(np.abs(g * x * rho).sum(axis=-1, keepdims=True) < ctx.cmax)
    dx = np.where(claim, dx_err, np.inf)
    return {"x": np.where(over | np.isnan(dx), -np.inf, dx),
            "weight": np.where(np.isnan(dw_err), -np.inf, np.where(claim.all(), dw_err, np.inf))}


def moved_product(values, errors):
    """max |prod(a_k + e_k) - prod(a_k)| over |e_k| <= errors_k: prod(|a_k| + errors_k) - prod|a_k|
    (expand the product: every term but prod(a_k) holds an e_k, and each is at most its magnitude)."""
    reach, exact = 1.0, 1.0
    for a, e in zip(values, errors):
        reach, exact = reach * (np.abs(a) + e), exact * np.abs(a)
    return reach - exact


def _rms_dx_error(ctx, x, g, rho, rho_rel, delta, g_err, cotangent, tiny, out_ctx):
    """dx_i = rho g_i - rho^3 x_i M, M = mean(g x), for a kernel whose rho is within R = rho_rel,
    each x_i within delta_i and g_i within e_i = g_err_i, to all orders in them (``moved_product``):

        rho' g'_i            off by  rho (R |g_i| + (1 + R) e_i)
        M' = mean(g' x')     off by  dM = m + (u_c + SAVED) mean((|g| + e)(|x| + delta)) + ORACLE's
                             + gam(n+2) (signed_reach(g x) + n m) / n,  m = mean((|g| + e)(|x| + delta) - |g x|)
                             (the products' roundings, then their mean's: ``signed_reach``)
        rho'^3 x'_i M'       off by  rho^3 (K (|x_i| + delta_i)(|M| + dM) - |x_i M|),  K = (1 + R)^3 (1 + 4 u_c)
                             (4 u_c: the products' roundings)

    plus SAVED + 2 u_c on the first product (``rms_norm_bwd``'s llama order), dx's rounding (after the
    rows' own cotangent is added) in the dtype it is stored in (``out_ctx``: ``NormInput.stored``),
    the flush floors lam_c, and the floor of a tiny saved xhat."""
    saved = ROUNDINGS * ctx.uo  # intermediates saved in x.dtype for backward
    reach_x, reach_g = np.abs(x) + delta, np.abs(g) + g_err
    direct = rho * np.abs(g)  # |rho g_i|
    mean_gx = np.abs(row_mean(g * x))
    moved_mean = row_mean(reach_g * reach_x)
    moved = moved_mean - row_mean(np.abs(g * x))  # how far the kernel's mean of products may move
    d_mean = (moved + (ctx.uc + saved) * moved_mean + ORACLE * row_mean(np.abs(g * x))
              + ctx.gam(x.shape[-1] + 2) * signed_reach(g * x, x.shape[-1] * moved) / max(x.shape[-1], 1))
    k = (1 + rho_rel) ** 3 * (1 + 4 * ctx.uc)
    dx_err = (rho * (rho_rel * np.abs(g) + (1 + rho_rel) * g_err) + (saved + 2 * ctx.uc) * rho * (1 + rho_rel) * reach_g
              + rho ** 3 * (k * reach_x * (mean_gx + d_mean) - np.abs(x) * mean_gx))
    # dx = dx_rms + the rows' own cotangent is rounded after the add: its magnitude, not |dx|, sets the rounding
    via_mean = rho ** 3 * np.abs(x)  # |rho^3 x_i|, the factor of M
    dx_err = (dx_err + out_ctx.round_out(direct + via_mean * mean_gx + np.abs(cotangent))
              + ctx.lam_c * (1 + direct + via_mean))
    return dx_err + ROUNDINGS * ctx.lam_o * rho ** 2 * (mean_gx * tiny + np.abs(x) * row_mean(np.abs(g) * tiny))


def _rms_dweight_error(ctx, weight_ctx, x, dy, rho, rho_rel, delta, cotangent_error, tiny, dweight):
    """dw_j = sum_rows dy_j x_j rho: each term off by ``moved_product`` of its factors (dy within
    cotangent_error, x within delta, rho within its row's rho_rel), the sum's rounding on its signed
    reach (``row_sum_error``) and a saved xhat's (SAVED) on the terms' largest magnitudes, dw's
    rounding, and the floors of flushed terms and of tiny saved xhat."""
    moved = sum_over_rows(moved_product((rho, dy, x), (rho * rho_rel, cotangent_error, delta)))
    dw_sum_err, reach_total = row_sum_error(weight_ctx, dy * x * rho, moved)
    return (dw_sum_err + ROUNDINGS * ctx.uo * reach_total + moved
            + weight_ctx.round_out(np.abs(dweight))
            + weight_ctx.lam_c * x.shape[0] + ROUNDINGS * ctx.lam_o * sum_over_rows(np.abs(dy) * tiny))


def gemma_rms_norm_bwd(args, cot, exact):
    """rms_norm's with the multiplier 1 + w, g = dy (1 + w) off by u_c relative (``rms_norm_bwd``)."""
    return rms_norm_bwd(args, cot, exact, multiplier=1.0 + affine_values(args, "weight"),
                        multiplier_rel=Context(args["x"].dtype).uc)


# ---------------------------------------------------------------- centred norms
def _layer_rows(ctx, args, rows, kernel=True):
    """The normalisation of layer_norm's rows (a ``NormInput``; default x): a rounded input (the
    fused sum, each s_i off by u_s |s_i|) enters as the input perturbation dz = u_s |s|."""
    rows = NormInput(to_float64(args["x"])) if rows is None else rows
    dz = rows.perturbation(args["x"].dtype, kernel)
    norm = normalisation_error(ctx, rows.values, args["eps"], dz)
    return replace(norm, claim=norm.claim & rows.claim), rows


def layer_norm_fwd(args, exact, kernel=True, rows=None):
    """y = xhat w + b (``error_model.affine_bound``); rows: a ``NormInput`` (``_layer_rows``)."""
    ctx = Context(args["x"].dtype, kernel=kernel)
    norm, _ = _layer_rows(ctx, args, rows, kernel)
    return (affine_bound(ctx, norm, affine_values(args, "weight"), affine_values(args, "bias")),)


def _affine_grads(ctx, args, norm, dy, w):
    """(dz bound before any downstream map, dw bound, db bound) for the normalisation + affine map:
    dz from ``error_model.normalisation_vjp_error``, dw and db from ``_affine_param_errors``."""
    with np.errstate(all="ignore"):
        return (normalisation_vjp_error(ctx, norm, dy * w), *_affine_param_errors(ctx, args, norm, dy))


def _affine_param_errors(ctx, args, norm, dy):
    """(dw bound, db bound) for dw = sum_rows dy xhat', db = sum_rows dy, rows of ``norm`` the
    positions summed over: dw carries xhat's error, sum_rows |dy| dxhat, its sum's rounding on the
    signed reach and a saved xhat's roundings on the terms' largest magnitudes, |dy| (|xhat| + dxhat)
    (``error_model.row_sum_error``); neither includes its own final rounding."""
    weight_ctx, bias_ctx = affine_grad_context(args, "weight"), affine_grad_context(args, "bias")
    with np.errstate(all="ignore"):
        moved = sum_over_rows(np.abs(dy) * norm.dxhat)
        dw_err, dw_total = row_sum_error(weight_ctx, dy * norm.xhat, moved)
        db_err, _ = row_sum_error(bias_ctx, dy)
    return dw_err + moved + ROUNDINGS * ctx.uo * dw_total, db_err


def layer_norm_bwd(args, cot, exact, rows=None):
    """dx = rho (g - mean g - xhat mean(g xhat)), g = dy w (``error_model.normalisation_vjp_error``);
    dw = sum_rows dy xhat, db = sum_rows dy (``error_model.row_sum_error``); each plus its rounding.
    rows: a ``NormInput`` (``_layer_rows``); its cotangent (the fused form's dresidual_out) is added
    to dx before dx is rounded, so the rounding is of |dx - cotangent| + |cotangent|, not |dx|, and
    in the dtype dx is stored in (``NormInput.stored``); autograd's further additions that carry it
    (``NormInput.carried``) add (COTANGENT_PATHS - 1) u_c |cotangent|."""
    ctx = Context(args["x"].dtype)
    norm, rows = _layer_rows(ctx, args, rows)
    dx_err, dw_err, db_err = _affine_grads(ctx, args, norm, to_float64(cot[0]),
                                                     affine_values(args, "weight"))
    weight_ctx, bias_ctx = affine_grad_context(args, "weight"), affine_grad_context(args, "bias")
    with np.errstate(all="ignore"):
        rounded = np.abs(exact["x"] - rows.cotangent) + np.abs(rows.cotangent)
    return {
        "x": np.where(norm.claim, dx_err + rows.stored_context(args["x"].dtype).round_out(rounded)
                      + rows.carried(args["x"].dtype), np.inf),
        "weight": np.where(norm.claim.all(), dw_err + weight_ctx.round_out(np.abs(exact.get("weight", 0.0))), np.inf),
        "bias": db_err + bias_ctx.round_out(np.abs(exact.get("bias", 0.0))),
    }


def _channels(args):
    """x as (positions, channels) float64, and the valid positions (all, without a mask)."""
    x = to_float64(args["x"])
    flat = x.reshape(-1, x.shape[-1])
    valid = np.ones(flat.shape[0], bool) if args.get("mask") is None else args["mask"].cpu().numpy().reshape(-1)
    return flat, valid


def batch_norm_fwd(args, exact, kernel=True):
    ctx = Context(args["x"].dtype, kernel=kernel)
    flat, valid = _channels(args)
    bound = np.full(flat.shape, np.inf)
    if valid.any():
        norm = normalisation_error(ctx, flat[valid].T, args["eps"]).transposed()
        bound[valid] = affine_bound(ctx, norm, affine_values(args, "weight"), affine_values(args, "bias"), axis=0)
    return (bound.reshape(exact[0].shape),)


def batch_norm_bwd(args, cot, exact):
    """layer_norm's per channel over the valid positions; a padded position's dx is exactly 0 for a
    correct kernel (bound: its rounding floor 2 lam_o)."""
    ctx = Context(args["x"].dtype)
    flat, valid = _channels(args)
    channels = flat.shape[-1]
    dy = to_float64(cot[0]).reshape(-1, channels)
    w = affine_values(args, "weight")
    weight_ctx, bias_ctx = affine_grad_context(args, "weight"), affine_grad_context(args, "bias")
    dx = np.full(flat.shape, 2 * ctx.lam_o)  # padded positions: exactly 0 for a correct kernel
    dw_err = db_err = np.zeros(channels)
    claim = True
    if valid.any():
        norm = normalisation_error(ctx, flat[valid].T, args["eps"])
        dx_valid = normalisation_vjp_error(ctx, norm, (dy[valid] * w).T)
        dx[valid] = (np.where(norm.claim, dx_valid, np.inf).T
                     + ctx.round_out(np.abs(exact["x"].reshape(-1, channels)[valid])))
        dw_err, db_err = _affine_param_errors(ctx, args, norm.transposed(), dy[valid])
        claim = norm.claim.all()
    return {
        "x": dx.reshape(exact["x"].shape),
        "weight": np.where(claim, dw_err + weight_ctx.round_out(np.abs(exact["weight"])), np.inf),
        "bias": db_err + bias_ctx.round_out(np.abs(exact["bias"])),
    }


# ---------------------------------------------------------------- DeepNorm
def fixture_gam(n: int) -> float:
    """gam_64(n + 1): the suite's sublayer (``deep_norm.affine_sublayer``) is a float64 matmul of n
    terms and a bias, rounded once to its input's dtype; that rounding is the kernel's u_o, this is
    the rest (the products of float32 or narrower values are exact in float64; of float64 values
    they round, which gam_64(n) covers as for any dot product).  The same holds for its VJP."""
    return (n + 1) * U_64 / (1 - (n + 1) * U_64)


def _deep_z(ctx, args):
    """z = alpha x + f, f = x A^T + c the suite's sublayer, the bound dz on the kernel's z, A, alpha,
    and the rows where those roundings cannot overflow.

    The kernel gets f from the sublayer it is handed, exact but for gam_64(n + 1) |x| |A|^T + |c|
    (``fixture_gam``) and one rounding to the dtype it calls it in (o, or c: u_o |f| covers both).
    Its own arithmetic is alpha x and the sum, at most two roundings in c (gam_c(2) (|alpha x| +
    |f|)), and up to three roundings to o (alpha x, f, z):

        dz = gam_64(n + 1) (|x| |A|^T + |c|) + gam_c(2) (|alpha x| + |f|) + u_o (|alpha x| + |f| + |z|)

    (Before stop 35 the sublayer computed in float32 and dz carried gam_c(n + 2) on |x| |A|^T:
    the fixture's own error, charged to the kernel.)  Rows fit where alpha x, f and z are each
    below omax by more than dz, which bounds the kernel's error in each of them (exactly below omax
    is not enough: alpha x = 32817 and f = 32680.9 round to 32832 + 32688 = 65520 in float16, whose
    sum rounds to inf, where z = 65497.9).  Elsewhere a kernel that rounds z to o may get inf."""
    x, a, c = to_float64(args["x"]), to_float64(args["sub_weight"]), to_float64(args["sub_bias"])
    alpha = float(args["alpha"])
    n = x.shape[-1]
    sublayer = x @ a.T + c
    z = alpha * x + sublayer
    matmul_abs = np.abs(x) @ np.abs(a).T + np.abs(c)
    fixture = fixture_gam(n) if ctx.uc else 0.0  # an exact kernel (kernel=False) is handed no fixture
    dz = (fixture * matmul_abs + ctx.gam(2) * (np.abs(alpha * x) + np.abs(sublayer))
          + ctx.uo * (np.abs(alpha * x) + np.abs(sublayer) + np.abs(z)))
    with np.errstate(all="ignore"):
        peak = np.maximum(np.maximum(np.abs(alpha * x), np.abs(sublayer)), np.abs(z))
        fits = np.all(~(peak + dz >= ctx.omax), axis=-1, keepdims=True)  # NaN (from NaN input) counts as fitting
    return z, dz, a, alpha, fits


def deep_norm_fwd(args, exact, kernel=True):
    ctx = Context(args["x"].dtype, kernel=kernel)
    z, dz, _, _, fits = _deep_z(ctx, args)
    norm = normalisation_error(ctx, z, args["eps"], dz)
    return (np.where(fits, affine_bound(ctx, norm, affine_values(args, "weight"), affine_values(args, "bias")),
                     np.inf),)


def deep_norm_bwd(args, cot, exact):
    """dz as layer_norm at z (with z's own perturbation), then dx = alpha dz + dz A.

    |d dx_j| <= |alpha| e_j + sum_i |A_ij| e_i + gam_64(n+1) (r |A|)_j + gam_c(2)(|alpha| r_j + (r |A|)_j)
                + u_o (2|alpha dz_j| + (|dz| |A|)_j + |(dz A)_j|) + 2 u_o |dx_j|,
    e = bound on dz, r = |dz| + e (the kernel's dz, whose products and sums round): dz A is the
    sublayer's VJP, float64 but for ``fixture_gam`` and rounded once (u_o |dz A|); alpha dz and
    the sum are the kernel's, two roundings in c and up to two to o.
    A kernel that holds dz in o (autograd through z stored in o) gets inf where |dz| + e reaches
    omax, and then inf * 0 = NaN through the sublayer: dx of such a row carries no claim (as
    the forward's rows where z overflows; a near-constant row with a small eps has rho |g| past
    float16's 65504).
    """
    ctx = Context(args["x"].dtype)
    z, dz_input, a, alpha, fits = _deep_z(ctx, args)
    w = affine_values(args, "weight")
    dy = to_float64(cot[0])
    norm = normalisation_error(ctx, z, args["eps"], dz_input)
    dz_err, dw_err, db_err = _affine_grads(ctx, args, norm, dy, w)
    with np.errstate(all="ignore"):
        g = dy * w
        dz = norm.rho * (g - row_mean(g) - norm.xhat * row_mean(g * norm.xhat))
        dz_abs_a = np.abs(dz) @ np.abs(a)
        reach = np.abs(dz) + dz_err  # the largest |dz'| the kernel may hold: its sums round on that
        dx = (np.abs(alpha) * dz_err + dz_err @ np.abs(a)
              + fixture_gam(z.shape[-1]) * (reach @ np.abs(a)) + ctx.gam(2) * (np.abs(alpha) * reach + reach @ np.abs(a))
              + ctx.uo * (2 * np.abs(alpha * dz) + dz_abs_a + np.abs(dz @ a)) + ctx.round_out(np.abs(exact["x"])))
        dz_fits = np.all(~(np.abs(dz) + dz_err >= ctx.omax), axis=-1, keepdims=True)
    weight_ctx, bias_ctx = affine_grad_context(args, "weight"), affine_grad_context(args, "bias")
    return {
        "x": np.where(norm.claim & fits & dz_fits, dx, np.inf),
        "weight": np.where((norm.claim & fits).all(), dw_err + weight_ctx.round_out(np.abs(exact["weight"])), np.inf),
        "bias": np.where(fits.all(), db_err + bias_ctx.round_out(np.abs(exact["bias"])), np.inf),
    }
