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
    """Where float64 loses the formula: g in [NEGLIGIBLE, UNDERFLOW), or g near-subnormal."""
    lo, hi = NEGLIGIBLE[approximate], UNDERFLOW[approximate]
    return lambda g, *_: ((g < hi) & (g >= lo)) | ((g != 0) & (np.abs(g) < 2.0 ** -900))


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


def forward(B, gate, up, approximate):
    return (B.pointwise(lambda B, g, u: (g * _cdf(B, g, approximate)) * u, gate, up, risky=_risky(approximate)),)


def vjp(B, cot, gate, up, approximate):
    (dy,) = cot
    risky = _risky(approximate)
    return {"gate": B.pointwise(lambda B, g, u, d: d * (u * _dgelu(B, g, approximate)), gate, up, dy, risky=risky),
            "up": B.pointwise(lambda B, g, d: d * (g * _cdf(B, g, approximate)), gate, dy, risky=risky)}

