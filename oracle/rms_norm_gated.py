"""Gated RMSNorm, as Mamba-2, Qwen3-Next's gated delta net, flash-linear-attention's
``FusedRMSNormGated`` and vLLM's ``RMSNormGated`` compute it.

Per row (last dim, length n), with weight w, gate z (x's shape) and s = silu(z) = z sigma(z)
(``swiglu``: its IEEE limits, silu(-inf) = NaN):

    norm_before_gate:       y = rms_norm(x, w, eps) * s  = x_i rho w_i s_i,   rho = 1 / sqrt(mean(x^2) + eps)
    not norm_before_gate:   y = rms_norm(x * s, w, eps)  = g_i rho_g w_i,     g = x s, rho_g = 1 / sqrt(mean(g^2) + eps)

Vector-Jacobian product for cotangent dy (``rms_norm``'s VJP, ``rms_norm.vjp``, is (dx, dw) of
rms_norm at the rows it normalises):

    norm_before_gate:       (dx, dw) = rms_norm's VJP at x for the cotangent dy s
                            dz = dy (x rho w) silu'(z)
    not norm_before_gate:   (dg, dw) = rms_norm's VJP at g for the cotangent dy
                            dx = dg s,   dz = dg x silu'(z)

silu'(z) = sigma(z) (1 + z (1 - sigma(z))).  Where x s overflows float64 (x and z near its largest
value), the rows are scaled first (``_gated_rows``: rms_norm is scale invariant); where dy s may,
the cotangent is (``_shrink``: the VJP is linear in it).  The float64 path forms s (and g = x s) once per
element, redoing exactly (mpmath) every element where float64 cannot be trusted (``_gate_risky``);
its own error is a few u_64 of s, which ``bounds_gated_norm`` adds to the model's ORACLE.
"""
from __future__ import annotations

import math

import numpy as np

from . import rms_norm
from .swiglu import dsilu, silu


SHRINK = 2.0 ** -1030  # |x silu(z)| < 2**2048: scaled by it, below 2**1018 (a subnormal power of two: exact)
LOG_NEGLIGIBLE = -1080 * math.log(2)  # a product below e**LOG_NEGLIGIBLE = 2**-1080 rounds to 0 in float64


def _gate_risky(z, *factors):
    """Where float64 cannot be trusted for silu(z) (or silu'(z)) times ``factors``, elementwise.

    For z >= -708, e**-z is finite and sigma(z) normal: float64's formula holds (a result near
    float64's subnormals is redone by ``pointwise`` anyway).  Below, sigma(z) is subnormal or 0;
    there |silu(z)| and |silu'(z)| are at most 2 |z| e**z, and where that times the factors is
    below 2**-1080, the product's correctly rounded value is the zero of its sign that float64's
    sigma = 0 gives.  The rest is redone exactly (as ``swiglu.risky``, whose fixed -2200 serves
    any factors; these factors are known, and a float16 gate at -1000 need not cost mpmath time)."""
    with np.errstate(all="ignore"):
        log_mag = z + np.log(2 * np.abs(z)) + sum(np.log(np.abs(f)) for f in factors)
        return (z < -708) & ~(log_mag < LOG_NEGLIGIBLE) | ((z != 0) & (np.abs(z) < 2.0 ** -900))


def _gated_rows(B, x, z, eps):
    """(g, eps', c): g = c x silu(z) rounded once per element and eps' = c^2 eps, where c = 1, or
    SHRINK on a row where x silu(z) overflows float64 though x and z are finite.  rms_norm is scale
    invariant, rms_norm(c g, c^2 eps) = rms_norm(g, eps), and its gradient with respect to g is c
    times the one at c g.  (c^2 eps underflows to 0; on such a row mean(g^2) > 2**2048 / n, so eps
    changed rho by less than 2**-2000 relative.)"""
    g = B.pointwise(lambda B, a, b: a * silu(B, b), x, z, risky=lambda a, b: _gate_risky(b, a))
    g64, x64, z64 = B.to_float64(g), B.to_float64(x), B.to_float64(z)
    over = (np.isinf(g64) & np.isfinite(x64) & np.isfinite(z64)).any(axis=-1, keepdims=True)
    if not over.any():
        return g, eps, 1.0
    c = np.where(over, SHRINK, 1.0)
    return (B.pointwise(lambda B, a, b, k: a * silu(B, b) * k, x, z, c, risky=lambda a, b, k: _gate_risky(b, a, k)),
            eps * c * c, c)


def forward(B, x, z, weight, eps, norm_before_gate):
    if norm_before_gate:
        (r,) = rms_norm.forward(B, x, weight, eps)
        return (B.pointwise(lambda B, a, b: a * silu(B, b), r, z, risky=lambda a, b: _gate_risky(b, a)),)
    g, eps_g, _ = _gated_rows(B, x, z, eps)
    return rms_norm.forward(B, g, weight, eps_g)


def _shrink(B, dy):
    """k = 2**-e, the power of two that brings every |dy| below 1/2 (1 where they are): then
    |k dy s| < 2**1023 never overflows, and rms_norm's VJP, linear in its cotangent, is 1/k times
    the one for k dy s."""
    peak = float(np.max(np.abs(B.to_float64(dy)), initial=0.0))
    return 2.0 ** -(int(np.frexp(peak)[1]) + 1) if np.isfinite(peak) and peak >= 0.5 else 1.0


def vjp(B, cot, x, z, weight, eps, norm_before_gate):
    (dy,) = cot
    if norm_before_gate:
        k = _shrink(B, dy)
        gated = B.pointwise(lambda B, d, b: d * k * silu(B, b), dy, z, risky=lambda d, b: _gate_risky(b, d, k))
        grads = rms_norm.vjp(B, (gated,), x, weight, eps)
        (r,) = rms_norm.forward(B, x, weight, eps)
        dz = B.pointwise(lambda B, d, a, b: d * a * dsilu(B, b), dy, r, z, risky=lambda d, a, b: _gate_risky(b, d, a))
        return {"x": grads["x"] / k, "z": dz, "weight": grads["weight"] / k}
    g, eps_g, c = _gated_rows(B, x, z, eps)
    grads = rms_norm.vjp(B, (dy,), g, weight, eps_g)
    dg = grads["x"]  # the gradient at c g: c dg is the one at g, formed last in each product (no underflow)
    return {"x": B.pointwise(lambda B, d, b, k: d * silu(B, b) * k, dg, z, c, risky=lambda d, b, k: _gate_risky(b, d, k)),
            "z": B.pointwise(lambda B, d, a, b, k: d * a * dsilu(B, b) * k, dg, x, z, c,
                             risky=lambda d, a, b, k: _gate_risky(b, d, a, k)),
            "weight": grads["weight"]}
