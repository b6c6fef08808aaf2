"""SwiGLU and SiLU-and-mul.

    sigma(g) = 1 / (1 + e**-g)
    silu(g)  = g * sigma(g) = g / (1 + e**-g)
    swiglu(gate, up) = silu(gate) * up                      (elementwise)
    silu_and_mul(x)  = swiglu(x[..., :h], x[..., h:]),  h = x.shape[-1] / 2

Vector-Jacobian product for cotangent dy:

    dgate = dy * up * sigma(g) * (1 + g * (1 - sigma(g)))
    dup   = dy * silu(g)
    silu_and_mul: dx = concat(dgate, dup)                   (the halves form: ``halves``)

Limits, by convention the IEEE evaluation of the defining formula (which is
what every common kernel formula gives, and what torch gives):
silu(+inf) = +inf, silu(-inf) = -inf / (1 + inf) = NaN (not the analytic limit
0), silu(NaN) = NaN; then the product with up follows IEEE (0 * inf = NaN).
For finite g != 0, silu(g) and silu'(g) are exactly nonzero, however small, so
silu(g) * (+-inf) is +-inf: the exact value, never the NaN that a float
evaluation gets once silu(g) has underflowed (see ``bounds_gated.swiglu_indeterminate``).
"""
from __future__ import annotations

import numpy as np

from .float64_backend import proven_overflow
from .special import NEAR_ZERO_TAILS


def _sigmas(B, g):
    """(sigma(g), 1 - sigma(g)), each computed without cancellation."""
    return 1 / (1 + B.exp(-g)), 1 / (1 + B.exp(g))


def silu(B, g):
    s, _ = _sigmas(B, g)
    return g * s


def dsilu(B, g):
    """silu'(g) = sigma(g) (1 + g (1 - sigma(g))); never exactly 0 at a float g."""
    s, sm = _sigmas(B, g)
    return s * (1 + g * sm)


NEGLIGIBLE = -2200.0  # below it, e**g times any two finite doubles rounds to 0 in float64
UNDERFLOW = -600.0  # below it, e**g < 2**-865: float64's formula loses it in a product


def _band(factors):
    """``pointwise``'s float64 form on g in [NEGLIGIBLE, UNDERFLOW), where e**g underflows: e**g
    times ``factors(g, *a)`` by ``exp_times``, nothing under- or overflowing before the result.
    (Below NEGLIGIBLE every product the oracle forms, silu(g) * u * d and silu'(g) * u * d with
    finite u, d (|u|, |d| < 2**1024), is below 2**-1075 in magnitude (|g| e**g and |1 + g| e**g
    decrease for g < -1, and 2200 > (1075 + 2048) ln 2 + ln 2200), so it rounds to a zero of sign
    sign(g u d) -- which is what float64 gets: e**-g = inf, sigma(g) = +0, silu(g) = g * 0 = -0.
    An infinite or NaN u or d is evaluated by mpmath, as every element with a non-finite input.)

    On the band sigma(g) = e**g / (1 + e**g) = e**g (1 - d), 0 < d < e**g < 2**-865, and
    1 - sigma(g) = 1 - d' with d' < 2**-865, so

        silu(g) u    = e**g g u (1 - d)
        silu'(g) u d = e**g (1 + g - g sigma(g)) u d = e**g (1 + g) u d (1 - d''),  |d''| < 2**-854

    (|g sigma(g) / (1 + g)| < 2 e**g).  Left out, d and d'' are 2**-800 of an ulp.  The float64
    value: e**r (under 1 ulp, with r's own error under 1/2 ulp of e**r, ``exp_times``), at most
    four products of mantissas (1/2 ulp each) and 1 + g (1/2 ulp): under 4 ulps, within the
    ORACLE term's 8 u_64 (and its LAM_64 where the result is subnormal: one rounding there)."""
    return (lambda g, *_: (g < UNDERFLOW) & (g >= NEGLIGIBLE),
            lambda B, g, *a: B.exp_times(g, *factors(g, *a)))


_SILU_TIMES = (_band(lambda g, v: (g, v)), NEAR_ZERO_TAILS[0])  # silu(g) v: y = silu(g) u, dup = dy silu(g)
_DSILU_TIMES = (_band(lambda g, u, d: (1 + g, u, d)), NEAR_ZERO_TAILS[1])  # dgate = d u silu'(g)


def _sigma_low(g):
    """A lower bound on sigma(g), and so on silu'(g) = sigma(g) (1 + g (1 - sigma(g))) >= sigma(g)
    for g >= 0: 1 - 2**-52 for g >= 45 (1 - sigma(g) = sigma(-g) < e**-45 < 2**-64), 1/2 for g >= 0,
    else 0 (no bound: sigma(g) -> 0)."""
    return np.where(g >= 45, 1 - 2.0 ** -52, np.where(g >= 0, 0.5, 0.0))


def _overflow_silu(out, g, u):
    """silu(g) u = g u sigma(g) past float64's range, proven (``float64_backend.proven_overflow``):
    the extreme profiles' huge gate and up, whose float64 product is inf (10**5 elements a case)."""
    return proven_overflow(out, _sigma_low(g), g, u)


def _overflow_dgate(out, g, u, d):
    """d u silu'(g) past float64's range, proven as ``_overflow_silu``."""
    return proven_overflow(out, _sigma_low(g), u, d)


def forward(B, gate, up):
    return (B.pointwise(lambda B, g, u: silu(B, g) * u, gate, up, overflows=_overflow_silu, tails=_SILU_TIMES),)


def vjp(B, cot, gate, up):
    (dy,) = cot
    return {"gate": B.pointwise(lambda B, g, u, d: d * (u * dsilu(B, g)), gate, up, dy, overflows=_overflow_dgate,
                                tails=_DSILU_TIMES),
            "up": B.pointwise(lambda B, g, d: d * silu(B, g), gate, dy, overflows=_overflow_silu, tails=_SILU_TIMES)}

