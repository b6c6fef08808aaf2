"""RMSNorm (fused with the residual add by ``fused``, quantised by ``quantised``).

Per row (last dim, length n), with weight w:

    ms   = (1/n) sum_j x_j**2
    rho  = 1 / sqrt(ms + eps)
    y_i  = x_i * rho * w_i                                   rms_norm(x, w, eps)

Vector-Jacobian product for cotangent dy (g_i = dy_i w_i):

    dx_i = rho g_i - rho**3 x_i * (1/n) sum_j g_j x_j  =  rho (g_i - xhat_i mean(g xhat)),  xhat = x rho
    dw_i = sum_over_rows dy_i x_i rho

Non-finite inputs: the formula evaluated in IEEE arithmetic.  A NaN anywhere in
a row makes every y of that row NaN and touches no other row.  A row holding
±inf (and no NaN) has ms = inf and rho = 0: finite x_i give ±0, infinite x_i
give NaN (inf * 0).
"""
from __future__ import annotations


def forward(B, x, weight, eps):
    return (x * B.inv_rms(x, eps) * weight,)


def vjp(B, cot, x, weight, eps):
    (dy,) = cot
    rho = B.inv_rms(x, eps)
    return {"x": _dx(B, x, weight, rho, dy), "weight": _dweight(B, x, rho, dy)}


def _dx(B, x, weight, rho, dy):
    g = dy * weight
    n = x.shape[-1]
    xhat = x * rho  # O(1) even where rho**3 or sum(g x) would under/overflow
    return rho * (g - xhat * (B.row_dot(g, xhat) / n))


def _dweight(B, x, rho, dy):
    n = x.shape[-1]
    terms = (dy * (x * rho)).reshape(-1, n).T  # one row per channel; x * rho first: no overflow
    return B.row_sum(terms).reshape(n)
