"""GeGLU and GELU-and-mul, in GELU's two forms (``approximate``: "none" or "tanh").

    Phi(g)        = (1 + erf(g / sqrt 2)) / 2 = erfc(-g / sqrt 2) / 2     the standard normal CDF
    gelu(g)       = g Phi(g)                                               approximate = "none" (erf)
    t(g)          = sqrt(2 / pi) (g + 0.044715 g**3)
    gelu_tanh(g)  = g (1 + tanh(t)) / 2 = g sigma(2 t)                     approximate = "tanh"
    geglu(gate, up, a)  = gelu_a(gate) * up                                (elementwise)
    gelu_and_mul(x, a)  = geglu(x[..., :h], x[..., h:], a),  h = x.shape[-1] / 2

The tanh form is a function of its own, with the real constants sqrt(2 / pi) and 0.044715 (the
decimal): its oracle is exact for it, not for erf-GELU.  (1 + tanh t) / 2 = sigma(2 t) =
1 / (1 + e**(-2 t)), so the backend evaluates sigma(c1 g + c3 g**3) with c1 = 2 sqrt(2 / pi),
c3 = 0.044715 c1.

Vector-Jacobian product for cotangent dy:

    gelu'(g)      = Phi(g) + g phi(g),  phi(g) = e**(-g**2 / 2) / sqrt(2 pi)
    gelu_tanh'(g) = sigma(2 t) + g 2 sigma(2 t) sigma(-2 t) t'(g),  t'(g) = sqrt(2 / pi) (1 + 3 0.044715 g**2)
    dgate = dy up gelu_a'(g),   dup = dy gelu_a(g)
    gelu_and_mul: dx = concat(dgate, dup)                  (the halves form: ``halves``)

Limits, as for SiLU the IEEE evaluation of the defining formula: gelu(+inf) = +inf * 1 = +inf,
gelu(-inf) = -inf * 0 = NaN (both forms), NaN gives NaN; the product with up follows IEEE.  For
finite g != 0, gelu(g) is exactly nonzero however small, so gelu(g) * (+-inf) is +-inf (a kernel
whose gelu(g) underflowed may give NaN there: ``bounds_gated.geglu_indeterminate``).
"""
from __future__ import annotations

import mpmath
import numpy as np

from .eft import two_prod
from .float64_backend import proven_overflow
from .special import INV_SQRT_2PI, NEAR_ZERO_TAILS

with mpmath.workprec(256):
    K0 = mpmath.sqrt(2 / mpmath.pi)  # sqrt(2 / pi)
    K1 = mpmath.mpf("0.044715")
    C1, C3 = 2 * K0, 2 * K0 * K1  # 2 t = C1 g + C3 g**3


# Below UNDERFLOW[a], Phi(g) or sigma(2 t) (and phi, sigma(2 t) sigma(-2 t)) are below float64's
# normal range (e**-708): float64 keeps too few of their bits, or none, though a product with up and
# dy may still be a normal number.  Below NEGLIGIBLE[a] every product the oracle forms, at most
# |g| times two finite doubles (below 2**1024 each) times one of them, is below 2**-1075 and rounds
# to a zero of the right sign, which float64 also gets: phi(g) <= e**(-g**2 / 2) with
# 67**2 / 2 > 3123 ln 2 + ln 67 (erf), and sigma(2 t) < e**(2 t) with 2 t(-32) < -2170 (tanh).
UNDERFLOW = {"none": -37.0, "tanh": -21.0}
NEGLIGIBLE = {"none": -67.0, "tanh": -32.0}


def _risky(approximate):
    """Where float64 loses the formula and mpmath evaluates it: the tanh form's g in [NEGLIGIBLE,
    UNDERFLOW) (the erf form's band has a float64 form, ``_erf_band``; a g near 0 has one in both,
    ``special.NEAR_ZERO_TAILS``)."""
    if approximate == "none":
        return None
    lo, hi = NEGLIGIBLE[approximate], UNDERFLOW[approximate]
    return lambda g, *_: (g < hi) & (g >= lo)


MILLS_TERMS = 10  # terms of the Mills ratio's series kept on the erf form's band


def _mills(g):
    """R(g) = sum_{k < MILLS_TERMS} (-1)**k (2k - 1)!! / g**(2k), so that Phi(g) = phi(g) R(g) / |g|
    for g <= -37 to under 2**-70 relative: the asymptotic series of Mills' ratio alternates with
    a remainder below its first term left out, (2 MILLS_TERMS - 1)!! / 37**(2 MILLS_TERMS) < 3e-23.
    Evaluated by Horner's rule in x = 1 / g**2 <= 37**-2: the last addition 1 + x (...) holds its
    error to 1/2 ulp, and x's own (1 ulp) moves R by x of that, under 2**-10 ulp."""
    x = 1 / (g * g)
    r = np.zeros_like(g)
    for k in range(MILLS_TERMS - 1, 0, -1):
        r = x * (_DOUBLE_FACTORIAL[k] - r)
    return 1 - r


_DOUBLE_FACTORIAL = [float(np.prod(np.arange(2 * k - 1, 0, -2))) for k in range(MILLS_TERMS)]  # (2k - 1)!!, exact


def _erf_band(factors):
    """``pointwise``'s float64 form on the erf form's band g in [NEGLIGIBLE, UNDERFLOW):
    e**(-g**2 / 2) times ``factors(g, R, *a)`` and 1 / sqrt(2 pi), by ``exp_times``.

    With g**2 = s + e exactly (``two_prod``), phi(g) = e**(-s / 2) e**(-e / 2) / sqrt(2 pi), where
    -s / 2 is exact, e**(-e / 2) = 1 - e / 2 to 2**-90 (|e| <= 2**-53 s < 2**-40), and, g < 0,
    Phi(g) = -phi(g) R(g) / g (``_mills``).  So

        gelu(g) v       = g Phi(g) v = -phi(g) R v
        gelu'(g) u d    = (Phi(g) + g phi(g)) u d = phi(g) (g - R / g) u d

    (g - R / g: |R / g| < |g| / 1300, no cancellation; 1 ulp).  The float64 value: e**r (under
    1 ulp with r's error, ``exp_times``), five products of mantissas (1/2 ulp each), 1 - e / 2 and
    1 / sqrt(2 pi)'s leading double (1/2 ulp each), R (under 1 ulp): under 6 ulps, within the
    ORACLE term's 8 u_64 (and its LAM_64 where the result is subnormal: one rounding there)."""
    lo, hi = NEGLIGIBLE["none"], UNDERFLOW["none"]

    def value(B, g, *a):
        s, e = two_prod(g, g)
        return B.exp_times(-s / 2, 1 - e / 2, INV_SQRT_2PI[0], *factors(g, _mills(g), *a))

    return (lambda g, *_: (g < hi) & (g >= lo)), value


_VALUE_NEAR_ZERO, _SLOPE_NEAR_ZERO = NEAR_ZERO_TAILS  # g near 0: Phi(g), gelu'(g) = 1/2, both forms
_TAILS = {"none": ((_erf_band(lambda g, r, v: (-r, v)), _VALUE_NEAR_ZERO),  # gelu(g) v: y = gelu(g) u, dup = dy gelu(g)
                   (_erf_band(lambda g, r, u, d: (g - r / g, u, d)), _SLOPE_NEAR_ZERO)),  # dgate = d u gelu'(g)
          "tanh": ((_VALUE_NEAR_ZERO,), (_SLOPE_NEAR_ZERO,))}


def _cdf(B, g, approximate):
    """Phi(g) ("none") or sigma(2 t(g)) ("tanh"): gelu(g) = g * this."""
    return B.ncdf(g) if approximate == "none" else B.sigmoid_cubic(g, C1, C3)


def _dgelu(B, g, approximate):
    if approximate == "none":
        return B.ncdf(g) + g * B.npdf(g)
    s, sm = B.sigmoid_cubic(g, C1, C3), B.sigmoid_cubic(-g, C1, C3)  # sigma(2t), sigma(-2t): t is odd
    k0, k1 = (K0, K1) if B.name == "mpmath" else (float(K0), float(K1))
    dt = k0 * (1 + 3 * k1 * (g * g))
    return s + g * (2 * s * sm) * dt


def _cdf_low(g):
    """A lower bound on Phi(g) and sigma(2 t(g)), and so on gelu_a'(g) >= them for g >= 0 (g phi(g)
    and g 2 sigma(2 t) sigma(-2 t) t'(g) are >= 0 there): 1 - 2**-52 for g >= 9 (1 - Phi(9) < 2**-62,
    1 - sigma(2 t(9)) < e**-66), 1/2 for g >= 0, else 0 (no bound; |gelu(g)| < |g| there)."""
    return np.where(g >= 9, 1 - 2.0 ** -52, np.where(g >= 0, 0.5, 0.0))


def _overflow(out, g, v):
    """gelu(g) v = g v Phi(g) past float64's range, proven (``float64_backend.proven_overflow``):
    the extreme profiles' huge gate and up, whose float64 product is inf (10**5 elements a case),
    which mpmath would otherwise evaluate one by one to the same inf."""
    return proven_overflow(out, _cdf_low(g), g, v)


def _overflow_dgate(out, g, u, d):
    """d u gelu_a'(g) past float64's range, proven as ``_overflow``."""
    return proven_overflow(out, _cdf_low(g), u, d)


def forward(B, gate, up, approximate):
    times, _ = _TAILS[approximate]
    return (B.pointwise(lambda B, g, u: (g * _cdf(B, g, approximate)) * u, gate, up, risky=_risky(approximate),
                        overflows=_overflow, tails=times),)


def vjp(B, cot, gate, up, approximate):
    (dy,) = cot
    risky = _risky(approximate)
    times, dtimes = _TAILS[approximate]
    return {"gate": B.pointwise(lambda B, g, u, d: d * (u * _dgelu(B, g, approximate)), gate, up, dy, risky=risky,
                                overflows=_overflow_dgate, tails=dtimes),
            "up": B.pointwise(lambda B, g, d: d * (g * _cdf(B, g, approximate)), gate, dy, risky=risky,
                              overflows=_overflow, tails=times)}

