"""LayerNorm, and the normalisation step it shares with BatchNorm and DeepNorm.

Per row (last dim, length n), weight w, bias b:

    mu    = (1/n) sum_j x_j
    var   = (1/n) sum_j (x_j - mu)**2          (biased variance)
    rho   = 1 / sqrt(var + eps)                (eps inside the square root)
    xhat  = (x - mu) * rho
    y     = xhat * w + b

Vector-Jacobian product for cotangent dy (g = dy * w):

    dx = rho * (g - mean(g) - xhat * mean(g * xhat))
    dw = sum_over_rows dy * xhat
    db = sum_over_rows dy

Non-finite inputs: IEEE evaluation of the formula.  ±inf or NaN anywhere in a
row makes mu or var non-finite, so every y of that row is NaN; no other row is
touched.
"""
from __future__ import annotations

import numpy as np


def normalize(B, z, eps):
    """(xhat, rho, c) for rows of z: xhat = (z - mean z) / sqrt(var z + eps).

    xhat is invariant under (z, eps) -> (c z, c**2 eps), and the backends'
    float64 arrays need two rows evaluated at another c (a power of two, so
    c z and c**2 eps are exact):

    * where |z| nears float64's range, z - mean z may overflow though xhat is
      finite: c = 1/2;
    * where max|z| < 2**-969, z - mean z lands among the subnormals, whose
      fixed spacing 2**-1074 is no longer a few u of the row's scale and is
      then multiplied by rho: c = 2**k brings max|c z| up to [1/2, 1), k capped
      so that c**2 eps stays finite.

    c = 1 elsewhere, and rho = 1 / sqrt(var(c z) + c**2 eps).
    """
    with np.errstate(all="ignore"):
        peak = B.row_peak(z)
        tiny = np.isfinite(peak) & (peak > 0) & (peak < 2.0 ** -969)
        room = (1023 - np.frexp(np.float64(eps))[1]) // 2
        c = np.ldexp(1.0, np.where(tiny, np.minimum(-np.frexp(peak)[1], room), 0))
    d, mean = B.center(z * c if tiny.any() else z)
    rho = B.inv_rms(d, eps * c * c)
    with np.errstate(all="ignore"):
        # rho = 0 exactly only where d holds an inf; with a finite mean, that inf is an overflow
        over = np.isfinite(B.to_float64(mean)) & (B.to_float64(rho) == 0)
    if over.any():
        c[over] = 0.5
        d, _ = B.center(z * c)
        rho = B.inv_rms(d, eps * c * c)
    return B.mul_add_(d, rho), rho, c  # in place: d is ours (a fresh array costs a page fault per 4 KiB)


def normalize_vjp(B, xhat, rho, c, g):
    """Cotangent of z given g = cotangent of xhat, through (xhat, rho, c) = normalize(z)."""
    n = xhat.shape[-1]
    return c * (rho * (g - B.row_sum(g) / n - xhat * (B.row_dot(g, xhat) / n)))


def affine_grads(B, xhat, dy):
    """(dw, db): sum over rows of dy * xhat and of dy."""
    n = xhat.shape[-1]
    dw = B.row_sum((dy * xhat).reshape(-1, n).T).reshape(n)
    db = B.row_sum(dy.reshape(-1, n).T).reshape(n)
    return dw, db


def forward(B, x, weight, bias, eps):
    xhat, _, _ = normalize(B, x, eps)
    return (B.mul_add_(xhat, weight, bias),)


def vjp(B, cot, x, weight, bias, eps):
    (dy,) = cot
    xhat, rho, c = normalize(B, x, eps)
    dw, db = affine_grads(B, xhat, dy)
    return {"x": normalize_vjp(B, xhat, rho, c, dy * weight), "weight": dw, "bias": db}
