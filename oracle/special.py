"""The float64 backend's special functions, with arguments carried in double-double.

GELU's functions take a scaled argument: Phi(g) = erfc(-g / sqrt 2) / 2, phi(g) = e**(-g**2 / 2)
/ sqrt(2 pi), sigma(c1 g + c3 g**3).  Rounding that argument to float64 costs a *relative* error
of about |f'(z) z / f(z)| u in f(z): 2 z**2 u for erfc at z = 5, far past the 8 u_64 that the
error model allows the oracle (``error_model.ORACLE``).  So each argument is formed exactly as an
unevaluated sum z = zh + zl (``eft.two_prod`` / ``two_sum``, the constants as double-doubles,
|zl| <= ~2**-104 |z|), the function is evaluated at zh (torch's float64 erfc: 0.75 ulp over
[-30, 30] against mpmath; numpy's exp: under 1 ulp), and corrected to first order:

    f(zh + zl) = f(zh) + f'(zh) zl + O(zl**2 f'')

where the relative size of the correction is at most ~2 |z| |zl| (erfc, exp) -- under 2**-90 for
every |z| for which f(z) is not zero or the result flushed, which ``B.pointwise`` redoes exactly.
Each function is then within about 3 u_64 of its exact value (relative), ``test_oracle``'s
cross-check against mpmath holds the results built from them to the ORACLE term.

Valid for finite |g| < 2**500 (Veltkamp's split and g**2 stay finite); outside that the results
are set from the limits (Phi = 0 or 1, phi = 0, sigma = 0 or 1), and non-finite g is left to
``pointwise``'s exact re-evaluation.
"""
from __future__ import annotations

import mpmath
import numpy as np
import torch

from .eft import two_prod, two_sum

BIG = 2.0 ** 500


def dd(x) -> tuple[float, float]:
    """An mpmath number as hi + lo, each a float64, hi = fl(x)."""
    with mpmath.workprec(256):
        x = mpmath.mpf(x)
        hi = float(x)
        return hi, float(x - hi)


with mpmath.workprec(256):
    INV_SQRT2 = dd(1 / mpmath.sqrt(2))
    INV_SQRT_2PI = dd(1 / mpmath.sqrt(2 * mpmath.pi))
    TWO_OVER_SQRT_PI = dd(2 / mpmath.sqrt(mpmath.pi))


def erfc(a: np.ndarray) -> np.ndarray:
    """erfc elementwise in float64 (torch's: 0.75 ulp over [-30, 30] against mpmath)."""
    return torch.special.erfc(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))).numpy()


def _small(g):
    return np.where(np.abs(g) < BIG, g, 0.0)


def ncdf(g: np.ndarray) -> np.ndarray:
    """Phi(g) = erfc(-g / sqrt 2) / 2, the standard normal CDF."""
    a = _small(g)
    p, e = two_prod(a, INV_SQRT2[0])
    zl = e + a * INV_SQRT2[1]  # g / sqrt 2 = p + zl, to ~2**-104 relative
    # erfc(-(p + zl)) = erfc(-p) + (2 / sqrt pi) e**(-p**2) zl
    out = (erfc(-p) + TWO_OVER_SQRT_PI[0] * np.exp(-p * p) * zl) / 2
    return np.where(np.abs(g) < BIG, out, np.where(g > 0, 1.0, 0.0))


def npdf(g: np.ndarray) -> np.ndarray:
    """phi(g) = e**(-g**2 / 2) / sqrt(2 pi), the standard normal density."""
    a = _small(g)
    s, se = two_prod(a, a)  # g**2 = s + se exactly
    r = np.exp(-s / 2)
    r = r - r * (se / 2)  # e**(-(s + se) / 2) to first order
    out = r * INV_SQRT_2PI[0] + r * INV_SQRT_2PI[1]
    return np.where(np.abs(g) < BIG, out, 0.0)


def sigmoid_cubic(g: np.ndarray, c1, c3) -> np.ndarray:
    """sigma(c1 g + c3 g**3) = 1 / (1 + e**-(c1 g + c3 g**3)) for real constants c1, c3 > 0."""
    c1, c3 = dd(c1), dd(c3)
    a = _small(g)
    s, se = two_prod(a, a)
    m, me = two_prod(c3[0], s)
    me = me + c3[0] * se + c3[1] * s  # c3 g**2 = m + me
    qh, qe = two_sum(c1[0], m)
    ql = qe + me + c1[1]  # c1 + c3 g**2 = qh + ql
    th, te = two_prod(a, qh)
    tl = te + a * ql  # the argument t = th + tl
    e = np.exp(-np.abs(th))
    e = e - e * (np.sign(th) * tl)  # e**-|t| to first order (the sign of t is th's)
    big, small = 1 / (1 + e), e / (1 + e)
    out = np.where(th >= 0, big, small)
    return np.where(np.abs(g) < BIG, out, np.where(g > 0, 1.0, 0.0))


NEAR_ZERO = 2.0 ** -900


def _near_zero(g, *_):
    return (g != 0) & (np.abs(g) < NEAR_ZERO)


NEAR_ZERO_TAILS = ((_near_zero, lambda B, g, v: B.exp_times(np.zeros_like(g), g, v, 0.5)),
                   (_near_zero, lambda B, g, u, d: B.exp_times(np.zeros_like(g), u, d, 0.5)))
"""``pointwise``'s tails for a gated op's gate g near zero, 0 < |g| < NEAR_ZERO, where float64
forms g sigma(g) (or g Phi(g)) among subnormals and a later product with a huge up or dy makes
that rounding large: (where, value) for the op's value times v, f(g) g v, and (where, value) for
its slope times u d.

Each gate function f of SwiGLU and GeGLU (sigma(g), Phi(g), sigma(2 t(g))) and each slope
(silu'(g), gelu'(g), gelu_tanh'(g)) is 1/2 + O(|g|) with the O's constant under 1, so there

    f(g) g v = g v / 2 (1 + d),    slope(g) u d = u d / 2 (1 + d'),    |d|, |d'| < 2**-898,

and ``exp_times(0, g, v, 1/2)`` (the mantissas' two products, one ldexp) is within 1 ulp, and
one rounding among subnormals, of the exact value: inside the ORACLE term."""
