r"""The one error model: how far a *correct* kernel may be from the exact value.

A correct kernel (the reference design every bound is derived for)

* reads its inputs exactly (they are the rounded tensors it was given);
* computes in the *compute format* c: float64 for float64 inputs, else float32;
* reduces in any order (sequential, pairwise, tree, Welford, atomics);
* may use approximate elementary functions (rsqrt, exp, division) good to
  ``FN_ULPS`` ulps of c, and ``exp(t) = exp2(t * log2 e)``, whose argument
  rounding costs a further 2 |t| u_c relative (``_silu_rel``);
* rounds to the output dtype o at up to ``ROUNDINGS`` = 2 points (e.g. round
  x*rho to x.dtype, multiply by the weight, round again: the llama order);
* may flush subnormal intermediates (in c) and outputs (in o) to zero.

Notation: u_o, u_c unit roundoffs; lam_o, lam_c smallest normals; n the
reduced length; gam(k) = k u_c / (1 - k u_c) (Higham's gamma, the worst-case
relative error of a k-term sum in any order).

The oracle's own error: ORACLE = 8 u_64 of each result's natural scale, plus
8 roundings among float64's subnormals (ORACLE lam_64).  The scale is |y_i| for
RMSNorm and SwiGLU; for the centred norms it is |w_i| max|xhat| +
|w_i xhat_i| + |b_i| over the normalised group, because a float64 mean can
only be as accurate as u_64 of the group's spread (``_affine_out``).  Every
bound below adds this term, and evaluating a bound with ``kernel=False`` (an
exact kernel: u = lam = 0, nothing overflows) leaves exactly this term:
``test_oracle`` holds the float64 path to it against mpmath.

Forward bounds, per output element i (derivations in the docstring of each
function below):

    rms_norm      |y_i| (2 u_o + gam(n+1)/2 + (FN_ULPS + 2) u_c + n lam_c / (ms + eps) + ORACLE)
                  + lam_o (2 + |w_i|) + lam_c |w_i|     (ms = mean(x^2) of the row)
    gemma_rms_norm  rms_norm's with w replaced by 1 + w, plus u_c |y_i| (the offset added in c)
    add_rms_norm  as rms_norm at s = x + r, plus 2 u_o |y_i| (the sum may be
                  rounded to x.dtype before normalising; rows where that
                  rounding overflows carry no claim); residual_out: 0 (bit-exact)
    layer_norm    |w_i| dxhat_i + (2 u_o + u_c + ORACLE)(|w_i xhat_i| + |b_i|) + floors,
                  dxhat from ``_normalize_error`` (two-pass *and* Welford
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
    swiglu        |y_i| (2 u_o + (2 FN_ULPS + 3) u_c + |g_i| gam(2) + ORACLE) + lam_o (2 + |up_i|) + lam_c |g_i up_i|
    rms_norm_fp8  on v = rms_norm(x) / scale before the kernel's last rounding (to float8_e4m3fn):
                  rms_norm's bound (x.dtype's roundings included: a kernel may round
                  rms_norm(x) to x.dtype and then scale it, as vLLM's does) / scale, plus
                  3 u_c |v| (scale rounded to c, and 1 / scale and a product, or a division);
                  add_rms_norm_fp8 likewise from add_rms_norm's.  The output must lie in
                  [RNE(v - B), RNE(v + B)] (``assessment.assess``, ``record.Op.quantised``)
    geglu         |g_i up_i| / 2 dP_i + |y_i| (2 u_o + 3 u_c + ORACLE) + lam_o (2 + |up_i|)
                  + lam_c (|g_i up_i| + |up_i|),
                  gelu(g) = g P / 2 and dP the error of P = 1 + erf or 1 + tanh (``_gelu_p``):
                  absolute where 1 + erf(z) cancels, as in torch's own formula

Gradients get the same treatment from their formulas in ``oracle/*`` (a weight or bias passed
as None has no gradient; its bound, computed at the gradient 0, goes unread); each is
``(error of the terms, taken in absolute value) + 2 u_o |result| + floors``,
where the terms may also carry ``SAVED`` = 2 u_x (x.dtype's unit roundoff): a
correct kernel may save forward intermediates for backward in x.dtype (the
llama order saves round(x * rho), and its dweight is computed from it).

Domain: a row whose mean square is not representable in the compute format
(e.g. |x| ~ 1e30 in bfloat16, where x**2 overflows float32) is outside the
contract of a float32-computing kernel.  Its bound is +inf (no claim), and the
suite counts such elements as ``unclaimed`` rather than pass them silently.

``assessment.assess`` compares a kernel's output with the exact value under the bound
and reports the worst error both in ulps of the output dtype and in model
units (error / bound; <= 1 passes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import geglu
from .formats import compute_format, fmt, to_float64
from .record import IDENTITY
from .special import erfc

ROUNDINGS = 2
FN_ULPS = 2
ORACLE = 8 * 2.0 ** -53
LAM_64 = 2.0 ** -1022  # ORACLE * LAM_64 = 8 * 2**-1075: eight roundings among float64's subnormals


class _Ctx:
    """Unit roundoffs and helpers for one (x dtype, output dtype) pair."""

    def __init__(self, dtype, out_dtype=None, kernel=True):
        o, c = fmt(out_dtype or dtype), compute_format(dtype)
        self.uo, self.uc, self.lam_o, self.lam_c, self.cmax, self.omax = o.u, c.u, o.lam, c.lam, c.max, o.max
        if not kernel:  # an exact kernel (u = lam = 0, no overflow): only the oracle's own error is left
            self.uo = self.uc = self.lam_o = self.lam_c = 0.0
            self.cmax = self.omax = np.inf

    def gam(self, k):
        k = np.asarray(k, dtype=np.float64)
        ku = k * self.uc
        return np.where(ku < 0.5, ku / (1 - np.minimum(ku, 0.5)), np.inf)

    def round_out(self, mag):
        """Rounding to the output dtype at up to ROUNDINGS points, plus the oracle's error on mag."""
        return ROUNDINGS * (self.uo * mag + self.lam_o) + ORACLE * (mag + LAM_64)


def _mean(a):
    return np.mean(a, axis=-1, keepdims=True) if a.shape[-1] else np.zeros(a.shape[:-1] + (1,))


def _claimable(ctx, z):
    """Rows whose sum of squares stays finite in the compute format."""
    with np.errstate(all="ignore"):
        m = np.max(np.abs(np.where(np.isfinite(z), z, 0.0)), axis=-1, keepdims=True, initial=0.0)
        return 4.0 * z.shape[-1] * m * m < ctx.cmax


# ---------------------------------------------------------------- normalisation
@dataclass
class _Norm:
    xhat: np.ndarray
    rho: np.ndarray  # 1/sqrt(var + eps), per row
    rho_rel: np.ndarray  # bound on the relative error of the kernel's rho
    dxhat: np.ndarray  # bound on |xhat_kernel - xhat| before any output rounding
    claim: np.ndarray  # rows where the model makes a claim


def _normalize_error(ctx, z, eps, dz=None):
    r"""Error of xhat = (z - mean z) * rho computed in c, for rows of z.

    dz_i bounds a perturbation of the input z itself (0 for layer_norm).

        S1    = mean|z|, R = sqrt(mean z^2), sigma = std(z)
        dmu   = gam(n+1) S1 + mean(dz)                        mean in any order
        dd_i  = dmu + u_c |d_i| + dz_i                         d = z - mu
        dv    = gam(2n+4)(sigma^2 + 2 R sigma)                 two-pass, and Welford (~n u kappa var)
              + 2 sigma rms(dz) + 2 (rms(dz) + dmu)^2          second-order: constant rows
        rho_rel = max(sqrt((v+eps)/(max(v-dv,0)+eps)) - 1, 1 - sqrt((v+eps)/(v+dv+eps))) + FN_ULPS u_c
        dxhat_i = rho (1 + rho_rel) dd_i + |xhat_i| (rho_rel + u_c)
    """
    n = z.shape[-1]
    dz = np.zeros_like(z) if dz is None else dz
    with np.errstate(all="ignore"):
        mu = _mean(z)
        d = z - mu
        var = _mean(d * d)
        sigma = np.sqrt(var)
        rho = 1.0 / np.sqrt(var + eps)
        s1 = _mean(np.abs(z))
        big_r = np.sqrt(_mean(z * z))
        rms_dz = np.sqrt(_mean(dz * dz))
        dmu = ctx.gam(n + 1) * s1 + _mean(dz)
        dd = dmu + ctx.uc * np.abs(d) + dz
        dv = ctx.gam(2 * n + 4) * (var + 2 * big_r * sigma) + 2 * sigma * rms_dz + 2 * (rms_dz + dmu) ** 2
        hi = np.sqrt((var + eps) / (np.maximum(var - dv, 0) + eps)) - 1
        lo = 1 - np.sqrt((var + eps) / (var + dv + eps))
        rho_rel = np.maximum(hi, lo) + FN_ULPS * ctx.uc
        xhat = d * rho
        dxhat = rho * (1 + rho_rel) * dd + np.abs(xhat) * (rho_rel + ctx.uc)
    return _Norm(xhat, rho, rho_rel, dxhat, _claimable(ctx, z) & np.isfinite(dxhat).all(-1, keepdims=True))


def _affine_out(ctx, norm, w, b, axis=-1):
    """Bound for y = xhat * w + b given the normalisation's error.

    The oracle's centred values are accurate to a few u_64 of the group's
    largest (``oracle.float64_backend``: its d_i are within 4 u_64 max|d|), not
    of each one: its term is ORACLE (|w_i| max|xhat| + |w_i xhat_i| + |b_i|),
    max over the normalised group (``axis``).
    """
    mag = np.abs(norm.xhat * w) + np.abs(b)
    with np.errstate(all="ignore"):
        peak = np.max(np.where(np.isfinite(norm.xhat), np.abs(norm.xhat), 0.0), axis=axis, keepdims=True, initial=0.0)
    bound = (np.abs(w) * norm.dxhat + ctx.uc * mag + ctx.round_out(mag) + ctx.lam_c * np.abs(w)
             + ORACLE * np.abs(w) * peak)
    return np.where(norm.claim, bound, np.inf)


def _norm_vjp_error(ctx, norm, g):
    """Bound for dz = rho (g - mean g - xhat mean(g xhat)), g = dy * w.

    shadow = rho (|g| + mean|g| + |xhat| mean|g xhat|); the kernel's error is
    gam(2n+6) shadow (the two reductions and the products) + rho_rel shadow
    (its rho) + rho (1+rho_rel)(dxhat |mean(g xhat)| + |xhat| mean(|g| dxhat))
    (its xhat).
    """
    n = g.shape[-1]
    with np.errstate(all="ignore"):
        xh, rho = norm.xhat, norm.rho
        m_gx = _mean(g * xh)
        shadow = rho * (np.abs(g) + _mean(np.abs(g)) + np.abs(xh) * _mean(np.abs(g * xh)))
        via_xhat = rho * (1 + norm.rho_rel) * (norm.dxhat * np.abs(m_gx) + np.abs(xh) * _mean(np.abs(g) * norm.dxhat))
        return (ctx.gam(2 * n + 6) + norm.rho_rel + ORACLE + ROUNDINGS * ctx.uo) * shadow + via_xhat


def _sum_rows_error(ctx_w, terms_abs, extra=0.0):
    """Bound for sum over rows of terms (dw, db), rounded to the weight's dtype."""
    rows = terms_abs.reshape(-1, terms_abs.shape[-1])
    total = rows.sum(axis=0)
    return (ctx_w.gam(rows.shape[0] + 2) + ORACLE) * total + extra, total


def _reduce_rows(a):
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


# ---------------------------------------------------------------- per-op bounds
def _f(t):
    return None if t is None else to_float64(t)


def _vec(args, name):
    """A weight or bias as float64; None (a weightless call) is its identity, ones or zeros."""
    t = args[name]
    return to_float64(t) if t is not None else np.full(args["x"].shape[-1], IDENTITY[name])


def _wctx(args, name):
    """The context of a weight's or bias's gradient (its dtype; x's for a weightless call)."""
    t = args[name]
    return _Ctx(args["x"].dtype, (t if t is not None else args["x"]).dtype)


def _rms(ctx, x, w, eps):
    n = x.shape[-1]
    with np.errstate(all="ignore"):
        ms = _mean(x * x)
        rho = 1.0 / np.sqrt(ms + eps)
        rel = ctx.gam(n + 1) / 2 + (FN_ULPS + 2) * ctx.uc + n * ctx.lam_c / (ms + eps)
    return rho, rel


def residual_overflows(args):
    """add_rms_norm rows where RNE(x + r) overflows x.dtype though x and r are finite (keepdims)."""
    x, r = _f(args["x"]), _f(args["residual"])
    with np.errstate(all="ignore"):
        rounded = fmt(args["x"].dtype).round(x + r)
    return (np.isinf(rounded) & np.isfinite(x) & np.isfinite(r)).any(axis=-1, keepdims=True)


def _rms_claim(ctx, args, s):
    """Rows an RMSNorm bound is claimed on: s's sum of squares fits the compute format, and for
    add_rms_norm RNE(x + r) does not overflow x.dtype (a kernel may normalise that rounded sum,
    the residual stream it stores, and then gets inf where the exact y is finite)."""
    claim = _claimable(ctx, s)
    if "residual" in args:
        claim = claim & ~residual_overflows(args)
    return claim


def rms_norm_fwd(args, exact, kernel=True, extra_rel=0.0, w=None):
    """w: the multiplier (default: the weight; gemma_rms_norm's is 1 + weight)."""
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    x, w = _f(args["x"]), _vec(args, "weight") if w is None else w
    if "residual" in args:
        x = x + _f(args["residual"])
    _, rel = _rms(ctx, x, w, args["eps"])
    y = np.abs(exact[0])
    bound = (rel + extra_rel) * y + ctx.round_out(y) + ctx.lam_c * np.abs(w) + ctx.lam_o * np.abs(w)
    return (np.where(_rms_claim(ctx, args, x), bound, np.inf),)


def gemma_rms_norm_fwd(args, exact, kernel=True):
    """rms_norm's bound with the multiplier 1 + w, plus u_c |y_i|: the kernel adds the offset
    in its compute format, one more rounding of the factor (1 + w_i)."""
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    return rms_norm_fwd(args, exact, kernel, extra_rel=ctx.uc, w=1.0 + _vec(args, "weight"))


def gemma_rms_norm_bwd(args, cot, exact):
    """rms_norm's with the multiplier 1 + w, g = dy (1 + w) off by u_c relative (``rms_norm_bwd``)."""
    return rms_norm_bwd(args, cot, exact, w=1.0 + _vec(args, "weight"), w_rel=_Ctx(args["x"].dtype).uc)


def add_rms_norm_fwd(args, exact, kernel=True):
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    (yb,) = rms_norm_fwd(args, exact, kernel, extra_rel=2 * ctx.uo)
    return yb, np.zeros_like(exact[1])


def _quantised(unscaled_fwd, args, exact, kernel):
    """The bound on v = y / scale (the first output, before its rounding to fp8) from
    ``unscaled_fwd``'s bound on y = v scale: divided by scale, plus 3 u_c |v|; the other outputs'
    bounds as ``unscaled_fwd`` gives them."""
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    v = exact[0]
    with np.errstate(all="ignore"):
        yb, *rest = unscaled_fwd(args, (v * args["scale"], *exact[1:]), kernel)
        return (yb / args["scale"] + 3 * ctx.uc * np.abs(v), *rest)


def rms_norm_fp8_fwd(args, exact, kernel=True):
    """rms_norm's bound, carried to v (``_quantised``)."""
    return _quantised(rms_norm_fwd, args, exact, kernel)


def add_rms_norm_fp8_fwd(args, exact, kernel=True):
    """add_rms_norm's bound, carried to v; residual_out: 0 (bit-exact)."""
    return _quantised(add_rms_norm_fwd, args, exact, kernel)


def layer_norm_fwd(args, exact, kernel=True):
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    norm = _normalize_error(ctx, _f(args["x"]), args["eps"])
    return (_affine_out(ctx, norm, _vec(args, "weight"), _vec(args, "bias")),)


def _bn_channels(args):
    x = _f(args["x"])
    c = x.shape[-1]
    flat = x.reshape(-1, c)
    keep = np.ones(flat.shape[0], bool) if args.get("mask") is None else args["mask"].cpu().numpy().reshape(-1)
    return flat, keep


def batch_norm_fwd(args, exact, kernel=True):
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    flat, keep = _bn_channels(args)
    bound = np.full(flat.shape, np.inf)
    if keep.any():
        norm = _normalize_error(ctx, flat[keep].T, args["eps"])
        norm = _Norm(norm.xhat.T, norm.rho.T, norm.rho_rel.T, norm.dxhat.T, norm.claim.T)
        bound[keep] = _affine_out(ctx, norm, _vec(args, "weight"), _vec(args, "bias"), axis=0)
    return (bound.reshape(exact[0].shape),)


def _deep_z(ctx, args):
    """z, the bound on the kernel's z (a matmul in c and <= 3 roundings to o), and
    the rows where those roundings cannot overflow: alpha x, sublayer(x) and z each
    below omax by more than dz, which bounds the kernel's error in each of them
    (exactly below omax is not enough: alpha x = 32817 and sublayer(x) = 32680.9 round
    to 32832 + 32688 = 65520 in float16, whose sum rounds to inf, where z = 65497.9).
    Elsewhere a kernel that rounds z to o may get inf."""
    x, a, c = _f(args["x"]), _f(args["sub_weight"]), _f(args["sub_bias"])
    alpha = float(args["alpha"])
    n = x.shape[-1]
    f = x @ a.T + c
    z = alpha * x + f
    mat = np.abs(x) @ np.abs(a).T + np.abs(c)
    dz = ctx.gam(n + 2) * (mat + np.abs(alpha * x)) + ctx.uo * (np.abs(alpha * x) + np.abs(f) + np.abs(z))
    with np.errstate(all="ignore"):
        peak = np.maximum(np.maximum(np.abs(alpha * x), np.abs(f)), np.abs(z))
        fits = np.all(~(peak + dz >= ctx.omax), axis=-1, keepdims=True)  # NaN (from NaN input) counts as fitting
    return z, dz, a, alpha, fits


def deep_norm_fwd(args, exact, kernel=True):
    ctx = _Ctx(args["x"].dtype, kernel=kernel)
    z, dz, _, _, fits = _deep_z(ctx, args)
    norm = _normalize_error(ctx, z, args["eps"], dz)
    return (np.where(fits, _affine_out(ctx, norm, _vec(args, "weight"), _vec(args, "bias")), np.inf),)


def _silu_rel(ctx, g):
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


def swiglu_fwd(args, exact, kernel=True, gate=None, up=None):
    ctx = _Ctx(args[next(iter(args))].dtype, kernel=kernel)
    g = _f(args["gate"]) if gate is None else gate
    u = _f(args["up"]) if up is None else up
    y = np.abs(exact[0])
    with np.errstate(all="ignore"):
        bound = _silu_rel(ctx, g) * y + ctx.round_out(y) + ctx.lam_o * np.abs(u) + ctx.lam_c * np.abs(g * u)
    return (bound,)


def silu_and_mul_fwd(args, exact, kernel=True):
    g, u = _halves(args)
    return swiglu_fwd(args, exact, kernel, gate=g, up=u)


def _halves(args):
    """silu_and_mul's x split into (gate, up), as float64 views."""
    x = _f(args["x"])
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def _indeterminate(dtype, g, u):
    """Output elements whose exact value is ±inf but where a correct kernel may return NaN.

    silu(g) * up with up = ±inf and 0 < |silu(g)| < lam_c (g very negative): the
    exact product is ±inf, but silu(g) rounds (or flushes) to ±0 in the compute
    format, and 0 * inf = NaN.
    """
    ctx = _Ctx(dtype)
    with np.errstate(all="ignore"):
        silu = np.abs(g) / (1 + np.exp(-g))
    return np.isinf(u) & np.isfinite(g) & (silu < ctx.lam_c)


def swiglu_indeterminate(args):
    return _indeterminate(args["gate"].dtype, _f(args["gate"]), _f(args["up"]))


def silu_and_mul_indeterminate(args):
    return _indeterminate(args["x"].dtype, *_halves(args))


# ---------------------------------------------------------------- GELU (geglu, gelu_and_mul)
K0, K1 = float(geglu.K0), float(geglu.K1)  # the tanh form's t = K0 (g + K1 g**3), as the oracle defines it
TWO_OVER_SQRT_PI = 2 / np.sqrt(np.pi)


def _tanh_arg(g):
    """t = K0 (g + K1 g**3), the tanh form's argument, in float64."""
    return K0 * (g + K1 * g * g * g)


def _gelu_p(ctx, g, approximate):
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
    2 more: a relative argument error of gam(10), which moves e**(-2 t), and with it sigma (whose
    relative sensitivity to e is e / (1 + e) <= 1), by |2 t| gam(10) relative; exp2, 1 + e and
    the division add (FN_ULPS + 2) u_c.  By tanh instead: tanh(t) is good to FN_ULPS u_c |tanh t|
    (absolute in P, 1 + tanh cancels for t << 0), its argument's error moves it by
    (1 - tanh**2) |t| gam(7) <= P |2 t| gam(10), and 1 + tanh rounds once:

        dP = FN_ULPS u_c |tanh t| + (|2 t| gam(10) + (FN_ULPS + 3) u_c) P
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
            dp = FN_ULPS * ctx.uc * np.abs(np.tanh(t)) + (np.abs(2 * t) * ctx.gam(10) + (FN_ULPS + 3) * ctx.uc) * p
    return p, dp


def geglu_fwd(args, exact, kernel=True, gate=None, up=None):
    """y = (g P / 2) u: dP (``_gelu_p``) carried through g / 2 and u, the products rounding up to 3
    times in c, the output's roundings, and floors for a flushed P (lam_c |g u|), gelu(g) (lam_c |u|)
    or y."""
    ctx = _Ctx(args[next(iter(args))].dtype, kernel=kernel)
    g = _f(args["gate"]) if gate is None else gate
    u = _f(args["up"]) if up is None else up
    y = np.abs(exact[0])
    p, dp = _gelu_p(ctx, g, args["approximate"])
    with np.errstate(all="ignore"):
        bound = np.abs(g * u) / 2 * dp + 3 * ctx.uc * y + ctx.round_out(y) + ctx.lam_o * (2 + np.abs(u)) \
            + ctx.lam_c * (np.abs(g * u) + np.abs(u))
    return (bound,)


def gelu_and_mul_fwd(args, exact, kernel=True):
    g, u = _halves(args)
    return geglu_fwd(args, exact, kernel, gate=g, up=u)


def _gelu_indeterminate(dtype, g, u, approximate):
    """gelu(g) * up with up = +-inf and g finite, nonzero: the exact product is +-inf, but a correct
    kernel's gelu(g) may be 0 -- its P may be (P <= dP: 1 + erf(z) rounds to 0 for z << 0), or
    g P / 2 may flush (below lam_c) -- and 0 * inf = NaN."""
    ctx = _Ctx(dtype)
    p, dp = _gelu_p(ctx, g, approximate)
    with np.errstate(all="ignore"):
        vanishes = (p <= dp) | (np.abs(g) * (p + dp) / 2 < ctx.lam_c)
    return np.isinf(u) & np.isfinite(g) & (g != 0) & vanishes


def geglu_indeterminate(args):
    return _gelu_indeterminate(args["gate"].dtype, _f(args["gate"]), _f(args["up"]), args["approximate"])


def gelu_and_mul_indeterminate(args):
    return _gelu_indeterminate(args["x"].dtype, *_halves(args), args["approximate"])


# ---------------------------------------------------------------- gradient bounds
def rms_norm_bwd(args, cot, exact, w=None, w_rel=0.0):
    """dx_i = rho g_i - rho^3 x_i M, M = mean(g x), g = dy w; dw = sum_rows dy x rho.

    |d dx_i| <= rho|g_i| (rho_rel + 2u_c) + rho^3 |x_i| (|M| (3 rho_rel + 4 u_c) + gam(n+2) mean|g x|)
                + 2 u_o |dx_i| + floors, rho_rel = gam(n+1)/2 + (FN_ULPS+2) u_c.
    A kernel may save xhat = x rho in x.dtype (the llama order; SAVED relative error) -- and a
    saved xhat that is subnormal in x.dtype, or flushed, is off by up to lam_x absolutely, not
    relatively.  Where |xhat| < 2 lam_x ("tiny"), xhat enters dw_j = sum_rows dy_j xhat_j (a floor of
    ROUNDINGS lam_x sum over tiny rows of |dy_j|) and dx_i = rho (g_i - xhat_i mean(g xhat)) (a floor
    of ROUNDINGS lam_x rho (rho |M| [i tiny] + rho |x_i| mean(|g| [tiny]))).  Without these floors
    the llama order was rejected in float16 on rows of |x| ~ 1e-4 with eps = 0.1 (xhat ~ 3e-5,
    below float16's smallest normal 6.1e-5): dweight 6.3 bounds off.
    w: the multiplier (default: the weight; gemma_rms_norm's is 1 + weight); w_rel: a relative
    error of it in the kernel (each g_i off by w_rel |g_i|), which adds w_rel (rho |g_i| + rho^3 |x_i| mean|g x|).
    """
    ctx = _Ctx(args["x"].dtype)
    x, w = _f(args["x"]), _vec(args, "weight") if w is None else w
    dy = to_float64(cot[0])
    dres = to_float64(cot[1]) if len(cot) > 1 else 0.0
    # add_rms_norm: the kernel may normalise s rounded to x.dtype (u_o |s_i| each)
    us = ctx.uo if "residual" in args else 0.0
    if "residual" in args:
        x = x + _f(args["residual"])
    n = x.shape[-1]
    rho, rho_rel = _rms(ctx, x, w, args["eps"])
    rho_rel = rho_rel + us
    with np.errstate(all="ignore"):
        g = dy * w
        a_t = rho * np.abs(g)
        b_t = rho ** 3 * np.abs(x)
        m = _mean(g * x)
        m_abs = _mean(np.abs(g * x))
        saved = ROUNDINGS * ctx.uo  # intermediates saved in x.dtype for backward
        dx_err = (a_t * (rho_rel + saved + 2 * ctx.uc + w_rel)
                  + b_t * (np.abs(m) * (3 * rho_rel + us + 4 * ctx.uc)
                           + (ctx.gam(n + 2) + us + saved + ORACLE + w_rel) * m_abs))
        # dx = dx_rms + dres is rounded after the add: its magnitude, not |dx|, sets the rounding
        dx_err = dx_err + ctx.round_out(a_t + b_t * np.abs(m) + np.abs(dres)) + ctx.lam_c * (1 + a_t + b_t)
        tiny = np.abs(x * rho) < 2 * ctx.lam_o  # xhat may be saved subnormal, or flushed
        dx_err = dx_err + ROUNDINGS * ctx.lam_o * rho ** 2 * (np.abs(m) * tiny + np.abs(x) * _mean(np.abs(g) * tiny))
        claim = _rms_claim(ctx, args, x)
        out = {"x": np.where(claim, dx_err, np.inf)}
        if "residual" in exact:
            out["residual"] = out["x"]
        cw = _wctx(args, "weight")
        terms = np.abs(dy * x * rho)
        err, total = _sum_rows_error(cw, terms)
        dw_err = (err + (rho_rel.max(initial=0) + us + saved) * total + cw.round_out(np.abs(exact.get("weight", 0.0)))
                  + cw.lam_c * x.shape[0] + ROUNDINGS * ctx.lam_o * _reduce_rows(np.abs(dy) * tiny))
        out["weight"] = np.where(claim.all(), dw_err, np.inf)
    return out


def _ln_grads(ctx, args, norm, dy, w):
    """dx (before any downstream map), dw, db bounds for the normalisation + affine."""
    with np.errstate(all="ignore"):
        g = dy * w
        dxn = _norm_vjp_error(ctx, norm, g)
        cw, cb = _wctx(args, "weight"), _wctx(args, "bias")
        ew, tw = _sum_rows_error(cw, np.abs(dy * norm.xhat))
        ew = ew + _reduce_rows(np.abs(dy) * norm.dxhat) + ROUNDINGS * ctx.uo * tw
        eb, tb = _sum_rows_error(cb, np.abs(dy))
    return dxn, (ew, tw), (eb, tb)


def layer_norm_bwd(args, cot, exact):
    ctx = _Ctx(args["x"].dtype)
    x, w = _f(args["x"]), _vec(args, "weight")
    dy = to_float64(cot[0])
    norm = _normalize_error(ctx, x, args["eps"])
    dxn, (ew, _), (eb, _) = _ln_grads(ctx, args, norm, dy, w)
    claim = norm.claim
    cw, cb = _wctx(args, "weight"), _wctx(args, "bias")
    return {
        "x": np.where(claim, dxn + ctx.round_out(np.abs(exact["x"])), np.inf),
        "weight": np.where(claim.all(), ew + cw.round_out(np.abs(exact.get("weight", 0.0))), np.inf),
        "bias": eb + cb.round_out(np.abs(exact.get("bias", 0.0))),
    }


def batch_norm_bwd(args, cot, exact):
    ctx = _Ctx(args["x"].dtype)
    flat, keep = _bn_channels(args)
    c = flat.shape[-1]
    dy = to_float64(cot[0]).reshape(-1, c)
    w = _vec(args, "weight")
    cw, cb = _wctx(args, "weight"), _wctx(args, "bias")
    dx = np.full(flat.shape, 2 * ctx.lam_o)  # padded positions: exactly 0 for a correct kernel
    ew = eb = np.zeros(c)
    claim = True
    if keep.any():
        norm = _normalize_error(ctx, flat[keep].T, args["eps"])
        dxn = _norm_vjp_error(ctx, norm, (dy[keep] * w).T)
        dx[keep] = np.where(norm.claim, dxn, np.inf).T + ctx.round_out(np.abs(exact["x"].reshape(-1, c)[keep]))
        tn = _Norm(norm.xhat.T, norm.rho.T, norm.rho_rel.T, norm.dxhat.T, norm.claim.T)
        ew, tw = _sum_rows_error(cw, np.abs(dy[keep] * tn.xhat))
        ew = ew + _reduce_rows(np.abs(dy[keep]) * tn.dxhat) + ROUNDINGS * ctx.uo * tw
        eb, _ = _sum_rows_error(cb, np.abs(dy[keep]))
        claim = norm.claim.all()
    return {
        "x": dx.reshape(exact["x"].shape),
        "weight": np.where(claim, ew + cw.round_out(np.abs(exact["weight"])), np.inf),
        "bias": eb + cb.round_out(np.abs(exact["bias"])),
    }


def deep_norm_bwd(args, cot, exact):
    """dz as layer_norm at z (with z's own perturbation), then dx = alpha dz + dz A.

    |d dx_j| <= |alpha| e_j + sum_i |A_ij| e_i + gam(n+2)(|alpha dz_j| + (|dz| |A|)_j)
                + u_o (2|alpha dz_j| + (|dz| |A|)_j + |(dz A)_j|) + 2 u_o |dx_j|,   e = bound on dz.
    """
    ctx = _Ctx(args["x"].dtype)
    z, dzin, a, alpha, fits = _deep_z(ctx, args)
    w = _vec(args, "weight")
    dy = to_float64(cot[0])
    norm = _normalize_error(ctx, z, args["eps"], dzin)
    e, (ew, _), (eb, _) = _ln_grads(ctx, args, norm, dy, w)
    with np.errstate(all="ignore"):
        g = dy * w
        m_gx = _mean(g * norm.xhat)
        dzv = norm.rho * (g - _mean(g) - norm.xhat * m_gx)
        n = z.shape[-1]
        absmat = np.abs(dzv) @ np.abs(a)
        dx = (np.abs(alpha) * e + e @ np.abs(a) + ctx.gam(n + 2) * (np.abs(alpha * dzv) + absmat)
              + ctx.uo * (2 * np.abs(alpha * dzv) + absmat + np.abs(dzv @ a)) + ctx.round_out(np.abs(exact["x"])))
    cw, cb = _wctx(args, "weight"), _wctx(args, "bias")
    return {
        "x": np.where(norm.claim & fits, dx, np.inf),
        "weight": np.where((norm.claim & fits).all(), ew + cw.round_out(np.abs(exact["weight"])), np.inf),
        "bias": np.where(fits.all(), eb + cb.round_out(np.abs(exact["bias"])), np.inf),
    }


def swiglu_bwd(args, cot, exact, gate=None, up=None):
    """dgate = dy up s (1 + g (1-s)), dup = dy g s; each |error| <= (rel) * shadow + 2 u_o |result| + floor.

    The floor is what flushing a subnormal intermediate to zero costs: s = sigma(g)
    (or e**g) is subnormal in c for g below about -708 (float64) or -87 (float32),
    and a flushed s loses at most lam_c times the factors it multiplies:
    |dy up| (1 + |g|) in dgate, |dy g| in dup.
    """
    key = "gate" if gate is None else "x"
    ctx = _Ctx(args[key].dtype)
    g = _f(args["gate"]) if gate is None else gate
    u = _f(args["up"]) if up is None else up
    dy = to_float64(cot[0])
    with np.errstate(all="ignore"):
        s = 1 / (1 + np.exp(-g))
        sm = 1 / (1 + np.exp(g))
        rel = _silu_rel(ctx, g) + 3 * ctx.uc + ORACLE + ROUNDINGS * ctx.uo  # saved silu / sigmoid in x.dtype
        shadow_g = np.abs(dy * u) * s * (1 + np.abs(g) * sm)
        floor_g = ctx.lam_c * (1 + np.abs(dy * u) * (1 + np.abs(g)))
        floor_u = ctx.lam_c * (1 + np.abs(dy * g))
        dg = rel * shadow_g + ctx.round_out(np.abs(exact_part(exact, "gate", gate, g))) + floor_g
        du = rel * np.abs(dy * g * s) + ctx.round_out(np.abs(exact_part(exact, "up", gate, g))) + floor_u
    if gate is None:
        return {"gate": dg, "up": du}
    return {"x": np.concatenate([dg, du], axis=-1)}


def exact_part(exact, name, gate, g):
    """The exact gradient of gate or up, also when they are halves of silu_and_mul's x."""
    if gate is None:
        return exact[name]
    h = g.shape[-1]
    return exact["x"][..., :h] if name == "gate" else exact["x"][..., h:]


def silu_and_mul_bwd(args, cot, exact):
    g, u = _halves(args)
    return swiglu_bwd(args, cot, exact, gate=g, up=u)


def _gelu_dp(ctx, g, p, approximate):
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


def geglu_bwd(args, cot, exact, gate=None, up=None):
    """dgate = dy u gelu'(g), gelu'(g) = P / 2 + g P' / 2;  dup = dy g P / 2.

    gelu'(g)'s error: dP / 2 + |g| eP' / 2 (``_gelu_p``, ``_gelu_dp``), plus 3 u_c on its terms in
    absolute value (the sum cancels near g = -0.75, where gelu' = 0).  Each gradient then carries
    its products' roundings (2 u_c) and a value saved for backward in x.dtype (ROUNDINGS u_o) on
    its shadow (its terms in absolute value), its output roundings, and floors for a flushed
    intermediate, as swiglu's: lam_c (1 + |dy u| (1 + |g|)) and lam_c (1 + |dy| (1 + |g|)).
    """
    key = "gate" if gate is None else "x"
    ctx = _Ctx(args[key].dtype)
    g = _f(args["gate"]) if gate is None else gate
    u = _f(args["up"]) if up is None else up
    dy = to_float64(cot[0])
    approximate = args["approximate"]
    p, ep = _gelu_p(ctx, g, approximate)
    dp, edp = _gelu_dp(ctx, g, p, approximate)
    with np.errstate(all="ignore"):
        terms = p / 2 + np.abs(g * dp) / 2
        e_dgelu = ep / 2 + np.abs(g) * edp / 2 + 3 * ctx.uc * terms
        rel = 2 * ctx.uc + ROUNDINGS * ctx.uo
        dyu, dyg = np.abs(dy * u), np.abs(dy * g)
        dg = dyu * e_dgelu + rel * dyu * terms + ctx.round_out(np.abs(exact_part(exact, "gate", gate, g))) \
            + ctx.lam_c * (1 + dyu * (1 + np.abs(g)))
        du = dyg / 2 * ep + rel * dyg * p / 2 + ctx.round_out(np.abs(exact_part(exact, "up", gate, g))) \
            + ctx.lam_c * (1 + np.abs(dy) * (1 + np.abs(g)))
    if gate is None:
        return {"gate": dg, "up": du}
    return {"x": np.concatenate([dg, du], axis=-1)}


def gelu_and_mul_bwd(args, cot, exact):
    g, u = _halves(args)
    return geglu_bwd(args, cot, exact, gate=g, up=u)
