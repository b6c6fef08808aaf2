r"""Error-model bounds of the gated activations: swiglu and geglu (GELU's erf and tanh forms).

Notation and the reference kernel as in ``error_model``; g = gate, u = up.  Forward bounds, per
output element i:

    swiglu  |y_i| (2 u_o + (2 FN_ULPS + 3) u_c + |g_i| gam(2) + ORACLE) + lam_o (2 + |u_i|) + lam_c |g_i u_i|
            (``silu_rel``: exp through exp2, whose argument rounding costs |g| gam(2) relative)
    geglu   |g_i u_i| / 2 dP_i + |y_i| (2 u_o + 3 u_c + ORACLE) + lam_o (2 + |u_i|) + lam_c (|g_i u_i| + |u_i|),
            gelu(g) = g P / 2 and dP the error of P = 1 + erf or 1 + tanh (``gelu_p``):
            absolute where 1 + erf(z) cancels, as in torch's own formula

Gradient bounds in the docstrings of ``swiglu_bwd`` and ``geglu_bwd``.  ``*_indeterminate``: the
output elements whose exact value is infinite but where a correct kernel may return NaN (its
silu(g) or gelu(g) rounded or flushed to 0, times an infinite up).  silu_and_mul and gelu_and_mul
are these ops on the two halves of one tensor (``bounds_derived.halves``).
"""
from __future__ import annotations

import numpy as np

from . import geglu
from .error_model import FN_ULPS, ORACLE, ROUNDINGS, Context
from .formats import to_float64
from .special import erfc


# ---------------------------------------------------------------- SiLU (swiglu)
def silu_rel(ctx, g):
    """Relative error of silu(g) = g sigma(g) in the compute format, sigma(g) = 1 / (1 + exp(-g)).

    A correct kernel forms e = exp(t) (t = -g, or -|g| to stay below 1) through exp2, as GPUs
    do (Triton's ``tl.exp`` in float32 is ``ex2.approx(t * log2e)``): a = fl(t * fl(log2 e)).
    The constant and the product each round once, so a = t log2(e) (1 + theta) with
    |theta| <= gam(2), and exp2(a) = e^t e^(t theta): a relative error of |t| gam(2) ~ 2 |g| u_c
    (to first order; e^(t theta) - 1 is within that for the |g| where e^t is normal), on top of
    exp2's own FN_ULPS ulps = 2 FN_ULPS u_c.  sigma is e / (1 + e) or 1 / (1 + e), whose relative
    sensitivity to e is e / (1 + e) <= 1; 1 + e, the division and g * sigma round once each
    (3 u_c).  Measured: an H100's float32 silu_and_mul (Triton) was 54.2 u_c off at g ~ -40, where
    |g| u_c (the product's rounding alone, the constant taken as exact) allowed 53.8."""
    return (2 * FN_ULPS + 3) * ctx.uc + np.abs(g) * ctx.gam(2)


def swiglu_fwd(args, exact, kernel=True):
    ctx = Context(args["gate"].dtype, kernel=kernel)
    g, u = to_float64(args["gate"]), to_float64(args["up"])
    y = np.abs(exact[0])
    with np.errstate(all="ignore"):
        bound = silu_rel(ctx, g) * y + ctx.round_out(y) + ctx.lam_o * np.abs(u) + ctx.lam_c * np.abs(g * u)
    return (bound,)


def swiglu_bwd(args, cot, exact):
    """dgate = dy up s (1 + g (1-s)), dup = dy g s; each |error| <= (rel) * shadow + 2 u_o |result| + floor.

    The floor is what flushing a subnormal intermediate to zero costs: s = sigma(g)
    (or e**g) is subnormal in c for g below about -708 (float64) or -87 (float32),
    and a flushed s loses at most lam_c times the factors it multiplies:
    |dy up| (1 + |g|) in dgate, |dy g| in dup.
    """
    ctx = Context(args["gate"].dtype)
    g, u = to_float64(args["gate"]), to_float64(args["up"])
    dy = to_float64(cot[0])
    with np.errstate(all="ignore"):
        sigma = 1 / (1 + np.exp(-g))
        one_minus_sigma = 1 / (1 + np.exp(g))
        rel = silu_rel(ctx, g) + 3 * ctx.uc + ORACLE + ROUNDINGS * ctx.uo  # saved silu / sigmoid in x.dtype
        shadow_gate = np.abs(dy * u) * sigma * (1 + np.abs(g) * one_minus_sigma)
        floor_gate = ctx.lam_c * (1 + np.abs(dy * u) * (1 + np.abs(g)))
        floor_up = ctx.lam_c * (1 + np.abs(dy * g))
        dgate = rel * shadow_gate + ctx.round_out(np.abs(exact["gate"])) + floor_gate
        dup = rel * np.abs(dy * g * sigma) + ctx.round_out(np.abs(exact["up"])) + floor_up
    return {"gate": dgate, "up": dup}


def swiglu_indeterminate(args):
    """silu(g) * up with up = ±inf and 0 < |silu(g)| < lam_c (g very negative): the exact product
    is ±inf, but silu(g) rounds (or flushes) to ±0 in the compute format, and 0 * inf = NaN."""
    ctx = Context(args["gate"].dtype)
    g, u = to_float64(args["gate"]), to_float64(args["up"])
    with np.errstate(all="ignore"):
        silu_abs = np.abs(g) / (1 + np.exp(-g))
    return np.isinf(u) & np.isfinite(g) & (silu_abs < ctx.lam_c)


# ---------------------------------------------------------------- GELU (geglu)
K0, K1 = float(geglu.K0), float(geglu.K1)  # the tanh form's t = K0 (g + K1 g**3), as the oracle defines it
TWO_OVER_SQRT_PI = 2 / np.sqrt(np.pi)


def _tanh_arg(g):
    """t = K0 (g + K1 g**3), the tanh form's argument, in float64."""
    return K0 * (g + K1 * g * g * g)


def gelu_p(ctx, g, approximate):
    r"""P with gelu(g) = g P / 2 (P = 1 + erf(g / sqrt 2), or 1 + tanh(t)), and dP, the bound on a
    correct kernel's absolute error in P, by whichever route it takes.

    erf form, z = g / sqrt 2.  The argument rounds twice (the constant and the product), z (1 +
    theta) with |theta| <= gam(2), which moves erf (or erfc) by (2 / sqrt pi) e**(-z**2) |z| gam(2)
    at most (to first order).  erf(z), or erfc(-z), is good to FN_ULPS ulps: FN_ULPS u_c |erf z|
    or FN_ULPS u_c P; 1 + erf rounds once (u_c P):

        dP = FN_ULPS u_c (|erf z| + P) + (2 / sqrt pi) e**(-z**2) |z| gam(2) + u_c P

    For z << 0 that is absolute, not relative to P: 1 + erf(z) cancels, and a float32 kernel's
    gelu(-5) is good to about |g| u_c only -- torch's own formula is, and it is correct.

    tanh form, t = K0 (g + K1 g**3).  A kernel forms t with up to 7 roundings (g**2, K1 g**2,
    1 + ., g ., K0 ., the two constants) and, to take 2 sigma(2 t) = 2 / (1 + exp2(-2 t log2 e)),
    2 more: a relative argument error theta, |theta| <= gam(10), which multiplies e = e**(-2 t) by
    e**phi, |phi| <= a = |2 t| gam(10).  sigma = 1 / (1 + e) then moves by |e' - e| / (1 + e')
    relative, at most s (e**a - 1) e**a with s = e / (1 + e) = sigma(-2 t): about a for t << 0,
    and about e**(-2 t) a, next to nothing, for t >> 0, where sigma is 1 whatever e's error.  (Up
    to this round the sensitivity s was taken as 1: at g = 6447, t ~ 1e10, the bound was 4.7e11
    against y = 4.2e7, and a kernel returning 0 there passed.)  exp2, 1 + e and the division add
    (FN_ULPS + 2) u_c.  By tanh instead: tanh(t) is good to FN_ULPS u_c |tanh t| (absolute in P,
    1 + tanh cancels for t << 0), its argument's error moves it by at most
    sup (1 - tanh**2) |t| gam(7) <= 2 P s a e**a over the moved interval, and 1 + tanh rounds once:

        dP = FN_ULPS u_c |tanh t| + (2 s (e**a - 1) e**a + (FN_ULPS + 3) u_c) P

    (2 s: the tanh route's 1 - tanh**2 = 2 P s; the sigmoid route's s alone fits under it.)
    """
    with np.errstate(all="ignore"):
        if approximate == "none":
            z = g / np.sqrt(2)
            p = erfc(-z)
            dp = FN_ULPS * ctx.uc * (np.abs(p - 1) + p) + TWO_OVER_SQRT_PI * np.exp(-z * z) * np.abs(z) * ctx.gam(2) \
                + ctx.uc * p
        else:
            t = _tanh_arg(g)
            p = 2 / (1 + np.exp(-2 * t))
            moved = 2 * argument_move(t, ctx.gam(10)) * p
            # t far below 0: the relative move overflows where P underflows; P itself moves less than
            # its largest value over the argument's interval, P(t (1 - gam)), which is 0 there too
            moved = np.where(np.isnan(moved) & (t < 0), 2 / (1 + np.exp(-2 * t * (1 - ctx.gam(10)))), moved)
            dp = FN_ULPS * ctx.uc * np.abs(np.tanh(t)) + moved + (FN_ULPS + 3) * ctx.uc * p
    return p, dp


def argument_move(t, gam):
    """s (e**a - 1) e**a, a = |2 t| gam, s = sigma(-2 t) = 1 / (1 + e**(2 t)): the relative move of
    sigma(2 t) = 1 / (1 + e**(-2 t)) when its argument is off by gam relative (``gelu_p``), in
    logarithms so that neither e**a nor s overflows or underflows on the way (0 where a = 0).  An
    infinite t (g**3 past float64) keeps a itself, +inf: no claim, as before."""
    a = np.abs(2 * t) * gam
    with np.errstate(all="ignore"):
        log_expm1 = np.where(a > 1, a + np.log1p(-np.exp(-a)), np.log(np.expm1(a)))
        return np.where(np.isfinite(t), np.exp(-np.logaddexp(0.0, 2 * t) + log_expm1 + a), a)


def gelu_dp(ctx, g, p, approximate):
    r"""P' = dP/dg, and its bound eP' on a correct kernel's absolute error.

    erf:  P' = sqrt(2 / pi) e**(-g**2 / 2).  The exp argument g**2 / 2 (with log2 e) rounds up to
          4 times: (g**2 / 2) gam(4) relative; exp2 FN_ULPS u_c, the constant and the product 2 u_c.
    tanh: P' = (1 - tanh(t)**2) t',  t' = K0 (1 + 3 K1 g**2), formed with 5 roundings (gam(5)).
          By tanh, 1 - th**2 with th off by FN_ULPS u_c |th| + (1 - th**2) |t| gam(7) is off by twice
          that plus 2 u_c (absolute: it cancels for |th| -> 1); by sigmoids, 4 sigma(2 t) sigma(-2 t),
          each factor off by |2 t| gam(10) + (FN_ULPS + 2) u_c relative.  Both fit

              eP' = t' (2 FN_ULPS + 2) u_c + |P'| (2 |2 t| gam(10) + 2 (FN_ULPS + 3) u_c + gam(5))
    """
    with np.errstate(all="ignore"):
        if approximate == "none":
            dp = np.sqrt(2 / np.pi) * np.exp(-g * g / 2)
            return dp, dp * (g * g / 2 * ctx.gam(4) + (FN_ULPS + 2) * ctx.uc)
        t = _tanh_arg(g)
        dt = K0 * (1 + 3 * K1 * g * g)
        dp = p * (2 / (1 + np.exp(2 * t))) * dt  # (1 + tanh)(1 - tanh) t' = 4 sigma(2t) sigma(-2t) t'
        return dp, dt * (2 * FN_ULPS + 2) * ctx.uc + dp * (2 * np.abs(2 * t) * ctx.gam(10) + 2 * (FN_ULPS + 3) * ctx.uc
                                                          + ctx.gam(5))


def geglu_fwd(args, exact, kernel=True):
    """y = (g P / 2) u: dP (``gelu_p``) carried through g / 2 and u, the products rounding up to 3
    times in c, the output's roundings, and floors for a flushed P (lam_c |g u|), gelu(g) (lam_c |u|)
    or y."""
    ctx = Context(args["gate"].dtype, kernel=kernel)
    g, u = to_float64(args["gate"]), to_float64(args["up"])
    y = np.abs(exact[0])
    _, dp = gelu_p(ctx, g, args["approximate"])
    with np.errstate(all="ignore"):
        bound = np.abs(g * u) / 2 * dp + 3 * ctx.uc * y + ctx.round_out(y) + ctx.lam_o * (2 + np.abs(u)) \
            + ctx.lam_c * (np.abs(g * u) + np.abs(u))
    return (bound,)


def geglu_bwd(args, cot, exact):
    """dgate = dy u gelu'(g), gelu'(g) = P / 2 + g P' / 2;  dup = dy g P / 2.

    gelu'(g)'s error: dP / 2 + |g| eP' / 2 (``gelu_p``, ``gelu_dp``), plus 3 u_c on its terms in
    absolute value (the sum cancels near g = -0.75, where gelu' = 0).  Each gradient then carries
    its products' roundings (2 u_c) and a value saved for backward in x.dtype (ROUNDINGS u_o) on
    its shadow (its terms in absolute value), its output roundings, and floors for a flushed
    intermediate, as swiglu's: lam_c (1 + |dy u| (1 + |g|)) and lam_c (1 + |dy| (1 + |g|)).
    """
    ctx = Context(args["gate"].dtype)
    g, u = to_float64(args["gate"]), to_float64(args["up"])
    dy = to_float64(cot[0])
    approximate = args["approximate"]
    p, dp = gelu_p(ctx, g, approximate)
    p_slope, p_slope_err = gelu_dp(ctx, g, p, approximate)
    with np.errstate(all="ignore"):
        dgelu_terms = p / 2 + np.abs(g * p_slope) / 2
        dgelu_err = dp / 2 + np.abs(g) * p_slope_err / 2 + 3 * ctx.uc * dgelu_terms
        rel = 2 * ctx.uc + ROUNDINGS * ctx.uo
        dy_up, dy_gate = np.abs(dy * u), np.abs(dy * g)
        dgate = dy_up * dgelu_err + rel * dy_up * dgelu_terms + ctx.round_out(np.abs(exact["gate"])) \
            + ctx.lam_c * (1 + dy_up * (1 + np.abs(g)))
        dup = dy_gate / 2 * dp + rel * dy_gate * p / 2 + ctx.round_out(np.abs(exact["up"])) \
            + ctx.lam_c * (1 + np.abs(dy) * (1 + np.abs(g)))
    return {"gate": dgate, "up": dup}


def geglu_indeterminate(args):
    """gelu(g) * up with up = +-inf and g finite, nonzero: the exact product is +-inf, but a correct
    kernel's gelu(g) may be 0 -- its P may be (P <= dP: 1 + erf(z) rounds to 0 for z << 0), or
    g P / 2 may flush (below lam_c) -- and 0 * inf = NaN."""
    ctx = Context(args["gate"].dtype)
    g, u = to_float64(args["gate"]), to_float64(args["up"])
    p, dp = gelu_p(ctx, g, args["approximate"])
    with np.errstate(all="ignore"):
        vanishes = (p <= dp) | (np.abs(g) * (p + dp) / 2 < ctx.lam_c)
    return np.isinf(u) & np.isfinite(g) & (g != 0) & vanishes
