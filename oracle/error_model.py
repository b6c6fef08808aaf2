r"""The one error model: how far a *correct* kernel may be from the exact value.

A correct kernel (the reference design every bound is derived for)

* reads its inputs exactly (they are the rounded tensors it was given);
* computes in the *compute format* c: float64 for float64 inputs, else float32;
* reduces in any order (sequential, pairwise, tree, Welford, atomics);
* may use approximate elementary functions (rsqrt, exp, division) good to
  ``FN_ULPS`` ulps of c, and ``exp(t) = exp2(t * log2 e)``, whose argument
  rounding costs a further 2 |t| u_c relative (``bounds_gated.silu_rel``);
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
only be as accurate as u_64 of the group's spread (``affine_bound``).  Every
bound below adds this term, and evaluating a bound with ``kernel=False`` (an
exact kernel: u = lam = 0, nothing overflows) leaves exactly this term:
``test_oracle`` holds the float64 path to it against mpmath.  One more own error, of the fused
forms alone: the float64 oracle forms s = fl64(x + r), off by u_64 |s_i| where r lies below
u_64 of x (a float32 stream's subnormals beside a half-precision x); a centred norm then centres
fl64(s), so the fused bounds take s as perturbed by u_64 |s_i| besides the kernel's own rounding
of s (``bounds_norms.NormInput.rounding``).

Where each bound is derived (each module's docstring states its maths):

    bounds_norms    rms_norm, gemma_rms_norm, layer_norm, batch_norm, deep_norm: forward and gradients
    bounds_gated    swiglu, geglu (both GELU forms): forward, gradients, and where an infinite
                    exact output may come back NaN (``indeterminate``)
    bounds_gated_norm  rms_norm_gated: rms_norm's bounds composed with SiLU's (gate after, gate first);
                    with group_size G, per group, G in place of the row length (``per_group``)
    bounds_quant    the dynamically quantised forms (rms_norm_dynamic_quant and its fused form, the
                    per-group quant, FP4 per block with a global scale): the kernel's scale against
                    the exact one, y against the kernel's own scale
    bounds_derived  the derived forms, from their base op's bounds: fused with the residual add
                    (add_rms_norm), on the two halves of one tensor (silu_and_mul, gelu_and_mul),
                    quantised to FP8 (rms_norm_fp8, add_rms_norm_fp8)

This module holds what they share: the constants, the ``Context`` of one dtype pair, and the
error of a normalisation, its affine map, its VJP and a sum over rows.

Gradients get the same treatment from their formulas in ``oracle/*`` (a weight or bias passed
as None has no gradient; its bound, computed at the gradient 0, goes unread); each is
``(error of the terms, taken in absolute value) + 2 u_o |result| + floors``,
where the terms may also carry ``SAVED`` = 2 u_x (x.dtype's unit roundoff): a
correct kernel may save forward intermediates for backward in x.dtype (the
llama order saves round(x * rho), and its dweight is computed from it).

A gradient that reaches the normalised rows directly (the fused form's residual_out cotangent) is
summed with the VJP's terms in c: autograd through a decomposed forward adds the gradient of s from
each of its uses, starting from that cotangent, so the cotangent rides along every one of those
additions, each rounding on a partial sum that holds it.  A correct kernel's forward uses s at most
``COTANGENT_PATHS`` = 3 times (a LayerNorm written as torch ops: the mean, the centring for the
variance and the centring for the output, as BERT's LayerNorm does; an RMSNorm: both operands of
s * s and the product s rho); ``bounds_norms.NormInput.carried`` states the term.

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

from .formats import compute_format, fmt

ROUNDINGS = 2
FN_ULPS = 2
COTANGENT_PATHS = 3  # the most uses of a normalised row s in a correct kernel's forward (module docstring)
U_64 = 2.0 ** -53  # float64's unit roundoff
ORACLE = 8 * U_64
LAM_64 = 2.0 ** -1022  # ORACLE * LAM_64 = 8 * 2**-1075: eight roundings among float64's subnormals


class Context:
    """Unit roundoffs (u_o, u_c), smallest normals (lam_o, lam_c) and largest finite numbers
    (omax, cmax) of one (x dtype, output dtype) pair: c is x.dtype's compute format."""

    def __init__(self, dtype, out_dtype=None, kernel=True):
        o, c = fmt(out_dtype or dtype), compute_format(dtype)
        self.uo, self.uc, self.lam_o, self.lam_c, self.cmax, self.omax = o.u, c.u, o.lam, c.lam, c.max, o.max
        if not kernel:  # an exact kernel (u = lam = 0, no overflow): only the oracle's own error is left
            self.uo = self.uc = self.lam_o = self.lam_c = 0.0
            self.cmax = self.omax = np.inf

    def gam(self, k):
        """gam(k) = k u_c / (1 - k u_c); +inf once k u_c reaches 1/2 (no claim)."""
        k = np.asarray(k, dtype=np.float64)
        ku = k * self.uc
        return np.where(ku < 0.5, ku / (1 - np.minimum(ku, 0.5)), np.inf)

    def round_out(self, mag):
        """Rounding to the output dtype at up to ROUNDINGS points, plus the oracle's error on mag."""
        return ROUNDINGS * (self.uo * mag + self.lam_o) + ORACLE * (mag + LAM_64)


def row_mean(a):
    """The mean over the last dim, kept as a length-1 dim (0 for an empty row)."""
    return np.mean(a, axis=-1, keepdims=True) if a.shape[-1] else np.zeros(a.shape[:-1] + (1,))


def claimable_rows(ctx, z):
    """Rows whose sum of squares stays finite in the compute format (keepdims)."""
    with np.errstate(all="ignore"):
        peak = np.max(np.abs(np.where(np.isfinite(z), z, 0.0)), axis=-1, keepdims=True, initial=0.0)
        return 4.0 * z.shape[-1] * peak * peak < ctx.cmax


# ---------------------------------------------------------------- normalisation
@dataclass
class Normalisation:
    """A normalisation xhat = (z - mean z) rho of rows of z and a correct kernel's error in it."""

    xhat: np.ndarray
    rho: np.ndarray  # 1/sqrt(var + eps), per row
    rho_rel: np.ndarray  # bound on the relative error of the kernel's rho
    dxhat: np.ndarray  # bound on |xhat_kernel - xhat| before any output rounding
    claim: np.ndarray  # rows where the model makes a claim

    def transposed(self) -> Normalisation:
        """The same normalisation with rows and columns swapped (batch_norm's channels as columns)."""
        return Normalisation(self.xhat.T, self.rho.T, self.rho_rel.T, self.dxhat.T, self.claim.T)


def lowest_bit(a):
    """The lowest set bit of each |a_i| (2**k, a_i = odd * 2**k), 0 where a_i is 0 or not finite:
    a_i's own lattice, the quantum every multiple of it sits on."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(all="ignore"):
        ok = np.isfinite(a) & (a != 0)
        m, e = np.frexp(np.where(ok, np.abs(a), 1.0))
        ints = np.ldexp(m, 53).astype(np.int64)  # |a| = ints * 2**(e - 53), ints < 2**53
        return np.where(ok, np.ldexp((ints & -ints).astype(np.float64), e - 53), 0.0)


def exact_mean_rows(ctx, z, dz):
    """Rows (keepdims) whose mean every correct kernel gets exactly: constant rows z_i = c read
    exactly (dz = 0) whose length n is a power of two and whose sum n c is exact in c in any order.

    Every partial sum of k copies of c (k <= n) is a multiple of q = ``lowest_bit(c)`` of magnitude
    at most n |c|; where n |c| <= q / u_c (2**p_c q, p_c the compute format's precision) each is
    representable, so no addition rounds, in any order, pairwise or tree alike.  The division by
    n = 2**k is then exact, and so is a product with 1/n (a reciprocal of a power of two; an
    approximate division computes one).  Welford's update adds (c - mu)/k = 0 once mu = c, so it
    is exact too.  Such a row's mean is c, its centred values are 0 and its variance 0."""
    n = z.shape[-1]
    if n == 0 or n & (n - 1):
        return np.zeros(z.shape[:-1] + (1,), dtype=bool)
    with np.errstate(all="ignore"):
        c = z[..., :1]
        constant = np.all(z == c, axis=-1, keepdims=True) & np.all(dz == 0, axis=-1, keepdims=True)
        return constant & np.isfinite(c) & (n * np.abs(c) * ctx.uc <= lowest_bit(c))


def normalisation_error(ctx, z, eps, dz=None):
    r"""Error of xhat = (z - mean z) * rho computed in c, for rows of z.

    dz_i bounds a perturbation of the input z itself (0 for layer_norm).

        S1    = mean|z|, R = sqrt(mean z^2), sigma = std(z)
        dmu   = gam(n+1) S1 + mean(dz)                        mean in any order
                0 on ``exact_mean_rows`` (constant rows whose sum is exact on their own lattice
                and n a power of two): then d = 0, v = 0, and only rho's own FN_ULPS u_c remain
        dd_i  = dmu + dz_i + u_c (|d_i| + dmu + dz_i)          d = z - mu, rounded on its own size
        dv    = gam(2n+4)(sigma^2 + 2 R sigma)                 two-pass, and Welford (~n u kappa var)
              + 2 sigma rms(dz) + 2 (rms(dz) + dmu)^2          second-order: constant rows
        rho_rel = max(sqrt((v+eps)/(max(v-dv,0)+eps)) - 1, 1 - sqrt((v+eps)/(v+dv+eps))) + FN_ULPS u_c
        dxhat_i = rho T dd_i + |xhat_i| (T - 1),  T = (1 + rho_rel)(1 + u_c)

    Every product of two errors is kept (second order included), so that the bounds built on
    dxhat (``normalisation_vjp_error``) hold for every xhat' within it however large it is.
    """
    n = z.shape[-1]
    dz = np.zeros_like(z) if dz is None else dz
    with np.errstate(all="ignore"):
        mu = row_mean(z)
        d = z - mu
        var = row_mean(d * d)
        sigma = np.sqrt(var)
        rho = 1.0 / np.sqrt(var + eps)
        s1 = row_mean(np.abs(z))
        big_r = np.sqrt(row_mean(z * z))
        rms_dz = np.sqrt(row_mean(dz * dz))
        dmu = np.where(exact_mean_rows(ctx, z, dz), 0.0, ctx.gam(n + 1) * s1 + row_mean(dz))
        dd = dmu + dz + ctx.uc * (np.abs(d) + dmu + dz)  # z - mu' rounds on its own magnitude
        dv = ctx.gam(2 * n + 4) * (var + 2 * big_r * sigma) + 2 * sigma * rms_dz + 2 * (rms_dz + dmu) ** 2
        rho_rel_hi = np.sqrt((var + eps) / (np.maximum(var - dv, 0) + eps)) - 1
        rho_rel_lo = 1 - np.sqrt((var + eps) / (var + dv + eps))
        rho_rel = np.maximum(rho_rel_hi, rho_rel_lo) + FN_ULPS * ctx.uc
        xhat = d * rho
        times = (1 + rho_rel) * (1 + ctx.uc)  # rho' and the product's rounding
        dxhat = rho * times * dd + np.abs(xhat) * (times - 1)
    claim = claimable_rows(ctx, z) & np.isfinite(dxhat).all(-1, keepdims=True)
    return Normalisation(xhat, rho, rho_rel, dxhat, claim)


def affine_bound(ctx, norm, w, b, axis=-1):
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


def signed_reach(t, slack=0.0):
    """max(sum t+, sum t-) over the last dim (keepdims), plus slack: the largest |partial sum| any
    order of summing t can form, since every partial sum is a sum over a subset of the terms.

    A sum of n terms in any order rounds n - 1 times, each by at most u_c of the partial sum it
    forms; with every |partial| <= m = signed_reach(t) + the error so far, the error E obeys
    E <= (n - 1) u_c (m + E), so E <= gam(n - 1) m (Higham's gamma bound with Sum |t_i| replaced
    by m, at most half of it when t's signs balance).  A mean adds one rounding (division by n,
    or 1/n and a product: two): gam(n + 1) m / n.  slack: a bound on how far the kernel's own
    terms may lie from t in sum, which each partial sum may carry."""
    positive, negative = np.maximum(t, 0).sum(axis=-1, keepdims=True), np.maximum(-t, 0).sum(axis=-1, keepdims=True)
    return np.maximum(positive, negative) + slack


def normalisation_vjp_error(ctx, norm, g):
    """Bound for dz = rho (g - mean g - xhat mean(g xhat)), g = dy * w, for every kernel whose rho
    is within rho_rel and whose xhat is within dxhat (``Normalisation``), to all orders in them.

    Write A = g - gbar - xhat M, gbar = mean g, M = mean(g xhat), so dz = rho A.  The kernel has
    rho' = rho (1 + r), |r| <= R = rho_rel, and xhat' = xhat + e, |e_i| <= E_i = dxhat_i; then
    mean(g xhat') = M + m with |m| <= mbar = mean(|g| E), and

        xhat' M' - xhat M = e M + xhat m + e m + xhat' (M' - mean(g xhat')),

    so the exact-arithmetic part is |A' - A| <= E |M| + (|xhat| + E) mbar, with the second-order
    e m kept: it is not small where E is not (a near-constant row whose mean is ulps off has
    E ~ rho dmu >> 1; dropping it let an xhat within its bound move dz 1.3 bounds).

    Rounding, each step on its own magnitudes (not one gam(2n+6) on every term):
        gbar'  off by dg = gam(n+1) signed_reach(g) / n                  (``signed_reach``)
        M'     off by dM = u_c mean(|g| (|xhat| + E)) + gam(n+2) (signed_reach(g xhat) + n mbar) / n
               (the n products round once, then their mean; the kernel's products lie within
               n mbar in sum of g xhat's)
        A'_i   three pointwise roundings and the product with rho': gam(4) P_i,
               P_i = |g_i| + |gbar| + dg + (|xhat_i| + E_i)(|M| + mbar + dM)
    so |fl(A') - A| <= a_i := dg + (|xhat_i| + E_i) dM + E_i |M| + (|xhat_i| + E_i) mbar + gam(4) P_i, and

        dz' - dz = rho (1 + r)(fl(A') - A) + rho r A:   |dz' - dz| <= rho (1 + R) a_i + R |dz_i|
                                                                      + (ORACLE + 2 u_o) shadow_i,

    shadow_i = rho (|g_i| + mean|g| + |xhat_i| mean|g xhat|): 2 u_o of it for intermediates saved
    in the output dtype (``ROUNDINGS``), ORACLE for the float64 dz the bound is evaluated with.
    """
    n = g.shape[-1]
    with np.errstate(all="ignore"):
        xhat, rho, e = norm.xhat, norm.rho, norm.dxhat
        gbar, gx = row_mean(g), g * xhat
        mean_gx = row_mean(gx)
        dz = rho * (g - gbar - xhat * mean_gx)
        shadow = rho * (np.abs(g) + row_mean(np.abs(g)) + np.abs(xhat) * row_mean(np.abs(gx)))
        reach = np.abs(xhat) + e  # the largest |xhat'| the kernel may hold
        mbar = row_mean(np.abs(g) * e)
        dg = ctx.gam(n + 1) * signed_reach(g) / max(n, 1)
        dm = ctx.uc * row_mean(np.abs(g) * reach) + ctx.gam(n + 2) * signed_reach(gx, n * mbar) / max(n, 1)
        pointwise = np.abs(g) + np.abs(gbar) + dg + reach * (np.abs(mean_gx) + mbar + dm)
        a = dg + reach * (dm + mbar) + e * np.abs(mean_gx) + ctx.gam(4) * pointwise
        return rho * (1 + norm.rho_rel) * a + norm.rho_rel * np.abs(dz) + (ORACLE + ROUNDINGS * ctx.uo) * shadow


def sum_over_rows(a):
    """The sum over every row (all leading dims) of a, per column."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


def row_sum_error(weight_ctx, terms, slack=0.0):
    """(bound, sum |terms| + slack) for a sum over rows of signed terms (dw, db), rounded in the
    weight's compute format: gam(rows + 2) times the sum's signed reach (``signed_reach``; slack, per
    column, bounds how far the kernel's own terms lie from ``terms`` in sum), plus the oracle's
    error on sum |terms|.  The second value is what the terms' relative errors apply to."""
    rows = terms.reshape(-1, terms.shape[-1])
    total = np.abs(rows).sum(axis=0)
    reach = signed_reach(rows.T, np.reshape(slack, (-1, 1)))[:, 0]
    return weight_ctx.gam(rows.shape[0] + 2) * reach + ORACLE * total, total + slack
