"""BatchNorm over the leading positions, channels in the last dim, with a padding mask.

x has shape (*P, C); mask (shape P, bool) marks the valid positions (all when
mask is None).  For each channel c, over the valid positions V only:

    mu_c   = (1/|V|) sum_{p in V} x_{p,c}
    var_c  = (1/|V|) sum_{p in V} (x_{p,c} - mu_c)**2     (biased)
    y_{p,c} = (x_{p,c} - mu_c) / sqrt(var_c + eps) * w_c + b_c

Outputs at padded positions are not part of the op's meaning: the oracle
returns them evaluated with the valid statistics, and nothing checks them.
A single valid position gives var = 0 and y = b (never NaN).  With no valid
position the statistics are NaN.

Vector-Jacobian product: the loss is sum_{p in V} dy_p * y_p (cotangents at
padded positions are ignored), so with g = dy * w over V

    dx_V = rho * (g - mean_V(g) - xhat * mean_V(g * xhat)),   dx at padded positions = 0
    dw   = sum_V dy * xhat,   db = sum_V dy

Non-finite values at valid positions poison their channel (IEEE); at padded
positions they are never read.
"""
from __future__ import annotations

import numpy as np

from .layer_norm import affine_grads, normalize, normalize_vjp


def _valid(x, mask):
    c = x.shape[-1]
    flat = x.reshape(-1, c)
    keep = np.ones(flat.shape[0], bool) if mask is None else np.asarray(mask, bool).reshape(-1)
    return flat, keep


def forward(B, x, weight, bias, eps, mask=None):
    flat, keep = _valid(x, mask)
    c = x.shape[-1]
    y = B.array(np.zeros(flat.shape))
    if keep.any():
        xhat_v, rho, s = normalize(B, flat[keep].T, eps)  # one row per channel
        y[keep] = (xhat_v.T * weight + bias)
        if (~keep).any():
            _, mu = B.center(flat[keep].T * s)
            y[~keep] = (flat[~keep] * s.T - mu.T) * rho.T * weight + bias
    else:
        y = y + float("nan")
    return (y.reshape(x.shape[:-1] + (c,)),)


def vjp(B, cot, x, weight, bias, eps, mask=None):
    (dy,) = cot
    flat, keep = _valid(x, mask)
    c = x.shape[-1]
    dyv = dy.reshape(-1, c)[keep]
    dx = B.array(np.zeros(flat.shape))  # padded positions: exactly 0 (x * 0 would be NaN there)
    dw = db = B.array(np.zeros(c))
    if keep.any():
        xhat_v, rho, s = normalize(B, flat[keep].T, eps)
        dx[keep] = normalize_vjp(B, xhat_v, rho, s, (dyv * weight).T).T
        dw, db = affine_grads(B, xhat_v.T, dyv)
    return {"x": dx.reshape(x.shape), "weight": dw, "bias": db}
