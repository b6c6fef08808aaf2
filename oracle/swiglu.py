"""SwiGLU and SiLU-and-mul.

    sigma(g) = 1 / (1 + e**-g)
    silu(g)  = g * sigma(g) = g / (1 + e**-g)
    swiglu(gate, up) = silu(gate) * up                      (elementwise)
    silu_and_mul(x)  = swiglu(x[..., :h], x[..., h:]),  h = x.shape[-1] / 2

Vector-Jacobian product for cotangent dy:

    dgate = dy * up * sigma(g) * (1 + g * (1 - sigma(g)))
    dup   = dy * silu(g)
    silu_and_mul: dx = concat(dgate, dup)

Limits, by convention the IEEE evaluation of the defining formula (which is
what every common kernel formula gives, and what torch gives):
silu(+inf) = +inf, silu(-inf) = -inf / (1 + inf) = NaN (not the analytic limit
0), silu(NaN) = NaN; then the product with up follows IEEE (0 * inf = NaN).
"""
from __future__ import annotations

import numpy as np


def _sigmas(B, g):
    """(sigma(g), 1 - sigma(g)), each computed without cancellation."""
    return 1 / (1 + B.exp(-g)), 1 / (1 + B.exp(g))


def forward(B, gate, up):
    s, _ = _sigmas(B, gate)
    return (gate * s * up,)


def vjp(B, cot, gate, up):
    (dy,) = cot
    s, sm = _sigmas(B, gate)
    return {"gate": dy * up * s * (1 + gate * sm), "up": dy * gate * s}


def mul_forward(B, x):
    h = x.shape[-1] // 2
    return forward(B, x[..., :h], x[..., h:])


def mul_vjp(B, cot, x):
    h = x.shape[-1] // 2
    g = vjp(B, cot, x[..., :h], x[..., h:])
    return {"x": np.concatenate([g["gate"], g["up"]], axis=-1)}
